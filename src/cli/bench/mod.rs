//! `prism bench`: turns the sweep's flags into a [`Sweep`] (each method name
//! into its settings) and runs it with [`prism::bench::sweep::run`].

mod method_names;

use super::method_args::MethodArgs;
use super::progress::Bar;
use super::{BackendArgs, DocumentArgs, SamplingArgs};
use anyhow::Result;
use clap::{ArgMatches, Args, Subcommand, ValueEnum};
use method_names::sweep_methods;
use prism::bench::sweep::{Judging, Sweep};
use prism::bench::{code_retrieval, report, task};
use prism::engine::sampling::SamplingConfig;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    sweep: SweepArgs,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Rebuild results.csv, report.md and the charts of a bench directory from its results.jsonl.
    Report {
        /// The bench directory (`--out` of the sweep).
        dir: PathBuf,
    },
}

/// The sweep's flags. The required ones are `Option`s only because
/// `prism bench report` goes without them; clap requires them otherwise.
#[derive(Debug, Args)]
struct SweepArgs {
    /// The documents: UTF-8 text files, or directories of them (each file in it, by name).
    /// With several, each document's runs go under runs/<file name>/.
    #[arg(conflicts_with = "tasks")]
    documents: Vec<PathBuf>,
    /// What the runs do: summarize the documents, or find the functions a code-retrieval task
    /// file describes (with --tasks; accuracy is reported beside the cost figures).
    #[arg(long, value_enum, default_value = "summary")]
    task: TaskName,
    /// The code-retrieval task file (as `scripts/code-retrieval build` writes it); each task's
    /// runs go under runs/<repository>/<function>/.
    #[arg(long)]
    tasks: Option<PathBuf>,
    /// With --tasks: at most this many tasks of each repository, spread over its source.
    #[arg(long)]
    tasks_per_repository: Option<usize>,
    /// Methods, comma-separated: prism-amendments or prism-in-place, each optionally followed by
    /// -no-updates and/or -unconstrained (in that order), or any other `summarize --method`.
    /// A prism name sets --memory, --no-updates and --constrained for its runs.
    #[arg(long, value_delimiter = ',', required = true)]
    methods: Vec<String>,
    /// Chunk sizes in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    chunk_tokens: Vec<usize>,
    /// The bench directory: runs/<method>-<chunk tokens>/, results.jsonl, results.csv, report.md, *.svg.
    #[arg(long, required = true)]
    out: Option<PathBuf>,
    /// Continue the sweep in --out: finished runs are skipped, a run cut short resumes from its checkpoint.
    #[arg(long)]
    resume: bool,
    /// Read only the first chunks of the document, up to this many tokens in all.
    #[arg(long)]
    first_tokens: Option<usize>,
    #[command(flatten)]
    input: DocumentArgs,
    /// Pause the sweep after this many runs; continue with --resume.
    #[arg(long)]
    stop_after_runs: Option<usize>,
    /// Judge every finished run's summary: coherence (BooookScore), and QA-F1 with --questions.
    /// Scores go into the run's row and coherence.json / qa.json in its directory.
    #[arg(long)]
    quality: bool,
    /// The judge model of --quality.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct")]
    judge_model: String,
    /// Question-answer pairs (as `prism qa generate` writes them) for the QA-F1 of --quality.
    #[arg(long, requires = "quality")]
    questions: Option<PathBuf>,
    /// Runs in flight at once, each on its own thread: a run's calls stay in order, so its
    /// prefix reuse is what it would be alone. Locally their decode steps batch into one
    /// forward pass each; on a remote backend each run is a client of its own. The judge of
    /// --quality also scores this many sentences or questions at once.
    #[arg(long, visible_alias = "parallel", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
    #[command(flatten)]
    method_args: MethodArgs,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TaskName {
    Summary,
    CodeRetrieval,
}

pub fn run(args: BenchArgs, matches: &ArgMatches) -> Result<()> {
    match args.command {
        Some(BenchCommand::Report { dir }) => regenerate(&dir),
        None => sweep(args.sweep, matches),
    }
}

/// `prism bench report DIR`.
fn regenerate(dir: &Path) -> Result<()> {
    let rows = prism::bench::sweep::regenerate(dir)?;
    out!("{}", report::markdown(&rows))?;
    Ok(())
}

fn sweep(args: SweepArgs, matches: &ArgMatches) -> Result<()> {
    let out = args.out.expect("clap requires --out without a subcommand");
    let methods = sweep_methods(&args.methods, &args.method_args, matches)?;
    let judging = match args.quality {
        false => None,
        true => Some(Judging {
            judge_model: args.judge_model.clone(),
            device: args.backend.engine.device,
            questions: args
                .questions
                .as_deref()
                .map(prism::qa::read_pairs)
                .transpose()?,
            concurrency: usize::from(args.concurrency),
        }),
    };
    let documents = match (args.task, &args.tasks) {
        (TaskName::CodeRetrieval, Some(tasks)) => code_retrieval::sweep_documents(
            tasks,
            args.tasks_per_repository,
            args.input.limit.max_bytes(),
        )?,
        (TaskName::CodeRetrieval, None) => {
            anyhow::bail!("--task code-retrieval needs --tasks FILE")
        }
        (TaskName::Summary, Some(_)) => {
            anyhow::bail!("--tasks is the task file of --task code-retrieval")
        }
        (TaskName::Summary, None) if args.documents.is_empty() => {
            anyhow::bail!(
                "name the documents to summarize, or give --task code-retrieval --tasks FILE"
            )
        }
        (TaskName::Summary, None) => task::summary_documents(
            &args.documents,
            args.input.limit.max_bytes(),
            args.input.whole_file,
        )?,
    };
    let sweep = Sweep {
        documents,
        methods,
        chunk_sizes: args.chunk_tokens,
        first_tokens: args.first_tokens,
        sampling: args.sampling.config(SamplingConfig::for_summaries())?,
        out,
        resume: args.resume,
        stop_after_runs: args.stop_after_runs,
        judging,
        command: command_line(),
        concurrency: usize::from(args.concurrency),
    };
    sweep.validate()?;
    let mut backend = args.backend.load()?;
    let mut bar = Bar::new(String::new());
    let outcome = prism::bench::sweep::run(&sweep, &mut backend, &mut bar);
    bar.bar.finish_and_clear();
    out!("{}", report::markdown(&outcome?.rows))?;
    Ok(())
}

/// This process's command line as a shell would take it back.
fn command_line() -> String {
    let quote = |arg: String| {
        let plain = !arg.is_empty()
            && arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./,=:@+%".contains(c));
        if plain {
            arg
        } else {
            format!("'{}'", arg.replace('\'', r"'\''"))
        }
    };
    std::iter::once("prism".to_string())
        .chain(std::env::args().skip(1).map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}
