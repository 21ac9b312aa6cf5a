//! `prism perplexity FILE`: the model's perplexity on a text, windowed and scored as
//! llama.cpp's `llama-perplexity` does, to compare the two on one GGUF file; with
//! `--reuse-segments`, how far segment reuse moves the model's predictions.

use super::{DocumentLimit, EngineArgs};
use anyhow::Result;
use clap::Args;
use prism::engine::perplexity::Windows;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct PerplexityArgs {
    /// The text: a UTF-8 file (llama.cpp's `-f`).
    file: PathBuf,
    /// Tokens per window (llama.cpp's `-c`); the second half of each is scored.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Tokens from one window's start to the next. Default: --context, the
    /// non-overlapping windows llama.cpp uses.
    #[arg(long)]
    stride: Option<usize>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// With --reuse-segments: how many tokens longer the text before each window's middle
    /// third was when that third was cached, so its reused keys move back by this much.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 24,
        requires = "reuse_segments"
    )]
    segment_shift: usize,
    #[command(flatten)]
    document_limit: DocumentLimit,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    // Perplexity scores the model's own prediction of every token, so a
    // draft model would be loaded and never asked.
    if let Some(draft) = &args.engine.draft_model {
        anyhow::bail!("--draft-model {draft} does not apply to perplexity, which scores the model's own predictions: leave it out");
    }
    let text = args.document_limit.read(&args.file)?;
    let windows = Windows {
        context: args.context,
        stride: args.stride.unwrap_or(args.context),
    };
    let mut engine = args.engine.open()?;
    windows.validate(engine.context_tokens())?;
    if let Some(reuse) = args.engine.segment_reuse() {
        let fidelity = engine.segment_fidelity(&text, windows, args.segment_shift, reuse)?;
        if args.json {
            outln!("{}", serde_json::to_string(&fidelity)?)?;
        } else {
            outln!(
                "perplexity {:.4} with segment reuse against {:.4} computed whole ({:+.2}%), mean KL {:.5} nats (max {:.3}) over {} tokens in {} windows; {} tokens taken, {} recomputed",
                fidelity.reused_perplexity,
                fidelity.exact_perplexity,
                100.0 * fidelity.perplexity_change,
                fidelity.mean_kl,
                fidelity.max_kl,
                fidelity.scored_tokens,
                fidelity.windows,
                fidelity.taken_tokens,
                fidelity.recomputed_tokens,
            )?;
        }
        return Ok(());
    }
    let result = engine.perplexity(&text, windows, &mut |window, running| {
        note!("[{window}] {running:.4}");
    })?;
    if args.json {
        outln!("{}", serde_json::to_string(&result)?)?;
    } else {
        outln!(
            "perplexity {:.4} ± {:.5} over {} tokens scored in {} windows of {} ({} tokens in the text)",
            result.perplexity,
            result.standard_error,
            result.scored_tokens,
            result.windows,
            windows.context,
            result.text_tokens,
        )?;
    }
    Ok(())
}
