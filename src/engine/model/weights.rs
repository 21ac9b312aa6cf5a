//! The model's matmul weights and embedding table, read from a [`WeightFile`]
//! by their Hugging Face names, each in the in-memory format it runs in.

use super::weight_file::{Stored, WeightFile};
use crate::engine::kernels::rowwise::rms_norm;
use crate::engine::kernels::{InterleavedMatmul, GROUP};
use crate::error::{CandleContext, Result};
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use std::borrow::Cow;
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
///
/// The format decides speed on a CPU. candle's quantized kernels are fast for
/// Q4_0, Q8_0 and the K-quants but fall back to a slow generic loop for Q4_1,
/// Q5_0 and Q5_1, which is what small models (576- or 896-wide rows, too narrow
/// for K-quants) are stored in. So at load time:
/// - Q4_1, Q8_0, Q4_K and Q6_K weights are reordered for our own kernel
///   ([`InterleavedMatmul`]); the other slow types are re-quantized to Q8_0;
///   from a GGUF file both happen as the rows are read, a few groups at a
///   time, so that a whole weight is never held twice;
/// - for prompt tokens (prefill) a dense f32 copy runs a GEMM when
///   [`PrefillWeights::Dense`] is chosen, for every weight candle multiplies.
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
    /// Whether each row of a decode pass is multiplied as it would be alone:
    /// prism's kernel quantizes and multiplies every input row by itself,
    /// where candle's matmuls may sum a row differently beside others.
    pub(crate) fn decodes_rows_alone(&self) -> bool {
        matches!(self.weight, DecodeWeight::Interleaved(_))
    }

    /// [`Linear::forward`] cut by output columns into consecutive parts of
    /// `widths`, each contiguous. prism's kernel writes them apart; other
    /// matmuls' outputs are copied out part by part.
    pub(crate) fn forward_parts(
        &self,
        x: &Tensor,
        pass: Pass,
        widths: &[usize],
    ) -> candle_core::Result<Vec<Tensor>> {
        match self.kernel_for_parts(pass, widths) {
            Some(weight) => self.with_bias(weight.forward_parts(x, widths)?, widths),
            None => {
                let whole = self.forward(x, pass)?;
                let mut start = 0;
                // Each part is copied out whole: the elementwise ops that
                // follow run several times faster on contiguous tensors.
                widths
                    .iter()
                    .map(|&width| {
                        start += width;
                        whole.narrow(2, start - width, width)?.contiguous()
                    })
                    .collect()
            }
        }
    }

    /// [`Linear::forward_parts`] of `x`'s RMS norm scaled by `alpha`. Where
    /// prism's kernel takes the product, each row is normed by the thread
    /// that quantizes it, so the norm is neither a tensor written and read
    /// back nor work left to the batch's thread while the pool waits.
    pub(crate) fn forward_parts_normed(
        &self,
        x: &Tensor,
        (alpha, eps): (&Tensor, f32),
        pass: Pass,
        widths: &[usize],
    ) -> candle_core::Result<Vec<Tensor>> {
        if let Some(weight) = self.kernel_for_parts(pass, widths) {
            if let Some(parts) = weight.forward_parts_normed(x, alpha, eps, widths)? {
                return self.with_bias(parts, widths);
            }
        }
        self.forward_parts(&rms_norm(x, alpha, eps)?, pass, widths)
    }

    /// prism's kernel, where it computes a `pass` in parts of `widths`.
    fn kernel_for_parts(&self, pass: Pass, widths: &[usize]) -> Option<&InterleavedMatmul> {
        match &self.weight {
            DecodeWeight::Interleaved(weight)
                if widths.iter().all(|w| w % GROUP == 0) && self.takes_kernel(pass) =>
            {
                Some(weight)
            }
            _ => None,
        }
    }

    /// `parts` of `widths` columns with the bias's columns added, if any.
    fn with_bias(&self, parts: Vec<Tensor>, widths: &[usize]) -> candle_core::Result<Vec<Tensor>> {
        let Some(bias) = &self.bias else {
            return Ok(parts);
        };
        let mut start = 0;
        parts
            .iter()
            .zip(widths)
            .map(|(part, &width)| {
                start += width;
                part.broadcast_add(&bias.narrow(0, start - width, width)?)
            })
            .collect()
    }

    /// `residual + forward(x, pass)`, which prism's kernel writes in one
    /// pass; a bias or another matmul takes candle's add.
    pub(crate) fn forward_onto(
        &self,
        x: &Tensor,
        residual: &Tensor,
        pass: Pass,
    ) -> candle_core::Result<Tensor> {
        match self.kernel_onto(residual, pass) {
            Some(weight) => weight.forward_onto(x, residual),
            None => residual + self.forward(x, pass)?,
        }
    }

    /// `residual + forward(silu(gate) · up, pass)` where prism's kernel
    /// takes the product and `gate` and `up` are f32 on the CPU: the kernel
    /// quantizes each row's SwiGLU as it computes it, so the elementwise
    /// product is neither written out nor a pass of its own. `None` where
    /// the caller has to compute the SwiGLU first.
    pub(crate) fn swiglu_onto(
        &self,
        gate: &Tensor,
        up: &Tensor,
        residual: &Tensor,
        pass: Pass,
    ) -> candle_core::Result<Option<Tensor>> {
        match self.kernel_onto(residual, pass) {
            Some(weight) => weight.swiglu_onto(gate, up, residual),
            None => Ok(None),
        }
    }

    /// prism's kernel, where it writes a `pass`'s product onto `residual`
    /// itself: no bias to add, and the residual in the CPU's memory.
    fn kernel_onto(&self, residual: &Tensor, pass: Pass) -> Option<&InterleavedMatmul> {
        match (&self.weight, &self.bias) {
            (DecodeWeight::Interleaved(weight), None)
                if self.takes_kernel(pass) && residual.device().is_cpu() =>
            {
                Some(weight)
            }
            _ => None,
        }
    }

    /// Whether [`Linear::forward`] multiplies a `pass` with the decode
    /// weight: a dense copy, where there is one, serves prompts.
    fn takes_kernel(&self, pass: Pass) -> bool {
        self.dense.is_none() || pass == Pass::Decode
    }

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

impl WeightFile {
    /// The token embedding table `name` of `vocab` rows of `hidden`: kept as
    /// stored when it is quantized and the device is the CPU, else dense.
    pub(crate) fn embedding(
        &mut self,
        name: &str,
        (vocab, hidden): (usize, usize),
        device: &Device,
    ) -> Result<Embedding> {
        // Every table our kernel reads is reordered here; re-quantized, a
        // table's lookups would read other values, so the others stay as stored.
        let names = [name.to_string()];
        if let Some(table) = self.streamed(&names, (&[vocab], hidden), false, device)? {
            return Ok(Embedding::Interleaved(table));
        }
        match self.read(name, &[vocab, hidden], device)? {
            Stored::Quantized(table) if device.is_cpu() && table.dtype().block_size() > 1 => {
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
        let bias = if bias {
            Some(self.dense(&format!("{prefix}.bias"), &[out_dim], device)?)
        } else {
            None
        };
        let names = std::slice::from_ref(&name);
        if let Some(matmul) = self.streamed(names, (&[out_dim], in_dim), true, device)? {
            return Ok(Linear::interleaved(matmul, bias));
        }
        let stored = self.read(&name, &[out_dim, in_dim], device)?;
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
        let mut biases = Vec::with_capacity(prefixes.len());
        if bias {
            for (prefix, &out_dim) in prefixes.iter().zip(outs) {
                biases.push(self.dense(&format!("{prefix}.bias"), &[out_dim], device)?);
            }
        }
        let name = format!("{} stacked", prefixes.join(", "));
        let stacked_bias = || match bias {
            true => Tensor::cat(&biases, 0)
                .map(Some)
                .context(format!("stacking the biases of {name}")),
            false => Ok(None),
        };
        let names: Vec<String> = prefixes.iter().map(|p| format!("{p}.weight")).collect();
        if let Some(matmul) = self.streamed(&names, (outs, in_dim), true, device)? {
            return Ok(Projections::Stacked {
                weight: Linear::interleaved(matmul, stacked_bias()?),
                outs: outs.to_vec(),
            });
        }
        let mut parts = Vec::with_capacity(prefixes.len());
        for (name, &out_dim) in names.iter().zip(outs) {
            parts.push(self.read(name, &[out_dim, in_dim], device)?);
        }
        let rows: usize = outs.iter().sum();
        let stacked =
            Stored::stack(&parts, (rows, in_dim), device).context(format!("stacking {name}"))?;
        if let Some(stored) = stacked {
            let bias = stacked_bias()?;
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
    /// [`Linear::decodes_rows_alone`] for every projection.
    pub(crate) fn decodes_rows_alone(&self) -> bool {
        match self {
            Projections::Stacked { weight, .. } => weight.decodes_rows_alone(),
            Projections::Separate(weights) => weights.iter().all(Linear::decodes_rows_alone),
        }
    }

    /// Each projection of the RMS norm of `x` `(1, seq, in)` scaled by
    /// `norm`'s weight, in the order they were read.
    pub(crate) fn forward_normed(
        &self,
        x: &Tensor,
        norm: (&Tensor, f32),
        pass: Pass,
    ) -> candle_core::Result<Vec<Tensor>> {
        match self {
            Projections::Stacked { weight, outs } => {
                weight.forward_parts_normed(x, norm, pass, outs)
            }
            Projections::Separate(linears) => {
                let normed = rms_norm(x, norm.0, norm.1)?;
                linears
                    .iter()
                    .map(|linear| linear.forward(&normed, pass))
                    .collect()
            }
        }
    }
}

impl Linear {
    fn interleaved(matmul: InterleavedMatmul, bias: Option<Tensor>) -> Linear {
        Linear {
            weight: DecodeWeight::Interleaved(matmul),
            dense: None,
            bias,
        }
    }

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
    if !device.is_cpu() || !slow_on_cpu(tensor.dtype()) {
        return Ok(DecodeWeight::Candle(QMatMul::from_arc(tensor)?));
    }
    let requantized = to_q8_0(&tensor, device)?;
    Ok(match InterleavedMatmul::new(&requantized) {
        Some(matmul) => DecodeWeight::Interleaved(matmul),
        None => DecodeWeight::Candle(QMatMul::from_qtensor(requantized)?),
    })
}

/// Whether candle multiplies `dtype` on the CPU with only its slow generic
/// loop, so that a weight stored in it is better re-quantized to Q8_0.
pub(super) fn slow_on_cpu(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1
    )
}

/// `tensor` re-quantized to Q8_0. Blocks quantize one by one, so a weight
/// re-quantized a run of rows at a time gets the same bytes as whole.
fn to_q8_0(tensor: &QTensor, device: &Device) -> candle_core::Result<QTensor> {
    QTensor::quantize(&tensor.dequantize(device)?, GgmlDType::Q8_0)
}

/// The rows in `stored` of a weight `width` wide stored in `dtype`,
/// re-quantized to Q8_0 by [`to_q8_0`], whole groups of rows on each of the
/// pool's threads: on one, re-quantizing was most of Qwen2.5-0.5B's load.
pub(super) fn requantized(
    stored: &[u8],
    dtype: GgmlDType,
    width: usize,
    device: &Device,
) -> candle_core::Result<Vec<u8>> {
    let row_bytes = width / dtype.block_size() * dtype.type_size();
    let groups = stored.len() / row_bytes / GROUP;
    let threads = candle_core::utils::get_num_threads().max(1);
    let share = GROUP * groups.div_ceil(threads).max(1) * row_bytes;
    let mut parts: Vec<(&[u8], candle_core::Result<Vec<u8>>)> = stored
        .chunks(share)
        .map(|part| (part, Ok(Vec::new())))
        .collect();
    crate::engine::pool::each_on_pool(&mut parts, |_, (part, bytes)| {
        *bytes = QStorage::from_data(Cow::Borrowed(part), device, dtype)
            .and_then(|storage| QTensor::new(storage, (part.len() / row_bytes, width)))
            .and_then(|tensor| to_q8_0(&tensor, device))
            .and_then(|tensor| Ok(tensor.data()?.into_owned()));
    });
    let q8_0 = GgmlDType::Q8_0;
    let q8_0_row_bytes = width / q8_0.block_size() * q8_0.type_size();
    let mut requantized = Vec::with_capacity(stored.len() / row_bytes * q8_0_row_bytes);
    for (_, bytes) in parts {
        requantized.extend(bytes?);
    }
    Ok(requantized)
}

#[cfg(test)]
mod tests {
    use super::super::weight_file::gguf_name;
    use super::*;
    use crate::error::Error;
    use candle_core::quantized::gguf_file;
    use std::fs::File;
    use std::path::Path;

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

    /// Values in -1..1 that do not repeat within a row.
    fn weight(rows: usize, width: usize, dtype: GgmlDType, salt: usize) -> QTensor {
        let values: Vec<f32> = (0..rows * width)
            .map(|i| (((i + salt) * 7919) % 1009) as f32 / 504.5 - 1.0)
            .collect();
        let dense = Tensor::from_vec(values, (rows, width), &Device::Cpu).unwrap();
        QTensor::quantize(&dense, dtype).unwrap()
    }

    /// `tensors` (by Hugging Face name) written to a GGUF file in `dir` and
    /// opened again; the file is cut short by `cut` bytes.
    fn gguf_file(dir: &Path, tensors: &[(&str, &QTensor)], cut: u64) -> WeightFile {
        let path = dir.join("weights.gguf");
        let named: Vec<(String, &QTensor)> = tensors
            .iter()
            .map(|&(name, tensor)| (gguf_name(name), tensor))
            .collect();
        let named: Vec<(&str, &QTensor)> = named.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let mut file = File::create(&path).unwrap();
        gguf_file::write(&mut file, &[], &named).unwrap();
        let length = file.metadata().unwrap().len();
        file.set_len(length - cut).unwrap();
        let mut file = File::open(&path).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        WeightFile::gguf(&path, content, file)
    }

    fn outputs(linear: &Linear, x: &Tensor) -> Vec<Vec<f32>> {
        [Pass::Prompt, Pass::Decode]
            .into_iter()
            .map(|pass| linear.forward(x, pass).unwrap().flatten_all().unwrap())
            .map(|out| out.to_vec1::<f32>().unwrap())
            .collect()
    }

    #[test]
    fn weights_reordered_as_they_are_read_multiply_as_whole_ones() {
        let device = Device::Cpu;
        let dir = tempfile::tempdir().unwrap();
        // Q5_0 is re-quantized on the way, the others reordered as stored,
        // each in runs of one to three groups.
        let parts = [
            (
                "model.layers.0.self_attn.q_proj",
                weight(16, 256, GgmlDType::Q5_0, 1),
            ),
            (
                "model.layers.0.self_attn.k_proj",
                weight(8, 256, GgmlDType::Q5_0, 2),
            ),
            (
                "model.layers.0.self_attn.v_proj",
                weight(8, 256, GgmlDType::Q5_0, 3),
            ),
            (
                "model.layers.0.mlp.gate_proj",
                weight(72, 256, GgmlDType::Q4_1, 4),
            ),
            (
                "model.layers.0.mlp.down_proj",
                weight(16, 256, GgmlDType::Q4K, 5),
            ),
            ("lm_head", weight(24, 256, GgmlDType::Q8_0, 6)),
        ];
        let names: Vec<String> = parts.iter().map(|(p, _)| format!("{p}.weight")).collect();
        let tensors: Vec<(&str, &QTensor)> = names
            .iter()
            .zip(&parts)
            .map(|(n, (_, t))| (n.as_str(), t))
            .collect();
        let mut file = gguf_file(dir.path(), &tensors, 0);
        let x = Tensor::from_vec(
            (0..3 * 256)
                .map(|i| ((i * 31) % 97) as f32 / 48.0 - 1.0)
                .collect(),
            (1, 3, 256),
            &device,
        )
        .unwrap();
        let whole = |tensor: &QTensor| {
            let data = tensor.data().unwrap();
            let storage = QStorage::from_data(data, &device, tensor.dtype()).unwrap();
            let copy = QTensor::new(storage, tensor.shape()).unwrap();
            let stored = Stored::Quantized(Arc::new(copy));
            Linear::new(stored, None, PrefillWeights::Quantized, &device).unwrap()
        };
        let prefixes: Vec<String> = parts[..3].iter().map(|(p, _)| p.to_string()).collect();
        let qkv = file
            .projections(
                &prefixes,
                (&[16, 8, 8], 256),
                false,
                PrefillWeights::Quantized,
                &device,
            )
            .unwrap();
        let Projections::Stacked {
            weight: stacked, ..
        } = &qkv
        else {
            panic!("q, k and v stored alike are stacked");
        };
        let streamed = crate::engine::kernels::has_avx2_fma_f16c();
        assert_eq!(
            matches!(stacked.weight, DecodeWeight::Interleaved(_)),
            streamed
        );
        let separate: Vec<Vec<Vec<f32>>> = parts[..3]
            .iter()
            .map(|(_, t)| outputs(&whole(t), &x))
            .collect();
        for (pass, stacked) in outputs(stacked, &x).iter().enumerate() {
            // Row after row, q's columns then k's then v's.
            let expected: Vec<f32> = (0..3)
                .flat_map(|row| {
                    separate.iter().flat_map(move |part| {
                        let width = part[pass].len() / 3;
                        part[pass][row * width..][..width].to_vec()
                    })
                })
                .collect();
            assert_eq!(stacked, &expected);
        }
        for (prefix, tensor) in &parts[3..] {
            let rows = tensor.shape().dims()[0];
            let linear = file
                .linear(
                    prefix,
                    (rows, 256),
                    false,
                    PrefillWeights::Quantized,
                    &device,
                )
                .unwrap();
            assert_eq!(
                matches!(linear.weight, DecodeWeight::Interleaved(_)),
                streamed
            );
            assert_eq!(
                outputs(&linear, &x),
                outputs(&whole(tensor), &x),
                "{prefix}"
            );
        }
    }

    #[test]
    fn a_weight_cut_short_by_the_file_end_is_refused() {
        let device = Device::Cpu;
        let dir = tempfile::tempdir().unwrap();
        let gate = weight(64, 256, GgmlDType::Q4_1, 1);
        let mut file = gguf_file(
            dir.path(),
            &[("model.layers.0.mlp.gate_proj.weight", &gate)],
            100,
        );
        let error = file
            .linear(
                "model.layers.0.mlp.gate_proj",
                (64, 256),
                false,
                PrefillWeights::Quantized,
                &device,
            )
            .expect_err("a weight past the end of the file");
        assert!(matches!(error, Error::BadModelFile { .. }), "{error}");
        assert!(
            error
                .to_string()
                .contains("`blk.0.ffn_gate.weight`: the file ends inside it"),
            "{error}"
        );
        let error = file
            .linear(
                "model.layers.0.mlp.gate_proj",
                (32, 256),
                false,
                PrefillWeights::Quantized,
                &device,
            )
            .expect_err("a shape other than the file's");
        assert!(error.to_string().contains("expected [32, 256]"), "{error}");
    }
}
