//! Rotary position embeddings: the cosine and sine tables, and each row's
//! queries and keys turned by its position and appended to its cache.

use super::Config;
use crate::engine::kernels::cpu_values;
use crate::engine::kernels::rowwise::f32_on_cpu;
use crate::engine::kv_cache::KvCache;
use crate::engine::pool::each_on_pool;
use crate::error::{CandleContext, Result};
use candle_core::{DType, Device, Tensor};

/// Cosine and sine tables for every position up to the context length, `(positions, head_dim / 2)`.
pub(super) struct Rope {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    /// Each pair of a head's values turns by its frequency times the position.
    inv_freq: Vec<f32>,
    interleaved: bool,
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

impl Rope {
    pub(super) fn new(config: &Config, device: &Device) -> Result<Self> {
        Rope::with(
            config.head_dim,
            config.rope_theta,
            config.context_tokens,
            config.rope_interleaved,
            device,
        )
    }

    /// The tables of heads of `head_dim` values for `positions` positions.
    fn with(
        head_dim: usize,
        theta: f64,
        positions: usize,
        interleaved: bool,
        device: &Device,
    ) -> Result<Self> {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32)
            .collect();
        let tables = || -> candle_core::Result<(Tensor, Tensor)> {
            let inv_freq = Tensor::from_vec(inv_freq.clone(), (1, half), device)?;
            let positions = Tensor::arange(0u32, positions as u32, device)?
                .to_dtype(DType::F32)?
                .reshape((positions, 1))?;
            let angles = positions.matmul(&inv_freq)?;
            Ok((angles.cos()?, angles.sin()?))
        };
        let (cos, sin) = tables().context("building RoPE tables")?;
        Ok(Rope {
            cos,
            sin,
            inv_freq,
            interleaved,
        })
    }

    /// Keys `(1, kv_heads, seq, head_dim)` already turned for their
    /// positions, turned `delta` positions further: a rotation by a
    /// position's angles after another adds the positions, so these are
    /// the keys of the same rows `delta` positions later (earlier when
    /// negative). Turned in f32 and returned in the keys' dtype.
    pub(super) fn shift(&self, keys: &Tensor, delta: i64) -> candle_core::Result<Tensor> {
        let (_, _, seq, _) = keys.dims4()?;
        let half = self.inv_freq.len();
        let angles: Vec<f64> = self
            .inv_freq
            .iter()
            .map(|&freq| delta as f64 * f64::from(freq))
            .collect();
        let table = |f: fn(f64) -> f64| {
            let row: Vec<f32> = angles.iter().map(|&angle| f(angle) as f32).collect();
            Tensor::from_vec(row, (1, half), keys.device())?
                .broadcast_as((seq, half))?
                .contiguous()
        };
        let (cos, sin) = (table(f64::cos)?, table(f64::sin)?);
        let turned = self.apply(&keys.to_dtype(DType::F32)?.contiguous()?, &cos, &sin)?;
        turned.to_dtype(keys.dtype())
    }

    /// The tables for positions `start..start + len`.
    pub(super) fn at(&self, start: usize, len: usize) -> candle_core::Result<(Tensor, Tensor)> {
        Ok((
            self.cos.narrow(0, start, len)?,
            self.sin.narrow(0, start, len)?,
        ))
    }

    /// Rotate `x` of shape `(1, heads, seq, head_dim)`.
    pub(super) fn apply(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> candle_core::Result<Tensor> {
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
    pub(super) fn turn_and_append(
        &self,
        (layer, caches, run_lengths): (usize, &mut [&mut KvCache], &[usize]),
        [q, k, v]: [Tensor; 3],
        (heads, kv_heads): (usize, usize),
        (cos, sin): (&Tensor, &Tensor),
    ) -> candle_core::Result<(Tensor, Vec<(Tensor, Tensor)>)> {
        // One function on purpose: the slices every job reads and writes
        // borrow from the storage guards and buffers made here, and they must
        // all live until the jobs' writes are checked; helpers would carry
        // those borrows through their signatures for no gain in clarity.
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
    use crate::engine::kv_cache::KvDtype;

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
                inv_freq: Vec::new(),
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

    #[test]
    fn keys_shifted_by_a_distance_are_the_keys_turned_at_the_new_positions() {
        let (kv_heads, seq, head_dim) = (2, 5, 16);
        let raw: Vec<f32> = (0..kv_heads * seq * head_dim)
            .map(|i| (i as f32 * 0.61).cos() * 3.0)
            .collect();
        let keys = Tensor::from_vec(raw, (1, kv_heads, seq, head_dim), &Device::Cpu).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for interleaved in [true, false] {
            let rope = Rope::with(head_dim, 1e6, 4096, interleaved, &Device::Cpu).unwrap();
            let turned_at = |start: usize| {
                let (cos, sin) = rope.at(start, seq).unwrap();
                rope.apply(
                    &keys,
                    &cos.contiguous().unwrap(),
                    &sin.contiguous().unwrap(),
                )
                .unwrap()
            };
            for (from, to) in [(40, 1999), (3000, 17), (9, 9)] {
                let moved = rope
                    .shift(&turned_at(from), to as i64 - from as i64)
                    .unwrap();
                let worst = flat(&moved)
                    .iter()
                    .zip(flat(&turned_at(to)))
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    worst < 2e-3,
                    "{from} -> {to}, interleaved {interleaved}: {worst}"
                );
            }
        }
    }
}
