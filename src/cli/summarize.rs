//! `prism summarize`: read a document in chunks with a method and write the
//! run directory (summary, memory, per-chunk steps, stats, checkpoint).

use super::{EngineArgs, SamplingArgs};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use prism::engine::GenerateOptions;
use prism::memory::Schema;
use prism::methods::llm::EngineLlm;
use prism::methods::prism::{run, MemoryMode, Outcome, Prism, PrismConfig, Progress, RunFiles};
use prism::metrics::Figures;
use prism::rundir::{fingerprint, RunDir};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MethodName {
    Prism,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MemoryArg {
    InPlace,
    Amendments,
}

#[derive(Debug, Args)]
pub struct SummarizeArgs {
    /// The document: a UTF-8 text file.
    document: PathBuf,
    #[arg(long, value_enum, default_value = "prism")]
    method: MethodName,
    /// How the memory is shown to the model.
    #[arg(long, value_enum, default_value = "amendments")]
    memory: MemoryArg,
    /// Allow `add` revisions only (the paper's "without updates" ablation).
    #[arg(long)]
    no_updates: bool,
    /// Tokens per chunk; chunks end on paragraph or sentence boundaries.
    #[arg(long, default_value_t = 2048)]
    chunk_tokens: usize,
    /// The memory schema (a JSON Schema file).
    #[arg(long, default_value = "schemas/book.json")]
    schema: PathBuf,
    /// What the final answer should be.
    #[arg(
        long,
        default_value = "Summarize the document: the main events in order, the people involved and what drives them, the setting and the central themes."
    )]
    query: String,
    /// The run directory: summary.txt, memory.json, steps.jsonl, stats.json, checkpoint.json.
    #[arg(long)]
    out: PathBuf,
    /// Continue the interrupted run in --out.
    #[arg(long)]
    resume: bool,
    /// Read only the first chunks of the document, up to this many tokens in all.
    #[arg(long)]
    first_tokens: Option<usize>,
    /// Stop after this many chunks (the run can be continued with --resume).
    #[arg(long)]
    stop_after_chunks: Option<usize>,
    /// The most tokens one revision step may write.
    #[arg(long, default_value_t = 512)]
    revision_tokens: usize,
    /// The most tokens of the final answer.
    #[arg(long, default_value_t = 900)]
    answer_tokens: usize,
    /// Decode revisions under a grammar derived from the schema (every line parses and type-checks).
    #[arg(long, value_enum, default_value = "on")]
    constrained: OnOff,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// Everything that decides a run's result; its fingerprint guards `--resume`.
#[derive(serde::Serialize)]
struct RunIdentity<'a> {
    document_sha256: String,
    model: &'a str,
    method: &'static str,
    chunk_tokens: usize,
    chunks: usize,
    schema: &'a serde_json::Value,
    prism: &'a PrismConfig,
    sampling: &'a prism::engine::sampling::SamplingConfig,
}

pub fn run_summarize(args: SummarizeArgs) -> Result<()> {
    anyhow::ensure!(args.chunk_tokens > 0, "--chunk-tokens must be at least 1");
    let text = prism::document::read_document(&args.document)?;
    let schema_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&args.schema)
            .with_context(|| format!("reading schema {}", args.schema.display()))?,
    )
    .with_context(|| format!("{}: not JSON", args.schema.display()))?;
    let schema = Schema::from_value(&schema_json)
        .with_context(|| format!("schema {}", args.schema.display()))?;
    let config = PrismConfig {
        memory: match args.memory {
            MemoryArg::InPlace => MemoryMode::InPlace,
            MemoryArg::Amendments => MemoryMode::Amendments,
        },
        updates: !args.no_updates,
        query: args.query.clone(),
        revision_tokens: args.revision_tokens,
        answer_tokens: args.answer_tokens,
        constrained: args.constrained == OnOff::On,
    };
    let sampling = args.sampling.config()?;

    let mut engine = args.engine.load()?;
    let context = engine.context_tokens();
    anyhow::ensure!(
        args.chunk_tokens + args.revision_tokens < context,
        "--chunk-tokens {} plus {} tokens of revisions does not fit the model's context of {context} tokens",
        args.chunk_tokens,
        args.revision_tokens,
    );
    let tokenizer = engine.tokenizer();
    // Encoding the whole text once surfaces any tokenizer error here, so the
    // chunker's counter (which cannot fail) never meets one.
    let document_tokens = tokenizer.encode(&text)?.len();
    let count = |piece: &str| tokenizer.encode(piece).map_or(usize::MAX, |ids| ids.len());
    let mut chunks = prism::chunk::split(&text, args.chunk_tokens, &count)?;
    if let Some(limit) = args.first_tokens {
        let mut covered = 0;
        chunks.retain(|chunk| {
            covered += chunk.tokens;
            covered <= limit
        });
        anyhow::ensure!(
            !chunks.is_empty(),
            "--first-tokens {limit} is less than the first chunk"
        );
    }
    eprintln!(
        "{}: {document_tokens} tokens; reading {} chunk{} of up to {} tokens",
        args.document.display(),
        chunks.len(),
        if chunks.len() == 1 { "" } else { "s" },
        args.chunk_tokens
    );
    let identity = RunIdentity {
        document_sha256: format!("{:x}", Sha256::digest(text.as_bytes())),
        model: engine.name(),
        method: "prism",
        chunk_tokens: args.chunk_tokens,
        chunks: chunks.len(),
        schema: &schema_json,
        prism: &config,
        sampling: &sampling,
    };
    let fingerprint = fingerprint(&identity);
    let options = GenerateOptions {
        sampling: sampling.clone(),
        ..GenerateOptions::default()
    };
    let mut llm = EngineLlm::new(&mut engine, options);

    let dir = RunDir::create(&args.out)?;
    let files = RunFiles {
        dir: &dir,
        fingerprint,
        resume: args.resume,
        stop_after: args.stop_after_chunks,
    };
    let method = Prism::new(&config, &schema);
    let mut progress = Bar::new();
    let outcome = run(&method, &mut llm, &chunks, &files, &mut progress)?;
    progress.bar.finish_and_clear();
    match outcome {
        Outcome::Finished { summary, stats } => {
            println!("{summary}");
            eprintln!(
                "{}: {} calls, cache hit {:.1}%, net {} tokens, output {}, cost index {:.4}, revisions applied {} / rejected {}, {:.0}s",
                args.out.display(),
                stats.calls,
                100.0 * stats.figures.cache_hit_rate,
                stats.figures.net_tokens,
                stats.figures.output_tokens,
                stats.figures.cost_index,
                stats.revisions_applied,
                stats.revisions_rejected,
                stats.wall_seconds,
            );
        }
        Outcome::Paused { completed } => eprintln!(
            "{}: stopped after {completed} of {} chunks; continue with --resume",
            args.out.display(),
            chunks.len()
        ),
    }
    Ok(())
}

/// A progress bar on stderr: chunks done, cache hit rate so far, ETA.
struct Bar {
    bar: ProgressBar,
}

impl Bar {
    fn new() -> Self {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} chunk {pos}/{len} [{bar:30}] {msg} elapsed {elapsed} eta {eta}",
            )
            .expect("a valid progress template")
            .progress_chars("=> "),
        );
        Bar { bar }
    }
}

impl Progress for Bar {
    fn begin(&mut self, total: usize, done: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
        self.bar.reset_eta();
    }

    fn chunk_done(&mut self, done: usize, figures: &Figures) {
        self.bar.set_position(done as u64);
        self.bar
            .set_message(format!("cache hit {:.1}%", 100.0 * figures.cache_hit_rate));
    }

    fn answering(&mut self) {
        self.bar.set_message("writing the final answer");
    }
}
