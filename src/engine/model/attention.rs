//! Causal grouped-query attention as two batched matmuls per key/value head.
//!
//! candle's fused CPU attention kernel is several times slower than its GEMM
//! once the context reaches a few thousand tokens, which is where PRISM's
//! prompts live. Here the query heads that share a key/value head are stacked
//! into one matrix, so keys and values are read straight from the cache,
//! never copied or repeated per query head.

use candle_core::{CpuStorage, DType, Device, Layout, Result, Storage, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

/// The additive causal mask for `seq` queries at the last positions of `total`:
/// query `i` (at position `total - seq + i`) sees keys `0..=total - seq + i`.
/// `None` for a single query, which sees everything.
pub fn causal_mask(seq: usize, total: usize, device: &Device) -> Result<Option<Tensor>> {
    if seq <= 1 {
        return Ok(None);
    }
    let start = total - seq;
    let mask: Vec<f32> = (0..seq)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (seq, total), device).map(Some)
}

/// Attend `queries` `(1, heads, seq, d)` to `keys` and `values`
/// `(1, kv_heads, total, d)`; returns `(1, seq, heads * d)`.
pub fn causal_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (_, heads, seq, d) = queries.dims4()?;
    let (_, kv_heads, total, _) = keys.dims4()?;
    let groups = heads / kv_heads;
    // Query head h reads key/value head h / groups, so consecutive heads stack
    // into one (groups * seq, d) matrix per key/value head.
    let queries = queries.reshape((kv_heads, groups * seq, d))?;
    let keys = keys.squeeze(0)?;
    let values = values.squeeze(0)?;
    // (kv_heads, groups * seq, total)
    let mut scores = (queries.matmul(&keys.t()?)? * scale)?;
    if let Some(mask) = mask {
        scores = scores
            .reshape((kv_heads, groups, seq, total))?
            .broadcast_add(mask)?
            .reshape((kv_heads, groups * seq, total))?;
    }
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    // (kv_heads, groups * seq, d) → (heads, seq, d) → (1, seq, heads * d)
    probs
        .matmul(&values)?
        .reshape((heads, seq, d))?
        .transpose(0, 1)?
        .reshape((1, seq, heads * d))
}

/// Below this many attention scores per layer (about one sequence of 1,500
/// positions on a small model), waking other threads costs more than it saves.
const PARALLEL_SCORES: usize = 16_384;

/// Attention for one new query per sequence, each over a cache of its own:
/// `queries` is `(sequences, heads, 1, head_dim)`, and `caches[i]` holds
/// sequence i's keys and values `(1, kv_heads, positions_i, head_dim)`, its
/// new position included. Returns `(1, sequences, heads * head_dim)`.
///
/// A decode step's attention is a few dot products per cached position. As
/// tensor ops (two matmuls, a softmax, reshapes) per sequence its cost was
/// mostly their overhead, more than half a step's time with many sequences;
/// here each query head makes one pass over its cache rows, in place, from
/// an f32, f16 or bf16 cache. Other devices take the tensor-op path.
pub fn decode_attention(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    scale: f64,
) -> Result<Tensor> {
    let count = queries.dim(0)?;
    if caches.len() != count {
        candle_core::bail!("{count} queries for {} caches", caches.len());
    }
    let queries = queries.contiguous()?;
    let on_cpu = |t: &Tensor, dtypes: &[DType]| t.device().is_cpu() && dtypes.contains(&t.dtype());
    let cache_dtypes = [DType::F32, DType::F16, DType::BF16];
    let all_on_cpu = on_cpu(&queries, &[DType::F32])
        && caches
            .iter()
            .all(|(keys, values)| on_cpu(keys, &cache_dtypes) && on_cpu(values, &cache_dtypes));
    if !all_on_cpu {
        return decode_attention_by_ops(&queries, caches, scale);
    }
    decode_attention_on_cpu(&queries, caches, scale, fused_multiply_add())
}

/// [`decode_attention`] on CPU tensors: contiguous f32 `queries`, caches in
/// f32, f16 or bf16; with the AVX2 kernels when `fused`, which only a CPU
/// that passes [`fused_multiply_add`] may ask for.
fn decode_attention_on_cpu(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    scale: f64,
    fused: bool,
) -> Result<Tensor> {
    let (count, heads, _, d) = queries.dims4()?;
    let query_guard = queries.storage_and_layout();
    let guards: Vec<_> = caches
        .iter()
        .map(|(keys, values)| (keys.storage_and_layout(), values.storage_and_layout()))
        .collect();
    let q = match &*query_guard.0 {
        Storage::Cpu(cpu) => &cpu.as_slice::<f32>()?[query_guard.1.start_offset()..],
        _ => candle_core::bail!("decode attention reads CPU storage only"),
    };
    let mut sequences = Vec::with_capacity(count);
    for (keys, values) in &guards {
        sequences.push((
            Rows::new(&keys.0, keys.1, d)?,
            Rows::new(&values.0, values.1, d)?,
        ));
    }
    let kv_heads = sequences[0].0.heads;
    let groups = heads / kv_heads.max(1);
    let scale = scale as f32;
    let mut out = vec![0f32; count * heads * d];
    // Item `sequence * kv_heads + kv_head` is the query heads of one
    // sequence that share a key/value head: consecutive heads, so their
    // queries and outputs are one run of `groups * d` floats, and each cache
    // row is read once for all of them.
    let attend = |scores: &mut Vec<f32>, (item, out): (usize, &mut [f32])| {
        let (keys, values) = &sequences[item / kv_heads];
        let group = Group {
            queries: &q[item * groups * d..(item + 1) * groups * d],
            keys,
            values,
            kv_head: item % kv_heads,
            scale,
        };
        if fused {
            // SAFETY: the CPU supports AVX2, FMA and F16C (see `fused`).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                group.attend_fma(scores, out)
            }
        } else {
            group.attend::<false>(scores, out)
        }
    };
    let scores: usize = sequences
        .iter()
        .map(|(keys, _)| keys.positions * heads)
        .sum();
    if scores < PARALLEL_SCORES {
        let mut scratch = Vec::new();
        out.chunks_mut(groups * d)
            .enumerate()
            .for_each(|item| attend(&mut scratch, item));
    } else {
        out.par_chunks_mut(groups * d)
            .enumerate()
            .for_each_init(Vec::new, attend);
    }
    drop(guards);
    Tensor::from_vec(out, (1, count, heads * d), queries.device())
}

/// [`decode_attention`] as tensor ops, for devices other than the CPU.
fn decode_attention_by_ops(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    scale: f64,
) -> Result<Tensor> {
    let mut outputs = Vec::with_capacity(caches.len());
    for (i, (keys, values)) in caches.iter().enumerate() {
        let query = queries.get(i)?.unsqueeze(0)?;
        let keys = keys.to_dtype(query.dtype())?;
        let values = values.to_dtype(query.dtype())?;
        outputs.push(causal_attention(&query, &keys, &values, None, scale)?);
    }
    Tensor::cat(&outputs, 1)
}

/// A cache tensor's storage, in the dtype it holds.
#[derive(Clone, Copy)]
enum RowData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

/// The rows of one cache tensor `(1, kv_heads, positions, head_dim)` as a
/// slice of its storage, whatever its capacity beyond `positions`.
struct Rows<'a> {
    data: RowData<'a>,
    start: usize,
    head_stride: usize,
    row_stride: usize,
    heads: usize,
    positions: usize,
    d: usize,
}

impl<'a> Rows<'a> {
    fn new(storage: &'a Storage, layout: &'a Layout, d: usize) -> Result<Self> {
        let (_, heads, positions, width) = layout.shape().dims4()?;
        let stride = layout.stride();
        if width != d || stride[3] != 1 {
            candle_core::bail!(
                "a cache of shape {:?} and strides {stride:?}",
                layout.dims()
            );
        }
        let Storage::Cpu(cpu) = storage else {
            candle_core::bail!("decode attention reads CPU storage only");
        };
        let data = match cpu {
            CpuStorage::F16(data) => RowData::F16(data),
            CpuStorage::BF16(data) => RowData::Bf16(data),
            _ => RowData::F32(cpu.as_slice::<f32>()?),
        };
        Ok(Rows {
            data,
            start: layout.start_offset(),
            head_stride: stride[1],
            row_stride: stride[2],
            heads,
            positions,
            d,
        })
    }

    /// The row of `head` at `position`, as stored.
    fn row(&self, head: usize, position: usize) -> Row<'a> {
        let at = self.start + head * self.head_stride + position * self.row_stride;
        let range = at..at + self.d;
        match self.data {
            RowData::F32(data) => Row::F32(&data[range]),
            RowData::F16(data) => Row::F16(&data[range]),
            RowData::Bf16(data) => Row::Bf16(&data[range]),
        }
    }
}

/// One cache row in the dtype it is stored in.
#[derive(Clone, Copy)]
enum Row<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl<'a> Row<'a> {
    /// The row as the `FMA` kernels read it: the vector kernels read 16-bit
    /// rows in place, widening eight values at a time in registers; the
    /// portable path widens them into `scratch` (`d` floats) first.
    #[inline(always)]
    fn readable<'b, const FMA: bool>(self, scratch: &'b mut [f32]) -> Row<'b>
    where
        'a: 'b,
    {
        match self {
            Row::F16(row) if !FMA => {
                row.convert_to_f32_slice(scratch);
                Row::F32(scratch)
            }
            Row::Bf16(row) if !FMA => {
                row.convert_to_f32_slice(scratch);
                Row::F32(scratch)
            }
            row => row,
        }
    }

    /// The dot product of `query` with this row.
    #[inline(always)]
    fn dot<const FMA: bool>(self, query: &[f32]) -> f32 {
        match self {
            Row::F32(row) => dot::<FMA>(query, row),
            // SAFETY (both arms): `FMA` kernels run only on CPUs with AVX2,
            // FMA and F16C ([`fused_multiply_add`]).
            #[cfg(target_arch = "x86_64")]
            Row::F16(row) if FMA => unsafe { widening::dot_f16(query, row) },
            #[cfg(target_arch = "x86_64")]
            Row::Bf16(row) if FMA => unsafe { widening::dot_bf16(query, row) },
            Row::F16(_) | Row::Bf16(_) => {
                unreachable!("16-bit rows reach the portable kernel widened ([`Row::readable`])")
            }
        }
    }

    /// `out += weight * row`, each element one fused multiply-add under `FMA`.
    #[inline(always)]
    fn add_scaled<const FMA: bool>(self, weight: f32, out: &mut [f32]) {
        match self {
            Row::F32(row) => {
                for (o, v) in out.iter_mut().zip(row) {
                    *o = multiply_add::<FMA>(weight, *v, *o);
                }
            }
            // SAFETY: as in `dot`.
            #[cfg(target_arch = "x86_64")]
            Row::F16(row) if FMA => unsafe { widening::add_scaled_f16(weight, row, out) },
            #[cfg(target_arch = "x86_64")]
            Row::Bf16(row) if FMA => unsafe { widening::add_scaled_bf16(weight, row, out) },
            Row::F16(_) | Row::Bf16(_) => {
                unreachable!("16-bit rows reach the portable kernel widened ([`Row::readable`])")
            }
        }
    }
}

/// Whether [`Group::attend_fma`] can run: an x86-64 CPU with AVX2, FMA and
/// F16C (every AVX2 CPU has the last).
fn fused_multiply_add() -> bool {
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

/// The query heads of one sequence that share a key/value head.
struct Group<'a> {
    /// `groups * d` floats, head after head.
    queries: &'a [f32],
    keys: &'a Rows<'a>,
    values: &'a Rows<'a>,
    kv_head: usize,
    scale: f32,
}

impl Group<'_> {
    /// [`Group::attend`] compiled for AVX2 with fused multiply-adds; the
    /// build's baseline is plain x86-64, whose vectors are half as wide.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn attend_fma(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        self.attend::<true>(scores, out)
    }

    /// Softmax-weighted sums of the value rows into `out` (`groups * d`),
    /// with `scores` as scratch.
    #[inline(always)]
    fn attend<const FMA: bool>(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        let (d, positions) = (self.keys.d, self.keys.positions);
        let groups = self.queries.len() / d;
        scores.clear();
        scores.resize(groups * positions, 0.0);
        let mut scratch = vec![0f32; d];
        for j in 0..positions {
            let key = self.keys.row(self.kv_head, j).readable::<FMA>(&mut scratch);
            for (g, query) in self.queries.chunks_exact(d).enumerate() {
                scores[g * positions + j] = key.dot::<FMA>(query) * self.scale;
            }
        }
        for head in scores.chunks_exact_mut(positions) {
            let max = head.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for score in head.iter_mut() {
                *score = (*score - max).exp();
                sum += *score;
            }
            for score in head.iter_mut() {
                *score /= sum;
            }
        }
        out.fill(0.0);
        for j in 0..positions {
            let value = self
                .values
                .row(self.kv_head, j)
                .readable::<FMA>(&mut scratch);
            for (g, out) in out.chunks_exact_mut(d).enumerate() {
                value.add_scaled::<FMA>(scores[g * positions + j], out);
            }
        }
    }
}

/// `a * b + c`, fused where the caller is compiled for it (unfused it would
/// be a slow library call).
#[inline(always)]
fn multiply_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// A dot product in eight independent lanes, which the compiler keeps in
/// vector registers (a single running sum could not be reordered).
#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a_blocks, b_blocks) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a_blocks
        .remainder()
        .iter()
        .zip(b_blocks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (a, b) in a_blocks.zip(b_blocks) {
        for lane in 0..8 {
            lanes[lane] = multiply_add::<FMA>(a[lane], b[lane], lanes[lane]);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The 16-bit rows of the vector kernels, widened eight values at a time in
/// registers as they are read. Each computes exactly what its f32 twin
/// computes on the widened row (widening is exact, and the lanes and the
/// order of the sums are the same), so the cache dtype alone decides the
/// result.
#[cfg(target_arch = "x86_64")]
mod widening {
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// Eight f16 values from `row[at..at + 8]` as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(row: &[f16], at: usize) -> __m256 {
        debug_assert!(at + 8 <= row.len());
        _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(at).cast()))
    }

    /// Eight bf16 values from `row[at..at + 8]` as f32: a bf16 is the top
    /// half of an f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_bf16(row: &[bf16], at: usize) -> __m256 {
        debug_assert!(at + 8 <= row.len());
        let halves = _mm256_cvtepu16_epi32(_mm_loadu_si128(row.as_ptr().add(at).cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(halves))
    }

    /// The two kernels for one 16-bit type, `load` reading eight of its
    /// values as f32: `$dot` is [`super::dot`] and `$add_scaled` is
    /// [`super::Row::add_scaled`] on the widened row, lane for lane.
    macro_rules! kernels {
        ($t:ty, $load:ident, $dot:ident, $add_scaled:ident) => {
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $dot(query: &[f32], row: &[$t]) -> f32 {
                let blocks = query.len().min(row.len()) / 8 * 8;
                let mut sums = _mm256_setzero_ps();
                for at in (0..blocks).step_by(8) {
                    let q = _mm256_loadu_ps(query.as_ptr().add(at));
                    sums = _mm256_fmadd_ps(q, $load(row, at), sums);
                }
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), sums);
                let tail: f32 = query[blocks..]
                    .iter()
                    .zip(&row[blocks..])
                    .map(|(x, y)| x * y.to_f32())
                    .sum();
                lanes.iter().sum::<f32>() + tail
            }

            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn $add_scaled(weight: f32, row: &[$t], out: &mut [f32]) {
                let blocks = out.len().min(row.len()) / 8 * 8;
                let weights = _mm256_set1_ps(weight);
                for at in (0..blocks).step_by(8) {
                    let sums = _mm256_loadu_ps(out.as_ptr().add(at));
                    let sums = _mm256_fmadd_ps(weights, $load(row, at), sums);
                    _mm256_storeu_ps(out.as_mut_ptr().add(at), sums);
                }
                for (o, v) in out[blocks..].iter_mut().zip(&row[blocks..]) {
                    *o = weight.mul_add(v.to_f32(), *o);
                }
            }
        };
    }

    kernels!(f16, load_f16, dot_f16, add_scaled_f16);
    kernels!(bf16, load_bf16, dot_bf16, add_scaled_bf16);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention written out one query head at a time with explicit loops.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: usize,
        kv_heads: usize,
        seq: usize,
        total: usize,
        d: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; seq * heads * d];
        for h in 0..heads {
            let kv = h / (heads / kv_heads);
            for i in 0..seq {
                let visible = total - seq + i + 1;
                let scores: Vec<f32> = (0..visible)
                    .map(|j| {
                        (0..d)
                            .map(|x| q[(h * seq + i) * d + x] * k[(kv * total + j) * d + x])
                            .sum::<f32>()
                            / (d as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = weights.iter().sum();
                for x in 0..d {
                    out[(i * heads + h) * d + x] = (0..visible)
                        .map(|j| weights[j] / sum * v[(kv * total + j) * d + x])
                        .sum();
                }
            }
        }
        out
    }

    #[test]
    fn matches_a_naive_loop_with_grouped_heads_and_a_cached_prefix() {
        let (heads, kv_heads, seq, total, d) = (6, 2, 3, 5, 4);
        let values = |n: usize, salt: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + salt).sin()).collect()
        };
        let (q, k, v) = (
            values(heads * seq * d, 0.1),
            values(kv_heads * total * d, 0.7),
            values(kv_heads * total * d, 1.3),
        );
        let dev = Device::Cpu;
        let qt = Tensor::from_vec(q.clone(), (1, heads, seq, d), &dev).unwrap();
        let kt = Tensor::from_vec(k.clone(), (1, kv_heads, total, d), &dev).unwrap();
        let vt = Tensor::from_vec(v.clone(), (1, kv_heads, total, d), &dev).unwrap();
        let mask = causal_mask(seq, total, &dev).unwrap();
        let out = causal_attention(&qt, &kt, &vt, mask.as_ref(), 1.0 / (d as f64).sqrt()).unwrap();
        let out: Vec<f32> = out.flatten_all().unwrap().to_vec1().unwrap();
        let expected = naive(&q, &k, &v, heads, kv_heads, seq, total, d);
        let diff = max_difference(&out, &expected);
        assert!(diff < 1e-5, "max difference {diff}");
    }

    fn max_difference(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    }

    /// Queries `(sequences, heads, 1, d)` and one cache per sequence of
    /// `positions` rows, held in a cache of room for more, as the engine's are.
    fn decode_inputs(
        heads: usize,
        kv_heads: usize,
        positions: &[usize],
        d: usize,
    ) -> (Tensor, Vec<(Tensor, Tensor)>) {
        let dev = Device::Cpu;
        let values = |n: usize, salt: f32| -> Vec<f32> {
            (0..n)
                .map(|i| (i as f32 * 0.37 + salt).sin() * 2.0)
                .collect()
        };
        let count = positions.len();
        let queries =
            Tensor::from_vec(values(count * heads * d, 0.1), (count, heads, 1, d), &dev).unwrap();
        let caches = positions
            .iter()
            .enumerate()
            .map(|(i, &filled)| {
                let room = filled + 3;
                let cache = |salt: f32| {
                    Tensor::from_vec(
                        values(kv_heads * room * d, salt),
                        (1, kv_heads, room, d),
                        &dev,
                    )
                    .unwrap()
                    .narrow(2, 0, filled)
                    .unwrap()
                };
                (cache(0.7 + i as f32), cache(1.3 + i as f32))
            })
            .collect();
        (queries, caches)
    }

    fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn decode_attention_matches_the_matmul_path() {
        // d = 20 leaves a tail after the blocks of eight.
        for d in [64, 20] {
            let (queries, caches) = decode_inputs(6, 2, &[5, 40], d);
            let scale = 1.0 / (d as f64).sqrt();
            let out = flat(&decode_attention(&queries, &caches, scale).unwrap());
            let expected = flat(&decode_attention_by_ops(&queries, &caches, scale).unwrap());
            let diff = max_difference(&out, &expected);
            assert!(diff < 1e-5, "d = {d}: max difference {diff}");
        }
    }

    /// A 16-bit cache gives exactly what an f32 cache holding the same
    /// (rounded) values gives: the kernels that read 16-bit rows in place
    /// compute what the f32 kernel computes on the widened rows.
    #[test]
    fn a_16_bit_cache_reads_as_its_values_widened_to_f32() {
        for dtype in [DType::F16, DType::BF16] {
            for d in [64, 20] {
                let (queries, caches) = decode_inputs(6, 2, &[5, 40], d);
                let stored: Vec<(Tensor, Tensor)> = caches
                    .iter()
                    .map(|(k, v)| (k.to_dtype(dtype).unwrap(), v.to_dtype(dtype).unwrap()))
                    .collect();
                let widened: Vec<(Tensor, Tensor)> = stored
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.to_dtype(DType::F32).unwrap(),
                            v.to_dtype(DType::F32).unwrap(),
                        )
                    })
                    .collect();
                let scale = 1.0 / (d as f64).sqrt();
                for fused in [false, fused_multiply_add()] {
                    let attend = |caches: &[(Tensor, Tensor)]| {
                        flat(&decode_attention_on_cpu(&queries, caches, scale, fused).unwrap())
                    };
                    assert_eq!(
                        attend(&stored),
                        attend(&widened),
                        "{dtype:?}, d = {d}, {fused}"
                    );
                }
            }
        }
    }
}
