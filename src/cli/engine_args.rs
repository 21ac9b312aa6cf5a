//! The flags that choose the model and how the engine runs it, and the
//! [`EngineConfig`] they make.

use super::shared_args::parse_size;
use anyhow::{Context, Result};
use clap::Args;
use prism::engine::device::{self, DeviceChoice};
use prism::engine::kv_cache::KvDtype;
use prism::engine::model::PrefillWeights;
use prism::engine::segments::{SegmentReuse, DEFAULT_MIN_TOKENS, DEFAULT_RECOMPUTE_TOKENS};
use prism::engine::{Engine, EngineConfig, OpenError, PromptCacheConfig, DEFAULT_DRAFT_TOKENS};
use std::time::Instant;

/// Flags that choose and load the model.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// A known model name (see `prism models list`), a .gguf file, a model directory, a Hugging Face repo id, or owner/repo:QUANT for one GGUF file of a hub repo (e.g. Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M). Default: qwen2.5-coder-1.5b-instruct; with --backend openai, the known model the server lists, if it lists one.
    #[arg(long, short)]
    pub model: Option<String>,
    /// CPU threads (default: physical cores; at most 1024).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Where the model runs: `auto` (the GPU a `cuda` or `metal` build was made for, else the
    /// CPU), `cpu`, `cuda` or `metal`.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Recompute every prompt from scratch instead of reusing the cached prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Token sequences kept cached (1 to 64); a prompt continues the one it shares the longest
    /// prefix with. Each slot's KV cache grows with the tokens it holds, up to the model's context.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub cache_slots: u16,
    /// Bound the KV storage of all cached sequences together, in bytes or with a binary
    /// unit (`512M`, `4G`); past it the least recently used sequences are dropped, never
    /// the one in use. Default: no bound beyond --cache-slots.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub cache_bytes: Option<usize>,
    /// Also keep the KV of each generated sequence on disk in DIR, and start a prompt from
    /// the stored prefix that matches most of it: a resumed run, or a second process with the
    /// same instructions, does not encode that prefix again. Sequences are stored in blocks of
    /// 256 tokens that shared prefixes share; of PRISM's calls only the whole blocks of what the
    /// next call starts with (instructions and memory). Blocks are checked before use (see
    /// `prism cache`).
    #[arg(long, value_name = "DIR")]
    pub prompt_cache: Option<std::path::PathBuf>,
    /// The most disk --prompt-cache may take (`512M`, `8G`); the least recently used blocks go first.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "4G", requires = "prompt_cache")]
    pub prompt_cache_size: usize,
    /// Weights for multi-token prefill: `dense` (an f32 copy of each weight candle multiplies:
    /// faster, more memory) or `quantized`. Q4_1, Q8_0, Q4_K and Q6_K weights on AVX2 CPUs
    /// take prism's own kernel either way. Default: dense when the copy stays under 4 GiB.
    #[arg(long, value_parser = parse_prefill_weights)]
    pub prefill_weights: Option<PrefillWeights>,
    /// How the KV cache stores keys and values: f32; f16 or bf16 for half the memory; q8 (8-bit
    /// integers and a scale per row of a head, CPU only) for a quarter. Perplexity on Frankenstein
    /// moves by under 0.1% with f16 and bf16; with q8 by 0.07% for SmolLM2 but 3.6% for
    /// Qwen2.5-0.5B, whose keys have outlying channels: keep Qwen models on f16.
    #[arg(long, default_value = "f32", value_parser = parse_kv_dtype)]
    pub kv_dtype: KvDtype,
    /// Draft up to N next tokens from where the last few tokens occurred earlier in the prompt
    /// or output, and check them in one pass with the token before: the output is the same,
    /// and text that repeats its document (summaries, memory updates) decodes faster. Only
    /// on CPUs where prism's own kernels run every matmul; 0 turns it off.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DRAFT_TOKENS as u8, value_parser = clap::value_parser!(u8).range(0..=16))]
    pub draft_tokens: u8,
    /// A small model that drafts tokens for --model to check in one pass (speculative
    /// decoding), named as --model is, e.g. qwen2.5-coder-0.5b-instruct for
    /// qwen2.5-coder-1.5b-instruct. Its tokenizer must be the model's. It runs on the same
    /// device with caches of its own; greedy output is the model's, and sampled output
    /// follows the model's distribution. Each round drafts from earlier text (--draft-tokens)
    /// when it has a draft that has been kept at least half as often as the model's lately,
    /// else from the model. On two CPU cores the 0.5B Qwen drafting for the 1.5B did not
    /// speed up text that does not repeat (docs/RESULTS.md).
    #[arg(long, value_name = "NAME")]
    pub draft_model: Option<String>,
    /// Where a prompt leaves the cached sequence it continues (a memory edited in the middle),
    /// still take the keys and values of later runs of at least --segment-min-tokens tokens
    /// that a cached sequence holds, moved to their new positions, computing the first
    /// --segment-recompute tokens of each again. Faster, and approximate: the taken rows were
    /// computed after other text (docs/RESULTS.md measures the drift). Off, only the exact
    /// prefix is reused.
    #[arg(long)]
    pub reuse_segments: bool,
    /// The shortest cached run --reuse-segments takes.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MIN_TOKENS as u16, requires = "reuse_segments", value_parser = clap::value_parser!(u16).range(1..))]
    pub segment_min_tokens: u16,
    /// Leading tokens of each run --reuse-segments takes that are computed again.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RECOMPUTE_TOKENS as u16, requires = "reuse_segments")]
    pub segment_recompute: u16,
}

fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    s.parse().map_err(|e: prism::Error| e.to_string())
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse().map_err(|e: prism::Error| e.to_string())
}

fn parse_prefill_weights(s: &str) -> Result<PrefillWeights, String> {
    match s {
        "dense" => Ok(PrefillWeights::Dense),
        "quantized" => Ok(PrefillWeights::Quantized),
        other => Err(format!("`{other}` is not one of dense, quantized")),
    }
}

impl EngineArgs {
    /// `--model`, or the default model.
    pub fn model(&self) -> &str {
        self.model
            .as_deref()
            .unwrap_or(prism::models::DEFAULT_MODEL)
    }

    /// The engine these flags ask for, with `--model` resolved (and fetched,
    /// when it names a hub repo).
    fn config(&self) -> Result<EngineConfig> {
        Ok(EngineConfig {
            source: prism::models::resolve(self.model())?,
            device: self.device,
            prefill_weights: self.prefill_weights,
            kv_dtype: self.kv_dtype,
            prefix_cache: !self.no_prefix_cache,
            cache_slots: usize::from(self.cache_slots),
            cache_bytes: self.cache_bytes,
            draft_tokens: usize::from(self.draft_tokens),
            draft_model: self
                .draft_model
                .as_deref()
                .map(prism::models::resolve)
                .transpose()?,
            prompt_cache: self.prompt_cache.as_ref().map(|dir| PromptCacheConfig {
                dir: dir.clone(),
                budget_bytes: self.prompt_cache_size as u64,
            }),
            segment_reuse: self.segment_reuse(),
        })
    }

    /// What --reuse-segments and its settings ask for, when given.
    pub fn segment_reuse(&self) -> Option<SegmentReuse> {
        self.reuse_segments.then_some(SegmentReuse {
            min_tokens: usize::from(self.segment_min_tokens),
            recompute_tokens: usize::from(self.segment_recompute),
        })
    }

    /// Size the thread pools, then open the engine these flags ask for,
    /// reporting the time on stderr.
    pub fn open(&self) -> Result<Engine> {
        if let Some(threads) = self.threads {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            if usize::from(threads) > cores {
                eprintln!("warning: --threads {threads} is more than the {cores} this machine has; they will contend");
            }
        }
        device::configure_cpu_pools(self.threads.map(usize::from));
        let config = self.config()?;
        let start = Instant::now();
        let engine = match Engine::open(&config) {
            Ok(engine) => engine,
            Err(OpenError::Model(err)) => {
                return Err(err).with_context(|| format!("loading {}", self.model()))
            }
            // A tokenizer mismatch names both models itself.
            Err(OpenError::DraftModel(err @ prism::Error::DraftTokenizerMismatch { .. })) => {
                return Err(err.into())
            }
            Err(OpenError::DraftModel(err)) => {
                let name = self.draft_model.as_deref().unwrap_or_default();
                return Err(err).with_context(|| format!("loading draft model {name}"));
            }
            Err(err) => return Err(err.into()),
        };
        let drafting = match engine.draft_model() {
            Some(draft) => format!(", drafting with {draft}"),
            None => String::new(),
        };
        note!(
            "loaded {}{drafting} ({:?}, {} layers, context {}) in {:.1}s on {} thread(s)",
            engine.name(),
            engine.config().architecture,
            engine.config().layers,
            engine.context_tokens(),
            start.elapsed().as_secs_f64(),
            device::default_threads(),
        );
        Ok(engine)
    }
}
