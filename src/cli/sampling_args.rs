//! The sampling flags every subcommand that generates shares.

use clap::Args;
use prism::engine::sampling::SamplingConfig;

/// Flags that choose how tokens are sampled. Each one left out takes the
/// value of the defaults the subcommand passes to [`SamplingArgs::config`]:
/// `summarize` and `bench` use [`SamplingConfig::for_summaries`], the others
/// (`generate`, `qa`, `score`, `schema`) have every repetition control off.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy decoding (the default).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sample only among the k most likely tokens (needs --temperature > 0).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities add up to p, in (0, 1].
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Penalize tokens among the last 64: divide positive logits by this, multiply negative ones;
    /// 1.0 (the default) is off.
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// Seed for sampling with --temperature > 0 (default 299792458).
    #[arg(long)]
    pub seed: Option<u64>,
    /// DRY: penalty for a token that would extend a token sequence already in the context
    /// (prompt and output); 0 is off. Default: 0.8 for summarize and bench, off elsewhere.
    #[arg(long)]
    pub dry_multiplier: Option<f32>,
    /// DRY: the penalty grows by this factor per repeated token beyond --dry-allowed-length
    /// (must be > 1; default 1.75).
    #[arg(long)]
    pub dry_base: Option<f32>,
    /// DRY: repeats shorter than this many tokens are free (default 2).
    #[arg(long)]
    pub dry_allowed_length: Option<usize>,
    /// DRY: search only the last N tokens for repeats; 0 (the default) searches the whole context.
    #[arg(long)]
    pub dry_penalty_last_n: Option<usize>,
    /// DRY: also penalize repeats of the prompt, as llama.cpp does (default off: only repeats
    /// within the output count, so quoting a name or line of the document is free).
    #[arg(long, value_enum)]
    pub dry_prompt: Option<super::method_args::OnOff>,
    /// Forbid any token that would repeat an N-gram of tokens already generated; 0 (the default) is off.
    #[arg(long, value_name = "N")]
    pub no_repeat_ngram: Option<usize>,
    /// Forbid any token that would copy a run of N tokens from the text a prompt asks to
    /// summarize (local engine only); 0 (the default) is off.
    #[arg(long, value_name = "N")]
    pub no_copy: Option<usize>,
    /// Stop when the output repeats a line or sentence it already wrote, cutting the repeat.
    /// Default: on for summarize and bench, off elsewhere. Ignored under a grammar.
    #[arg(long, value_enum)]
    pub loop_guard: Option<super::method_args::OnOff>,
}

impl SamplingArgs {
    /// The flags given, over `defaults` for those left out.
    pub fn config(&self, defaults: SamplingConfig) -> prism::Result<SamplingConfig> {
        let config = SamplingConfig {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.or(defaults.top_k),
            top_p: self.top_p.or(defaults.top_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(defaults.repeat_penalty),
            seed: self.seed.unwrap_or(defaults.seed),
            dry_multiplier: self.dry_multiplier.unwrap_or(defaults.dry_multiplier),
            dry_base: self.dry_base.unwrap_or(defaults.dry_base),
            dry_allowed_length: self
                .dry_allowed_length
                .unwrap_or(defaults.dry_allowed_length),
            dry_penalty_last_n: self
                .dry_penalty_last_n
                .unwrap_or(defaults.dry_penalty_last_n),
            dry_prompt: self.dry_prompt.map_or(defaults.dry_prompt, |on| {
                on == super::method_args::OnOff::On
            }),
            no_repeat_ngram: self.no_repeat_ngram.unwrap_or(defaults.no_repeat_ngram),
            no_copy_ngram: self.no_copy.unwrap_or(defaults.no_copy_ngram),
            loop_guard: self.loop_guard.map_or(defaults.loop_guard, |on| {
                on == super::method_args::OnOff::On
            }),
            ..defaults
        };
        config.validate()?;
        Ok(config)
    }
}
