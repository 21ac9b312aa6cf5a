//! Causal grouped-query attention over a KV cache: on the CPU by the kernel of
//! [`crate::engine::kernels::attention`], elsewhere by tensor ops.

use crate::engine::kernels::attention::{attention_on_cpu, Kernel};
use candle_core::{DType, Device, Result, Tensor};

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

/// Attention for the new query rows of several sequences, each over a cache
/// of its own: `queries` is `(rows, heads, 1, head_dim)`, `runs[i]` rows of
/// sequence i after those of the sequences before it, and `caches[i]` holds
/// sequence i's keys and values `(1, kv_heads, positions_i, head_dim)`, its
/// new positions last. Row `r` of a run attends to the positions before the
/// run and to the run's rows up to its own. Returns `(1, rows, heads * head_dim)`.
///
/// A decode step's attention is a few dot products per cached position. As
/// tensor ops (two matmuls, a softmax, reshapes) per sequence its cost was
/// mostly their overhead, more than half a step's time with many sequences;
/// here each query head makes one pass over its cache rows, in place, from
/// an f32, f16 or bf16 cache. Other devices take the tensor-op path.
pub fn batch_attention(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    runs: &[usize],
    scale: f64,
) -> Result<Tensor> {
    let rows = queries.dim(0)?;
    if caches.len() != runs.len() || runs.iter().sum::<usize>() != rows {
        candle_core::bail!(
            "{rows} query rows in runs {runs:?} for {} caches",
            caches.len()
        );
    }
    if !readable_on_cpu(queries, caches) {
        return batch_attention_by_ops(&queries.contiguous()?, caches, runs, scale);
    }
    batch_attention_on_cpu(queries, caches, runs, scale, Kernel::best())
}

/// [`batch_attention`] on tensors [`readable_on_cpu`], with `kernel`.
fn batch_attention_on_cpu(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    runs: &[usize],
    scale: f64,
    kernel: Kernel,
) -> Result<Tensor> {
    let mut views = Vec::with_capacity(queries.dim(0)?);
    for (cache, ((keys, _), &run)) in caches.iter().zip(runs).enumerate() {
        let earlier = keys.dim(2)?.checked_sub(run).ok_or_else(|| {
            candle_core::Error::Msg(format!("a run of {run} rows over a shorter cache"))
        })?;
        views.extend((1..=run).map(|row| (cache, earlier + row)));
    }
    attention_on_cpu(queries, caches, |row| views[row], scale, kernel)
}

/// Whether `batch_attention` and `prompt_attention` can read these tensors
/// in place: f32 queries and an f32, f16, bf16 or 8-bit cache, all on the CPU.
fn readable_on_cpu(queries: &Tensor, caches: &[(Tensor, Tensor)]) -> bool {
    let on_cpu = |t: &Tensor, dtypes: &[DType]| t.device().is_cpu() && dtypes.contains(&t.dtype());
    let cache_dtypes = [DType::F32, DType::F16, DType::BF16, DType::U8];
    on_cpu(queries, &[DType::F32])
        && caches
            .iter()
            .all(|(keys, values)| on_cpu(keys, &cache_dtypes) && on_cpu(values, &cache_dtypes))
}

/// Causal attention for a prompt's `queries` `(1, heads, seq, d)`, the last
/// `seq` positions of `keys` and `values` `(1, kv_heads, total, d)`; returns
/// `(1, seq, heads * d)`. Query `i` attends to positions `..=total - seq + i`.
///
/// On the CPU each query runs the decode kernel over the positions it sees,
/// in tiles of consecutive rows that share each widened chunk of the cache:
/// the masked half of the score matrix is never computed, no score matrix
/// of `heads × seq × total` floats is allocated, a 16-bit cache is read in
/// place, and a prompt token's attention is computed as a generated token's
/// would be. Other devices take the matmul path.
pub fn prompt_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let (_, heads, seq, d) = queries.dims4()?;
    let total = keys.dim(2)?;
    let caches = [(keys.clone(), values.clone())];
    if !readable_on_cpu(queries, &caches) {
        let mask = causal_mask(seq, total, queries.device())?;
        let (keys, values) = (as_floats(keys, DType::F32)?, as_floats(values, DType::F32)?);
        return causal_attention(queries, &keys, &values, mask.as_ref(), scale);
    }
    // Row after row of `heads * d`, as the kernel takes one query per row.
    let rows = queries
        .transpose(1, 2)?
        .contiguous()?
        .reshape((seq, heads, 1, d))?;
    batch_attention_on_cpu(&rows, &caches, &[seq], scale, Kernel::best())
}

/// [`batch_attention`] as tensor ops, for devices other than the CPU: the
/// query heads that share a key/value head are stacked into one matrix per
/// key/value head, which attends with two matmuls.
fn batch_attention_by_ops(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    runs: &[usize],
    scale: f64,
) -> Result<Tensor> {
    let mut outputs = Vec::with_capacity(caches.len());
    let mut first = 0;
    for ((keys, values), &run) in caches.iter().zip(runs) {
        // (1, heads, run, d), the run's rows as one sequence's queries.
        let query = queries
            .narrow(0, first, run)?
            .transpose(0, 2)?
            .contiguous()?;
        let keys = as_floats(keys, query.dtype())?;
        let values = as_floats(values, query.dtype())?;
        let mask = causal_mask(run, keys.dim(2)?, query.device())?;
        outputs.push(causal_attention(
            &query,
            &keys,
            &values,
            mask.as_ref(),
            scale,
        )?);
        first += run;
    }
    Tensor::cat(&outputs, 1)
}

/// A float cache tensor in `dtype`, for the tensor-op path. An 8-bit
/// cache's bytes are not its values, and only the CPU kernels read it.
fn as_floats(cache: &Tensor, dtype: DType) -> Result<Tensor> {
    if cache.dtype() == DType::U8 {
        candle_core::bail!("an 8-bit KV cache is read by the CPU attention kernels only");
    }
    cache.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kernels::attention::TILE_ROWS;
    use crate::engine::kv_cache::Q8_SCALE_BYTES;

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

    /// Each cache's keys and values converted to `dtype`, or for `U8`
    /// stored as an 8-bit cache stores them.
    fn stored_as(caches: &[(Tensor, Tensor)], dtype: DType) -> Vec<(Tensor, Tensor)> {
        let store = |t: &Tensor| {
            if dtype != DType::U8 {
                return t.to_dtype(dtype).unwrap();
            }
            let (_, heads, positions, d) = t.dims4().unwrap();
            let rows = flat(&t.contiguous().unwrap());
            let bytes = crate::engine::kv_cache::quantize_rows(&rows, d);
            Tensor::from_vec(
                bytes,
                (1, heads, positions, d + Q8_SCALE_BYTES),
                &Device::Cpu,
            )
            .unwrap()
        };
        caches.iter().map(|(k, v)| (store(k), store(v))).collect()
    }

    /// The f32 values an 8-bit cache `stored_as` gave stands for.
    fn dequantized(caches: &[(Tensor, Tensor)]) -> Vec<(Tensor, Tensor)> {
        let values = |t: &Tensor| {
            let (_, heads, positions, width) = t.dims4().unwrap();
            let d = width - Q8_SCALE_BYTES;
            let bytes: Vec<u8> = t.flatten_all().unwrap().to_vec1().unwrap();
            let floats: Vec<f32> = bytes
                .chunks_exact(width)
                .flat_map(|row| {
                    let scale = f32::from_le_bytes(row[d..].try_into().unwrap());
                    row[..d].iter().map(move |&b| f32::from(b as i8) * scale)
                })
                .collect();
            Tensor::from_vec(floats, (1, heads, positions, d), &Device::Cpu).unwrap()
        };
        caches.iter().map(|(k, v)| (values(k), values(v))).collect()
    }

    impl Kernel {
        /// Every kernel this CPU runs.
        fn available() -> Vec<Kernel> {
            match Kernel::best() {
                Kernel::Portable => vec![Kernel::Portable],
                Kernel::Avx2 => vec![Kernel::Portable, Kernel::Avx2],
                Kernel::Avx512 => vec![Kernel::Portable, Kernel::Avx2, Kernel::Avx512],
            }
        }
    }

    /// Every kernel, with the query heads of a key/value head in one pass
    /// or split over several (seven heads: four and three scored, six and
    /// one weighted), over cache chunks and their tails.
    ///
    /// An 8-bit cache attends as the f32 values its rows stand for, up to
    /// the order of rounding: a score's scale applies to its sum.
    #[test]
    fn every_kernel_matches_the_matmul_path_for_any_grouping_of_heads() {
        for (heads, kv_heads, d) in [(9, 3, 64), (12, 2, 128), (14, 2, 64), (2, 1, 32)] {
            let (queries, caches) = decode_inputs(heads, kv_heads, &[5, 70], d);
            for dtype in [DType::F16, DType::U8] {
                let caches = stored_as(&caches, dtype);
                let floats = match dtype {
                    DType::U8 => dequantized(&caches),
                    _ => caches.clone(),
                };
                let scale = 1.0 / (d as f64).sqrt();
                let expected =
                    flat(&batch_attention_by_ops(&queries, &floats, &[1, 1], scale).unwrap());
                for kernel in Kernel::available() {
                    let out = batch_attention_on_cpu(&queries, &caches, &[1, 1], scale, kernel);
                    let diff = max_difference(&flat(&out.unwrap()), &expected);
                    assert!(
                        diff < 1e-5,
                        "{kernel:?} on {dtype:?}, {heads}/{kv_heads} heads, d = {d}: {diff}"
                    );
                }
            }
        }
    }

    /// The tensor-op path cannot read an 8-bit cache's bytes as values and
    /// says so instead of attending to them.
    #[test]
    fn the_matmul_path_refuses_an_8_bit_cache() {
        let (queries, caches) = decode_inputs(6, 2, &[5], 64);
        let caches = stored_as(&caches, DType::U8);
        let err = batch_attention_by_ops(&queries, &caches, &[1], 0.125).unwrap_err();
        assert!(err.to_string().contains("8-bit"), "{err}");
    }

    #[test]
    fn decode_attention_matches_the_matmul_path() {
        // d = 20 leaves a tail after the blocks of eight.
        for d in [64, 20] {
            let (queries, caches) = decode_inputs(6, 2, &[5, 45], d);
            let scale = 1.0 / (d as f64).sqrt();
            let out = flat(&batch_attention(&queries, &caches, &[1, 1], scale).unwrap());
            let expected =
                flat(&batch_attention_by_ops(&queries, &caches, &[1, 1], scale).unwrap());
            let diff = max_difference(&out, &expected);
            assert!(diff < 1e-5, "d = {d}: max difference {diff}");
        }
    }

    #[test]
    fn prompt_attention_matches_the_matmul_path_after_a_cached_prefix() {
        // Three prompt rows after 42 cached positions, over a cache with room
        // to spare; d = 20 takes the portable loop.
        for d in [64, 20] {
            let (heads, kv_heads, seq, total) = (6, 2, 3, 45);
            let (rows, caches) = decode_inputs(heads, kv_heads, &[total; 1], d);
            let queries = rows
                .narrow(0, 0, 1)
                .and_then(|one| one.repeat((seq, 1, 1, 1)))
                .and_then(|q| q.affine(0.5, 0.25))
                .and_then(|q| q.reshape((1, heads, seq, d)))
                .unwrap();
            let (keys, values) = &caches[0];
            let scale = 1.0 / (d as f64).sqrt();
            let out = flat(&prompt_attention(&queries, keys, values, scale).unwrap());
            let mask = causal_mask(seq, total, &Device::Cpu).unwrap();
            let expected = causal_attention(&queries, keys, values, mask.as_ref(), scale).unwrap();
            let diff = max_difference(&out, &flat(&expected));
            assert!(diff < 1e-5, "d = {d}: max difference {diff}");
        }
    }

    /// A prompt's rows, attended in tiles, get the very bits each would get
    /// as a decode step over the positions it sees: past several tiles, a
    /// last partial tile and chunk boundaries of the widened cache rows.
    #[test]
    fn a_prompt_row_attends_as_a_decode_step_would() {
        let cases = [
            (DType::F16, 64),
            (DType::F32, 64),
            (DType::BF16, 20),
            (DType::U8, 64),
            (DType::U8, 20),
        ];
        for (dtype, d) in cases {
            let (heads, kv_heads, seq, total) = (6, 2, 2 * TILE_ROWS + 3, 150);
            let (rows, caches) = decode_inputs(heads, kv_heads, &[total; 1], d);
            let [(keys, values)] = <[_; 1]>::try_from(stored_as(&caches, dtype)).unwrap();
            let queries = rows
                .narrow(0, 0, 1)
                .and_then(|one| one.repeat((seq, 1, 1, 1)))
                .and_then(|q| q.affine(0.5, 0.25))
                .and_then(|q| q.transpose(0, 2))
                .unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let prompt = flat(&prompt_attention(&queries, &keys, &values, scale).unwrap());
            for i in 0..seq {
                let seen = total - seq + i + 1;
                let query = queries.narrow(2, i, 1).unwrap().transpose(0, 2).unwrap();
                let cache = [(
                    keys.narrow(2, 0, seen).unwrap(),
                    values.narrow(2, 0, seen).unwrap(),
                )];
                let alone = flat(&batch_attention(&query, &cache, &[1], scale).unwrap());
                assert_eq!(
                    &prompt[i * heads * d..(i + 1) * heads * d],
                    &alone[..],
                    "{dtype:?}, d = {d}, row {i}"
                );
            }
        }
    }

    /// Runs of several rows and of one row in one call get the bits each
    /// sequence gets attended alone.
    #[test]
    fn a_batch_of_runs_attends_each_sequence_as_alone() {
        let (heads, kv_heads, d) = (6, 2, 64);
        let runs = [3, 1, 12];
        let (rows, caches) = decode_inputs(heads, kv_heads, &[7, 40, 90], d);
        let caches = stored_as(&caches, DType::F16);
        // One query row per sequence from `decode_inputs`, varied per run row.
        let queries: Vec<Tensor> = runs
            .iter()
            .enumerate()
            .map(|(i, &run)| {
                let one = rows.narrow(0, i, 1).unwrap();
                let run_rows: Vec<Tensor> = (0..run)
                    .map(|r| one.affine(1.0 - 0.05 * r as f64, 0.01 * r as f64).unwrap())
                    .collect();
                Tensor::cat(&run_rows, 0).unwrap()
            })
            .collect();
        let scale = 1.0 / (d as f64).sqrt();
        let together = flat(
            &batch_attention(&Tensor::cat(&queries, 0).unwrap(), &caches, &runs, scale).unwrap(),
        );
        let mut first = 0;
        for ((queries, cache), &run) in queries.iter().zip(&caches).zip(&runs) {
            let alone = flat(
                &batch_attention(queries, std::slice::from_ref(cache), &[run], scale).unwrap(),
            );
            assert_eq!(
                &together[first..first + alone.len()],
                &alone[..],
                "a run of {run}"
            );
            first += alone.len();
        }
        let by_ops = flat(
            &batch_attention_by_ops(&Tensor::cat(&queries, 0).unwrap(), &caches, &runs, scale)
                .unwrap(),
        );
        let diff = max_difference(&together, &by_ops);
        assert!(diff < 1e-5, "max difference {diff} from the matmul path");
    }

    /// A 16-bit cache gives exactly what an f32 cache holding the same
    /// (rounded) values gives: the kernels that read 16-bit rows in place
    /// compute what the f32 kernel computes on the widened rows.
    #[test]
    fn a_16_bit_cache_reads_as_its_values_widened_to_f32() {
        for dtype in [DType::F16, DType::BF16] {
            for d in [64, 20] {
                let (queries, caches) = decode_inputs(6, 2, &[5, 45], d);
                let stored = stored_as(&caches, dtype);
                let widened = stored_as(&stored, DType::F32);
                let scale = 1.0 / (d as f64).sqrt();
                for kernel in Kernel::available() {
                    let attend = |caches: &[(Tensor, Tensor)]| {
                        flat(
                            &batch_attention_on_cpu(&queries, caches, &[1, 1], scale, kernel)
                                .unwrap(),
                        )
                    };
                    assert_eq!(
                        attend(&stored),
                        attend(&widened),
                        "{dtype:?}, d = {d}, {kernel:?}"
                    );
                }
            }
        }
    }
}
