//! An open GGUF file or set of safetensors files, whose tensors are read by
//! their Hugging Face names: as stored, dense, or reordered as they are read.

use super::weights::{requantized, slow_on_cpu};
use crate::engine::kernels::{InterleavedMatmul, Interleaver, GROUP};
use crate::error::{CandleContext, Error, Result};
use candle_core::quantized::{gguf_file, GgmlDType, QStorage, QTensor};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{Device, Tensor};
use std::borrow::Cow;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// About how many bytes of a weight's stored rows are read from the file at
/// a time when it is reordered as it is read ([`WeightFile::streamed`]).
/// Unit tests read one to three groups at a time, so that their small
/// weights take several runs and a run is shared among threads.
const STREAMED_BYTES: usize = if cfg!(test) { 4096 } else { 4 << 20 };

/// An open model file, from which tensors are read by their Hugging Face names.
pub(crate) enum WeightFile {
    Gguf {
        path: PathBuf,
        content: gguf_file::Content,
        reader: File,
    },
    Safetensors {
        path: PathBuf,
        /// Each file mapped, not read: a tensor is copied out when it is
        /// loaded, and the file's pages stay the kernel's to drop.
        files: Vec<MmapedSafetensors>,
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

    /// Map the given safetensors files (shards of one model) and check
    /// their headers.
    pub(crate) fn safetensors(dir: &Path, files: &[PathBuf]) -> Result<Self> {
        let mut mapped = Vec::with_capacity(files.len());
        for file in files {
            // SAFETY: the mapping is read-only and prism never writes a
            // model file; as llama.cpp does with the files it maps, it
            // trusts other programs not to rewrite one while it runs.
            let map = unsafe { MmapedSafetensors::new(file) }.map_err(|e| match e {
                // The error line names the file already.
                candle_core::Error::WithPath { inner, .. } => *inner,
                e => e,
            });
            mapped.push(map.map_err(|e| bad_file(file, e.to_string()))?);
        }
        Ok(WeightFile::Safetensors {
            path: dir.to_path_buf(),
            files: mapped,
        })
    }

    /// The mapped file of a safetensors model that holds tensor `name`.
    fn mapped_file<'a>(
        files: &'a [MmapedSafetensors],
        name: &str,
    ) -> Option<&'a MmapedSafetensors> {
        files.iter().find(|file| file.get(name).is_ok())
    }

    fn path(&self) -> &Path {
        match self {
            WeightFile::Gguf { path, .. } | WeightFile::Safetensors { path, .. } => path,
        }
    }

    fn bad(&self, reason: String) -> Error {
        bad_file(self.path(), reason)
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        match self {
            WeightFile::Gguf { content, .. } => content.tensor_infos.contains_key(&gguf_name(name)),
            WeightFile::Safetensors { files, .. } => Self::mapped_file(files, name).is_some(),
        }
    }

    /// The tensor `name` as the file stores it (quantized in GGUF files, dense
    /// f32 from safetensors), after checking that its shape is `dims`.
    pub(super) fn read(&mut self, name: &str, dims: &[usize], device: &Device) -> Result<Stored> {
        let stored = match self {
            WeightFile::Gguf {
                path,
                content,
                reader,
            } => {
                let (gguf, info) = gguf_tensor(path, content, name, dims)?;
                match info.read(reader, content.tensor_data_offset, device) {
                    Ok(tensor) => Stored::Quantized(Arc::new(tensor)),
                    Err(e) => return Err(bad_file(path, format!("tensor `{gguf}`: {e}"))),
                }
            }
            WeightFile::Safetensors { path, files } => match Self::mapped_file(files, name) {
                Some(file) => Stored::Dense(
                    file.load(name, device)
                        .and_then(|tensor| tensor.to_dtype(candle_core::DType::F32))
                        .map_err(|e| bad_file(path, format!("tensor `{name}`: {e}")))?,
                ),
                None => return Err(bad_file(path, format!("tensor `{name}` is missing"))),
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

    /// The matmul weights `names` (`outs[i]` rows of `in_dim`), stacked row
    /// after row into one matmul for our own kernel and reordered as they are
    /// read from a GGUF file, a few groups of rows at a time; when
    /// `requantize`, a type the kernel does not take is re-quantized to Q8_0
    /// on the way, as `decode_weight` does. Read whole, a weight's file
    /// bytes, candle's blocks of them and the reordered copy were held at
    /// once: Qwen2.5-0.5B's load peaked at 979 MB for 711 MB loaded.
    ///
    /// `None` where the kernel does not take them: from safetensors files,
    /// on another device, stored in different types or in one it cannot
    /// take, in rows that are not whole groups.
    pub(super) fn streamed(
        &mut self,
        names: &[String],
        (outs, in_dim): (&[usize], usize),
        requantize: bool,
        device: &Device,
    ) -> Result<Option<InterleavedMatmul>> {
        let WeightFile::Gguf {
            path,
            content,
            reader,
        } = self
        else {
            return Ok(None);
        };
        let mut parts = Vec::with_capacity(names.len());
        for (name, &rows) in names.iter().zip(outs) {
            let (gguf, info) = gguf_tensor(path, content, name, &[rows, in_dim])?;
            parts.push((gguf, info.ggml_dtype, info.offset, rows));
        }
        let Some(&(_, dtype, _, _)) = parts.first() else {
            return Ok(None);
        };
        let whole = parts
            .iter()
            .all(|&(_, part_dtype, _, rows)| part_dtype == dtype && rows.is_multiple_of(GROUP));
        if !device.is_cpu() || !whole || !in_dim.is_multiple_of(dtype.block_size()) {
            return Ok(None);
        }
        let shape = (outs.iter().sum(), in_dim);
        let (mut interleaver, requantizing) = match Interleaver::new(dtype, shape) {
            Some(interleaver) => (interleaver, false),
            None if requantize && slow_on_cpu(dtype) => {
                match Interleaver::new(GgmlDType::Q8_0, shape) {
                    Some(interleaver) => (interleaver, true),
                    None => return Ok(None),
                }
            }
            None => return Ok(None),
        };
        let row_bytes = in_dim / dtype.block_size() * dtype.type_size();
        let run_rows = GROUP * (STREAMED_BYTES / (GROUP * row_bytes)).max(1);
        let mut stored = Vec::new();
        for (gguf, _, offset, rows) in parts {
            let failed = |e: String| bad_file(path, format!("tensor `{gguf}`: {e}"));
            let start = content.tensor_data_offset.saturating_add(offset);
            reader
                .seek(SeekFrom::Start(start))
                .map_err(|e| failed(e.to_string()))?;
            for first in (0..rows).step_by(run_rows) {
                let run = run_rows.min(rows - first);
                stored.resize(run * row_bytes, 0);
                reader.read_exact(&mut stored).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => failed("the file ends inside it".into()),
                    _ => failed(e.to_string()),
                })?;
                let pushed = if requantizing {
                    requantized(&stored, dtype, in_dim, device)
                        .and_then(|bytes| interleaver.push(&bytes))
                } else {
                    interleaver.push(&stored)
                };
                pushed.map_err(|e| failed(e.to_string()))?;
            }
        }
        let names = names.join(", ");
        Ok(Some(
            interleaver
                .finish()
                .context(format!("reordering {names}"))?,
        ))
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
}

/// The GGUF name of the tensor `name` and what the file says of it, after
/// checking that it is there and of shape `dims`.
fn gguf_tensor<'a>(
    path: &Path,
    content: &'a gguf_file::Content,
    name: &str,
    dims: &[usize],
) -> Result<(String, &'a gguf_file::TensorInfo)> {
    let gguf = gguf_name(name);
    let Some(info) = content.tensor_infos.get(&gguf) else {
        return Err(bad_file(
            path,
            format!("tensor `{gguf}` ({name}) is missing"),
        ));
    };
    let found = info.shape.dims();
    if found != dims {
        return Err(bad_file(
            path,
            format!("tensor `{name}` has shape {found:?}, expected {dims:?}"),
        ));
    }
    Ok((gguf, info))
}

fn bad_file(path: &Path, reason: String) -> Error {
    Error::BadModelFile {
        path: path.to_path_buf(),
        reason,
    }
}

pub(super) enum Stored {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
}

impl Stored {
    /// `parts` stacked row after row into one `(rows, in)` tensor, when
    /// they are stored alike: all dense, or all of one quantized type on
    /// the CPU (whose rows are whole blocks, so their bytes stack as rows).
    pub(super) fn stack(
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
pub(super) fn gguf_name(hf_name: &str) -> String {
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
