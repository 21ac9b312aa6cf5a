//! The forward pass shared by Llama and Qwen2: embeddings, a stack of
//! pre-norm attention + SwiGLU blocks, a final norm and the output head.
//!
//! The model holds no state between calls: the caller passes the [`KvCache`],
//! whose length is the position of the first token given.

use super::attention::{batch_attention, prompt_attention};
use super::weights::{Embedding, Linear, Pass, PrefillWeights, Projections, WeightFile};
use super::Config;
use crate::engine::kernels::cpu_values;
use crate::engine::kernels::rowwise::{f32_on_cpu, rms_norm, swiglu};
use crate::engine::kv_cache::{KvCache, KvDtype};
use crate::engine::pool::each_on_pool;
use crate::error::{CandleContext, Result};
use candle_core::{DType, Device, Tensor};

/// Prompts are encoded this many tokens at a time, which bounds the memory of
/// the intermediate activations without slowing the GEMMs down.
pub const PREFILL_BATCH: usize = 512;

struct Attention {
    /// The query, key and value projections.
    qkv: Projections,
    o_proj: Linear,
}

struct Mlp {
    /// The gate and up projections.
    gate_up: Projections,
    down_proj: Linear,
}

/// Read `{layer}.{name}` for each `(name, out)` of `parts`, all `(out, in)`
/// matmuls of the same input.
fn read_projections(
    weights: &mut WeightFile,
    layer: &str,
    (parts, in_dim): (&[(&str, usize)], usize),
    bias: bool,
    prefill: PrefillWeights,
    device: &Device,
) -> Result<Projections> {
    let prefixes: Vec<String> = parts
        .iter()
        .map(|(name, _)| format!("{layer}.{name}"))
        .collect();
    let outs: Vec<usize> = parts.iter().map(|(_, out)| *out).collect();
    weights.projections(&prefixes, (&outs, in_dim), bias, prefill, device)
}

/// The `N` outputs of [`Projections::forward`] as an array.
fn outputs<const N: usize>(outputs: Vec<Tensor>) -> candle_core::Result<[Tensor; N]> {
    let count = outputs.len();
    outputs
        .try_into()
        .map_err(|_| candle_core::Error::Msg(format!("{count} projections where {N} were read")))
}

struct Block {
    input_layernorm: Tensor,
    self_attn: Attention,
    post_attention_layernorm: Tensor,
    mlp: Mlp,
}

/// Cosine and sine tables for every position up to the context length, `(positions, head_dim / 2)`.
struct Rope {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

/// The rows of a run whose next-token logits [`Transformer::forward_together`]
/// returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// The last: a decode step's, or a prompt's once encoded.
    Last,
    /// Every row: a token and the drafts checked in its pass, each row
    /// the logits a decode step of its token would give.
    Every,
}

/// A loaded Llama or Qwen2 model.
pub struct Transformer {
    config: Config,
    embed_tokens: Embedding,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    /// What the KV caches made by [`Transformer::new_cache`] store.
    kv_dtype: KvDtype,
    device: Device,
}

impl Transformer {
    /// Read every weight of the model described by `config` from `weights`.
    pub(crate) fn new(
        config: Config,
        weights: &mut WeightFile,
        prefill: PrefillWeights,
        kv_dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        let c = &config;
        let (hidden, q_dim, kv_dim) =
            (c.hidden_size, c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let embed_tokens =
            weights.embedding("model.embed_tokens.weight", (c.vocab_size, hidden), device)?;
        let mut blocks = Vec::with_capacity(c.layers);
        for layer in 0..c.layers {
            let p = format!("model.layers.{layer}");
            let qkv = [
                ("self_attn.q_proj", q_dim),
                ("self_attn.k_proj", kv_dim),
                ("self_attn.v_proj", kv_dim),
            ];
            let self_attn = Attention {
                qkv: read_projections(
                    weights,
                    &p,
                    (&qkv, hidden),
                    c.attention_bias,
                    prefill,
                    device,
                )?,
                o_proj: weights.linear(
                    &format!("{p}.self_attn.o_proj"),
                    (hidden, q_dim),
                    false,
                    prefill,
                    device,
                )?,
            };
            let gate_up = [
                ("mlp.gate_proj", c.intermediate_size),
                ("mlp.up_proj", c.intermediate_size),
            ];
            let mlp = Mlp {
                gate_up: read_projections(weights, &p, (&gate_up, hidden), false, prefill, device)?,
                down_proj: weights.linear(
                    &format!("{p}.mlp.down_proj"),
                    (hidden, c.intermediate_size),
                    false,
                    prefill,
                    device,
                )?,
            };
            blocks.push(Block {
                input_layernorm: weights.dense(
                    &format!("{p}.input_layernorm.weight"),
                    &[hidden],
                    device,
                )?,
                self_attn,
                post_attention_layernorm: weights.dense(
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[hidden],
                    device,
                )?,
                mlp,
            });
        }
        let norm = weights.dense("model.norm.weight", &[hidden], device)?;
        // Models with tied embeddings store no output head: it is the
        // embedding table itself, shared rather than read a second time (a
        // Q6_K table of Qwen-1.5B's 151,936 tokens is 190 MB). Only the last
        // position goes through the head, so it never needs a dense copy.
        let lm_head = if weights.contains("lm_head.weight") {
            weights.linear(
                "lm_head",
                (c.vocab_size, hidden),
                false,
                PrefillWeights::Quantized,
                device,
            )?
        } else {
            embed_tokens
                .as_output_head(device)
                .context("sharing the embedding table as the output head")?
        };
        let rope = Rope::new(&config, device)?;
        Ok(Transformer {
            config,
            embed_tokens,
            blocks,
            norm,
            lm_head,
            rope,
            kv_dtype,
            device: device.clone(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty KV cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(
            self.config.layers,
            self.config.kv_heads,
            self.config.head_dim,
            self.config.context_tokens,
            self.kv_dtype,
            &self.device,
        )
    }

    /// Run `tokens` through the model after the positions already in `cache`,
    /// append their keys and values to it, and return the next-token logits
    /// after the last of them, as an f32 vector of `vocab_size`.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, pass: Pass) -> Result<Tensor> {
        if tokens.is_empty() {
            return Err(crate::Error::invalid("forward", "no tokens to run"));
        }
        // A generated token takes the decode step's path, so that a sequence
        // decoding alone gets the logits it gets batched with others.
        if let ([token], Pass::Decode) = (tokens, pass) {
            let logits = self.forward_together(&[(&[*token], Rows::Last)], &mut [cache], pass)?;
            return logits.squeeze(0).context("output head");
        }
        cache.reserve(tokens.len())?;
        let mut last_hidden = None;
        for batch in tokens.chunks(PREFILL_BATCH) {
            let hidden = self
                .forward_batch(batch, cache, pass)
                .context("forward pass")?;
            cache.commit(batch);
            last_hidden = Some(hidden);
        }
        let hidden = last_hidden.expect("tokens is not empty");
        let seq = hidden.dim(1).context("forward pass")?;
        hidden
            .narrow(1, seq - 1, 1)
            .and_then(|last| self.output_head(&last, pass)?.flatten_all())
            .context("output head")
    }

    /// Run `tokens` through the decode path after the positions in `cache`
    /// (appending them) and return the next-token logits after each of
    /// them, `(tokens, vocab_size)` in f32: what checking drafted tokens
    /// needs. When [`Transformer::decodes_rows_alone`], row `i` holds the
    /// bits a decode step of `tokens[i]` alone would give.
    pub fn forward_rows(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.forward_together(&[(tokens, Rows::Every)], &mut [cache], Pass::Decode)
    }

    /// Whether a decode pass of several tokens of one sequence computes
    /// each row as a decode step of that token alone would, to the bit:
    /// every matmul takes prism's kernel (the norms, rotation and attention
    /// of the decode path already treat rows one by one).
    pub fn decodes_rows_alone(&self) -> bool {
        self.lm_head.decodes_rows_alone()
            && self.blocks.iter().all(|block| {
                block.self_attn.qkv.decodes_rows_alone()
                    && block.self_attn.o_proj.decodes_rows_alone()
                    && block.mlp.gate_up.decodes_rows_alone()
                    && block.mlp.down_proj.decodes_rows_alone()
            })
    }

    /// One forward pass for several sequences at once: the tokens of
    /// `runs[i]` follow the positions in `caches[i]` and are appended there.
    /// Returns the next-token logits of the rows each run asks for, run
    /// after run, `(rows, vocab_size)` in f32.
    ///
    /// Every matmul weight is read once for all the rows, which is what a
    /// decode step costs on a CPU; only attention runs per sequence, over its
    /// own cache. A batch of decode steps is runs of one token with
    /// [`Pass::Decode`]; a prompt's batch may share the pass with them, with
    /// [`Pass::Prompt`]. Each row is computed by the kernels it would meet
    /// alone, in the same order; where a weight keeps a dense copy for
    /// prompts, the rows of a pass all take the copy its `pass` selects.
    pub fn forward_together(
        &self,
        runs: &[(&[u32], Rows)],
        caches: &mut [&mut KvCache],
        pass: Pass,
    ) -> Result<Tensor> {
        let tokens: Vec<&[u32]> = runs.iter().map(|&(tokens, _)| tokens).collect();
        if runs.is_empty() || runs.len() != caches.len() || tokens.iter().any(|run| run.is_empty())
        {
            let lengths: Vec<usize> = tokens.iter().map(|run| run.len()).collect();
            return Err(crate::Error::invalid(
                "forward",
                format!("runs of {lengths:?} tokens for {} sequences", caches.len()),
            ));
        }
        for (cache, run) in caches.iter_mut().zip(&tokens) {
            cache.reserve(run.len())?;
        }
        let hidden = self
            .blocks_together(&tokens, caches, pass)
            .context("forward pass")?;
        for (cache, run) in caches.iter_mut().zip(&tokens) {
            cache.commit(run);
        }
        let mut start = 0;
        let mut wanted = Vec::new();
        for &(run, rows) in runs {
            let end = start + run.len();
            match rows {
                Rows::Last => wanted.push(end as u32 - 1),
                Rows::Every => wanted.extend(start as u32..end as u32),
            }
            start = end;
        }
        let hidden = if wanted.len() == start {
            hidden
        } else {
            Tensor::new(wanted.as_slice(), &self.device)
                .and_then(|wanted| hidden.index_select(&wanted, 1))
                .context("output head")?
        };
        self.output_head(&hidden, pass).context("output head")
    }

    /// The final norm and the output head over `hidden` `(1, rows, hidden)`:
    /// each row's next-token logits, `(rows, vocab_size)` in f32.
    fn output_head(&self, hidden: &Tensor, pass: Pass) -> candle_core::Result<Tensor> {
        let eps = self.config.rms_norm_eps as f32;
        let normed = rms_norm(hidden, &self.norm, eps)?;
        self.lm_head
            .forward(&normed, pass)?
            .squeeze(0)?
            .to_dtype(DType::F32)
    }

    /// The blocks of [`Transformer::forward_together`]; returns the hidden
    /// states `(1, rows, hidden)`, the runs' rows one after another.
    fn blocks_together(
        &self,
        runs: &[&[u32]],
        caches: &mut [&mut KvCache],
        pass: Pass,
    ) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let tokens = runs.concat();
        let count = tokens.len();
        let run_lengths: Vec<usize> = runs.iter().map(|run| run.len()).collect();
        let positions: Vec<u32> = caches
            .iter()
            .zip(&run_lengths)
            .flat_map(|(cache, &length)| (cache.len()..cache.len() + length).map(|p| p as u32))
            .collect();
        let positions = Tensor::new(positions.as_slice(), &self.device)?;
        // Each row is a batch entry of one position, with its own row of the
        // tables, so one rotation call turns each by its own position.
        let half = c.head_dim / 2;
        let cos = self
            .rope
            .cos
            .index_select(&positions, 0)?
            .reshape((count, 1, half))?;
        let sin = self
            .rope
            .sin
            .index_select(&positions, 0)?
            .reshape((count, 1, half))?;
        let mut x = self
            .embed_tokens
            .rows(&tokens, &self.device)?
            .unsqueeze(0)?;
        let eps = c.rms_norm_eps as f32;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        for (layer, block) in self.blocks.iter().enumerate() {
            let attn = &block.self_attn;
            let norm = (&block.input_layernorm, eps);
            let qkv = outputs(attn.qkv.forward_normed(&x, norm, pass)?)?;
            let heads = (c.heads, c.kv_heads);
            let (q, sequences) = self.rope.turn_and_append(
                (layer, caches, &run_lengths),
                qkv,
                heads,
                (&cos, &sin),
            )?;
            let attended = batch_attention(&q, &sequences, &run_lengths, scale)?;
            x = attn.o_proj.forward_onto(&attended, &x, pass)?;
            x = block
                .mlp
                .forward_onto(&x, (&block.post_attention_layernorm, eps), pass)?;
        }
        Ok(x)
    }

    /// Run `tokens` after the positions already in `cache` (committing them)
    /// and return, for each position `p` of `tokens` from `first` to the
    /// second last, the natural log of the probability the model gives
    /// `tokens[p + 1]`: what a perplexity is computed from.
    pub fn next_token_log_probs(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        first: usize,
    ) -> Result<Vec<f32>> {
        cache.reserve(tokens.len())?;
        let mut log_probs = Vec::with_capacity(tokens.len().saturating_sub(first + 1));
        let mut start = 0;
        for batch in tokens.chunks(PREFILL_BATCH) {
            let hidden = self
                .forward_batch(batch, cache, Pass::Prompt)
                .context("forward pass")?;
            cache.commit(batch);
            // Positions of this batch that are scored: from `first`, and only
            // those with a next token to score.
            let from = first.max(start);
            let to = (start + batch.len()).min(tokens.len() - 1);
            if from < to {
                let targets = &tokens[from + 1..to + 1];
                let rows = hidden.narrow(1, from - start, to - from);
                let scored = rows
                    .and_then(|rows| self.scored_log_probs(&rows, targets))
                    .context("output head")?;
                log_probs.extend(scored);
            }
            start += batch.len();
        }
        Ok(log_probs)
    }

    /// The log-probabilities of `targets` under the output head applied to
    /// `hidden` `(1, n, hidden)`, one per row.
    fn scored_log_probs(&self, hidden: &Tensor, targets: &[u32]) -> candle_core::Result<Vec<f32>> {
        let logits = self.output_head(hidden, Pass::Prompt)?;
        let log_probs = candle_nn::ops::log_softmax(&logits, 1)?;
        let index = Tensor::new(targets, &self.device)?.unsqueeze(1)?;
        log_probs.gather(&index, 1)?.squeeze(1)?.to_vec1::<f32>()
    }

    /// One batch of tokens through every block; returns the hidden states `(1, seq, hidden)`.
    fn forward_batch(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        pass: Pass,
    ) -> candle_core::Result<Tensor> {
        let start = cache.len();
        let mut x = self.embed_tokens.rows(tokens, &self.device)?.unsqueeze(0)?;
        let (cos, sin) = self.rope.at(start, tokens.len())?;
        let eps = self.config.rms_norm_eps as f32;
        for (layer, block) in self.blocks.iter().enumerate() {
            let rope = (&cos, &sin);
            let attn = &block.self_attn;
            let norm = (&block.input_layernorm, eps);
            x = self.attention(attn, &x, norm, (layer, cache), rope, pass)?;
            x = block
                .mlp
                .forward_onto(&x, (&block.post_attention_layernorm, eps), pass)?;
        }
        Ok(x)
    }

    /// The hidden states `x` plus the attention of their RMS norm, scaled
    /// by `norm`'s weight.
    fn attention(
        &self,
        attn: &Attention,
        x: &Tensor,
        norm: (&Tensor, f32),
        (layer, cache): (usize, &mut KvCache),
        (cos, sin): (&Tensor, &Tensor),
        pass: Pass,
    ) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let seq = x.dim(1)?;
        // 1. Project: (1, seq, heads * head_dim).
        let [q, k, v] = outputs(attn.qkv.forward_normed(x, norm, pass)?)?;
        // 2. Split heads: (1, heads, seq, head_dim).
        let heads_first = |t: Tensor, heads: usize| {
            t.reshape((1, seq, heads, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = heads_first(q, c.heads)?;
        let k = heads_first(k, c.kv_heads)?;
        let v = heads_first(v, c.kv_heads)?;
        // 3. Rotate queries and keys by position.
        let q = self.rope.apply(&q, cos, sin)?;
        let k = self.rope.apply(&k, cos, sin)?;
        // 4. Cache, then attend over every position so far: (1, seq, heads * head_dim).
        let (keys, values) = cache
            .append(layer, &k, &v)
            .map_err(candle_core::Error::wrap)?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let out = prompt_attention(&q, &keys, &values, scale)?;
        attn.o_proj.forward_onto(&out, x, pass)
    }
}

/// One sequence's share of [`append_runs`].
struct Append<'a> {
    cache: &'a mut KvCache,
    /// The sequence's first row among all the runs'.
    first: usize,
    length: usize,
    /// Every position of the layer so far, once appended.
    appended: Option<candle_core::Result<(Tensor, Tensor)>>,
}

/// Append each run's rows of `keys` and `values` `(rows, kv_heads, 1,
/// head_dim)`, `run_lengths[i]` rows for `caches[i]`, to its cache's `layer`,
/// and return each cache's keys and values so far. Several sequences are
/// appended on the pool: one thread appending sixteen took 2 ms of a decode
/// step, long enough for the pool's other thread to park.
fn append_runs(
    layer: usize,
    caches: &mut [&mut KvCache],
    run_lengths: &[usize],
    (keys, values): (&Tensor, &Tensor),
) -> candle_core::Result<Vec<(Tensor, Tensor)>> {
    let append = |job: &mut Append| {
        // (1, kv_heads, length, head_dim), as the cache stores them: a view
        // the cache reads in place.
        let run = |t: &Tensor| t.narrow(0, job.first, job.length)?.transpose(0, 2);
        let appended = run(keys).and_then(|keys| {
            job.cache
                .append(layer, &keys, &run(values)?)
                .map_err(candle_core::Error::wrap)
        });
        job.appended = Some(appended);
    };
    let firsts = run_lengths.iter().scan(0, |first, length| {
        *first += length;
        Some(*first - length)
    });
    let mut jobs: Vec<Append> = caches
        .iter_mut()
        .zip(firsts.zip(run_lengths))
        .map(|(cache, (first, &length))| Append {
            cache,
            first,
            length,
            appended: None,
        })
        .collect();
    if let [job] = jobs.as_mut_slice() {
        append(job);
    } else {
        each_on_pool(&mut jobs, |_, job| append(job));
    }
    jobs.into_iter()
        .map(|job| {
            job.appended
                .unwrap_or_else(|| candle_core::bail!("a run was not appended"))
        })
        .collect()
}

impl Mlp {
    /// The hidden states `x` plus the block's feed-forward output for their
    /// RMS norm, scaled by `norm`'s weight.
    fn forward_onto(
        &self,
        x: &Tensor,
        norm: (&Tensor, f32),
        pass: Pass,
    ) -> candle_core::Result<Tensor> {
        let [gate, up] = outputs(self.gate_up.forward_normed(x, norm, pass)?)?;
        match self.down_proj.swiglu_onto(&gate, &up, x, pass)? {
            Some(sum) => Ok(sum),
            None => self.down_proj.forward_onto(&swiglu(&gate, &up)?, x, pass),
        }
    }
}

impl Rope {
    fn new(config: &Config, device: &Device) -> Result<Self> {
        let half = config.head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                (1.0 / config
                    .rope_theta
                    .powf(2.0 * i as f64 / config.head_dim as f64)) as f32
            })
            .collect();
        let tables = || -> candle_core::Result<(Tensor, Tensor)> {
            let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
            let positions = Tensor::arange(0u32, config.context_tokens as u32, device)?
                .to_dtype(DType::F32)?
                .reshape((config.context_tokens, 1))?;
            let angles = positions.matmul(&inv_freq)?;
            Ok((angles.cos()?, angles.sin()?))
        };
        let (cos, sin) = tables().context("building RoPE tables")?;
        Ok(Rope {
            cos,
            sin,
            interleaved: config.rope_interleaved,
        })
    }

    /// The tables for positions `start..start + len`.
    fn at(&self, start: usize, len: usize) -> candle_core::Result<(Tensor, Tensor)> {
        Ok((
            self.cos.narrow(0, start, len)?,
            self.sin.narrow(0, start, len)?,
        ))
    }

    /// Rotate `x` of shape `(1, heads, seq, head_dim)`.
    fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        if self.interleaved {
            candle_nn::rotary_emb::rope_i(x, cos, sin)
        } else {
            candle_nn::rotary_emb::rope(x, cos, sin)
        }
    }

    /// Turn each row's queries and keys by its own position and write its
    /// keys and values to its sequence's cache at `layer`, `run_lengths[i]`
    /// rows for `caches[i]`. `q`, `k` and `v` are the projections' rows
    /// `(1, rows, heads · head_dim)`, `cos` and `sin` each row's table row
    /// `(rows, 1, head_dim / 2)`. Returns the turned queries `(rows, heads,
    /// 1, head_dim)` and each cache's keys and values so far.
    ///
    /// On the CPU each job turns up to [`ROWS_PER_JOB`] rows of one
    /// sequence with candle's arithmetic and writes them straight into the
    /// cache: one pass of the pool where turning and appending took one
    /// each, and no tensors made of the turned keys or of each sequence's
    /// rows on the way (a four-sequence decode step spent 0.19 ms turning
    /// alone, most of it in its pass and its tensors).
    fn turn_and_append(
        &self,
        (layer, caches, run_lengths): (usize, &mut [&mut KvCache], &[usize]),
        [q, k, v]: [Tensor; 3],
        (heads, kv_heads): (usize, usize),
        (cos, sin): (&Tensor, &Tensor),
    ) -> candle_core::Result<(Tensor, Vec<(Tensor, Tensor)>)> {
        let rows: usize = run_lengths.iter().sum();
        let head_dim = 2 * cos.dim(2)?;
        let by_head = |t: Tensor, heads: usize| t.reshape((rows, heads, 1, head_dim));
        if ![&q, &k, &v, cos, sin].into_iter().all(f32_on_cpu) {
            let q = self.apply(&by_head(q, heads)?, cos, sin)?;
            let k = self.apply(&by_head(k, kv_heads)?, cos, sin)?;
            let v = by_head(v, kv_heads)?;
            return Ok((q, append_runs(layer, caches, run_lengths, (&k, &v))?));
        }
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
        let guards = [&q, &k, &v, &cos, &sin].map(Tensor::storage_and_layout);
        let [q_rows, k_rows, v_rows, cos, sin] = guards.each_ref().map(cpu_values);
        let (q_rows, k_rows, v_rows, cos, sin) = (q_rows?, k_rows?, v_rows?, cos?, sin?);
        let (q_width, kv_width, half) = (heads * head_dim, kv_heads * head_dim, head_dim / 2);
        if q_rows.len() != rows * q_width
            || [k_rows, v_rows].map(<[f32]>::len) != [rows * kv_width; 2]
        {
            candle_core::bail!("{rows} rows of queries, keys and values in runs {run_lengths:?}");
        }
        let mut turned_q = vec![0f32; q_rows.len()];
        let mut turned_k = vec![0f32; k_rows.len()];
        let mut jobs = Vec::new();
        let (mut q_left, mut k_left) = (turned_q.as_mut_slice(), turned_k.as_mut_slice());
        let mut first = 0;
        for (cache, &length) in caches.iter().zip(run_lengths) {
            for offset in (0..length).step_by(ROWS_PER_JOB) {
                let count = ROWS_PER_JOB.min(length - offset);
                let (turned_q, q_rest) = std::mem::take(&mut q_left).split_at_mut(count * q_width);
                let (turned_k, k_rest) = std::mem::take(&mut k_left).split_at_mut(count * kv_width);
                (q_left, k_left) = (q_rest, k_rest);
                jobs.push(TurnJob {
                    cache,
                    first: first + offset,
                    offset,
                    turned_q,
                    turned_k,
                    written: None,
                });
            }
            first += length;
        }
        let turn = |job: &mut TurnJob| {
            let count = job.turned_q.len() / q_width;
            for n in 0..count {
                let row = job.first + n;
                let (cos, sin) = (&cos[row * half..][..half], &sin[row * half..][..half]);
                for (x, turned, width) in [
                    (q_rows, &mut *job.turned_q, q_width),
                    (k_rows, &mut *job.turned_k, kv_width),
                ] {
                    let x = x[row * width..][..width].chunks_exact(head_dim);
                    for (x, out) in x.zip(turned[n * width..][..width].chunks_exact_mut(head_dim)) {
                        turn_head(x, (cos, sin), self.interleaved, out);
                    }
                }
            }
            let values = &v_rows[job.first * kv_width..][..count * kv_width];
            job.written = Some(
                job.cache
                    .write_rows(layer, job.offset, job.turned_k, values),
            );
        };
        if let [only] = jobs.as_mut_slice() {
            turn(only);
        } else {
            each_on_pool(&mut jobs, |_, job| turn(job));
        }
        for job in jobs {
            match job.written {
                Some(written) => written.map_err(candle_core::Error::wrap)?,
                None => candle_core::bail!("a run's rows were not appended"),
            }
        }
        let sequences = caches
            .iter()
            .zip(run_lengths)
            .map(|(cache, &length)| {
                cache
                    .written(layer, length)
                    .map_err(candle_core::Error::wrap)
            })
            .collect::<candle_core::Result<_>>()?;
        drop(guards);
        let q = Tensor::from_vec(turned_q, (rows, heads, 1, head_dim), q.device())?;
        Ok((q, sequences))
    }
}

/// Rows of one sequence turned and appended by one job of
/// [`Rope::turn_and_append`].
struct TurnJob<'a> {
    cache: &'a KvCache,
    /// The first row's place among every run's rows.
    first: usize,
    /// The first row's place after the sequence's cached positions.
    offset: usize,
    turned_q: &'a mut [f32],
    turned_k: &'a mut [f32],
    written: Option<Result<()>>,
}

/// Rows a job of [`Rope::turn_and_append`] takes at most, so that a
/// prompt's rows are shared among the pool's threads.
const ROWS_PER_JOB: usize = 32;

/// One head's row `x` turned by the angles of `cos` and `sin` (half its
/// width), in candle's order of operations: adjacent values paired when
/// `interleaved`, else each value of the first half with its partner in the
/// second.
fn turn_head(x: &[f32], (cos, sin): (&[f32], &[f32]), interleaved: bool, out: &mut [f32]) {
    let half = x.len() / 2;
    for (j, (&c, &s)) in cos.iter().zip(sin).enumerate() {
        let (first, second) = if interleaved {
            (2 * j, 2 * j + 1)
        } else {
            (j, j + half)
        };
        let (a, b) = (x[first], x[second]);
        out[first] = a * c - b * s;
        out[second] = a * s + b * c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_turned_and_appended_on_the_pool_are_candles_rotation_stored() {
        // Two sequences, one run longer than a job, after a cached position each.
        let (run_lengths, heads, kv_heads, head_dim) = ([ROWS_PER_JOB + 3, 2], 6, 2, 16);
        let rows: usize = run_lengths.iter().sum();
        let values = |count: usize, salt: f32| -> Vec<f32> {
            (0..count)
                .map(|i| (i as f32 * 0.37 + salt).sin() * 4.0)
                .collect()
        };
        let tensor = |count: usize, salt: f32, shape: (usize, usize, usize)| {
            Tensor::from_vec(values(count, salt), shape, &Device::Cpu).unwrap()
        };
        let q = tensor(rows * heads * head_dim, 0.1, (1, rows, heads * head_dim));
        let k = tensor(
            rows * kv_heads * head_dim,
            1.7,
            (1, rows, kv_heads * head_dim),
        );
        let v = tensor(
            rows * kv_heads * head_dim,
            2.3,
            (1, rows, kv_heads * head_dim),
        );
        let half = head_dim / 2;
        let table = |salt: f32| tensor(rows * half, salt, (rows, 1, half));
        let (cos, sin) = (table(0.3), table(2.9));
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let by_head = |t: &Tensor, heads: usize| t.reshape((rows, heads, 1, head_dim)).unwrap();
        for interleaved in [true, false] {
            let rope = Rope {
                cos: cos.clone(),
                sin: sin.clone(),
                interleaved,
            };
            let mut caches: Vec<KvCache> = (0..run_lengths.len())
                .map(|_| KvCache::new(3, kv_heads, head_dim, 512, KvDtype::F32, &Device::Cpu))
                .collect();
            for cache in &mut caches {
                cache.append_zeros_for_test(&[7]);
                cache.reserve(ROWS_PER_JOB + 3).unwrap();
            }
            let mut borrowed: Vec<&mut KvCache> = caches.iter_mut().collect();
            let (turned_q, sequences) = rope
                .turn_and_append(
                    (1, &mut borrowed, &run_lengths),
                    [q.clone(), k.clone(), v.clone()],
                    (heads, kv_heads),
                    (&cos, &sin),
                )
                .unwrap();
            let expected_q = rope.apply(&by_head(&q, heads), &cos, &sin).unwrap();
            assert_eq!(turned_q.dims(), expected_q.dims());
            assert_eq!(
                flat(&turned_q),
                flat(&expected_q),
                "interleaved: {interleaved}"
            );
            let expected_k = rope.apply(&by_head(&k, kv_heads), &cos, &sin).unwrap();
            let mut first = 0;
            for ((keys, values), &length) in sequences.iter().zip(&run_lengths) {
                // The cached position's zeros, then the run's rows by head.
                let stored = |t: &Tensor| t.narrow(2, 1, length).unwrap();
                let run = |t: &Tensor| t.narrow(0, first, length).unwrap().transpose(0, 2).unwrap();
                assert_eq!(keys.dims(), [1, kv_heads, 1 + length, head_dim]);
                assert_eq!(flat(&stored(keys)), flat(&run(&expected_k)));
                assert_eq!(flat(&stored(values)), flat(&run(&by_head(&v, kv_heads))));
                assert!(flat(&keys.narrow(2, 0, 1).unwrap())
                    .iter()
                    .all(|&x| x == 0.0));
                first += length;
            }
        }
    }
}
