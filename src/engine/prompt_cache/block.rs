//! One block file of the prompt cache: how its key is derived, how its keys
//! and values are written, and the checks it must pass before it is read.

use super::super::kv_cache::KvDtype;
use candle_core::safetensors::Load;
use candle_core::{Device, Tensor};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// Written into every block file and the index; anything else is not ours.
pub(super) const FORMAT: &str = "prism-kv-blocks-1";

/// The KV of one block in the cache's layout, for every layer: `(keys,
/// values)` shaped `(1, kv_heads, tokens, row_width)`.
pub(super) type Layers = Vec<(Tensor, Tensor)>;

/// The shape every tensor of a model's blocks shares, but for its token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    pub layers: usize,
    pub kv_heads: usize,
    /// Stored elements per row of a head (see `KvDtype::row_width`).
    pub row_width: usize,
}

/// What a block must be to be used: whose, of which tokens, after which block.
#[derive(Debug, Clone, Copy)]
pub(super) struct Expected<'a> {
    pub model_sha256: &'a str,
    pub kv_dtype: KvDtype,
    pub parent: Option<&'a str>,
    pub tokens: &'a [u32],
    pub geometry: Geometry,
}

/// A block's key: the hex sha256 of the format, the model, the KV dtype, the
/// parent block's key and the block's token ids. Through the parent it stands
/// for every token before the block too, so equal keys mean equal prefixes
/// and a stored prefix is found by hashing the prompt block by block.
pub(super) fn key(
    model_sha256: &str,
    kv_dtype: KvDtype,
    parent: Option<&str>,
    tokens: &[u32],
) -> String {
    let mut hasher = Sha256::new();
    for field in [FORMAT, model_sha256, kv_dtype.name(), parent.unwrap_or("")] {
        hasher.update(field.as_bytes());
        hasher.update([0]);
    }
    hasher.update((tokens.len() as u32).to_le_bytes());
    for token in tokens {
        hasher.update(token.to_le_bytes());
    }
    format!("{:x}", hasher.finalize())
}

impl Expected<'_> {
    pub fn key(&self) -> String {
        key(self.model_sha256, self.kv_dtype, self.parent, self.tokens)
    }

    /// The file's bytes: each layer's keys `k.N` and values `v.N`, and
    /// metadata that repeats everything the key hashes and the sha256 of
    /// the tensors' bytes.
    pub fn encode(&self, layers: &[(Tensor, Tensor)]) -> Result<Vec<u8>, String> {
        let mut named = Vec::with_capacity(2 * layers.len());
        for (layer, (keys, values)) in layers.iter().enumerate() {
            named.push((format!("k.{layer}"), Raw::of(keys, self.kv_dtype)?));
            named.push((format!("v.{layer}"), Raw::of(values, self.kv_dtype)?));
        }
        let mut hasher = Sha256::new();
        for (_, raw) in &named {
            hasher.update(&raw.bytes);
        }
        let metadata = self.metadata(format!("{:x}", hasher.finalize()));
        let views = named.iter().map(|(name, raw)| (name, raw));
        safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())
    }

    fn metadata(&self, data_sha256: String) -> HashMap<String, String> {
        let tokens: Vec<String> = self.tokens.iter().map(u32::to_string).collect();
        HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("model_sha256".to_string(), self.model_sha256.to_string()),
            ("kv_dtype".to_string(), self.kv_dtype.name().to_string()),
            ("parent".to_string(), self.parent.unwrap_or("").to_string()),
            ("tokens".to_string(), tokens.join(",")),
            ("data_sha256".to_string(), data_sha256),
        ])
    }

    /// Check the file's `bytes` against what this block must be, and return
    /// its tensors on `device`, narrowed to their first `used` positions.
    /// The error says why the block is refused.
    pub fn decode(&self, bytes: &[u8], used: usize, device: &Device) -> Result<Layers, String> {
        let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
        let views = self.checked(bytes, &file)?;
        let used = used.min(self.tokens.len());
        // Loaded where the cache lives: a GPU cache refuses CPU tensors.
        let load = |(name, view): &(String, safetensors::tensor::TensorView)| {
            let tensor = view.load(device).map_err(|e| format!("{name}: {e}"))?;
            let prefix = tensor.narrow(2, 0, used).and_then(|t| t.contiguous());
            prefix.map_err(|e| format!("{name}: {e}"))
        };
        views
            .chunks(2)
            .map(|pair| Ok((load(&pair[0])?, load(&pair[1])?)))
            .collect()
    }

    /// Check the file's `bytes` against what this block must be, without
    /// loading its tensors. The error says why the block is refused.
    pub fn check(&self, bytes: &[u8]) -> Result<(), String> {
        let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
        self.checked(bytes, &file).map(|_| ())
    }

    /// The tensors of `file` (parsed from `bytes`) in layer order, `k.0`,
    /// `v.0`, `k.1` …, once its metadata, shapes and checksum pass.
    fn checked<'b>(
        &self,
        bytes: &[u8],
        file: &safetensors::SafeTensors<'b>,
    ) -> Result<Vec<(String, safetensors::tensor::TensorView<'b>)>, String> {
        let (_, header) =
            safetensors::SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let field = |name: &str| metadata.get(name).map(String::as_str);
        if field("format") != Some(FORMAT) {
            return Err("it is not a prism KV block".into());
        }
        if field("model_sha256") != Some(self.model_sha256) {
            return Err("it was computed by another model".into());
        }
        if field("kv_dtype") != Some(self.kv_dtype.name()) {
            return Err("it holds another KV dtype".into());
        }
        if field("parent") != Some(self.parent.unwrap_or("")) {
            return Err("it follows another block than the index says".into());
        }
        let tokens: Vec<String> = self.tokens.iter().map(u32::to_string).collect();
        if field("tokens") != Some(tokens.join(",").as_str()) {
            return Err("it holds other tokens than the index says".into());
        }
        let Geometry {
            layers,
            kv_heads,
            row_width,
        } = self.geometry;
        if file.len() != 2 * layers {
            return Err(format!(
                "it holds {} tensors where the model has {layers} layers of keys and values",
                file.len()
            ));
        }
        let shape = [1, kv_heads, self.tokens.len(), row_width];
        let dtype = stored_dtype(self.kv_dtype);
        let mut hasher = Sha256::new();
        let mut views = Vec::with_capacity(2 * layers);
        for layer in 0..layers {
            for name in [format!("k.{layer}"), format!("v.{layer}")] {
                let view = file.tensor(&name).map_err(|e| format!("{name}: {e}"))?;
                if view.shape() != shape || view.dtype() != dtype {
                    return Err(format!(
                        "{name} is {:?} {:?}, not {dtype:?} {shape:?}",
                        view.dtype(),
                        view.shape(),
                    ));
                }
                hasher.update(view.data());
                views.push((name, view));
            }
        }
        if field("data_sha256") != Some(format!("{:x}", hasher.finalize()).as_str()) {
            return Err("its bytes do not match the sha256 recorded when it was stored".into());
        }
        Ok(views)
    }
}

/// A tensor's bytes as safetensors stores them (little-endian, in memory
/// order), read once both to hash and to write.
struct Raw {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Raw {
    fn of(tensor: &Tensor, kv_dtype: KvDtype) -> Result<Raw, String> {
        let flat = tensor.flatten_all().map_err(|e| e.to_string())?;
        let bytes = match kv_dtype {
            KvDtype::Q8 => flat.to_vec1::<u8>(),
            KvDtype::F32 => flat
                .to_vec1::<f32>()
                .map(|v| le_bytes(&v, f32::to_le_bytes)),
            KvDtype::F16 => flat
                .to_vec1::<half::f16>()
                .map(|v| le_bytes(&v, half::f16::to_le_bytes)),
            KvDtype::Bf16 => flat
                .to_vec1::<half::bf16>()
                .map(|v| le_bytes(&v, half::bf16::to_le_bytes)),
        };
        Ok(Raw {
            dtype: stored_dtype(kv_dtype),
            shape: tensor.dims().to_vec(),
            bytes: bytes.map_err(|e| e.to_string())?,
        })
    }
}

fn le_bytes<T: Copy, const N: usize>(values: &[T], to_bytes: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to_bytes(v)).collect()
}

impl safetensors::View for &Raw {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }

    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn stored_dtype(kv_dtype: KvDtype) -> safetensors::Dtype {
    match kv_dtype {
        KvDtype::F32 => safetensors::Dtype::F32,
        KvDtype::F16 => safetensors::Dtype::F16,
        KvDtype::Bf16 => safetensors::Dtype::BF16,
        KvDtype::Q8 => safetensors::Dtype::U8,
    }
}
