//! `prism score`: measures of a finished summary, its coherence to a judge model
//! (BooookScore) or its answers to questions (Correct-F1, in `qa.rs`).

use super::method_args::OnOff;
use super::{BackendArgs, SamplingArgs};
use anyhow::Result;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use prism::engine::sampling::SamplingConfig;
use prism::engine::GenerateOptions;
use prism::quality::coherence::{score_coherence, CoherenceConfig, CoherenceReport, VerdictKind};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ScoreArgs {
    #[command(subcommand)]
    command: ScoreCommand,
}

#[derive(Debug, Subcommand)]
enum ScoreCommand {
    /// Ask a judge model, sentence by sentence, whether a summary would confuse a reader (BooookScore).
    Coherence(Box<CoherenceArgs>),
    /// Answer questions from the summary alone and score the answers with Correct-F1 (Chain of Summaries).
    Qa(Box<super::qa::ScoreQaArgs>),
}

#[derive(Debug, Args)]
#[command(mut_arg("model", |arg| arg
    .visible_alias("judge-model")
    .help("The judge: a known model name (see `prism models list`), a .gguf file, a model directory, a Hugging Face repo id, or owner/repo:QUANT for one GGUF file of a hub repo (e.g. Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M)")))]
pub struct CoherenceArgs {
    /// The summary: a UTF-8 text file.
    summary: PathBuf,
    /// Print the whole report as JSON instead of one line per sentence.
    #[arg(long)]
    json: bool,
    /// Decode each verdict under a JSON grammar, so that it always parses.
    #[arg(long, value_enum, default_value = "on")]
    constrained: OnOff,
    /// Sentences judged at once, each on its own thread (locally their decode
    /// steps batch into one forward pass; remotely each is a client of its own).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// The report as printed with `--json`: the judge's name, then the report.
#[derive(serde::Serialize)]
struct Printed<'a> {
    summary: &'a std::path::Path,
    judge_model: &'a str,
    #[serde(flatten)]
    report: &'a CoherenceReport,
}

pub fn run(args: ScoreArgs) -> Result<()> {
    match args.command {
        ScoreCommand::Coherence(args) => run_coherence(*args),
        ScoreCommand::Qa(args) => super::qa::run_score_qa(*args),
    }
}

fn run_coherence(args: CoherenceArgs) -> Result<()> {
    let summary =
        prism::document::read_document(&args.summary, prism::document::MAX_DOCUMENT_BYTES)?;
    let sampling = args.sampling.config(SamplingConfig::default())?;
    let mut backend = args.backend.load()?;
    let config = CoherenceConfig {
        constrained: args.constrained == OnOff::On,
    };
    let options = GenerateOptions {
        sampling,
        ..GenerateOptions::default()
    };
    let judge_model = backend.name().to_string();
    let mut llm = backend.llm_side_by_side(options, usize::from(args.concurrency))?;
    let bar = if super::is_quiet() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} sentence {pos}/{len} [{bar:30}] elapsed {elapsed} eta {eta}",
        )
        .expect("a valid progress template")
        .progress_chars("=> "),
    );
    let report = score_coherence(&mut *llm, &summary, &config, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    if args.json {
        let printed = Printed {
            summary: &args.summary,
            judge_model: &judge_model,
            report: &report,
        };
        outln!("{}", serde_json::to_string_pretty(&printed)?)?;
    } else {
        for verdict in &report.verdicts {
            let label = match verdict.verdict {
                VerdictKind::Clean => "clean".to_string(),
                VerdictKind::Confusing if verdict.types.is_empty() => "confusing".to_string(),
                VerdictKind::Confusing => {
                    let types: Vec<&str> = verdict.types.iter().map(|t| t.name()).collect();
                    format!("confusing: {}", types.join(", "))
                }
                VerdictKind::Unparsed => "unparsed".to_string(),
            };
            outln!("[{label}] {}", verdict.sentence)?;
        }
    }
    let parsed = report
        .score_parsed
        .map_or("n/a".to_string(), |score| format!("{score:.3}"));
    let judge = &report.judge;
    note!(
        "{}: coherence {:.3} ({} of {} sentences clean, {} confusing, {} unparsed; {parsed} over parsed verdicts); judge {judge_model}: {} calls, cache hit {:.1}%, net {} tokens, output {}, {:.0}s",
        args.summary.display(),
        report.score,
        report.clean,
        report.sentences,
        report.confusing,
        report.unparsed,
        judge.calls,
        100.0 * judge.figures.cache_hit_rate,
        judge.figures.net_tokens,
        judge.figures.output_tokens,
        judge.seconds,
    );
    Ok(())
}
