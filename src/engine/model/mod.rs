//! Decoder-only transformer models: what each supported architecture is, and
//! the configuration read from a GGUF file's metadata or a `config.json`.
//!
//! Llama and Qwen2 share one forward pass ([`transformer`]); the few ways they
//! differ are properties of [`Architecture`], so there is no second copy of the
//! model code with small variations.

mod attention;
#[cfg(target_arch = "x86_64")]
mod exp;
mod interleaved;
mod rowwise;
mod transformer;
mod weights;

/// Whether this CPU runs the vector kernels of [`attention`] and [`interleaved`]:
/// x86-64 with AVX2, FMA and F16C (every AVX2 CPU has the last).
fn has_avx2_fma_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

thread_local! {
    /// Set while the calling thread runs its share of a batch alone
    /// ([`alone_on_this_thread`]).
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with this module's pool helpers ([`each_on_pool`],
/// [`claimed_on_pool`]) doing all their work on the calling thread, so that
/// several threads can each run a batch of their own through the model at
/// once: none of them waits on candle's pool, whose callers take turns.
pub(crate) fn alone_on_this_thread<R>(f: impl FnOnce() -> R) -> R {
    /// Puts back the flag as it was, even if `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ALONE.set(self.0);
        }
    }
    let _restore = Restore(ALONE.replace(true));
    f()
}

/// Call `f(index, item)` for each of `items` on candle's thread pool, the
/// one the matmuls run on, each item on one thread.
fn each_on_pool<T: Send>(items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
    if ALONE.get() {
        for (index, item) in items.iter_mut().enumerate() {
            f(index, item);
        }
        return;
    }
    let items: Vec<Mutex<&mut T>> = items.iter_mut().map(Mutex::new).collect();
    candle_core::utils::barrier_pool().execute_chunked(items.len(), |indices| {
        for index in indices {
            // Each item has one thread, so its lock is never contended and
            // can only be poisoned by a panic, which the pool re-raises.
            let mut item = items[index].lock().unwrap_or_else(PoisonError::into_inner);
            f(index, &mut item);
        }
    });
}

/// Call `f(range)` for consecutive ranges covering `0..items` on candle's
/// pool, each thread claiming the next range as it finishes one: a half of
/// what is left per thread, down to one item, so that a matmul's last
/// claims are small. candle's `execute_chunked` hands out sixteenths of
/// the items, and in a four-sequence decode step the batch thread waited
/// 5.6% of its samples at the end of passes for the other thread's last
/// sixteenth. Not for a job already on the pool: nested, candle's pool
/// would wait for itself.
fn claimed_on_pool(items: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    claimed_on_pool_after(0, |_| {}, items, f);
}

/// [`claimed_on_pool`], in the same pass of the pool after `job(j)` has
/// been called once for each `j < jobs` by whichever thread claims it:
/// one pass where a pass for the jobs and one for the items took two, each
/// costing 0.75-1.6 µs to hand out and gather on two threads.
fn claimed_on_pool_after(
    jobs: usize,
    job: impl Fn(usize) + Sync,
    items: usize,
    f: impl Fn(std::ops::Range<usize>) + Sync,
) {
    if ALONE.get() {
        (0..jobs).for_each(job);
        if items > 0 {
            f(0..items);
        }
        return;
    }
    let pool = candle_core::utils::barrier_pool();
    let threads = pool.n_workers() + 1;
    let (next_job, jobs_done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let next = AtomicUsize::new(0);
    pool.execute(|_| {
        loop {
            let claimed = next_job.fetch_add(1, Ordering::Relaxed);
            if claimed >= jobs {
                break;
            }
            // Counted even if the job panics, so that no thread waits
            // below forever; the pool re-raises the panic at the end.
            let _counted = Counted(&jobs_done);
            job(claimed);
        }
        while jobs_done.load(Ordering::Acquire) < jobs {
            std::hint::spin_loop();
        }
        let mut start = next.load(Ordering::Relaxed);
        while start < items {
            let size = ((items - start) / (2 * threads)).max(1);
            match next.compare_exchange_weak(
                start,
                start + size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    f(start..start + size);
                    start = next.load(Ordering::Relaxed);
                }
                Err(now) => start = now,
            }
        }
    });
}

/// Adds one to its counter when dropped, releasing what was written before.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// A vector of `len` values that `write` fills chunk by chunk, `chunk`
/// values a call, on candle's pool when `on_pool` and there is more than
/// one chunk. The memory is not cleared first: clearing the outputs of a
/// sixteen-sequence decode step's elementwise passes was 2% of the step,
/// on the batch thread while the pool idled.
///
/// # Safety
/// Each call of `write` initializes every value of the chunk it is given.
unsafe fn written(
    len: usize,
    chunk: usize,
    on_pool: bool,
    write: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    let mut chunks: Vec<&mut [MaybeUninit<f32>]> = out.spare_capacity_mut()[..len]
        .chunks_mut(chunk.max(1))
        .collect();
    if on_pool && chunks.len() > 1 {
        each_on_pool(&mut chunks, |index, chunk| write(index, chunk));
    } else {
        for (index, chunk) in chunks.iter_mut().enumerate() {
            write(index, chunk);
        }
    }
    drop(chunks);
    // SAFETY: the chunks cover the first `len` values, and the caller
    // promised that `write` initialized every value of each.
    unsafe { out.set_len(len) };
    out
}

/// The f32 values of a contiguous CPU tensor, read through the guard its
/// `storage_and_layout` gave.
fn cpu_values<'a>(
    (storage, layout): &'a (impl Deref<Target = Storage>, &Layout),
) -> candle_core::Result<&'a [f32]> {
    let Storage::Cpu(storage) = &**storage else {
        candle_core::bail!("reading the values of a tensor that is not on the CPU");
    };
    let count = layout.shape().elem_count();
    Ok(&storage.as_slice::<f32>()?[layout.start_offset()..][..count])
}

pub use transformer::{Rows, Transformer, PREFILL_BATCH};
pub(crate) use weights::WeightFile;
pub use weights::{Pass, PrefillWeights};

use crate::error::{Error, Result};
use candle_core::quantized::gguf_file;
use candle_core::{Layout, Storage};
use std::cell::Cell;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// The model families prism can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Qwen2,
}

impl Architecture {
    /// Parse the name a GGUF file (`general.architecture`) or a `config.json`
    /// (`model_type`) gives.
    pub fn from_name(name: &str, model: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            other => Err(Error::UnsupportedArchitecture {
                model: model.to_string(),
                architecture: other.to_string(),
            }),
        }
    }

    /// The prefix of this architecture's GGUF metadata keys.
    fn gguf_prefix(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }

    /// Qwen2 adds learned biases to the query, key and value projections.
    fn attention_bias(self) -> bool {
        matches!(self, Architecture::Qwen2)
    }

    /// Which RoPE layout the stored q/k weights expect. llama.cpp's converter
    /// permutes Llama's q/k rows so that rotation pairs adjacent dimensions
    /// (interleaved); Qwen2 GGUF files and every Hugging Face checkpoint keep
    /// the split-halves (NeoX) layout.
    fn rope_interleaved(self, from_gguf: bool) -> bool {
        from_gguf && self == Architecture::Llama
    }
}

/// The longest context prism accepts from a model's metadata: four times
/// that of the largest shipped Llama and Qwen models.
pub const MAX_CONTEXT_TOKENS: usize = 1 << 19;

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_interleaved: bool,
    pub attention_bias: bool,
    /// The longest sequence the model was trained for; prompts beyond it are refused.
    pub context_tokens: usize,
}

impl Config {
    /// Read the configuration from GGUF metadata (`{arch}.block_count` and friends).
    pub fn from_gguf(content: &gguf_file::Content, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            reason,
        };
        let get = |key: &str| {
            content
                .metadata
                .get(key)
                .ok_or_else(|| bad(format!("metadata key `{key}` is missing")))
        };
        let arch_name = get("general.architecture")?
            .to_string()
            .map_err(|e| bad(format!("general.architecture: {e}")))?;
        let architecture = Architecture::from_name(arch_name, &path.display().to_string())?;
        let prefix = architecture.gguf_prefix();
        let integer = |key: &str| -> Result<usize> {
            let key = format!("{prefix}.{key}");
            let value = get(&key)?;
            value
                .to_u64()
                .or_else(|_| value.to_u32().map(u64::from))
                .map(|v| v as usize)
                .map_err(|e| bad(format!("{key}: {e}")))
        };
        let float = |key: &str, default: f64| -> Result<f64> {
            let key = format!("{prefix}.{key}");
            match content.metadata.get(&key) {
                None => Ok(default),
                Some(value) => value
                    .to_f32()
                    .map(f64::from)
                    .map_err(|e| bad(format!("{key}: {e}"))),
            }
        };
        let hidden_size = integer("embedding_length")?;
        let heads = integer("attention.head_count")?;
        let kv_heads = integer("attention.head_count_kv").unwrap_or(heads);
        let vocab_size = match content.metadata.get("tokenizer.ggml.tokens") {
            Some(tokens) => tokens.to_vec().map(Vec::len).unwrap_or(0),
            None => 0,
        };
        let vocab_size = match content.tensor_infos.get("token_embd.weight") {
            Some(info) => *info
                .shape
                .dims()
                .first()
                .ok_or_else(|| bad("tensor token_embd.weight has no dimensions".to_string()))?,
            None => vocab_size,
        };
        let config = Config {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: integer("feed_forward_length")?,
            layers: integer("block_count")?,
            heads,
            kv_heads,
            head_dim: integer("rope.dimension_count").unwrap_or(hidden_size / heads.max(1)),
            rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-6)?,
            rope_theta: float("rope.freq_base", 10_000.0)?,
            rope_interleaved: architecture.rope_interleaved(true),
            attention_bias: architecture.attention_bias(),
            context_tokens: integer("context_length")?,
        };
        config.validate().map_err(bad)?;
        Ok(config)
    }

    /// Read the configuration from a Hugging Face `config.json`.
    pub fn from_hf_json(json: &str, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            reason,
        };
        let hf: HfConfig = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(
                "rope_scaling is set; prism supports only unscaled RoPE".to_string(),
            ));
        }
        let architecture = Architecture::from_name(&hf.model_type, &path.display().to_string())?;
        let heads = hf.num_attention_heads;
        let config = Config {
            architecture,
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            layers: hf.num_hidden_layers,
            heads,
            kv_heads: hf.num_key_value_heads.unwrap_or(heads),
            head_dim: hf.head_dim.unwrap_or(hf.hidden_size / heads.max(1)),
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: hf.rope_theta,
            rope_interleaved: architecture.rope_interleaved(false),
            attention_bias: hf.attention_bias.unwrap_or(architecture.attention_bias()),
            context_tokens: hf.max_position_embeddings,
        };
        config.validate().map_err(bad)?;
        Ok(config)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("context length", self.context_tokens),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(format!("{name} is zero"));
        }
        // Checked before anything is allocated from them: the RoPE tables
        // alone take context × head dimension floats, and a corrupt file
        // can claim billions.
        let bounded = [
            ("vocab_size", self.vocab_size, 1 << 22),
            ("hidden_size", self.hidden_size, 1 << 16),
            ("intermediate_size", self.intermediate_size, 1 << 18),
            ("layers", self.layers, 1 << 10),
            ("heads", self.heads, 1 << 10),
            ("head_dim", self.head_dim, 1 << 12),
            ("context length", self.context_tokens, MAX_CONTEXT_TOKENS),
        ];
        if let Some((name, value, limit)) = bounded.iter().find(|(_, value, limit)| value > limit) {
            return Err(format!(
                "{name} of {value} is beyond what prism supports ({limit}); the file is likely corrupt"
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "{} attention heads do not divide into {} key/value heads",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head dimension {} is odd", self.head_dim));
        }
        Ok(())
    }
}

/// The fields of a Llama or Qwen2 `config.json` that prism reads.
#[derive(Debug, serde::Deserialize)]
struct HfConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    max_position_embeddings: usize,
    attention_bias: Option<bool>,
    rope_scaling: Option<serde_json::Value>,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

fn default_rope_theta() -> f64 {
    10_000.0
}

#[cfg(test)]
mod tests {
    use super::{claimed_on_pool, claimed_on_pool_after};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn the_pool_claims_every_item_once() {
        for items in [0, 1, 7, 64, 1000] {
            let claimed = Mutex::new(Vec::new());
            claimed_on_pool(items, |range| {
                assert!(!range.is_empty(), "an empty claim of {items}");
                claimed.lock().unwrap().push(range);
            });
            let mut claimed = claimed.into_inner().unwrap();
            claimed.sort_by_key(|range| range.start);
            let mut next = 0;
            for range in claimed {
                assert_eq!(range.start, next, "{items} items");
                next = range.end;
            }
            assert_eq!(next, items);
        }
    }

    #[test]
    fn each_job_runs_once_before_any_item_of_the_same_pass() {
        for (jobs, items) in [(0, 5), (1, 0), (2, 64), (9, 3)] {
            let runs: Vec<AtomicUsize> = (0..jobs).map(|_| AtomicUsize::new(0)).collect();
            let claimed = AtomicUsize::new(0);
            claimed_on_pool_after(
                jobs,
                |job| {
                    runs[job].fetch_add(1, Ordering::Relaxed);
                },
                items,
                |range| {
                    for (job, runs) in runs.iter().enumerate() {
                        assert_eq!(
                            runs.load(Ordering::Relaxed),
                            1,
                            "job {job} before {range:?}"
                        );
                    }
                    claimed.fetch_add(range.len(), Ordering::Relaxed);
                },
            );
            assert!(runs.iter().all(|runs| runs.load(Ordering::Relaxed) == 1));
            assert_eq!(claimed.into_inner(), items, "{jobs} jobs");
        }
    }
}
