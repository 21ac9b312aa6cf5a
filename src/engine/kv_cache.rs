//! The KV cache: per-layer keys and values for a token sequence, which knows the
//! token ids it holds so that a new prompt can reuse the longest common prefix.

use crate::error::{CandleContext, Result};
use candle_core::{DType, Device, Tensor};
use half::slice::HalfFloatSliceExt;

const INITIAL_CAPACITY: usize = 256;

/// How the cache stores keys and values (`--kv-dtype`). Attention always
/// computes in f32; a 16-bit cache halves the memory a long context takes
/// and the bytes each decode step reads, and rounds every key and value to
/// 16 bits, so logits move from f32's by more than the 1e-4 that cached and
/// uncached runs agree to (see the README). An 8-bit cache halves them
/// again: each row of a head is stored as integers and one scale, which
/// rounds a value by up to half a 127th of its row's largest magnitude. The
/// CPU kernels alone read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    #[default]
    F32,
    F16,
    Bf16,
    Q8,
}

impl KvDtype {
    pub fn dtype(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::Bf16 => DType::BF16,
            KvDtype::Q8 => DType::U8,
        }
    }

    /// Stored elements per row of a head of `head_dim` values: an 8-bit
    /// row's integers are followed by the bytes of its scale.
    pub fn row_width(self, head_dim: usize) -> usize {
        match self {
            KvDtype::Q8 => head_dim + Q8_SCALE_BYTES,
            _ => head_dim,
        }
    }

    /// As `--kv-dtype` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8 => "q8",
        }
    }

    /// For `skip_serializing_if`: identities and fingerprints written before
    /// the choice existed stay as they were.
    pub(crate) fn is_f32(&self) -> bool {
        *self == KvDtype::F32
    }
}

impl std::str::FromStr for KvDtype {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "bf16" => Ok(KvDtype::Bf16),
            "q8" => Ok(KvDtype::Q8),
            other => Err(crate::Error::invalid_setting(
                crate::Setting::KvDtype,
                format!("`{other}` is not one of f32, f16, bf16, q8"),
            )),
        }
    }
}

/// Bytes after the integers of each row of an 8-bit cache: the row's f32
/// scale, little-endian.
pub(crate) const Q8_SCALE_BYTES: usize = 4;

/// Rows of `head_dim` floats as the rows of an 8-bit cache: each row's
/// integers as [`quantize_row`] gives them, then its scale.
pub(crate) fn quantize_rows(values: &[f32], head_dim: usize) -> Vec<u8> {
    let width = head_dim + Q8_SCALE_BYTES;
    let mut stored = vec![0u8; values.len() / head_dim.max(1) * width];
    for (row, out) in values
        .chunks_exact(head_dim)
        .zip(stored.chunks_exact_mut(width))
    {
        let (integers, scale) = out.split_at_mut(head_dim);
        scale.copy_from_slice(&quantize_row(row, integers).to_le_bytes());
    }
    stored
}

/// Write each value of `row` over the row's scale (its largest magnitude
/// over 127), rounded to the nearest integer, as its two's-complement byte
/// into `out`, and return the scale. A row of zeros has scale zero.
///
/// Where the CPU has AVX2 the same steps run eight values at a time: the
/// compiler's own vector code for them kept the largest magnitude a scalar
/// chain and took about 2% of a sixteen-sequence decode step.
pub(crate) fn quantize_row(row: &[f32], out: &mut [u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { quantize_row_avx2(row, out) };
    }
    quantize_row_portable(row, out)
}

/// [`quantize_row`] in AVX2 registers, to the bits of
/// [`quantize_row_portable`] for every value that is a number: a maximum is
/// exact in any order, and a value rounds half away from zero as its
/// truncation plus the truncation of twice what that left (exact for
/// magnitudes below 2^23).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_row_avx2(row: &[f32], out: &mut [u8]) -> f32 {
    use std::arch::x86_64::*;
    const TRUNCATE: i32 = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
    let (runs, rest) = row.as_chunks::<8>();
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut largest = _mm256_setzero_ps();
    for run in runs {
        // SAFETY: `run` holds eight floats.
        let v = unsafe { _mm256_loadu_ps(run.as_ptr()) };
        largest = _mm256_max_ps(_mm256_and_ps(v, magnitude), largest);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), largest) };
    let largest = lanes
        .into_iter()
        .chain(rest.iter().map(|v| v.abs()))
        .fold(0f32, f32::max);
    let scale = largest / 127.0;
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let len = row.len().min(out.len());
    let (runs, rest) = row[..len].as_chunks::<8>();
    let (out_runs, out_rest) = out[..len].as_chunks_mut::<8>();
    let factor = _mm256_set1_ps(inverse);
    for (run, out) in runs.iter().zip(out_runs) {
        // SAFETY: `run` holds eight floats.
        let scaled = _mm256_mul_ps(unsafe { _mm256_loadu_ps(run.as_ptr()) }, factor);
        let whole = _mm256_round_ps::<TRUNCATE>(scaled);
        let left = _mm256_sub_ps(scaled, whole);
        let rounded = _mm256_add_ps(
            whole,
            _mm256_round_ps::<TRUNCATE>(_mm256_add_ps(left, left)),
        );
        let integers = _mm256_cvttps_epi32(rounded);
        // Within ±127, so packing keeps every value; lanes 0-3 and 4-7 of
        // the 32-bit integers come out as bytes 0-3 and 4-7 of the halves.
        let words = _mm_packs_epi32(
            _mm256_castsi256_si128(integers),
            _mm256_extracti128_si256::<1>(integers),
        );
        let bytes = _mm_packs_epi16(words, words);
        // SAFETY: `out` holds eight bytes.
        unsafe { _mm_storel_epi64(out.as_mut_ptr().cast(), bytes) };
    }
    for (out, value) in out_rest.iter_mut().zip(rest) {
        *out = (value * inverse).round() as i8 as u8;
    }
    scale
}

#[inline(always)]
fn quantize_row_portable(row: &[f32], out: &mut [u8]) -> f32 {
    let largest = row
        .iter()
        .fold(0f32, |largest, value| largest.max(value.abs()));
    let scale = largest / 127.0;
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (out, value) in out.iter_mut().zip(row) {
        *out = (value * inverse).round() as i8 as u8;
    }
    scale
}

/// Write f32 `rows` `(1, kv_heads, seq, head_dim)`, whatever their strides,
/// into the CPU cache tensor `to` at position `at`, converted or quantized
/// to its dtype as [`KvCache::stored`] would. Returns whether it applied:
/// both tensors on the CPU, `rows` in f32 with its values contiguous.
/// `rows` is never a view of the cache: its storage stays read-locked
/// while the cache's is written.
///
/// A decode step's few rows went through a copy, a conversion, a new
/// tensor and a slice copy on the way. Written in place, a SmolLM2 decode
/// step's appends and rotations took 0.16-0.17 ms instead of 0.25-0.29 for
/// one sequence and 0.51-0.53 instead of 0.67-0.74 for four (a step probe,
/// builds alternated).
fn write_in_place(rows: &Tensor, to: &Tensor, at: usize) -> candle_core::Result<bool> {
    let (storage, layout) = rows.storage_and_layout();
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(source)) = &*storage else {
        return Ok(false);
    };
    if !to.device().is_cpu() || layout.stride()[3] != 1 {
        return Ok(false);
    }
    to.inplace_op1(&WriteRows { source, layout, at })?;
    Ok(true)
}

/// [`write_in_place`]'s work on the cache's storage.
struct WriteRows<'a> {
    source: &'a [f32],
    layout: &'a candle_core::Layout,
    at: usize,
}

impl candle_core::InplaceOp1 for WriteRows<'_> {
    fn name(&self) -> &'static str {
        "kv-cache-write"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        use candle_core::CpuStorage;
        let (_, heads, seq, head_dim) = self.layout.shape().dims4()?;
        let (_, cache_heads, capacity, width) = layout.shape().dims4()?;
        let row_width = match storage {
            CpuStorage::U8(_) => head_dim + Q8_SCALE_BYTES,
            _ => head_dim,
        };
        if cache_heads != heads
            || width != row_width
            || self.at + seq > capacity
            || !layout.is_contiguous()
        {
            candle_core::bail!(
                "{seq} rows of {heads} heads {head_dim} wide at {} for a cache {:?}",
                self.at,
                layout.dims()
            );
        }
        let stride = self.layout.stride();
        for head in 0..heads {
            for position in 0..seq {
                let from = self.layout.start_offset() + head * stride[1] + position * stride[2];
                let row = &self.source[from..from + head_dim];
                let to = layout.start_offset() + (head * capacity + self.at + position) * width;
                match storage {
                    CpuStorage::F32(data) => data[to..to + head_dim].copy_from_slice(row),
                    CpuStorage::F16(data) => data[to..to + head_dim].convert_from_f32_slice(row),
                    CpuStorage::BF16(data) => data[to..to + head_dim].convert_from_f32_slice(row),
                    CpuStorage::U8(data) => {
                        let (integers, scale) = data[to..to + width].split_at_mut(head_dim);
                        scale.copy_from_slice(&quantize_row(row, integers).to_le_bytes());
                    }
                    _ => candle_core::bail!("a KV cache in a dtype it never stores"),
                }
            }
        }
        Ok(())
    }
}

/// Length of the longest common prefix of two token sequences: what a
/// cache holding one can reuse for the other.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One layer's keys and values; positions `0..len` are valid.
#[derive(Debug, Clone)]
struct LayerCache {
    keys: Tensor,
    values: Tensor,
}

/// The KV state of one token sequence across all layers.
///
/// Each layer's storage is preallocated as `(1, kv_heads, capacity, head_dim)`
/// and written in place; capacity doubles when needed, so appending a token
/// never copies the whole cache, and truncating only moves the length back.
/// Each head's positions are contiguous rows, so attention multiplies straight
/// out of the cache without copying it.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<LayerCache>>,
    /// Token ids whose keys and values are stored, in order.
    tokens: Vec<u32>,
    /// Positions every layer has been written up to. While a forward pass is
    /// running, layers run ahead of this by the tokens being appended.
    len: usize,
    /// The first position whose rows were taken from another sequence
    /// (segment reuse) rather than computed here: those rows, and every row
    /// computed after them, are approximate. `None` when all were computed.
    approximate_from: Option<usize>,
    capacity: usize,
    max_len: usize,
    kv_heads: usize,
    head_dim: usize,
    dtype: KvDtype,
    device: Device,
}

impl KvCache {
    /// An empty cache for a model with `layers` layers, holding at most `max_len` positions.
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        dtype: KvDtype,
        device: &Device,
    ) -> Self {
        KvCache {
            layers: vec![None; layers],
            tokens: Vec::new(),
            len: 0,
            approximate_from: None,
            capacity: 0,
            max_len,
            kv_heads,
            head_dim,
            dtype,
            device: device.clone(),
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions this cache can hold (the model's context length).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The token ids whose keys and values are cached.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Length of the longest common prefix of `prompt` and the cached tokens.
    pub fn common_prefix(&self, prompt: &[u32]) -> usize {
        common_prefix(&self.tokens, prompt)
    }

    /// Forget every position from `len` on. The storage stays allocated.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            self.tokens.truncate(len);
        }
        self.approximate_from = self.approximate_from.filter(|&from| from < len);
    }

    /// How many leading positions hold the rows a prefill of their tokens
    /// computes: all of them unless segment reuse took some.
    pub fn exact_len(&self) -> usize {
        self.approximate_from.unwrap_or(self.len)
    }

    /// Replace this cache's contents with the first `len` positions of `source`.
    pub fn copy_prefix_from(&mut self, source: &KvCache, len: usize) -> Result<()> {
        let len = len.min(source.len);
        self.truncate(0);
        if len == 0 {
            return Ok(());
        }
        self.reserve(len)?;
        for (to, from) in self.layers.iter().zip(&source.layers) {
            let (Some(to), Some(from)) = (to, from) else {
                continue;
            };
            let copy = |from: &Tensor, to: &Tensor| {
                to.slice_set(&from.narrow(2, 0, len)?.contiguous()?, 2, 0)
            };
            copy(&from.keys, &to.keys).context("copying a cached prefix")?;
            copy(&from.values, &to.values).context("copying a cached prefix")?;
        }
        self.commit(&source.tokens[..len]);
        self.approximate_from = source.approximate_from.filter(|&from| from < len);
        Ok(())
    }

    /// `(kv_heads, row_width)`: the rows each layer stores per position,
    /// and their width in the storage dtype.
    pub(crate) fn row_shape(&self) -> (usize, usize) {
        (self.kv_heads, self.row_width())
    }

    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Where the keys and values live.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Each layer's keys and values for the first `len` positions, shaped
    /// `(1, kv_heads, len, head_dim)` and contiguous.
    pub(crate) fn prefix_tensors(&self, len: usize) -> Result<Vec<(Tensor, Tensor)>> {
        self.rows(0, len.min(self.len))
    }

    /// Each layer's keys and values at positions `start..start + len`, as
    /// stored, in tensors of their own: writing this cache afterwards does
    /// not change them.
    pub(crate) fn rows(&self, start: usize, len: usize) -> Result<Vec<(Tensor, Tensor)>> {
        if start + len > self.len {
            return Err(crate::Error::invalid(
                "KV cache",
                format!(
                    "positions {start}..{} asked of {} cached",
                    start + len,
                    self.len
                ),
            ));
        }
        self.layers
            .iter()
            .map(|layer| {
                let layer = layer.as_ref().ok_or_else(|| {
                    crate::Error::invalid("KV cache", "a layer holds nothing yet")
                })?;
                let rows = |t: &Tensor| t.narrow(2, start, len)?.force_contiguous();
                Ok((
                    rows(&layer.keys).context("reading cached rows")?,
                    rows(&layer.values).context("reading cached rows")?,
                ))
            })
            .collect()
    }

    /// Replace this cache's contents with `tokens` and their keys and values,
    /// one `(keys, values)` pair per layer shaped `(1, kv_heads, tokens, width)`
    /// in the storage dtype, `width` as [`KvDtype::row_width`] gives it.
    /// Refuses tensors of another layer count, shape or dtype, leaving the cache as it was.
    pub(crate) fn load_prefix(
        &mut self,
        tokens: &[u32],
        layers: &[(Tensor, Tensor)],
    ) -> Result<()> {
        self.check_stored(tokens.len(), layers)?;
        self.truncate(0);
        self.write_after(tokens, layers, "restoring a cached prefix")
    }

    /// Append `tokens` after the cached positions with keys and values
    /// already computed, shaped as [`KvCache::load_prefix`] takes them.
    pub(crate) fn append_stored(
        &mut self,
        tokens: &[u32],
        layers: &[(Tensor, Tensor)],
    ) -> Result<()> {
        self.check_stored(tokens.len(), layers)?;
        let from = self.len;
        self.write_after(tokens, layers, "reusing cached rows")?;
        self.approximate_from.get_or_insert(from);
        Ok(())
    }

    /// An error unless `layers` holds keys and values of `count` positions
    /// for every layer, in this cache's shape and dtype.
    fn check_stored(&self, count: usize, layers: &[(Tensor, Tensor)]) -> Result<()> {
        let expected = (1, self.kv_heads, count, self.row_width());
        if layers.len() != self.layers.len() {
            return Err(crate::Error::invalid(
                "KV cache",
                format!(
                    "{} layers given for a model of {}",
                    layers.len(),
                    self.layers.len()
                ),
            ));
        }
        for (keys, values) in layers {
            for tensor in [keys, values] {
                if tensor.dims4().ok() != Some(expected) || tensor.dtype() != self.dtype.dtype() {
                    return Err(crate::Error::invalid(
                        "KV cache",
                        format!(
                            "a layer of shape {:?} and dtype {:?}, not {expected:?} and {:?}",
                            tensor.dims(),
                            tensor.dtype(),
                            self.dtype.dtype()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Write checked `layers` for `tokens` after the cached positions;
    /// `what` names the write in an error.
    fn write_after(
        &mut self,
        tokens: &[u32],
        layers: &[(Tensor, Tensor)],
        what: &str,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Ok(());
        }
        self.reserve(tokens.len())?;
        let at = self.len;
        for (to, (keys, values)) in self.layers.iter().zip(layers) {
            let to = to.as_ref().expect("reserve() allocates every layer");
            to.keys.slice_set(keys, 2, at).context(what)?;
            to.values.slice_set(values, 2, at).context(what)?;
        }
        self.commit(tokens);
        Ok(())
    }

    /// Bytes of key and value storage currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        let row_bytes = self.row_width() * self.dtype.dtype().size_in_bytes();
        let per_layer = 2 * self.capacity * self.kv_heads * row_bytes;
        per_layer * self.layers.iter().filter(|layer| layer.is_some()).count()
    }

    /// Make room for `extra` more positions in every layer.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed > self.max_len {
            return Err(crate::Error::PromptTooLong {
                prompt_tokens: needed,
                context_tokens: self.max_len,
            });
        }
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = needed
            .next_power_of_two()
            .max(INITIAL_CAPACITY)
            .min(self.max_len);
        let shape = (1, self.kv_heads, capacity, self.row_width());
        let dtype = self.dtype.dtype();
        for layer in &mut self.layers {
            let grown = LayerCache {
                keys: Tensor::zeros(shape, dtype, &self.device).context("allocating KV cache")?,
                values: Tensor::zeros(shape, dtype, &self.device).context("allocating KV cache")?,
            };
            if let Some(old) = layer.as_ref().filter(|_| self.len > 0) {
                let copy = |from: &Tensor, to: &Tensor| {
                    to.slice_set(&from.narrow(2, 0, self.len)?.contiguous()?, 2, 0)
                };
                copy(&old.keys, &grown.keys).context("growing KV cache")?;
                copy(&old.values, &grown.values).context("growing KV cache")?;
            }
            *layer = Some(grown);
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Write `keys` and `values` of shape `(1, kv_heads, seq, head_dim)` for the
    /// positions after the cached ones, and return every position of this layer
    /// so far as stored, shaped `(1, kv_heads, cached + seq, width)` (see
    /// [`KvDtype::row_width`]).
    ///
    /// Call [`KvCache::reserve`] first and [`KvCache::commit`] once all layers are written.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        keys: &Tensor,
        values: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let seq = keys.dim(2).context("KV cache append")?;
        let store = self.layers[layer]
            .as_ref()
            .expect("reserve() allocates every layer before append()");
        for (rows, to) in [(keys, &store.keys), (values, &store.values)] {
            if !write_in_place(rows, to, self.len).context("KV cache append")? {
                let rows = rows
                    .contiguous()
                    .and_then(|rows| self.stored(&rows))
                    .context("KV cache append")?;
                to.slice_set(&rows, 2, self.len)
                    .context("KV cache append")?;
            }
        }
        self.written(layer, seq)
    }

    /// Write `keys` and `values` at the positions from `offset` after the
    /// cached ones: f32 rows, position after position, each of `kv_heads`
    /// heads of `head_dim` values, as a CPU forward pass holds them, so
    /// that no tensor is made of them first. A shared borrow: jobs on the
    /// pool each write their own positions of a layer, and candle's lock
    /// on the layer's storage takes their writes in turn.
    ///
    /// Call [`KvCache::reserve`] first; [`KvCache::written`] then reads the layer.
    pub(crate) fn write_rows(
        &self,
        layer: usize,
        offset: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let width = self.kv_heads * self.head_dim;
        let seq = keys.len() / width.max(1);
        if keys.len() != seq * width || values.len() != keys.len() {
            return Err(crate::Error::invalid(
                "KV cache write",
                format!(
                    "{} keys and {} values are not whole rows of {width}",
                    keys.len(),
                    values.len()
                ),
            ));
        }
        let store = self.layers[layer]
            .as_ref()
            .expect("reserve() allocates every layer before write_rows()");
        let layout = candle_core::Layout::new(
            (1, self.kv_heads, seq, self.head_dim).into(),
            vec![seq * width, self.head_dim, width, 1],
            0,
        );
        let at = self.len + offset;
        for (source, to) in [(keys, &store.keys), (values, &store.values)] {
            to.inplace_op1(&WriteRows {
                source,
                layout: &layout,
                at,
            })
            .context("KV cache write")?;
        }
        Ok(())
    }

    /// Every position of `layer` up to `count` after the cached ones, as
    /// stored, shaped `(1, kv_heads, cached + count, width)`.
    pub(crate) fn written(&self, layer: usize, count: usize) -> Result<(Tensor, Tensor)> {
        let store = self.layers[layer]
            .as_ref()
            .expect("reserve() allocates every layer before it is read");
        let total = self.len + count;
        Ok((
            store.keys.narrow(2, 0, total).context("KV cache read")?,
            store.values.narrow(2, 0, total).context("KV cache read")?,
        ))
    }

    /// `rows` `(1, kv_heads, seq, head_dim)` as this cache stores them, for
    /// [`Tensor::slice_set`] where [`write_in_place`] does not apply.
    fn stored(&self, rows: &Tensor) -> candle_core::Result<Tensor> {
        if self.dtype != KvDtype::Q8 {
            return rows.to_dtype(self.dtype.dtype());
        }
        let (_, heads, seq, head_dim) = rows.dims4()?;
        let values = rows.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let shape = (1, heads, seq, self.row_width());
        Tensor::from_vec(quantize_rows(&values, head_dim), shape, &self.device)
    }

    fn row_width(&self) -> usize {
        self.dtype.row_width(self.head_dim)
    }

    /// Record that every layer now holds `tokens` after the previously cached positions.
    pub(crate) fn commit(&mut self, tokens: &[u32]) {
        self.len += tokens.len();
        self.tokens.extend_from_slice(tokens);
    }
}

#[cfg(test)]
impl KvCache {
    /// Append `tokens` with all-zero keys and values.
    pub(crate) fn append_zeros_for_test(&mut self, tokens: &[u32]) {
        self.reserve(tokens.len()).unwrap();
        let shape = (1, self.kv_heads, tokens.len(), self.head_dim);
        let zeros = Tensor::zeros(shape, DType::F32, &self.device).unwrap();
        for layer in 0..self.layers.len() {
            self.append(layer, &zeros, &zeros).unwrap();
        }
        self.commit(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(max_len: usize) -> KvCache {
        KvCache::new(2, 2, 1, max_len, KvDtype::F32, &Device::Cpu)
    }

    fn step(cache: &mut KvCache, tokens: &[u32]) -> Tensor {
        cache.reserve(tokens.len()).unwrap();
        // Two heads of width one: head 0 holds the token id, head 1 its negation.
        let values: Vec<f32> = [1.0f32, -1.0]
            .iter()
            .flat_map(|sign| tokens.iter().map(move |&t| sign * t as f32))
            .collect();
        let kv = Tensor::from_vec(values, (1, 2, tokens.len(), 1), &Device::Cpu).unwrap();
        let mut all = None;
        for layer in 0..2 {
            all = Some(cache.append(layer, &kv, &kv).unwrap().0);
        }
        cache.commit(tokens);
        all.unwrap()
    }

    #[test]
    fn append_grows_past_initial_capacity_and_keeps_contents() {
        let mut cache = cache(4096);
        let tokens: Vec<u32> = (0..300).collect();
        step(&mut cache, &tokens[..200]);
        let keys = step(&mut cache, &tokens[200..]);
        assert_eq!(keys.dims(), &[1, 2, 300, 1]);
        let stored: Vec<f32> = keys.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let expected: Vec<f32> = [1.0f32, -1.0]
            .iter()
            .flat_map(|sign| (0..300).map(move |t| sign * t as f32))
            .collect();
        assert_eq!(stored, expected);
        assert_eq!(cache.tokens(), &tokens[..]);
    }

    #[test]
    fn truncate_then_append_overwrites_the_tail() {
        let mut cache = cache(64);
        step(&mut cache, &[1, 2, 3, 4]);
        assert_eq!(cache.common_prefix(&[1, 2, 9, 4]), 2);
        cache.truncate(2);
        let keys = step(&mut cache, &[9]);
        let keys: Vec<f32> = keys.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(keys, vec![1.0, 2.0, 9.0, -1.0, -2.0, -9.0]);
        assert_eq!(cache.tokens(), &[1, 2, 9]);
    }

    #[test]
    fn a_copied_prefix_holds_the_same_keys() {
        let mut source = cache(64);
        step(&mut source, &[1, 2, 3, 4, 5]);
        let mut copy = cache(64);
        step(&mut copy, &[7, 7]);
        copy.copy_prefix_from(&source, 3).unwrap();
        assert_eq!(copy.tokens(), &[1, 2, 3]);
        let keys = step(&mut copy, &[6]);
        let keys: Vec<f32> = keys.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(keys, vec![1.0, 2.0, 3.0, 6.0, -1.0, -2.0, -3.0, -6.0]);
    }

    #[test]
    fn an_8_bit_row_is_its_integers_then_its_scale() {
        let row = [0.5f32, -1.27, 0.0, 1.0];
        let stored = quantize_rows(&row, 4);
        assert_eq!(stored.len(), 4 + Q8_SCALE_BYTES);
        let scale = f32::from_le_bytes(stored[4..].try_into().unwrap());
        assert_eq!(scale, 1.27 / 127.0);
        let integers: Vec<i8> = stored[..4].iter().map(|&b| b as i8).collect();
        assert_eq!(integers, vec![50, -127, 0, 100]);
        for (&value, &integer) in row.iter().zip(&integers) {
            assert!((f32::from(integer) * scale - value).abs() <= scale / 2.0);
        }
        assert_eq!(quantize_rows(&[0.0; 4], 4), vec![0; 4 + Q8_SCALE_BYTES]);
    }

    #[test]
    fn a_row_quantizes_to_the_same_bits_in_vector_registers_as_one_value_at_a_time() {
        // With 127 the largest magnitude the scale is one, so the halves
        // are ties, which round away from zero; and rows longer than a register.
        for width in [4, 64, 131] {
            let row: Vec<f32> = (0..width)
                .map(|i| match i % 5 {
                    1 => 127.0,
                    0 => i as f32 - 60.5,
                    _ => (i as f32 * 0.37).sin() * 30.0,
                })
                .collect();
            let (mut vector, mut scalar) = (vec![0u8; width], vec![0u8; width]);
            let scale = quantize_row(&row, &mut vector);
            assert_eq!(scale, quantize_row_portable(&row, &mut scalar));
            assert_eq!(vector, scalar, "{width} values");
        }
    }

    #[test]
    fn an_8_bit_cache_stores_rows_with_their_scales() {
        let mut cache = KvCache::new(1, 2, 4, 64, KvDtype::Q8, &Device::Cpu);
        let rows: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let kv = Tensor::from_vec(rows.clone(), (1, 2, 2, 4), &Device::Cpu).unwrap();
        cache.reserve(2).unwrap();
        let (keys, _) = cache.append(0, &kv, &kv).unwrap();
        cache.commit(&[1, 2]);
        assert_eq!(keys.dims(), &[1, 2, 2, 4 + Q8_SCALE_BYTES]);
        let stored: Vec<u8> = keys.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(stored, quantize_rows(&rows, 4));
        // Keys and values, room for the context of 64, two heads' rows.
        assert_eq!(cache.allocated_bytes(), 2 * 64 * 2 * (4 + Q8_SCALE_BYTES));
        let layers = cache.prefix_tensors(2).unwrap();
        let mut copy = KvCache::new(1, 2, 4, 64, KvDtype::Q8, &Device::Cpu);
        copy.load_prefix(&[1, 2], &layers).unwrap();
        let mut floats = KvCache::new(1, 2, 4, 64, KvDtype::F32, &Device::Cpu);
        assert!(floats.load_prefix(&[1, 2], &layers).is_err());
    }

    /// A batched pass hands the cache a strided view of its rows (position
    /// after position, each with every head), which is written in place.
    #[test]
    fn rows_written_in_place_are_stored_as_a_copied_tensor_would_be() {
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8] {
            let values: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let by_position = Tensor::from_vec(values, (3, 2, 1, 4), &Device::Cpu).unwrap();
            let rows = by_position.transpose(0, 2).unwrap();
            assert!(!rows.is_contiguous());
            let mut in_place = KvCache::new(1, 2, 4, 64, dtype, &Device::Cpu);
            in_place.append_zeros_for_test(&[7]);
            in_place.reserve(3).unwrap();
            let (keys, _) = in_place.append(0, &rows, &rows).unwrap();
            let mut copied = KvCache::new(1, 2, 4, 64, dtype, &Device::Cpu);
            copied.append_zeros_for_test(&[7]);
            copied.reserve(3).unwrap();
            let stored = copied.stored(&rows.contiguous().unwrap()).unwrap();
            let layer = copied.layers[0].as_ref().unwrap();
            layer.keys.slice_set(&stored, 2, 1).unwrap();
            let as_floats = |t: Tensor| -> Vec<f32> {
                let t = t.to_dtype(DType::F32).unwrap();
                t.flatten_all().unwrap().to_vec1().unwrap()
            };
            let expected = layer.keys.narrow(2, 0, 4).unwrap();
            assert_eq!(keys.dims(), expected.dims(), "{dtype:?}");
            assert_eq!(as_floats(keys), as_floats(expected), "{dtype:?}");
        }
    }

    #[test]
    fn rows_written_from_slices_are_stored_as_appended_tensors_are() {
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8] {
            // Three positions of two heads of four, position after position.
            let values: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let by_position = Tensor::from_vec(values.clone(), (3, 2, 1, 4), &Device::Cpu).unwrap();
            let rows = by_position.transpose(0, 2).unwrap();
            let mut appended = KvCache::new(1, 2, 4, 64, dtype, &Device::Cpu);
            appended.append_zeros_for_test(&[7]);
            appended.reserve(3).unwrap();
            let expected = appended.append(0, &rows, &rows).unwrap();
            let mut written = KvCache::new(1, 2, 4, 64, dtype, &Device::Cpu);
            written.append_zeros_for_test(&[7]);
            written.reserve(3).unwrap();
            // In two writes, as two jobs of one run would.
            written
                .write_rows(0, 1, &values[8..], &values[8..])
                .unwrap();
            written
                .write_rows(0, 0, &values[..8], &values[..8])
                .unwrap();
            let (keys, values) = written.written(0, 3).unwrap();
            let as_floats = |t: &Tensor| -> Vec<f32> {
                let t = t.to_dtype(DType::F32).unwrap();
                t.flatten_all().unwrap().to_vec1().unwrap()
            };
            for (got, expected) in [(keys, &expected.0), (values, &expected.1)] {
                assert_eq!(got.dims(), expected.dims(), "{dtype:?}");
                assert_eq!(as_floats(&got), as_floats(expected), "{dtype:?}");
            }
        }
    }

    #[test]
    fn slices_of_partial_rows_or_past_the_reserved_room_are_refused() {
        let mut cache = KvCache::new(1, 2, 4, 64, KvDtype::Q8, &Device::Cpu);
        cache.reserve(1).unwrap();
        let row = [1f32; 8];
        assert!(cache.write_rows(0, 0, &row[..7], &row[..7]).is_err());
        assert!(cache.write_rows(0, 0, &row, &row[..4]).is_err());
        let capacity = cache.capacity;
        assert!(cache.write_rows(0, capacity, &row, &row).is_err());
        let keys = &cache.layers[0].as_ref().unwrap().keys;
        let stored: Vec<u8> = keys.flatten_all().unwrap().to_vec1().unwrap();
        assert!(stored.iter().all(|&byte| byte == 0));
    }

    #[test]
    fn rows_of_another_width_are_refused_not_written() {
        for dtype in [KvDtype::F32, KvDtype::Q8] {
            let mut cache = KvCache::new(1, 2, 4, 64, dtype, &Device::Cpu);
            cache.reserve(1).unwrap();
            let narrow = Tensor::ones((1, 2, 1, 3), DType::F32, &Device::Cpu).unwrap();
            assert!(cache.append(0, &narrow, &narrow).is_err(), "{dtype:?}");
            let keys = &cache.layers[0].as_ref().unwrap().keys;
            let stored: Vec<f32> = keys
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert!(stored.iter().all(|&v| v == 0.0), "{dtype:?}");
        }
    }

    #[test]
    fn refuses_to_grow_past_the_context() {
        let mut cache = cache(8);
        step(&mut cache, &[1, 2, 3, 4, 5, 6]);
        assert!(matches!(
            cache.reserve(3),
            Err(crate::Error::PromptTooLong {
                context_tokens: 8,
                ..
            })
        ));
    }
}
