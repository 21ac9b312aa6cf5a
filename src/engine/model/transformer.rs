//! The forward pass shared by Llama and Qwen2: embeddings, a stack of
//! pre-norm attention + SwiGLU blocks, a final norm and the output head.

use super::attention::{batch_attention, prompt_attention};
use super::rope::Rope;
use super::weight_file::WeightFile;
use super::weights::{Embedding, Linear, Pass, PrefillWeights, Projections};
use super::Config;
use crate::engine::kernels::rowwise::{rms_norm, swiglu};
use crate::engine::kv_cache::{KvCache, KvDtype};
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

impl Block {
    /// Read layer `layer`'s weights: q/k/v, o, gate/up, down, then the two norms.
    fn read(
        weights: &mut WeightFile,
        c: &Config,
        layer: usize,
        prefill: PrefillWeights,
        device: &Device,
    ) -> Result<Self> {
        let (hidden, q_dim, kv_dim) =
            (c.hidden_size, c.heads * c.head_dim, c.kv_heads * c.head_dim);
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
        Ok(Block {
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
        })
    }
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
///
/// The model holds no state between calls: the caller passes the [`KvCache`],
/// whose length is the position of the first token given.
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
        let hidden = c.hidden_size;
        let embed_tokens =
            weights.embedding("model.embed_tokens.weight", (c.vocab_size, hidden), device)?;
        let mut blocks = Vec::with_capacity(c.layers);
        for layer in 0..c.layers {
            blocks.push(Block::read(weights, c, layer, prefill, device)?);
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

    /// Cached keys `(1, kv_heads, seq, head_dim)` of rows moved `delta`
    /// positions, as they would have been computed there (see
    /// [`Rope::shift`]).
    pub(crate) fn shift_keys(&self, keys: &Tensor, delta: i64) -> Result<Tensor> {
        self.rope
            .shift(keys, delta)
            .context("moving cached keys to new positions")
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
        let mut log_probs = Vec::with_capacity(tokens.len().saturating_sub(first + 1));
        // Only positions with a next token are scored.
        let last = tokens.len().saturating_sub(1);
        self.each_scored_batch(tokens, cache, first, &mut |from, hidden| {
            let to = (from + hidden.dim(1)?).min(last);
            if from < to {
                let rows = hidden.narrow(1, 0, to - from)?;
                log_probs.extend(self.scored_log_probs(&rows, &tokens[from + 1..to + 1])?);
            }
            Ok(())
        })?;
        Ok(log_probs)
    }

    /// Run `tokens` after the positions in `cache` (committing them) and
    /// return the natural logs of the next-token probabilities over the
    /// whole vocabulary after each position of `tokens` from `first` on,
    /// `(tokens.len() - first, vocab_size)` in f32: what comparing two
    /// ways of computing the same text needs.
    pub fn log_prob_rows(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        first: usize,
    ) -> Result<Tensor> {
        let mut rows = Vec::new();
        self.each_scored_batch(tokens, cache, first, &mut |_, hidden| {
            let logits = self.output_head(hidden, Pass::Prompt)?;
            rows.push(candle_nn::ops::log_softmax(&logits, 1)?);
            Ok(())
        })?;
        Tensor::cat(&rows, 0).context("output head")
    }

    /// Run `tokens` after the positions in `cache` a prompt batch at a time
    /// (committing them) and hand `scored` the hidden states `(1, n,
    /// hidden)` of each batch's positions from `first` on, with the index
    /// in `tokens` of the first of them.
    fn each_scored_batch(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        first: usize,
        scored: &mut dyn FnMut(usize, &Tensor) -> candle_core::Result<()>,
    ) -> Result<()> {
        cache.reserve(tokens.len())?;
        let mut start = 0;
        for batch in tokens.chunks(PREFILL_BATCH) {
            let hidden = self
                .forward_batch(batch, cache, Pass::Prompt)
                .context("forward pass")?;
            cache.commit(batch);
            let from = first.max(start);
            let end = start + batch.len();
            if from < end {
                hidden
                    .narrow(1, from - start, end - from)
                    .and_then(|rows| scored(from, &rows))
                    .context("output head")?;
            }
            start = end;
        }
        Ok(())
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
