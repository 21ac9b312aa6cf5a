//! Reading weights from a GGUF file or safetensors files, by their Hugging Face
//! names, and choosing the in-memory format each matmul runs in.
//!
//! The format decides speed on a CPU. candle's quantized kernels are fast for
//! Q4_0, Q8_0 and the K-quants but fall back to a slow generic loop for Q4_1,
//! Q5_0 and Q5_1, which is what small models (576- or 896-wide rows, too narrow
//! for K-quants) are stored in. So at load time:
//! - Q4_1, Q8_0, Q4_K and Q6_K weights are reordered for our own kernel
//!   ([`InterleavedMatmul`]); the other slow types are re-quantized to Q8_0;
//! - for prompt tokens (prefill) a dense f32 copy runs a GEMM when
//!   [`PrefillWeights::Dense`] is chosen, for every weight candle multiplies.

use super::interleaved::InterleavedMatmul;
use crate::error::{CandleContext, Error, Result};
use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which weights prompt (prefill) passes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefillWeights {
    /// An f32 copy of every matmul weight that candle multiplies: faster
    /// prefill than its quantized kernels, four bytes per parameter more
    /// memory. Weights our own kernel holds need no copy: it serves prompts
    /// about as fast as the copy would.
    Dense,
    /// The stored (or re-quantized) weights, as decode uses them.
    Quantized,
}

/// Which phase a forward pass belongs to; it picks the weights every matmul uses.
///
/// The choice follows the phase, not the number of tokens, so that a prompt
/// token's keys, values and logits come out the same whether it is encoded in
/// one batch, after a cached prefix, or alone as the last uncached token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Encoding prompt tokens.
    Prompt,
    /// Feeding back a generated token.
    Decode,
}

/// The weight a decode step multiplies with.
#[derive(Debug, Clone)]
enum DecodeWeight {
    /// candle's matmul: dense weights, and the quantized types it is fast for.
    Candle(QMatMul),
    Interleaved(InterleavedMatmul),
}

/// A matmul weight, with an optional dense copy for prompts, and an optional bias.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    /// Used for decode steps, and for prompts too when `dense` is absent.
    weight: DecodeWeight,
    /// `(out, in)` in f32, used for prompt tokens.
    dense: Option<Tensor>,
    bias: Option<Tensor>,
}

impl Linear {
    /// `x` is `(1, seq, in)`; the result is `(1, seq, out)`.
    pub(crate) fn forward(&self, x: &Tensor, pass: Pass) -> candle_core::Result<Tensor> {
        let y = match (&self.dense, pass) {
            (Some(dense), Pass::Prompt) => dense_matmul(&x.squeeze(0)?, dense)?.unsqueeze(0)?,
            _ => match &self.weight {
                DecodeWeight::Interleaved(weight) => weight.forward(x)?,
                DecodeWeight::Candle(weight) => weight.forward(x)?,
            },
        };
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}

/// `x (rows, in) · weightᵀ` with a summation order that does not depend on `rows`.
///
/// The GEMM library takes a GEMV shortcut for a single row, whose float sums
/// come out in a different order; a lone prompt token (a prompt that is cached
/// but for its last token) would then get slightly different logits than the
/// same token inside a longer batch. Doubling the row keeps it on the GEMM path.
fn dense_matmul(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    if x.dim(0)? == 1 {
        let doubled = Tensor::cat(&[x, x], 0)?;
        return doubled.matmul(&weight.t()?)?.narrow(0, 0, 1);
    }
    x.matmul(&weight.t()?)
}

/// An open model file, from which tensors are read by their Hugging Face names.
pub(crate) enum WeightFile {
    Gguf {
        path: PathBuf,
        content: gguf_file::Content,
        reader: File,
    },
    Safetensors {
        path: PathBuf,
        tensors: HashMap<String, Tensor>,
    },
}

impl WeightFile {
    pub(crate) fn gguf(path: &Path, content: gguf_file::Content, reader: File) -> Self {
        WeightFile::Gguf {
            path: path.to_path_buf(),
            content,
            reader,
        }
    }

    /// Load every tensor of the given safetensors files (shards of one model).
    pub(crate) fn safetensors(dir: &Path, files: &[PathBuf], device: &Device) -> Result<Self> {
        let mut tensors = HashMap::new();
        for file in files {
            let loaded =
                candle_core::safetensors::load(file, device).map_err(|e| Error::BadModelFile {
                    path: file.clone(),
                    reason: e.to_string(),
                })?;
            tensors.extend(loaded);
        }
        Ok(WeightFile::Safetensors {
            path: dir.to_path_buf(),
            tensors,
        })
    }

    fn path(&self) -> &Path {
        match self {
            WeightFile::Gguf { path, .. } | WeightFile::Safetensors { path, .. } => path,
        }
    }

    fn bad(&self, reason: String) -> Error {
        Error::BadModelFile {
            path: self.path().to_path_buf(),
            reason,
        }
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        match self {
            WeightFile::Gguf { content, .. } => content.tensor_infos.contains_key(&gguf_name(name)),
            WeightFile::Safetensors { tensors, .. } => tensors.contains_key(name),
        }
    }

    /// The tensor `name` as the file stores it (quantized in GGUF files, dense
    /// f32 from safetensors), after checking that its shape is `dims`.
    fn read(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<Stored> {
        let stored = match self {
            WeightFile::Gguf {
                content, reader, ..
            } => {
                let gguf = gguf_name(name);
                if !content.tensor_infos.contains_key(&gguf) {
                    return Err(self.bad(format!("tensor `{gguf}` ({name}) is missing")));
                }
                match content.tensor(reader, &gguf, device) {
                    Ok(tensor) => Stored::Quantized(Arc::new(tensor)),
                    Err(e) => return Err(self.bad(format!("tensor `{gguf}`: {e}"))),
                }
            }
            WeightFile::Safetensors { tensors, .. } => match tensors.get(name) {
                Some(tensor) => Stored::Dense(
                    tensor
                        .to_dtype(candle_core::DType::F32)
                        .context(format!("converting {name} to f32"))?,
                ),
                None => return Err(self.bad(format!("tensor `{name}` is missing"))),
            },
        };
        let found = stored.dims();
        if found != dims {
            return Err(self.bad(format!(
                "tensor `{name}` has shape {found:?}, expected {dims:?}"
            )));
        }
        Ok(stored)
    }

    /// A dense f32 tensor (norm weights, biases, embeddings).
    pub(crate) fn dense(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<Tensor> {
        match self.read(name, dims, device)? {
            Stored::Dense(tensor) => Ok(tensor),
            Stored::Quantized(tensor) => tensor
                .dequantize(device)
                .context(format!("dequantizing {name}")),
        }
    }

    /// The token embedding table `name` of `vocab` rows of `hidden`: kept as
    /// stored when it is quantized and the device is the CPU, else dense.
    pub(crate) fn embedding(
        &mut self,
        name: &str,
        (vocab, hidden): (usize, usize),
        device: &Device,
    ) -> Result<Embedding> {
        match self.read(name, &[vocab, hidden], device)? {
            Stored::Quantized(table) if device.is_cpu() && table.dtype().block_size() > 1 => {
                if let Some(interleaved) = InterleavedMatmul::new(&table) {
                    return Ok(Embedding::Interleaved(interleaved));
                }
                let row_bytes = hidden / table.dtype().block_size() * table.dtype().type_size();
                Ok(Embedding::Quantized {
                    table,
                    row_bytes,
                    hidden,
                })
            }
            Stored::Quantized(table) => Ok(Embedding::Dense(
                table
                    .dequantize(device)
                    .context(format!("dequantizing {name}"))?,
            )),
            Stored::Dense(table) => Ok(Embedding::Dense(table)),
        }
    }

    /// A `(out, in)` matmul weight named `{prefix}.weight`, with `{prefix}.bias` when `bias`.
    pub(crate) fn linear(
        &mut self,
        prefix: &str,
        (out_dim, in_dim): (usize, usize),
        bias: bool,
        prefill: PrefillWeights,
        device: &Device,
    ) -> Result<Linear> {
        let name = format!("{prefix}.weight");
        let stored = self.read(&name, &[out_dim, in_dim], device)?;
        let bias = if bias {
            Some(self.dense(&format!("{prefix}.bias"), &[out_dim], device)?)
        } else {
            None
        };
        Linear::new(stored, bias, prefill, device).context(format!("preparing {name}"))
    }

    /// The matmul weights `{prefix}.weight` of `(outs[i], in)` that read the
    /// same input (with `{prefix}.bias` when `bias`), each read once. They are
    /// stacked into one `(Σ outs, in)` weight whose output columns are theirs
    /// one after another, unless the file stores them in different types
    /// (Q4_K_M files mix Q4_K and Q6_K). One stacked matmul quantizes its
    /// input once and wakes the cores once, where separate ones would do
    /// both for each; each column's dot product is the same.
    pub(crate) fn projections(
        &mut self,
        prefixes: &[String],
        (outs, in_dim): (&[usize], usize),
        bias: bool,
        prefill: PrefillWeights,
        device: &Device,
    ) -> Result<Projections> {
        let mut parts = Vec::with_capacity(prefixes.len());
        let mut biases = Vec::with_capacity(prefixes.len());
        for (prefix, &out_dim) in prefixes.iter().zip(outs) {
            parts.push(self.read(&format!("{prefix}.weight"), &[out_dim, in_dim], device)?);
            if bias {
                biases.push(self.dense(&format!("{prefix}.bias"), &[out_dim], device)?);
            }
        }
        let rows: usize = outs.iter().sum();
        let name = format!("{} stacked", prefixes.join(", "));
        let stacked =
            Stored::stack(&parts, (rows, in_dim), device).context(format!("stacking {name}"))?;
        if let Some(stored) = stacked {
            let bias = if bias {
                let stacked = Tensor::cat(&biases, 0);
                Some(stacked.context(format!("stacking the biases of {name}"))?)
            } else {
                None
            };
            let weight =
                Linear::new(stored, bias, prefill, device).context(format!("preparing {name}"))?;
            return Ok(Projections::Stacked {
                weight,
                outs: outs.to_vec(),
            });
        }
        let mut biases = biases.into_iter();
        let mut linears = Vec::with_capacity(parts.len());
        for (stored, prefix) in parts.into_iter().zip(prefixes) {
            // Empty unless `bias`, so a part without one gets `None`.
            linears.push(
                Linear::new(stored, biases.next(), prefill, device)
                    .context(format!("preparing {prefix}.weight"))?,
            );
        }
        Ok(Projections::Separate(linears))
    }
}

/// Matmuls that read the same input: one stacked weight where the file
/// stores them alike, else one matmul each.
pub(crate) enum Projections {
    Stacked { weight: Linear, outs: Vec<usize> },
    Separate(Vec<Linear>),
}

impl Projections {
    /// Each projection of `x` `(1, seq, in)`, in the order they were read.
    pub(crate) fn forward(&self, x: &Tensor, pass: Pass) -> candle_core::Result<Vec<Tensor>> {
        match self {
            Projections::Stacked { weight, outs } => {
                let stacked = weight.forward(x, pass)?;
                let mut start = 0;
                // Each part is copied out whole: the elementwise ops that
                // follow run several times faster on contiguous tensors.
                outs.iter()
                    .map(|&out| {
                        let part = stacked.narrow(2, start, out)?.contiguous();
                        start += out;
                        part
                    })
                    .collect()
            }
            Projections::Separate(linears) => linears
                .iter()
                .map(|linear| linear.forward(x, pass))
                .collect(),
        }
    }
}

impl Linear {
    /// The matmul of a weight as the file stores it, with its dense copy
    /// for prompts when `prefill` asks for one and candle multiplies it.
    fn new(
        stored: Stored,
        bias: Option<Tensor>,
        prefill: PrefillWeights,
        device: &Device,
    ) -> candle_core::Result<Linear> {
        let (weight, dense) = match stored {
            Stored::Dense(tensor) => (DecodeWeight::Candle(QMatMul::Tensor(tensor)), None),
            Stored::Quantized(tensor) => {
                let weight = decode_weight(Arc::clone(&tensor), device)?;
                let wants_copy = matches!(weight, DecodeWeight::Candle(_))
                    && prefill == PrefillWeights::Dense
                    && device.is_cpu();
                let dense = wants_copy.then(|| tensor.dequantize(device)).transpose()?;
                (weight, dense)
            }
        };
        Ok(Linear {
            weight,
            dense,
            bias,
        })
    }
}

/// The token embedding table. A quantized table stays quantized and only the
/// rows a batch looks up are dequantized: the f32 table of a 150k-token
/// vocabulary is most of a small model's memory (0.9 GB for Qwen-1.5B, whose
/// file is 1.1 GB).
pub(crate) enum Embedding {
    Dense(Tensor),
    /// A table in a format our kernel reads, so that a tied output head
    /// multiplies with the very bytes the lookups read.
    Interleaved(InterleavedMatmul),
    Quantized {
        table: Arc<QTensor>,
        /// Bytes of one row: whole blocks, since GGUF rows hold whole blocks.
        row_bytes: usize,
        hidden: usize,
    },
}

impl Embedding {
    /// The output head of a model whose head is tied to its embeddings: a
    /// matmul over this very table, quantized as it is stored, with no
    /// dense copy for prompts.
    pub(crate) fn as_output_head(&self, device: &Device) -> candle_core::Result<Linear> {
        let weight = match self {
            Embedding::Dense(table) => DecodeWeight::Candle(QMatMul::Tensor(table.clone())),
            Embedding::Interleaved(table) => DecodeWeight::Interleaved(table.clone()),
            Embedding::Quantized { table, .. } => decode_weight(table.clone(), device)?,
        };
        Ok(Linear {
            weight,
            dense: None,
            bias: None,
        })
    }

    /// The rows of `tokens`, as `(tokens, hidden)` f32.
    pub(crate) fn rows(&self, tokens: &[u32], device: &Device) -> candle_core::Result<Tensor> {
        match self {
            Embedding::Dense(table) => table.index_select(&Tensor::new(tokens, device)?, 0),
            Embedding::Interleaved(table) => {
                let mut rows = Vec::new();
                for &token in tokens {
                    rows.extend(table.row(token as usize).ok_or_else(|| {
                        candle_core::Error::Msg(format!(
                            "token id {token} is outside the embedding table"
                        ))
                    })?);
                }
                Tensor::from_vec(rows, (tokens.len(), table.width()), device)
            }
            Embedding::Quantized {
                table,
                row_bytes,
                hidden,
            } => {
                let data = table.data()?;
                let mut rows = Vec::with_capacity(tokens.len() * row_bytes);
                for &token in tokens {
                    let start = token as usize * row_bytes;
                    let row = data.get(start..start + row_bytes).ok_or_else(|| {
                        candle_core::Error::Msg(format!(
                            "token id {token} is outside the embedding table"
                        ))
                    })?;
                    rows.extend_from_slice(row);
                }
                let storage = QStorage::from_data(Cow::Owned(rows), device, table.dtype())?;
                QTensor::new(storage, (tokens.len(), *hidden))?.dequantize(device)
            }
        }
    }
}

/// The quantized weight that single-token steps multiply with: reordered for
/// [`InterleavedMatmul`] when it reads the type, as stored when candle has a
/// fast CPU kernel for it, else re-quantized to Q8_0 for one of the two.
fn decode_weight(tensor: Arc<QTensor>, device: &Device) -> candle_core::Result<DecodeWeight> {
    if let Some(matmul) = InterleavedMatmul::new(&tensor) {
        return Ok(DecodeWeight::Interleaved(matmul));
    }
    let slow_on_cpu = matches!(
        tensor.dtype(),
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1
    );
    if !device.is_cpu() || !slow_on_cpu {
        return Ok(DecodeWeight::Candle(QMatMul::from_arc(tensor)?));
    }
    let requantized = QTensor::quantize(&tensor.dequantize(device)?, GgmlDType::Q8_0)?;
    Ok(match InterleavedMatmul::new(&requantized) {
        Some(matmul) => DecodeWeight::Interleaved(matmul),
        None => DecodeWeight::Candle(QMatMul::from_qtensor(requantized)?),
    })
}

enum Stored {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
}

impl Stored {
    /// `parts` stacked row after row into one `(rows, in)` tensor, when
    /// they are stored alike: all dense, or all of one quantized type on
    /// the CPU (whose rows are whole blocks, so their bytes stack as rows).
    fn stack(
        parts: &[Stored],
        (rows, in_dim): (usize, usize),
        device: &Device,
    ) -> candle_core::Result<Option<Stored>> {
        let dense: Vec<&Tensor> = parts
            .iter()
            .filter_map(|part| match part {
                Stored::Dense(tensor) => Some(tensor),
                Stored::Quantized(_) => None,
            })
            .collect();
        if dense.len() == parts.len() {
            return Tensor::cat(&dense, 0).map(|tensor| Some(Stored::Dense(tensor)));
        }
        let quantized: Vec<&Arc<QTensor>> = parts
            .iter()
            .filter_map(|part| match part {
                Stored::Quantized(tensor) => Some(tensor),
                Stored::Dense(_) => None,
            })
            .collect();
        let Some(dtype) = quantized.first().map(|tensor| tensor.dtype()) else {
            return Ok(None);
        };
        let alike = quantized.len() == parts.len()
            && quantized.iter().all(|tensor| tensor.dtype() == dtype);
        if !alike || !device.is_cpu() {
            return Ok(None);
        }
        let mut bytes = Vec::new();
        for tensor in quantized {
            bytes.extend_from_slice(&tensor.data()?);
        }
        let storage = QStorage::from_data(Cow::Owned(bytes), device, dtype)?;
        let stacked = QTensor::new(storage, (rows, in_dim))?;
        Ok(Some(Stored::Quantized(Arc::new(stacked))))
    }

    fn dims(&self) -> Vec<usize> {
        match self {
            Stored::Quantized(tensor) => tensor.shape().dims().to_vec(),
            Stored::Dense(tensor) => tensor.dims().to_vec(),
        }
    }
}

/// The GGUF name of a Hugging Face weight name, as llama.cpp's converter writes it.
fn gguf_name(hf_name: &str) -> String {
    const WHOLE: [(&str, &str); 3] = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    const PARTS: [(&str, &str); 9] = [
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    if let Some((_, gguf)) = WHOLE.iter().find(|(hf, _)| *hf == hf_name) {
        return gguf.to_string();
    }
    let mut name = hf_name.replacen("model.layers.", "blk.", 1);
    for (hf, gguf) in PARTS {
        name = name.replacen(hf, gguf, 1);
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantized_embedding_gives_the_rows_of_the_dequantized_table() {
        let device = Device::Cpu;
        let values: Vec<f32> = (0..8 * 64)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let table = Tensor::from_vec(values, (8, 64), &device).unwrap();
        let quantized = Arc::new(QTensor::quantize(&table, GgmlDType::Q8_0).unwrap());
        let dense = quantized.dequantize(&device).unwrap();
        let mut embeddings = vec![Embedding::Quantized {
            row_bytes: 64 / 32 * GgmlDType::Q8_0.type_size(),
            table: quantized.clone(),
            hidden: 64,
        }];
        // Where this CPU runs our kernel, the table it reorders too.
        embeddings.extend(InterleavedMatmul::new(&quantized).map(Embedding::Interleaved));
        let tokens = [5, 0, 7, 2];
        let expected = dense
            .index_select(&Tensor::new(&tokens, &device).unwrap(), 0)
            .unwrap();
        for embedding in embeddings {
            let rows = embedding.rows(&tokens, &device).unwrap();
            assert_eq!(
                rows.to_vec2::<f32>().unwrap(),
                expected.to_vec2::<f32>().unwrap()
            );
            assert!(embedding.rows(&[8], &device).is_err(), "past the table");
        }
    }

    #[test]
    fn hugging_face_names_map_to_llama_cpp_names() {
        assert_eq!(gguf_name("model.embed_tokens.weight"), "token_embd.weight");
        assert_eq!(gguf_name("lm_head.weight"), "output.weight");
        assert_eq!(
            gguf_name("model.layers.12.self_attn.q_proj.bias"),
            "blk.12.attn_q.bias"
        );
        assert_eq!(
            gguf_name("model.layers.0.post_attention_layernorm.weight"),
            "blk.0.ffn_norm.weight"
        );
        assert_eq!(
            gguf_name("model.layers.3.mlp.down_proj.weight"),
            "blk.3.ffn_down.weight"
        );
    }
}
