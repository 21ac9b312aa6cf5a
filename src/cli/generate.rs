//! `prism generate`: prompts in order on one engine, with per-call accounting.

use super::{EngineArgs, SamplingArgs};
use anyhow::{Context, Result};
use clap::{ArgMatches, Args};
use prism::engine::chat::ChatMessage;
use prism::engine::constraint::Grammar;
use prism::engine::sampling::SamplingConfig;
use prism::engine::{GenerateOptions, Generation};
use prism::metrics::{Figures, Ledger};
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// A prompt; repeat the flag for several calls, run in the order given.
    #[arg(long)]
    prompt: Vec<String>,
    /// A file whose text is a prompt; may be mixed with --prompt, order is kept.
    #[arg(long)]
    prompt_file: Vec<PathBuf>,
    /// Wrap each prompt as a user turn in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// The most new tokens per call.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Stop when the output contains this text; repeatable.
    #[arg(long)]
    stop: Vec<String>,
    /// Print one JSON object per call, then one with the totals.
    #[arg(long)]
    json: bool,
    /// Constrain the output to JSON that validates against this JSON Schema file.
    #[arg(long, conflicts_with_all = ["lark", "regex"])]
    json_schema: Option<PathBuf>,
    /// Constrain the output to this Lark grammar file (llguidance's dialect).
    #[arg(long, conflicts_with = "regex")]
    lark: Option<PathBuf>,
    /// Constrain the output to text matching this regular expression.
    #[arg(long)]
    regex: Option<String>,
    /// `off` ignores --json-schema/--lark/--regex, to compare with unconstrained output.
    #[arg(long, value_enum, default_value = "on")]
    constrained: super::method_args::OnOff,
}

/// One line of `--json` output.
#[derive(serde::Serialize)]
struct CallReport<'a> {
    call: usize,
    text: &'a str,
    stop_reason: prism::engine::StopReason,
    #[serde(flatten)]
    figures: Figures,
}

#[derive(serde::Serialize)]
struct TotalReport {
    total: Figures,
    calls: usize,
}

pub fn run(args: GenerateArgs, matches: &ArgMatches) -> Result<()> {
    let prompts = ordered_prompts(&args, matches)?;
    anyhow::ensure!(
        !prompts.is_empty(),
        "give at least one --prompt or --prompt-file"
    );
    let options = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: args.sampling.config(SamplingConfig::default())?,
        stop: args.stop.clone(),
        grammar: grammar(&args)?,
        ..GenerateOptions::default()
    };
    let mut engine = args.engine.open()?;
    let mut ledger = Ledger::default();
    let mut stdout = std::io::stdout().lock();
    for (index, prompt) in prompts.iter().enumerate() {
        let call = index + 1;
        let ids = if args.chat {
            let mut messages = Vec::new();
            messages.extend(args.system.as_deref().map(ChatMessage::system));
            messages.push(ChatMessage::user(prompt.as_str()));
            engine.chat_prompt(&messages)?
        } else {
            engine.text_prompt(prompt)?
        };
        let options = GenerateOptions {
            copy_source: match options.sampling.no_copy_ngram {
                0 => Vec::new(),
                _ => engine.tokenizer().encode(prompt)?,
            },
            ..options.clone()
        };
        let generation = engine
            .generate(&ids, &options)
            .with_context(|| format!("prompt {call}"))?;
        ledger.record(&generation.usage);
        print_call(&mut stdout, call, &generation, args.json)?;
    }
    if args.json {
        let total = TotalReport {
            total: ledger.figures(),
            calls: ledger.calls,
        };
        writeln!(stdout, "{}", serde_json::to_string(&total)?)?;
    } else {
        note!("total: {}", describe(&ledger.figures()));
    }
    Ok(())
}

fn print_call(
    out: &mut impl Write,
    call: usize,
    generation: &Generation,
    json: bool,
) -> Result<()> {
    let figures = Figures::of(&generation.usage);
    if json {
        let report = CallReport {
            call,
            text: &generation.text,
            stop_reason: generation.stop_reason,
            figures,
        };
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        writeln!(out, "{}", generation.text)?;
        out.flush()?;
        note!("[call {call}] {}", describe(&figures));
    }
    Ok(())
}

/// One human-readable line of accounting.
pub fn describe(f: &Figures) -> String {
    let restored = match f.restored_tokens {
        0 => String::new(),
        restored => format!(", restored from disk {restored}"),
    };
    let segments = match (f.segment_tokens, f.recomputed_tokens) {
        (0, 0) => String::new(),
        (taken, recomputed) => {
            format!(", taken from cached segments {taken} (recomputed {recomputed})")
        }
    };
    format!(
        "prompt {} tokens, reused {} ({:.1}%){restored}{segments}, net {}, output {}, cost index {:.6}, prefill {:.1} tok/s, decode {:.1} tok/s",
        f.prompt_tokens,
        f.reused_tokens,
        100.0 * f.cache_hit_rate,
        f.net_tokens,
        f.output_tokens,
        f.cost_index,
        f.prefill_tokens_per_second,
        f.decode_tokens_per_second,
    )
}

/// The grammar --json-schema, --lark or --regex asks for, unless --constrained off.
fn grammar(args: &GenerateArgs) -> Result<Option<Grammar>> {
    if args.constrained == super::method_args::OnOff::Off {
        return Ok(None);
    }
    if let Some(path) = &args.json_schema {
        let schema = serde_json::from_str(&read_text(path)?)
            .with_context(|| format!("{}: not JSON", path.display()))?;
        return Ok(Some(Grammar::JsonSchema(schema)));
    }
    if let Some(path) = &args.lark {
        return Ok(Some(Grammar::Lark(read_text(path)?)));
    }
    Ok(args.regex.clone().map(Grammar::Regex))
}

/// The prompts of --prompt and --prompt-file in command-line order.
fn ordered_prompts(args: &GenerateArgs, matches: &ArgMatches) -> Result<Vec<String>> {
    let mut ordered: Vec<(usize, String)> = Vec::new();
    if let Some(indices) = matches.indices_of("prompt") {
        ordered.extend(indices.zip(args.prompt.iter().cloned()));
    }
    if let Some(indices) = matches.indices_of("prompt_file") {
        for (index, path) in indices.zip(&args.prompt_file) {
            ordered.push((index, read_text(path)?));
        }
    }
    ordered.sort_by_key(|(index, _)| *index);
    Ok(ordered.into_iter().map(|(_, text)| text).collect())
}

/// A text file's contents, refusing binary and non-UTF-8 files with a clear error.
pub fn read_text(path: &std::path::Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", path.display()))?;
    anyhow::ensure!(
        !text.contains('\0'),
        "{}: binary file (contains NUL bytes)",
        path.display()
    );
    Ok(text)
}
