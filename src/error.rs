//! The library's one error type: every variant names the input that failed.

mod setting;

pub use setting::{spell_settings_as, Setting};

use std::path::PathBuf;

/// Everything that can go wrong inside prism, with the path, model or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not a usable model file: {reason}")]
    BadModelFile { path: PathBuf, reason: String },

    #[error("unknown model `{name}`: not a manifest name (see `prism models list`), an existing path, or an owner/name repo id")]
    UnknownModel { name: String },

    #[error("{model}: not fetched yet (expected {path}): run `prism models fetch {model}`")]
    NotFetched { model: String, path: PathBuf },

    #[error("{model}: unsupported architecture `{architecture}` (prism runs llama and qwen2)")]
    UnsupportedArchitecture { model: String, architecture: String },

    #[error("{model}: tokenizer: {reason}")]
    Tokenizer { model: String, reason: String },

    /// The draft model ([`Setting::DraftModel`]) must tokenize text as the
    /// model it drafts for does: its tokens are checked by id.
    #[error(
        "{} {draft} cannot draft for {model}: their tokenizers differ ({reason})",
        Setting::DraftModel
    )]
    DraftTokenizerMismatch {
        model: String,
        draft: String,
        reason: String,
    },

    #[error("chat template: {reason}")]
    ChatTemplate { reason: String },

    #[error("{prompt_tokens} tokens do not fit the model's context of {context_tokens} tokens")]
    PromptTooLong {
        prompt_tokens: usize,
        context_tokens: usize,
    },

    #[error("{model}: download failed: {reason}")]
    Download { model: String, reason: String },

    #[error("{path}: checksum mismatch: expected sha256 {expected}, found {actual}")]
    Checksum {
        path: PathBuf,
        expected: String,
        actual: String,
    },

    #[error("{repo}: cannot reach the Hugging Face hub: {reason}")]
    Hub { repo: String, reason: String },

    #[error("remote backend {url}: {reason}")]
    Remote { url: String, reason: String },

    #[error("remote backend {url} serves {served}, not {model} that prism formats prompts for: {evidence}; pass {} for the served model, or {}", Setting::Model, Setting::AllowModelMismatch)]
    ModelMismatch {
        url: String,
        served: String,
        model: String,
        evidence: String,
    },

    #[error("remote backend {url} does not keep to the grammar sent as {dialect}: its reply is not text the grammar admits, so revisions would not parse; choose another {}, or pass {} to go on and refuse what does not parse", Setting::RemoteConstraint, Setting::AllowUnconstrained)]
    GrammarNotKept { url: String, dialect: String },

    #[error("batched decoding: {reason}")]
    Batch { reason: String },

    #[error("{what}: {reason}")]
    InvalidInput { what: String, reason: String },

    #[error("{setting}: {reason}")]
    InvalidSetting { setting: Setting, reason: String },

    #[error("{context}: {source}")]
    Candle {
        context: String,
        #[source]
        source: candle_core::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            what: what.into(),
            reason: reason.into(),
        }
    }

    pub fn invalid_setting(setting: Setting, reason: impl Into<String>) -> Self {
        Error::InvalidSetting {
            setting,
            reason: reason.into(),
        }
    }
}

/// Attach a short description of what the engine was doing to a candle error.
pub trait CandleContext<T> {
    fn context(self, context: impl Into<String>) -> Result<T>;
}

impl<T> CandleContext<T> for candle_core::Result<T> {
    fn context(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|source| Error::Candle {
            context: context.into(),
            source: without_backtrace(source),
        })
    }
}

/// candle attaches a backtrace to most errors and prints it with the message;
/// a user should see one line.
fn without_backtrace(error: candle_core::Error) -> candle_core::Error {
    match error {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(*inner),
        candle_core::Error::Context { inner, context } => {
            candle_core::Error::Msg(format!("{context}: {}", without_backtrace(*inner)))
        }
        other => other,
    }
}

/// Run `parse`, a third-party parser of untrusted bytes that panics on some
/// input it does not expect, and return `None` if it panicked. The panic
/// message is kept off stderr: the caller reports the bad input as an error.
///
/// The panic hook is process-wide, so a panic on another thread in the same
/// moment goes unprinted too; parsers run while a model loads, when nothing
/// else is at work. Two threads swapping the hook at once could restore the
/// silent one for good (every later panic of the test suite went unprinted
/// so), hence the lock.
pub(crate) fn without_panic<T>(parse: impl FnOnce() -> T) -> Option<T> {
    static SWAPPING_HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _swapping = SWAPPING_HOOK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse));
    std::panic::set_hook(hook);
    parsed.ok()
}
