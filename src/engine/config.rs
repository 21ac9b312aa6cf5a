//! How an engine is opened: the model, where it runs, and how it caches
//! prompts, in memory and on disk.

use super::device::DeviceChoice;
use super::kv_cache::KvDtype;
use super::model::PrefillWeights;
use super::segments::SegmentReuse;
use super::source::ModelSource;
use crate::error::{Error, Setting};
use std::path::PathBuf;

/// Tokens drafted a pass unless [`EngineConfig::draft_tokens`] says otherwise.
pub const DEFAULT_DRAFT_TOKENS: usize = 4;

/// Everything [`Engine::open`](super::Engine::open) needs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// What `--model` resolved to (see `models`, above the engine).
    pub source: ModelSource,
    pub device: DeviceChoice,
    /// `None` picks dense prefill weights when their f32 copy stays under
    /// [`DENSE_PREFILL_LIMIT_BYTES`](super::DENSE_PREFILL_LIMIT_BYTES).
    pub prefill_weights: Option<PrefillWeights>,
    pub kv_dtype: KvDtype,
    /// With reuse off every call recomputes its whole prompt, for comparison.
    pub prefix_cache: bool,
    /// Token sequences kept cached; a prompt continues the one it shares the
    /// longest prefix with. See [`cache_slots`](super::cache_slots).
    pub cache_slots: usize,
    /// A bound on the KV storage of all cached sequences together; the least
    /// recently used go first, the one in use never. `None` is no bound.
    pub cache_bytes: Option<usize>,
    /// Draft up to this many next tokens by finding the last few tokens
    /// earlier in the prompt or output and taking what followed them there,
    /// and check the draft in the same pass as the token before it. A
    /// summary or a memory update repeats much of its document, and on a
    /// CPU a pass of a few tokens costs little more than a pass of one.
    /// Only drafts that match what the sampler picks are kept, and each
    /// token's logits are the bits a pass of that token alone would give,
    /// so the output is the same as with 0, which turns drafting off.
    /// Drafting runs only where every matmul is prism's own kernel (whose
    /// rows do not depend on each other); a sibling's drafts are checked in
    /// the shared passes, beside the other sequences' rows.
    pub draft_tokens: usize,
    /// A small model that drafts tokens for `source` to check in one pass
    /// (speculative decoding), loaded on the same device with the same
    /// cache settings and caches of its own. Its tokenizer must be
    /// `source`'s. Under greedy decoding the output is `source`'s; under
    /// sampling drafts are kept by rejection sampling, so the output
    /// follows `source`'s distribution (see `engine::speculative`).
    pub draft_model: Option<ModelSource>,
    /// Keep the KV of each generation's sequence on disk as well, and start
    /// a prompt from the stored chain of blocks that shares the most of it
    /// when memory holds less.
    pub prompt_cache: Option<PromptCacheConfig>,
    /// Where a prompt leaves the cached sequence it continues, still take
    /// the keys and values of the later runs it shares with a cached
    /// sequence, moved to their new positions (see `engine::segments`).
    /// Approximate: the taken rows were computed after other text. `None`
    /// reuses the exact prefix only.
    pub segment_reuse: Option<SegmentReuse>,
}

impl EngineConfig {
    /// `source` on the device the build is for, with an f32 KV cache,
    /// prefix reuse in one slot without a byte bound, drafting from
    /// earlier text but no draft model, no prompt cache on disk and no
    /// segment reuse.
    pub fn new(source: ModelSource) -> Self {
        EngineConfig {
            source,
            device: DeviceChoice::default(),
            prefill_weights: None,
            kv_dtype: KvDtype::default(),
            prefix_cache: true,
            cache_slots: 1,
            cache_bytes: None,
            draft_tokens: DEFAULT_DRAFT_TOKENS,
            draft_model: None,
            prompt_cache: None,
            segment_reuse: None,
        }
    }
}

/// Where the prompt cache keeps its blocks, and how much disk they may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptCacheConfig {
    pub dir: PathBuf,
    /// The least recently used blocks go first past it (never one a kept block follows).
    pub budget_bytes: u64,
}

/// Why [`Engine::open`](super::Engine::open) failed: the model did not load,
/// or the prompt cache did not open; a caller names the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Model(Error),
    /// The draft model did not load, or cannot draft for the model.
    #[error(transparent)]
    DraftModel(Error),
    #[error("{} {}", Setting::PromptCache, dir.display())]
    PromptCache {
        dir: PathBuf,
        #[source]
        source: Box<Error>,
    },
}

impl From<OpenError> for Error {
    fn from(err: OpenError) -> Self {
        match err {
            OpenError::Model(err) | OpenError::DraftModel(err) => err,
            OpenError::PromptCache { dir, source } => Error::invalid(
                format!("{} {}", Setting::PromptCache, dir.display()),
                source.to_string(),
            ),
        }
    }
}
