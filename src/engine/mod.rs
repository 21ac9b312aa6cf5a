//! The engine: a model, its tokenizer and KV caches that survive across calls, so
//! each prompt computes only what follows its longest cached token prefix.

pub mod allocator;
mod batch;
pub mod cache_slots;
mod call;
pub mod chat;
mod chooser;
mod config;
pub mod constraint;
pub mod device;
mod generate;
mod kernels;
pub mod kv_cache;
pub mod model;
pub mod perplexity;
mod pool;
mod prefill;
pub mod prompt_cache;
pub mod prompt_format;
pub mod sampling;
pub mod segments;
pub mod source;
pub mod speculative;
pub mod tokenizer;

pub(crate) use call::is_zero;
pub use call::{GenerateOptions, Generation, LineCheck, LineVerdict, StopReason, Usage};
pub use config::{EngineConfig, OpenError, PromptCacheConfig, DEFAULT_DRAFT_TOKENS};
pub(crate) use generate::{check_lines_after, first_refused_line};
pub use prefill::CachePreview;

use crate::error::{without_panic, Error, Result, Setting};
use batch::ModelRunner;
use cache_slots::CacheSlots;
use candle_core::quantized::gguf_file;
use candle_core::Tensor;
use chat::ChatMessage;
use constraint::Grammars;
use device::DeviceChoice;
use kv_cache::KvDtype;
use model::{Config, Pass, PrefillWeights, Transformer, WeightFile};
use prompt_cache::PromptCache;
use prompt_format::PromptFormat;
use sampling::TokenMarks;
use segments::SegmentReuse;
use sha2::{Digest, Sha256};
use source::ModelSource;
use std::path::Path;
use std::sync::Arc;
use tokenizer::Tokenizer;

/// The largest f32 copy of the matmul weights kept for prefill when the user
/// does not choose: 4 GiB covers models up to about one billion parameters.
pub const DENSE_PREFILL_LIMIT_BYTES: usize = 4 << 30;

/// What decides the numbers an engine computes: the model's name and the
/// sha256 of its weights (a different file under the same name is another
/// model), and the settings that change results or their accounting. Run
/// fingerprints include it, so `--resume` never mixes two of them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EngineIdentity {
    pub model: String,
    /// Of the GGUF file; for a model directory, of its config and weight files.
    pub model_sha256: String,
    pub prefill_weights: PrefillWeights,
    /// Where it runs, resolved (never `Auto`): GPUs compute in bf16.
    pub device: DeviceChoice,
    #[serde(skip_serializing_if = "KvDtype::is_f32")]
    pub kv_dtype: KvDtype,
    pub prefix_cache: bool,
    pub cache_slots: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_bytes: Option<usize>,
    /// The draft model's name and sha256: under sampling it decides which
    /// tokens are drawn, and it changes the accounting of drafts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_model_sha256: Option<String>,
    /// Reused segments are approximate: they change the logits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_reuse: Option<SegmentReuse>,
}

impl EngineIdentity {
    fn new(
        model: &str,
        model_sha256: String,
        prefill_weights: PrefillWeights,
        device: DeviceChoice,
        kv_dtype: KvDtype,
    ) -> Self {
        EngineIdentity {
            model: model.to_string(),
            model_sha256,
            prefill_weights,
            device,
            kv_dtype,
            prefix_cache: true,
            cache_slots: 1,
            cache_bytes: None,
            draft_model: None,
            draft_model_sha256: None,
            segment_reuse: None,
        }
    }
}

/// A loaded model with its tokenizer, chat template and KV cache.
pub struct Engine {
    /// As loaded; [`Engine::identity`] adds the settings changed since.
    identity: EngineIdentity,
    model: ModelRunner,
    format: Arc<PromptFormat>,
    slots: CacheSlots,
    prefix_cache: bool,
    /// The most tokens drafted from earlier text and checked in one pass
    /// (see [`EngineConfig::draft_tokens`]); 0 decodes a token a pass.
    draft_tokens: usize,
    /// The small model that drafts tokens for this one
    /// ([`EngineConfig::draft_model`]), with caches of its own.
    draft: Option<Box<Engine>>,
    /// Prefixes kept on disk across processes (`--prompt-cache`).
    prompt_cache: Option<PromptCache>,
    /// Cached runs taken at new positions ([`EngineConfig::segment_reuse`]).
    segment_reuse: Option<SegmentReuse>,
    /// Built on the first constrained generation.
    grammars: std::cell::OnceCell<Grammars>,
    /// Built on the first generation with DRY or the loop guard.
    token_marks: std::cell::OnceCell<Arc<TokenMarks>>,
}

impl Engine {
    /// Load the model `config` names and set the engine up as it says.
    pub fn open(config: &EngineConfig) -> Result<Self, OpenError> {
        let mut engine = Engine::load(config).map_err(OpenError::Model)?;
        if let Some(source) = &config.draft_model {
            let draft =
                Engine::open_draft(&engine, source, config).map_err(OpenError::DraftModel)?;
            engine.identity.draft_model = Some(draft.identity.model.clone());
            engine.identity.draft_model_sha256 = Some(draft.identity.model_sha256.clone());
            engine.draft = Some(Box::new(draft));
        }
        if let Some(cache) = &config.prompt_cache {
            let opened = PromptCache::open(
                &cache.dir,
                cache.budget_bytes,
                &engine.identity.model_sha256,
                config.kv_dtype,
            );
            engine.prompt_cache = Some(opened.map_err(|source| OpenError::PromptCache {
                dir: cache.dir.clone(),
                source: Box::new(source),
            })?);
        }
        Ok(engine)
    }

    /// The draft model `source`, for `target`: on the same device with the
    /// same cache settings (device and dtype are chosen in one place, as for
    /// the target), refused unless it tokenizes as `target` does.
    fn open_draft(target: &Engine, source: &ModelSource, config: &EngineConfig) -> Result<Self> {
        let draft = Engine::load(&EngineConfig {
            source: source.clone(),
            draft_tokens: 0,
            draft_model: None,
            prompt_cache: None,
            segment_reuse: None,
            ..config.clone()
        })?;
        if let Some(reason) =
            speculative::tokenizer_difference(target.tokenizer(), draft.tokenizer())
        {
            return Err(Error::DraftTokenizerMismatch {
                model: target.name().to_string(),
                draft: draft.name().to_string(),
                reason,
            });
        }
        Ok(draft)
    }

    /// The model `engine_config.source` points at, with the caches in memory
    /// it asks for.
    fn load(engine_config: &EngineConfig) -> Result<Self> {
        let source = &engine_config.source;
        // The hash reads the whole model file again; it runs beside the
        // load instead of before it (Qwen-1.5B loaded in 5.5 s against 6.0,
        // as means of six alternated runs).
        std::thread::scope(|scope| {
            let digest = scope.spawn(|| model_digest(source));
            let chosen = device::resolve(engine_config.device);
            let device = device::open(chosen)?;
            if engine_config.kv_dtype == KvDtype::Q8 && engine_config.segment_reuse.is_some() {
                return Err(Error::invalid_setting(
                    Setting::SegmentReuse,
                    "moves cached keys, which a q8 cache stores as integers; use f32, f16 or bf16",
                ));
            }
            if engine_config.kv_dtype == KvDtype::Q8 && !device.is_cpu() {
                return Err(Error::invalid_setting(
                    Setting::KvDtype,
                    "q8 is read by the CPU kernels only; use f16 or bf16 on a GPU",
                ));
            }
            let (name, config, format, mut weights) = match source {
                ModelSource::Gguf { path, name } => {
                    let (content, file) = read_gguf_header(path)?;
                    let config = Config::from_gguf(&content, path)?;
                    let format =
                        PromptFormat::new(name, Tokenizer::from_gguf(&content, name)?, &config)?;
                    let weights = WeightFile::gguf(path, content, file);
                    (name, config, format, weights)
                }
                ModelSource::HfDir { dir, name } => {
                    let config_path = dir.join("config.json");
                    let json = std::fs::read_to_string(&config_path)
                        .map_err(|e| Error::io(&config_path, e))?;
                    let config = Config::from_hf_json(&json, &config_path)?;
                    let format = PromptFormat::new(name, Tokenizer::from_hf_dir(dir)?, &config)?;
                    let files = safetensors_files(dir)?;
                    let weights = WeightFile::safetensors(dir, &files)?;
                    (name, config, format, weights)
                }
            };
            let prefill = engine_config
                .prefill_weights
                .unwrap_or_else(|| default_prefill_weights(&config));
            let kv_dtype = engine_config.kv_dtype;
            let model = Transformer::new(config, &mut weights, prefill, kv_dtype, &device)?;
            let digest = digest
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            let mut identity = EngineIdentity::new(name, digest, prefill, chosen, kv_dtype);
            identity.segment_reuse = engine_config.segment_reuse;
            Engine::new(identity, model, format, engine_config)
        })
    }

    fn new(
        identity: EngineIdentity,
        model: Transformer,
        format: PromptFormat,
        engine_config: &EngineConfig,
    ) -> Result<Self> {
        let mut slots = CacheSlots::new(model.new_cache(), engine_config.cache_slots);
        slots.set_byte_budget(engine_config.cache_bytes);
        Ok(Engine {
            identity,
            model: ModelRunner::new(model),
            format: Arc::new(format),
            slots,
            prefix_cache: engine_config.prefix_cache,
            draft_tokens: engine_config.draft_tokens,
            draft: None,
            prompt_cache: None,
            segment_reuse: engine_config.segment_reuse,
            grammars: std::cell::OnceCell::new(),
            token_marks: std::cell::OnceCell::new(),
        })
    }

    /// Another engine on the same weights, with caches of its own and the
    /// same settings, for a sequence that runs beside this one's on another
    /// thread. From the first sibling on, the decode steps of all of them
    /// that coincide run as one batched forward pass (see `engine::batch`), so
    /// sequences decoding side by side cost little more than one.
    pub fn sibling(&mut self) -> Result<Engine> {
        let model = self.model.share()?;
        let draft = match self.draft.as_mut() {
            Some(draft) => Some(Box::new(draft.sibling()?)),
            None => None,
        };
        let mut slots = CacheSlots::new(model.new_cache(), self.slots.limit());
        slots.set_byte_budget(self.slots.byte_budget());
        Ok(Engine {
            identity: self.identity.clone(),
            model,
            format: Arc::clone(&self.format),
            slots,
            prefix_cache: self.prefix_cache,
            draft_tokens: self.draft_tokens,
            draft,
            prompt_cache: self.prompt_cache.clone(),
            segment_reuse: self.segment_reuse,
            grammars: std::cell::OnceCell::new(),
            token_marks: self.token_marks.clone(),
        })
    }

    pub fn name(&self) -> &str {
        &self.identity.model
    }

    /// What decides the numbers this engine computes, as it is set now.
    pub fn identity(&self) -> EngineIdentity {
        EngineIdentity {
            prefix_cache: self.prefix_cache,
            cache_slots: self.slots.limit(),
            cache_bytes: self.slots.byte_budget(),
            ..self.identity.clone()
        }
    }

    pub fn config(&self) -> &Config {
        self.model.config()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.format.tokenizer()
    }

    /// The longest sequence the model accepts, prompt and generated tokens together.
    pub fn context_tokens(&self) -> usize {
        self.model.config().context_tokens
    }

    /// With reuse off every call recomputes its whole prompt, for comparison.
    pub fn set_prefix_cache(&mut self, enabled: bool) {
        self.prefix_cache = enabled;
        if let Some(draft) = self.draft.as_mut() {
            draft.set_prefix_cache(enabled);
        }
    }

    /// Whether sequences are also kept on disk (`--prompt-cache`).
    pub fn keeps_prompts_on_disk(&self) -> bool {
        self.prompt_cache.is_some()
    }

    /// The draft model's name, when one drafts for this engine.
    pub fn draft_model(&self) -> Option<&str> {
        self.draft.as_deref().map(Engine::name)
    }

    /// Forget every cached sequence, so the next call starts cold, as on a
    /// freshly loaded engine; runs measured one after another then do not
    /// depend on their order. The storage stays allocated.
    pub fn clear_cache(&mut self) {
        self.slots.clear();
        if let Some(draft) = self.draft.as_mut() {
            draft.clear_cache();
        }
    }

    /// The token ids whose keys and values the engine holds in the sequence
    /// it used last.
    pub fn cached_tokens(&self) -> &[u32] {
        self.slots.active().cache.tokens()
    }

    /// The model's text side: how prompts become token ids.
    pub fn format(&self) -> &PromptFormat {
        &self.format
    }

    /// The model's text side, for a thread that builds prompts while the
    /// engine works.
    pub fn shared_format(&self) -> Arc<PromptFormat> {
        Arc::clone(&self.format)
    }

    /// See [`PromptFormat::text_prompt`].
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.format.text_prompt(text)
    }

    /// See [`PromptFormat::chat_prompt`].
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.format.chat_prompt(messages)
    }

    /// See [`PromptFormat::segmented_chat_prompt`].
    pub fn segmented_chat_prompt(
        &self,
        system: Option<&str>,
        user_segments: &[String],
    ) -> Result<Vec<u32>> {
        self.format.segmented_chat_prompt(system, user_segments)
    }

    /// Append `tokens` to the cached sequence, one decode step each, and
    /// return the logits after the last of them. Benchmarks use it to time
    /// decode steps without sampling.
    pub fn extend(&mut self, tokens: &[u32]) -> Result<Tensor> {
        self.check_room_for(tokens)?;
        let cache = &mut self.slots.active_mut().cache;
        let Some((&last, steps)) = tokens.split_last() else {
            return Err(Error::invalid("extend", "no tokens to append"));
        };
        let _decoding = self.model.decoding();
        for &token in steps {
            self.model.forward(&[token], cache, Pass::Decode)?;
        }
        self.model.forward(&[last], cache, Pass::Decode)
    }

    /// Append `tokens` to the cached sequence in one decode pass and return
    /// the logits after each of them, `(tokens, vocab)`: the pass that
    /// checks drafted tokens. `None` where its rows would not be the bits of
    /// [`Engine::extend`]'s one-token steps, so no draft is checked there.
    pub fn extend_in_one_pass(&mut self, tokens: &[u32]) -> Result<Option<Tensor>> {
        if !self.model.checks_drafts() {
            return Ok(None);
        }
        self.check_room_for(tokens)?;
        let cache = &mut self.slots.active_mut().cache;
        self.model.forward_rows(tokens, cache).map(Some)
    }

    /// An error unless `tokens` fit after the cached sequence.
    fn check_room_for(&self, tokens: &[u32]) -> Result<()> {
        let total = self.slots.active().cache.len() + tokens.len();
        let context = self.model.config().context_tokens;
        if total >= context {
            return Err(Error::PromptTooLong {
                prompt_tokens: total,
                context_tokens: context,
            });
        }
        Ok(())
    }

    fn grammars(&self) -> Result<&Grammars> {
        if let Some(grammars) = self.grammars.get() {
            return Ok(grammars);
        }
        let built = Grammars::new(
            self.format.tokenizer(),
            self.model.config().vocab_size,
            self.name(),
        )?;
        Ok(self.grammars.get_or_init(|| built))
    }
}

/// Open a GGUF file and read its header. candle's reader divides by the
/// file's `general.alignment` and panics when it is zero; that panic is
/// caught here and reported as the bad file it is.
pub(super) fn read_gguf_header(
    path: &std::path::Path,
) -> Result<(gguf_file::Content, std::fs::File)> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let read = without_panic(|| gguf_file::Content::read(&mut file));
    let bad = |reason: String| Error::BadModelFile {
        path: path.to_path_buf(),
        reason,
    };
    match read {
        Some(Ok(content)) => Ok((content, file)),
        Some(Err(e)) => Err(bad(format!("cannot read GGUF header: {e}"))),
        None => Err(bad(
            "cannot read GGUF header: its metadata is inconsistent (general.alignment of 0?)"
                .to_string(),
        )),
    }
}

/// Dense when the f32 copy of the model's matmul weights stays under
/// [`DENSE_PREFILL_LIMIT_BYTES`].
fn default_prefill_weights(config: &Config) -> PrefillWeights {
    let per_layer = config.hidden_size
        * (2 * config.heads * config.head_dim
            + 2 * config.kv_heads * config.head_dim
            + 3 * config.intermediate_size);
    let dense_bytes = per_layer * config.layers * std::mem::size_of::<f32>();
    if dense_bytes <= DENSE_PREFILL_LIMIT_BYTES {
        PrefillWeights::Dense
    } else {
        PrefillWeights::Quantized
    }
}

/// sha256 of what a model is loaded from: the GGUF file, or a directory's
/// config and safetensors files (the hash of their hashes).
fn model_digest(source: &ModelSource) -> Result<String> {
    match source {
        ModelSource::Gguf { path, .. } => source::sha256_file(path),
        ModelSource::HfDir { dir, .. } => {
            let mut digests = vec![source::sha256_file(&dir.join("config.json"))?];
            for file in &safetensors_files(dir)? {
                digests.push(source::sha256_file(file)?);
            }
            Ok(format!("{:x}", Sha256::digest(digests.concat())))
        }
    }
}

/// The `*.safetensors` files of a model directory, in name order (shards are numbered).
fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut files: Vec<_> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::BadModelFile {
            path: dir.to_path_buf(),
            reason: "no *.safetensors file".to_string(),
        });
    }
    Ok(files)
}
