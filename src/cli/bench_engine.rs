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
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    context: Vec<usize>,
    /// Single-token steps timed for decode.
    #[arg(long, default_value_t = 32)]
    decode_steps: usize,
    /// Runs per figure; the best is kept.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
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
    let mut engine = args.engine.load()?;
    if !args.json {
        outln!("| context | prefill tok/s | decode tok/s | 90% cached (s) | cold (s) | speedup | peak RSS (MB) |")?;
        outln!("|---:|---:|---:|---:|---:|---:|---:|")?;
    }
    for &context in &args.context {
        anyhow::ensure!(
            context + args.decode_steps < engine.context_tokens(),
            "--context {context} plus {} decode steps exceeds the model's context of {}",
            args.decode_steps,
            engine.context_tokens()
        );
        let figures = measure(&mut engine, context, args.decode_steps, args.repeats)?;
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
    for &context in &args.context {
        let all = measure_side_by_side(
            &mut engine,
            &sequences,
            context,
            args.decode_steps,
            args.repeats,
        )?;
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
