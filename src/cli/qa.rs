//! `prism qa generate` writes question–answer pairs about a document as JSONL;
//! `prism score qa` answers them from a summary alone and reports Correct-F1.

use super::generate::describe;
use super::method_args::OnOff;
use super::{BackendArgs, DocumentArgs, SamplingArgs};
use anyhow::Result;
use clap::{Args, Subcommand};
use prism::engine::sampling::SamplingConfig;
use prism::engine::GenerateOptions;
use prism::job::{Chunking, Document};
use prism::qa;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct QaArgs {
    #[command(subcommand)]
    command: QaCommand,
}

#[derive(Debug, Subcommand)]
enum QaCommand {
    /// Write question-answer pairs about a document, chunk by chunk, as JSONL.
    Generate(Box<GenerateQaArgs>),
}

#[derive(Debug, Args)]
pub struct GenerateQaArgs {
    /// The document: a UTF-8 text file.
    document: PathBuf,
    /// Pairs to write in all, spread evenly over the chunks.
    #[arg(long, default_value_t = 10)]
    n: usize,
    /// Where to write the pairs: one {"question", "answer", "chunk"} object a line.
    #[arg(long)]
    out: PathBuf,
    /// Tokens per chunk; chunks end on paragraph or sentence boundaries.
    #[arg(long, default_value_t = 2048)]
    chunk_tokens: usize,
    /// Read only the first chunks of the document, up to this many tokens in all.
    #[arg(long)]
    first_tokens: Option<usize>,
    #[command(flatten)]
    input: DocumentArgs,
    /// Decode pairs under a JSON Schema, so that every pair parses.
    #[arg(long, value_enum, default_value = "on")]
    constrained: OnOff,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(args: QaArgs) -> Result<()> {
    match args.command {
        QaCommand::Generate(args) => generate(*args),
    }
}

fn generate(args: GenerateQaArgs) -> Result<()> {
    anyhow::ensure!(args.n > 0, "--n must be at least 1");
    let sampling = args.sampling.config(SamplingConfig::default())?;
    let text = args.input.read(&args.document)?;
    let mut backend = args.backend.load()?;
    let chunking = Chunking {
        chunk_tokens: args.chunk_tokens,
        first_tokens: args.first_tokens,
    };
    let document = Document::prepare(backend.format(), &args.document, &text, chunking)?;
    let options = GenerateOptions {
        sampling,
        ..GenerateOptions::default()
    };
    let mut llm = backend.llm(options);
    let chunks = document.chunks.len();
    let written = qa::generate_document_pairs(
        &mut *llm,
        &document.chunks,
        args.n,
        args.constrained == OnOff::On,
        &mut |chunk, got, asked| {
            note!("chunk {}/{chunks}: {got} of {asked} pairs", chunk.index + 1)
        },
    )?;
    qa::write_pairs(&args.out, &written.pairs)?;
    note!(
        "{}: {} pairs from {chunks} chunk{}; {} calls, {}",
        args.out.display(),
        written.pairs.len(),
        if chunks == 1 { "" } else { "s" },
        written.ledger.calls,
        describe(&written.ledger.figures()),
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct ScoreQaArgs {
    /// The summary to score: a UTF-8 text file.
    summary: PathBuf,
    /// Questions with reference answers, as `prism qa generate` writes them (JSONL).
    #[arg(long)]
    questions: PathBuf,
    /// Print one JSON object: correct_f1, every question, and the calls' token figures.
    #[arg(long)]
    json: bool,
    /// Questions answered at once, each on its own thread (locally their decode
    /// steps batch into one forward pass; remotely each is a client of its own).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn run_score_qa(args: ScoreQaArgs) -> Result<()> {
    let summary =
        prism::document::read_document(&args.summary, prism::document::MAX_DOCUMENT_BYTES)?;
    let pairs = qa::read_pairs(&args.questions)?;
    let mut backend = args.backend.load()?;
    let mut llm =
        backend.llm_side_by_side(GenerateOptions::default(), usize::from(args.concurrency))?;
    let score = qa::score_summary(&mut *llm, &summary, &pairs)?;
    if args.json {
        outln!("{}", serde_json::to_string(&score)?)?;
        return Ok(());
    }
    for answered in &score.questions {
        outln!(
            "{:.2}  {}  → {}  (reference: {})",
            answered.f1,
            answered.question,
            answered.answer,
            answered.reference
        )?;
    }
    outln!(
        "Correct-F1 {:.3} over {} questions",
        score.correct_f1,
        score.questions.len()
    )?;
    note!("{} calls, {}", score.calls, describe(&score.figures));
    Ok(())
}
