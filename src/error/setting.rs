//! The configuration an error can name, by the field a library user sets.

use std::sync::OnceLock;

/// One variant per setting, with the name a library user knows it by; one
/// list, so that `ALL` and `name` cannot leave a setting out.
macro_rules! settings {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// A configuration field that an error names, so that a caller can
        /// tell which of its settings to change.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Setting {
            $($(#[$doc])* $variant,)*
        }

        impl Setting {
            pub const ALL: &[Setting] = &[$(Setting::$variant,)*];

            /// The field's name, as in the struct or argument it configures.
            pub fn name(self) -> &'static str {
                match self {
                    $(Setting::$variant => $name,)*
                }
            }
        }
    };
}

settings! {
    /// `Windows::context` of a perplexity measurement.
    Context => "context",
    /// `Windows::stride` of a perplexity measurement.
    Stride => "stride",
    Temperature => "temperature",
    TopK => "top_k",
    TopP => "top_p",
    RepeatPenalty => "repeat_penalty",
    DryMultiplier => "dry_multiplier",
    DryBase => "dry_base",
    DryAllowedLength => "dry_allowed_length",
    NoCopyNgram => "no_copy_ngram",
    KvDtype => "kv_dtype",
    Device => "device",
    ChunkTokens => "chunk_tokens",
    FirstTokens => "first_tokens",
    /// The bound on a document's size that `document::read_document` and
    /// `read_sources` take.
    MaxDocumentBytes => "max_bytes",
    Out => "out",
    Resume => "resume",
    MaxSummaryTokens => "max_summary_tokens",
    /// The model prism loads, or formats prompts for on a remote backend.
    Model => "model",
    /// Whether prompts go through the model's chat template.
    Chat => "chat",
    AllowModelMismatch => "allow_model_mismatch",
    /// `RemoteOptions::constraint`.
    RemoteConstraint => "constraint",
    AllowUnconstrained => "allow_unconstrained",
    /// `Sweep::methods`.
    Methods => "methods",
    /// `Sweep::chunk_sizes`.
    ChunkSizes => "chunk_sizes",
    Concurrency => "concurrency",
    /// `Sweep::judging`, the judge of each finished summary.
    Judging => "judging",
    Domain => "domain",
    ExampleQuery => "example_query",
    RequestTimeout => "request_timeout",
    /// `EngineConfig::prompt_cache`.
    PromptCache => "prompt_cache",
    /// `EngineConfig::draft_model`, the small model that drafts tokens.
    DraftModel => "draft_model",
    /// `EngineConfig::segment_reuse`.
    SegmentReuse => "segment_reuse",
}

/// How this process spells settings, when a front end has chosen.
static SPELLING: OnceLock<fn(Setting) -> &'static str> = OnceLock::new();

/// Spell every setting with `spell` from now on, in this process: a command
/// line passes its flags, so that its users read the flag they typed. Errors
/// are rendered in many places (the error line, a value parser, progress
/// notes, a server's replies, other threads), hence once per process rather
/// than at each. Only the first call counts.
pub fn spell_settings_as(spell: fn(Setting) -> &'static str) {
    // A second front end in one process would have to agree with the first;
    // there is none, so the first choice stands.
    let _ = SPELLING.set(spell);
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let spell = SPELLING.get().copied().unwrap_or(Setting::name);
        f.write_str(spell(*self))
    }
}

#[cfg(test)]
mod tests {
    use crate::Error;

    #[test]
    fn an_error_names_the_field_not_a_flag() {
        let bad = Error::invalid_setting(super::Setting::KvDtype, "`q4` is not one of f32, f16");
        assert_eq!(bad.to_string(), "kv_dtype: `q4` is not one of f32, f16");
        let mismatch = Error::ModelMismatch {
            url: "http://127.0.0.1:8080/v1".into(),
            served: "llama-3".into(),
            model: "qwen-0.5b".into(),
            evidence: "its name".into(),
        }
        .to_string();
        assert!(
            mismatch.ends_with("pass model for the served model, or allow_model_mismatch"),
            "{mismatch}"
        );
    }
}
