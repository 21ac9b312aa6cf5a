//! `prism bench-engine`: prefill and decode speed at several context lengths,
//! and the time saved by a cached 90% prefix.

use super::EngineArgs;
use anyhow::Result;
use clap::Args;
use prism::bench::engine::{measure, measure_side_by_side};

#[derive(Debug, Args)]
pub struct BenchEngineArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Context lengths to measure at, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,2048", value_parser = clap::value_parser!(u32).range(1..))]
    context: Vec<u32>,
    /// Single-token steps timed for decode.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    decode_steps: u32,
    /// Runs per figure; the best is kept.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    repeats: u16,
    /// Also decode this many sequences side by side at each context length,
    /// their steps batched into one forward pass (comma-separated, e.g.
    /// 1,4,16); the counts take turns, each run --repeats times.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..=256))]
    sequences: Vec<u16>,
    /// Print one JSON object per context length (and per sequence count).
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchEngineArgs) -> Result<()> {
    let mut engine = args.engine.open()?;
    let contexts: Vec<usize> = args.context.iter().map(|&tokens| tokens as usize).collect();
    let (decode_steps, repeats) = (args.decode_steps as usize, usize::from(args.repeats));
    // Every length is checked before the first is measured, so a bad one
    // costs no minutes of measuring the others.
    for &context in &contexts {
        anyhow::ensure!(
            context + decode_steps < engine.context_tokens(),
            "--context {context} plus {decode_steps} decode steps exceeds the model's context of {}",
            engine.context_tokens()
        );
    }
    if !args.json {
        outln!("| context | prefill tok/s | decode tok/s | 90% cached (s) | cold (s) | speedup | peak RSS (MB) |")?;
        outln!("|---:|---:|---:|---:|---:|---:|---:|")?;
    }
    for &context in &contexts {
        let figures = measure(&mut engine, context, decode_steps, repeats)?;
        if args.json {
            outln!("{}", serde_json::to_string(&figures)?)?;
        } else {
            outln!(
                "| {} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1}× | {} |",
                figures.context_tokens,
                figures.prefill_tokens_per_second,
                figures.decode_tokens_per_second,
                figures.warm_90_seconds,
                figures.cold_seconds,
                figures.cold_seconds / figures.warm_90_seconds,
                figures
                    .peak_rss_bytes
                    .map_or("–".to_string(), |bytes| (bytes >> 20).to_string()),
            )?;
        }
    }
    if args.sequences.is_empty() {
        return Ok(());
    }
    if !args.json {
        outln!()?;
        let first = args
            .sequences
            .first()
            .map_or(1, |&count| usize::from(count));
        outln!(
            "| context | sequences | decode tok/s, all together | per sequence | gain over {first} |"
        )?;
        outln!("|---:|---:|---:|---:|---:|")?;
    }
    let sequences: Vec<usize> = args.sequences.iter().map(|&count| count.into()).collect();
    for &context in &contexts {
        let all = measure_side_by_side(&mut engine, &sequences, context, decode_steps, repeats)?;
        let Some(first_rate) = all.first().map(|first| first.decode_tokens_per_second) else {
            continue;
        };
        for figures in all {
            if args.json {
                outln!("{}", serde_json::to_string(&figures)?)?;
            } else {
                outln!(
                    "| {} | {} | {:.1} | {:.1} | {:.2}× |",
                    figures.context_tokens,
                    figures.sequences,
                    figures.decode_tokens_per_second,
                    figures.decode_tokens_per_second / figures.sequences as f64,
                    figures.decode_tokens_per_second / first_rate,
                )?;
            }
        }
    }
    Ok(())
}
