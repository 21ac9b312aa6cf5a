//! Subcommands and the flags they share.

mod bench;
mod bench_engine;
mod generate;
mod models;
mod qa;
mod schema;
mod score;
mod summarize;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use prism::engine::device::{self, DeviceChoice};
use prism::engine::model::PrefillWeights;
use prism::engine::sampling::SamplingConfig;
use prism::engine::source;
use prism::engine::{Engine, LoadOptions};
use std::time::Instant;

#[derive(Debug, Parser)]
#[command(
    name = "prism",
    version,
    about = "Summarize long documents with local Llama/Qwen models, structured memory and prefix-KV reuse"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one or more prompts in order on one engine, so later prompts reuse earlier prefixes.
    Generate(generate::GenerateArgs),
    /// List or fetch the known models.
    Models(models::ModelsArgs),
    /// Summarize a document far longer than the context, chunk by chunk.
    Summarize(Box<summarize::SummarizeArgs>),
    /// Sweep methods × chunk sizes over a document: one run each, a report and charts.
    Bench(Box<bench::BenchArgs>),
    /// Measure prefill and decode speed and the gain from a cached prefix.
    BenchEngine(bench_engine::BenchEngineArgs),
    /// Question-answer pairs about a document.
    Qa(qa::QaArgs),
    /// Score a finished summary (coherence).
    Score(score::ScoreArgs),
    /// Write memory schemas for new domains.
    Schema(schema::SchemaArgs),
}

pub fn run() -> Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging();
    match cli.command {
        Command::Generate(args) => {
            let sub = matches
                .subcommand_matches("generate")
                .expect("clap matched the generate subcommand");
            generate::run(args, sub)
        }
        Command::Models(args) => models::run(args),
        Command::Summarize(args) => summarize::run_summarize(*args),
        Command::Bench(args) => {
            let sub = matches
                .subcommand_matches("bench")
                .expect("clap matched the bench subcommand");
            bench::run(*args, sub)
        }
        Command::BenchEngine(args) => bench_engine::run(args),
        Command::Qa(args) => qa::run(args),
        Command::Score(args) => score::run(args),
        Command::Schema(args) => schema::run(args),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PRISM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Flags that choose and load the model.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// A known model name (see `prism models list`), a .gguf file, a model directory, or a Hugging Face repo id.
    #[arg(long, short, default_value = source::DEFAULT_MODEL)]
    pub model: String,
    /// CPU threads (default: physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Recompute every prompt from scratch instead of reusing the cached prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Token sequences kept cached; a prompt continues the one it shares the longest prefix with.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub cache_slots: u16,
    /// Weights for multi-token prefill: `dense` (f32 copy, fastest, more memory) or `quantized`.
    /// Default: dense when the copy stays under 4 GiB.
    #[arg(long, value_parser = parse_prefill_weights)]
    pub prefill_weights: Option<PrefillWeights>,
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse().map_err(|e: prism::Error| e.to_string())
}

fn parse_prefill_weights(s: &str) -> Result<PrefillWeights, String> {
    match s {
        "dense" => Ok(PrefillWeights::Dense),
        "quantized" => Ok(PrefillWeights::Quantized),
        other => Err(format!("`{other}` is not one of dense, quantized")),
    }
}

impl EngineArgs {
    /// Size the thread pools, resolve `--model` and load it, reporting the time on stderr.
    pub fn load(&self) -> Result<Engine> {
        if let Some(threads) = self.threads {
            anyhow::ensure!(threads > 0, "--threads must be at least 1");
            device::set_threads(threads);
        }
        let source = source::resolve(&self.model)?;
        let start = Instant::now();
        let options = LoadOptions {
            device: self.device,
            prefill_weights: self.prefill_weights,
        };
        let mut engine =
            Engine::load(&source, &options).with_context(|| format!("loading {}", self.model))?;
        engine.set_prefix_cache(!self.no_prefix_cache);
        engine.set_cache_slots(usize::from(self.cache_slots));
        eprintln!(
            "loaded {} ({:?}, {} layers, context {}) in {:.1}s on {} thread(s)",
            engine.name(),
            engine.config().architecture,
            engine.config().layers,
            engine.context_tokens(),
            start.elapsed().as_secs_f64(),
            device::default_threads(),
        );
        Ok(engine)
    }
}

/// Flags that choose how tokens are sampled.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Penalty for tokens among the last 64; 1.0 is off.
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = SamplingConfig::default().seed)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn config(&self) -> prism::Result<SamplingConfig> {
        let config = SamplingConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed,
            ..SamplingConfig::default()
        };
        config.validate()?;
        Ok(config)
    }
}
