//! Subcommands and the flags they share.

/// `print!` to stdout that returns the write's error instead of panicking,
/// so that a closed pipe (`prism models list | head -1`) ends the program
/// quietly rather than with a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `println!` to stdout that returns the write's error, like [`out!`].
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `eprintln!` for progress, figures and notes, which `--quiet` silences.
/// Errors and warnings are printed whatever the flag.
macro_rules! note {
    ($($arg:tt)*) => {{
        if !$crate::cli::is_quiet() {
            eprintln!($($arg)*);
        }
    }};
}

mod backend_args;
mod bench;
mod bench_engine;
mod cache;
mod engine_args;
mod flags;
mod generate;
mod method_args;
mod method_spec;
mod models;
mod perplexity;
mod progress;
mod qa;
mod sampling_args;
mod schema;
mod score;
mod serve;
mod shared_args;
mod summarize;

pub use backend_args::BackendArgs;
pub use engine_args::EngineArgs;
pub use sampling_args::SamplingArgs;
pub use shared_args::{DocumentArgs, DocumentLimit};

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once from `--quiet` before any subcommand runs.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Whether `--quiet` asked for results and errors only.
pub fn is_quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

#[derive(Debug, Parser)]
#[command(
    name = "prism",
    version,
    about = "Summarize long documents with local Llama/Qwen models, structured memory and prefix-KV reuse"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print only results and errors: no progress bars, figures or notes on stderr.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Log more on stderr: -v info, -vv debug, -vvv trace (`PRISM_LOG` overrides).
    #[arg(long, short, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one or more prompts in order on one engine, so later prompts reuse earlier prefixes.
    Generate(generate::GenerateArgs),
    /// List or fetch the known models.
    Models(models::ModelsArgs),
    /// Summarize a document far longer than the context, chunk by chunk.
    Summarize(Box<summarize::SummarizeArgs>),
    /// Answer a query of your own over a long document, a set of files or a source tree (PRISM or whole).
    Query(Box<summarize::QueryArgs>),
    /// Sweep methods × chunk sizes over a document: one run each, a report and charts.
    Bench(Box<bench::BenchArgs>),
    /// Measure prefill and decode speed and the gain from a cached prefix.
    BenchEngine(bench_engine::BenchEngineArgs),
    /// List, check or clear the blocks a --prompt-cache directory holds.
    Cache(cache::CacheArgs),
    /// The model's perplexity on a text, measured as llama.cpp's llama-perplexity does.
    Perplexity(perplexity::PerplexityArgs),
    /// Question-answer pairs about a document.
    Qa(qa::QaArgs),
    /// Score a finished summary (coherence).
    Score(score::ScoreArgs),
    /// Write memory schemas for new domains.
    Schema(schema::SchemaArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat and text completions).
    Serve(Box<serve::ServeArgs>),
    /// Print a completion script for a shell, e.g. `prism completions bash > ~/.local/share/bash-completion/completions/prism`.
    Completions {
        /// bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
}

pub fn run() -> Result<()> {
    prism::error::spell_settings_as(flags::flag);
    let matches = Cli::command()
        .try_get_matches()
        .unwrap_or_else(|e| exit_on_usage(e));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| exit_on_usage(e));
    QUIET.store(cli.quiet, Ordering::Relaxed);
    init_logging(cli.verbose);
    match cli.command {
        Command::Generate(args) => {
            let sub = matches
                .subcommand_matches("generate")
                .expect("clap matched the generate subcommand");
            generate::run(args, sub)
        }
        Command::Models(args) => models::run(args),
        Command::Summarize(args) => summarize::run_summarize(*args),
        Command::Query(args) => {
            let sub = matches
                .subcommand_matches("query")
                .expect("clap matched the query subcommand");
            summarize::run_query(*args, sub)
        }
        Command::Bench(args) => {
            let sub = matches
                .subcommand_matches("bench")
                .expect("clap matched the bench subcommand");
            bench::run(*args, sub)
        }
        Command::BenchEngine(args) => bench_engine::run(args),
        Command::Cache(args) => cache::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Qa(args) => qa::run(args),
        Command::Score(args) => score::run(args),
        Command::Schema(args) => schema::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "prism", &mut script);
            out!("{}", String::from_utf8_lossy(&script))?;
            Ok(())
        }
    }
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PRISM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colours only on a terminal: a log redirected to a file stays plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Print help or the version as clap does; print any other usage error as
/// one line (clap's message without its usage block) and exit with status 2.
fn exit_on_usage(err: clap::Error) -> ! {
    if !err.use_stderr() {
        err.exit()
    }
    let rendered = err.render().to_string();
    let message = rendered
        .split("\n\nUsage:")
        .next()
        .unwrap_or_default()
        .split("\n\nFor more information")
        .next()
        .unwrap_or_default();
    let message: Vec<&str> = message.split_whitespace().collect();
    eprintln!("{}", message.join(" "));
    std::process::exit(2)
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// `prism --help` and each subcommand's help document every flag and argument.
    #[test]
    fn every_flag_and_argument_has_help_text() {
        fn undocumented(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() && !arg.is_hide_set() {
                    missing.push(format!("{path}: {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                undocumented(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut command = Cli::command();
        command.build();
        let mut missing = Vec::new();
        undocumented(&command, "prism", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
    }
}
