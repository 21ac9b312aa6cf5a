//! What one engine call is asked and what it gives back: its options, the
//! line check it runs under, its result and its cost.

use super::constraint::Grammar;
use super::sampling::SamplingConfig;

/// What one engine call cost. Only the engine fills these in; reports derive
/// rates from them (see `metrics`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the cache in memory.
    pub reused_tokens: usize,
    /// Prompt tokens whose keys and values were read from the prompt cache
    /// on disk (`--prompt-cache`); none of them is also counted as reused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restored_tokens: usize,
    /// Prompt tokens whose keys and values were taken from a run of a
    /// cached sequence at another position (`--reuse-segments`); none of
    /// them is also counted as reused or restored.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub segment_tokens: usize,
    /// Prompt tokens of such runs that were computed anyway, to fit them to
    /// what now precedes them. They are computed, not reused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recomputed_tokens: usize,
    /// Tokens sampled, including an end-of-turn token that stopped generation.
    pub output_tokens: usize,
    pub prefill_seconds: f64,
    /// Tokens fed to the model while decoding: each a pass of its own,
    /// unless it had been drafted and checked in an earlier pass.
    pub decode_steps: usize,
    /// Decode steps whose token had been drafted and was checked in the
    /// pass of the token before it ([`EngineConfig::draft_tokens`],
    /// [`EngineConfig::draft_model`]): the target's passes run were
    /// `decode_steps - accepted_drafts`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_drafts: usize,
    /// Of `accepted_drafts`, those drafted from earlier text (prompt lookup).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_lookup_drafts: usize,
    /// Of `accepted_drafts`, those proposed by the draft model
    /// ([`EngineConfig::draft_model`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_model_drafts: usize,
    pub decode_seconds: f64,
    /// Time spent computing grammar masks (part of `decode_seconds`).
    pub mask_seconds: f64,
}

/// For `skip_serializing_if`: counts that are zero unless a feature is in use
/// stay out of the JSON, so files written without it keep their shape.
pub(crate) fn is_zero(count: &usize) -> bool {
    *count == 0
}

impl std::ops::AddAssign<&Usage> for Usage {
    fn add_assign(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.reused_tokens += other.reused_tokens;
        self.restored_tokens += other.restored_tokens;
        self.segment_tokens += other.segment_tokens;
        self.recomputed_tokens += other.recomputed_tokens;
        self.output_tokens += other.output_tokens;
        self.prefill_seconds += other.prefill_seconds;
        self.decode_steps += other.decode_steps;
        self.accepted_drafts += other.accepted_drafts;
        self.accepted_lookup_drafts += other.accepted_lookup_drafts;
        self.accepted_model_drafts += other.accepted_model_drafts;
        self.decode_seconds += other.decode_seconds;
        self.mask_seconds += other.mask_seconds;
    }
}

/// What to generate after a prompt.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingConfig,
    /// Generation stops when the text contains any of these; the text is cut before it.
    pub stop: Vec<String>,
    /// When set, only tokens that keep the output inside this grammar are sampled.
    pub grammar: Option<Grammar>,
    /// Token ids of the text the output must not copy long runs of
    /// (`sampling.no_copy_ngram`): the chunk a prompt asks to summarize.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy_source: Vec<u32>,
    /// Tokens at the start of the prompt that later prompts may share:
    /// only their whole blocks are kept in the prompt cache on disk.
    /// `None` keeps the whole sequence, output included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_prefix_tokens: Option<usize>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplingConfig::default(),
            stop: Vec::new(),
            grammar: None,
            copy_source: Vec::new(),
            shared_prefix_tokens: None,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-turn token.
    EndOfTurn,
    /// The text reached a stop string.
    StopString,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The loop guard saw a line or sentence repeated; the text is cut before the repeat.
    Repetition,
    /// The caller's line check refused a line; the text is cut before it.
    LineRefused,
    /// The caller stopped it (a client went away, a deadline passed).
    Cancelled,
}

/// A check on each whole line of output as it is generated: given the text
/// kept so far (whole lines) and the next line (without its `\n`), what to
/// do with that line. See [`Engine::generate_checking_lines`].
pub type LineCheck<'a> = dyn Fn(&str, &str) -> LineVerdict + 'a;

/// What a [`LineCheck`] says of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineVerdict {
    Keep,
    /// Drop the line and decode on in its place. From byte `from` of the
    /// line on, the tokens it was written with are banned where the new
    /// line follows it token for token, so the model writes something else.
    Skip {
        from: usize,
    },
    /// Stop before the line.
    Stop,
}

/// The result of one call.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub stop_reason: StopReason,
    pub usage: Usage,
}
