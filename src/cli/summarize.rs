//! `prism summarize` and `prism query`: read a document in chunks with a method and
//! write the run directory; `summarize` is the preset, `query` asks a query of its own.

use super::method_args::{MethodArgs, MethodName};
use super::progress::Bar;
use super::{BackendArgs, DocumentArgs, SamplingArgs};
use anyhow::Result;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use prism::engine::sampling::SamplingConfig;
use prism::job::{self, Chunking, Documents, Job, Request};
use prism::methods::MethodSpec;
use prism::run::Outcome;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct SummarizeArgs {
    /// The document: a UTF-8 text file.
    document: PathBuf,
    /// How to summarize: PRISM, one of its baselines, or the whole document in one prompt.
    #[arg(long, value_enum, default_value = "prism")]
    method: MethodName,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The document: a UTF-8 text file, or several files or directories read as one document
    /// in order, each file under a `=== File: PATH ===` line (a directory: every text file below
    /// it, by path). Chunks keep whole files where they fit.
    #[arg(required = true)]
    documents: Vec<PathBuf>,
    /// prism (its four variants through --memory and --no-updates), or whole, the document in one prompt.
    #[arg(long, value_enum, default_value = "prism")]
    method: MethodName,
    #[command(flatten)]
    run: RunArgs,
}

/// What a run needs besides its document and method.
#[derive(Debug, Args)]
struct RunArgs {
    /// Tokens per chunk; chunks end on file, paragraph or sentence boundaries.
    #[arg(long, default_value_t = 2048)]
    chunk_tokens: usize,
    /// The run directory: summary.txt (the answer), steps.jsonl, stats.json, checkpoint.json, and memory.json for methods with a memory.
    #[arg(long)]
    out: PathBuf,
    /// Continue the interrupted run in --out.
    #[arg(long)]
    resume: bool,
    /// Read only the first chunks of the document, up to this many tokens in all.
    #[arg(long)]
    first_tokens: Option<usize>,
    #[command(flatten)]
    input: DocumentArgs,
    /// Stop after this many steps (one chunk each for prism, incremental and detail; one model call each for hierarchical, gu/gm/cok); continue with --resume.
    #[arg(long, alias = "stop-after-steps")]
    stop_after_chunks: Option<usize>,
    /// Calls in flight at once where a method's calls are independent (the chunks of
    /// hierarchical and of detail without --recursive), each on a sibling of the engine or
    /// another client of a remote server. The prompts are the same as one at a time; those
    /// steps come in batches, and --stop-after-chunks stops after the batch that reaches it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    #[command(flatten)]
    method_args: MethodArgs,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run_summarize(args: SummarizeArgs) -> Result<()> {
    let spec = args.run.method_args.spec(args.method)?;
    let text = args.run.input.read(&args.document)?;
    run_job(&args.run, spec, &args.document, &text)
}

/// `prism query`: the query and schema must be the user's own, since the
/// defaults are the summarization preset's.
pub fn run_query(args: QueryArgs, matches: &ArgMatches) -> Result<()> {
    for (id, flag) in [("query", "--query"), ("schema", "--schema")] {
        anyhow::ensure!(
            matches.value_source(id) == Some(ValueSource::CommandLine),
            "prism query needs {flag}; to summarize with the defaults, use prism summarize"
        );
    }
    let spec = args
        .run
        .method_args
        .spec(args.method)?
        .answering(&args.run.method_args.query)
        .ok_or_else(|| {
            anyhow::anyhow!("prism query runs --method prism or whole; the other methods summarize")
        })?;
    let text = args.run.input.read_sources(&args.documents)?;
    let name = match args.documents.as_slice() {
        [one] => one.clone(),
        _ => PathBuf::from(format!("{} inputs", args.documents.len())),
    };
    run_job(&args.run, spec, &name, &text)
}

/// Split `text` (read from `source`) for `spec`, run it into `--out` and
/// print its answer.
fn run_job(args: &RunArgs, spec: MethodSpec, source: &Path, text: &str) -> Result<()> {
    let sampling = args.sampling.config(SamplingConfig::for_summaries())?;
    if args.resume {
        Job::check_resumable(&args.out)?;
    }
    let mut backend = args.backend.load()?;
    let request = Request {
        source,
        text,
        spec: &spec,
        chunking: Chunking {
            chunk_tokens: args.chunk_tokens,
            first_tokens: args.first_tokens,
        },
        sampling: &sampling,
        out: &args.out,
        resume: args.resume,
    };
    let mut documents = Documents::default();
    let index = job::prepare(
        backend.format(),
        &backend.identity(),
        &mut documents,
        &request,
    )?;
    let document = &documents[index];
    note!(
        "{}: {} tokens; reading {} chunk{} of up to {} tokens",
        source.display(),
        document.tokens,
        document.chunks.len(),
        if document.chunks.len() == 1 { "" } else { "s" },
        document.chunk_tokens
    );
    let job = Job {
        spec: &spec,
        document,
        sampling: &sampling,
        out: &args.out,
        resume: args.resume,
        stop_after: args.stop_after_chunks,
        concurrency: usize::from(args.concurrency),
    };
    let mut progress = Bar::new(String::new());
    let outcome = job.run(&mut backend, &mut progress)?;
    progress.bar.finish_and_clear();
    match outcome {
        Outcome::Finished { summary, stats } => {
            outln!("{summary}")?;
            let target = stats
                .run
                .summary_words_target
                .map_or(String::new(), |words| format!(" (target {words})"));
            note!(
                "{}: {} calls, cache hit {:.1}%, net {} tokens, output {}, cost index {:.4}, answer {} words{target}, {:.0}% of its 8-grams copied, {:.0}s",
                args.out.display(),
                stats.run.calls,
                100.0 * stats.figures.cache_hit_rate,
                stats.figures.net_tokens,
                stats.figures.output_tokens,
                stats.figures.cost_index,
                stats.run.summary_words,
                100.0 * stats.run.copied_8gram_share.unwrap_or(0.0),
                stats.run.wall_seconds,
            );
        }
        Outcome::Paused { completed } => note!(
            "{}: stopped after {completed} steps; continue with --resume",
            args.out.display(),
        ),
    }
    Ok(())
}
