//! `prism schema generate`: the model writes a memory schema for a new query domain
//! (PRISM §3.4), saved where `summarize --schema` can read it.

use super::method_args::OnOff;
use super::{BackendArgs, SamplingArgs};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use prism::engine::sampling::SamplingConfig;
use prism::engine::GenerateOptions;
use prism::schema_gen::{generate_schema, SchemaGenConfig, SchemaRequest};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct SchemaArgs {
    #[command(subcommand)]
    command: SchemaCommand,
}

#[derive(Debug, Subcommand)]
enum SchemaCommand {
    /// Write a memory schema for a new query domain with the model, from a description and an example query.
    Generate(GenerateSchemaArgs),
}

#[derive(Debug, Args)]
pub struct GenerateSchemaArgs {
    /// What the documents are and what is asked of them, e.g. "meeting transcripts of a city council".
    #[arg(long)]
    domain: String,
    /// One query of that domain, e.g. "What did the council decide about the budget?".
    #[arg(long)]
    example_query: String,
    /// Where to write the schema (a .json file).
    #[arg(long)]
    out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    force: bool,
    /// Attempts after the first when the model's schema is refused; each shows the model why.
    #[arg(long, default_value_t = 3)]
    retries: usize,
    /// The most tokens one reply may take.
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    /// Decode the reply under a grammar of the schemas prism accepts, so it is always JSON of that form.
    #[arg(long, value_enum, default_value = "on")]
    constrained: OnOff,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(args: SchemaArgs) -> Result<()> {
    match args.command {
        SchemaCommand::Generate(args) => run_generate(args),
    }
}

fn run_generate(args: GenerateSchemaArgs) -> Result<()> {
    let out = &args.out;
    anyhow::ensure!(
        args.force || !out.exists(),
        "{} exists; pass --force to replace it",
        out.display()
    );
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        anyhow::ensure!(parent.is_dir(), "{}: no such directory", parent.display());
    }
    let request = SchemaRequest {
        domain: args.domain.clone(),
        example_query: args.example_query.clone(),
    };
    let config = SchemaGenConfig {
        retries: args.retries,
        max_tokens: args.max_tokens,
        constrained: args.constrained == OnOff::On,
    };
    let options = GenerateOptions {
        sampling: args.sampling.config(SamplingConfig::default())?,
        ..GenerateOptions::default()
    };
    let mut backend = args.backend.load()?;
    let mut llm = backend.llm(options);
    let generated = generate_schema(&mut *llm, &request, &config)?;
    for (index, attempt) in generated.attempts.iter().enumerate() {
        if let Some(reason) = &attempt.refused {
            note!("attempt {} refused: {reason}", index + 1);
        }
    }
    let text = format!("{}\n", serde_json::to_string_pretty(&generated.schema)?);
    prism::run::dir::write_atomic(out, text.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    out!("{text}")?;
    let figures = &generated.figures;
    note!(
        "{}: schema accepted on attempt {} of {}; {} calls, prompt {} tokens, reused {}, net {}, output {}, cache hit {:.1}%",
        out.display(),
        generated.attempts.len(),
        config.retries + 1,
        generated.calls,
        figures.prompt_tokens,
        figures.reused_tokens,
        figures.net_tokens,
        figures.output_tokens,
        100.0 * figures.cache_hit_rate,
    );
    Ok(())
}
