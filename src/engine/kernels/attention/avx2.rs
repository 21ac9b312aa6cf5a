//! The AVX2 attention kernel, with the loops of [`super::avx512`] for scores
//! and weighted sums on a CPU that has AVX-512.

use super::{prefetch_row_ahead, HeadRows, RowData, RowScale, Scratch, Tile, PREFETCH_ROWS};
use crate::engine::kernels::exp::exp;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// Floats in one AVX register.
pub(super) const LANES: usize = 8;

/// Positions widened at a time: 32 rows of a 128-wide head are 16 KB of
/// f32. A one-thread probe ran sixteen SmolLM2 decode steps' attention
/// in 43-49 ms with 32 rows against 51-57 with 64, and a Qwen-1.5B
/// prompt's 10-15% faster too.
const CHUNK: usize = 32;

/// The lane sums of eight registers, `sums[r]` in lane `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sum_each(sums: &[__m256; 8]) -> __m256 {
    let pairs = [
        _mm256_hadd_ps(sums[0], sums[1]),
        _mm256_hadd_ps(sums[2], sums[3]),
        _mm256_hadd_ps(sums[4], sums[5]),
        _mm256_hadd_ps(sums[6], sums[7]),
    ];
    // Lanes 0-3 now hold the sums of the low halves of registers 0-3
    // (and 4-7 in `high`), lanes 4-7 those of their high halves.
    let low = _mm256_hadd_ps(pairs[0], pairs[1]);
    let high = _mm256_hadd_ps(pairs[2], pairs[3]);
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(low, high),
        _mm256_permute2f128_ps::<0x31>(low, high),
    )
}

/// A value of a cache the kernels read eight at a time, as f32.
trait Lane: RowScale {
    /// The eight values from `at`, widened exactly.
    ///
    /// # Safety
    /// Eight values are readable from `at`, and the CPU has AVX2 and F16C.
    unsafe fn eight(at: *const Self) -> __m256;
}

impl Lane for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(at: *const f32) -> __m256 {
        // SAFETY: as the caller promises.
        unsafe { _mm256_loadu_ps(at) }
    }
}

impl Lane for f16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(at: *const f16) -> __m256 {
        // SAFETY: as the caller promises.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) }
    }
}

impl Lane for bf16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(at: *const bf16) -> __m256 {
        // SAFETY: as the caller promises. A bf16 is the top half of an f32.
        let halves = unsafe { _mm256_cvtepu16_epi32(_mm_loadu_si128(at.cast())) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(halves))
    }
}

impl Lane for i8 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(at: *const i8) -> __m256 {
        // SAFETY: as the caller promises.
        let bytes = unsafe { _mm_loadl_epi64(at.cast()) };
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))
    }
}

/// Rows `first..first + count` of `rows` and their stride: widened to
/// f32 into `scratch` (`d` apart) when `widen` and the cache is 16-bit,
/// else in place. A tile of several rows reads each row once per row and
/// head pair, so widening it once first saves conversions; a single row
/// (a decode step) is better served by converting as it reads. An 8-bit
/// cache is always read in place: its scale applies to a score as a
/// whole, which a widened row could not give a prompt row bit for bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn chunk<'a>(
    rows: &HeadRows<'a>,
    (first, count): (usize, usize),
    widen: bool,
    scratch: &'a mut Vec<f32>,
) -> (RowData<'a>, usize) {
    let (d, stride) = (rows.d, rows.stride);
    let span = first * stride..(first + count - 1) * stride + rows.width;
    let data = match rows.data {
        RowData::F32(data) => RowData::F32(&data[span]),
        RowData::Q8(data) => RowData::Q8(&data[span]),
        RowData::F16(data) if !widen => RowData::F16(&data[span]),
        RowData::Bf16(data) if !widen => RowData::Bf16(&data[span]),
        RowData::F16(data) => return (RowData::F32(widened(&data[span], (stride, d), scratch)), d),
        RowData::Bf16(data) => {
            return (RowData::F32(widened(&data[span], (stride, d), scratch)), d)
        }
    };
    (data, stride)
}

/// The rows of `data` (`d` values each, `stride` apart) widened into
/// `scratch`, `d` apart.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widened<'a, L: Lane>(
    data: &[L],
    (stride, d): (usize, usize),
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    let count = (data.len() - d) / stride + 1;
    scratch.resize(count * d, 0.0);
    for (j, out) in scratch.chunks_exact_mut(d).enumerate() {
        let row = &data[j * stride..][..d];
        for (values, out) in row.chunks_exact(LANES).zip(out.chunks_exact_mut(LANES)) {
            // SAFETY: both runs hold eight values.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), L::eight(values.as_ptr())) };
        }
    }
    scratch
}

/// [`Tile::attend`] with AVX2, and with the scores and weighted sums of
/// [`super::avx512`] when `wide`. Each row's scores and sums take the
/// same steps in the same order as they would in a tile of that row alone.
///
/// For a tile of several prompt rows, a 16-bit cache is widened to f32 a
/// chunk of positions at a time, once for all the rows and heads that read
/// it, into a scratch buffer that stays in the L1 cache. A decode step's
/// single row reads the 16-bit rows directly, widening each load: the round
/// trip through the buffer cost it more than the conversions it saved.
/// Widening is exact either way, so the cache dtype alone decides the result.
///
/// Two query heads go through a chunk together, so that each load of a
/// cache row serves both: four positions' scores at a time, each in its own
/// register and summed across lanes at the end, and four blocks of each
/// head's output kept in registers through every position of a chunk. The
/// chunks continue the same sums. Every score and output therefore rounds
/// the same however positions, heads and rows are grouped, and a prompt row
/// gets the bits a decode step would. On a CPU with AVX-512 the scores and
/// weighted sums come from [`super::avx512`]'s loops instead, which read each
/// cache row once for up to four heads' scores or six heads' outputs.
///
/// # Safety
/// When `wide`, the CPU has AVX-512F and `d` is a multiple of sixteen.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend(
    tile: &Tile,
    scratch: &mut Scratch,
    outs: &mut [&mut [f32]],
    wide: bool,
) {
    let (d, positions) = (tile.keys.d, tile.keys.positions);
    let groups = tile
        .rows
        .first()
        .map_or(0, |(queries, _)| queries.len() / d);
    // Row r's head g keeps its scores at `(r * groups + g) * positions`,
    // the first as many as the row sees.
    let Scratch { scores, rows } = scratch;
    // Every score read is written first in this tile, so what an earlier
    // tile left needs no clearing.
    let needed = tile.rows.len() * groups * positions;
    if scores.len() < needed {
        scores.resize(needed, 0.0);
    }
    let scores = &mut scores[..needed];
    let per_row = groups * positions;
    let widen = tile.rows.len() > 1;
    // The kernels ask for rows `PREFETCH_ROWS` ahead as they go; these
    // are the rows before.
    for rows in [&tile.keys, &tile.values] {
        let count = PREFETCH_ROWS.min(rows.positions);
        if count > 0 {
            let bytes = rows.bytes(0, count);
            super::prefetch(bytes.as_ptr(), bytes.len());
        }
    }
    for first in (0..positions).step_by(CHUNK) {
        let count = CHUNK.min(positions - first);
        let (keys, stride) = chunk(&tile.keys, (first, count), widen, rows);
        for (&(queries, seen), scores) in tile.rows.iter().zip(scores.chunks_exact_mut(per_row)) {
            let keys = (keys, stride, count.min(seen.saturating_sub(first)));
            let scores = (&mut scores[first..], positions);
            match wide {
                // SAFETY: as the caller promises.
                true => unsafe {
                    super::avx512::score_chunk((queries, d), keys, tile.scale, scores)
                },
                false => score_chunk((queries, d), keys, tile.scale, scores),
            }
        }
    }
    for (&(_, seen), scores) in tile.rows.iter().zip(scores.chunks_exact_mut(per_row)) {
        for scores in scores.chunks_exact_mut(positions) {
            softmax(&mut scores[..seen]);
        }
    }
    for out in outs.iter_mut() {
        out.fill(0.0);
    }
    for first in (0..positions).step_by(CHUNK) {
        let count = CHUNK.min(positions - first);
        let (values, stride) = chunk(&tile.values, (first, count), widen, rows);
        for ((&(_, seen), scores), out) in tile
            .rows
            .iter()
            .zip(scores.chunks_exact(per_row))
            .zip(outs.iter_mut())
        {
            let values = (values, stride, count.min(seen.saturating_sub(first)));
            let weights = (&scores[first..], positions);
            match wide {
                // SAFETY: as the caller promises.
                true => unsafe { super::avx512::add_weighted(weights, values, out, d) },
                false => add_weighted(weights, values, out, d),
            }
        }
    }
}

/// Turn `scores` into their softmax, in place, eight at a time. A last
/// run of fewer than eight is padded, so every score takes the same path.
///
/// The largest score and the quotients are exact, so computing them in
/// registers gives the bits of a scalar loop; one score at a time, the
/// divisions took a quarter of a decode step's attention.
#[target_feature(enable = "avx2,fma,f16c")]
fn softmax(scores: &mut [f32]) {
    let (runs, rest) = scores.as_chunks_mut::<LANES>();
    let mut largest = _mm256_set1_ps(f32::NEG_INFINITY);
    for run in runs.iter() {
        // SAFETY: `run` holds eight floats.
        largest = _mm256_max_ps(largest, unsafe { _mm256_loadu_ps(run.as_ptr()) });
    }
    let largest = lanes_of(largest)
        .into_iter()
        .chain(rest.iter().copied())
        .fold(f32::NEG_INFINITY, f32::max);
    let largest = _mm256_set1_ps(largest);
    let mut sums = _mm256_setzero_ps();
    for run in runs.iter_mut() {
        // SAFETY: `run` holds eight floats.
        unsafe {
            let weights = exp(_mm256_sub_ps(_mm256_loadu_ps(run.as_ptr()), largest));
            _mm256_storeu_ps(run.as_mut_ptr(), weights);
            sums = _mm256_add_ps(sums, weights);
        }
    }
    if !rest.is_empty() {
        let mut lanes = [0f32; LANES];
        lanes[..rest.len()].copy_from_slice(rest);
        let weights = exp(_mm256_sub_ps(
            // SAFETY: `lanes` holds eight floats.
            unsafe { _mm256_loadu_ps(lanes.as_ptr()) },
            largest,
        ));
        let mut lanes = lanes_of(weights);
        rest.copy_from_slice(&lanes[..rest.len()]);
        lanes[rest.len()..].fill(0.0);
        // SAFETY: as above.
        sums = _mm256_add_ps(sums, unsafe { _mm256_loadu_ps(lanes.as_ptr()) });
    }
    let total: f32 = lanes_of(sums).iter().sum();
    let totals = _mm256_set1_ps(total);
    for run in runs.iter_mut() {
        // SAFETY: `run` holds eight floats.
        unsafe {
            let quotients = _mm256_div_ps(_mm256_loadu_ps(run.as_ptr()), totals);
            _mm256_storeu_ps(run.as_mut_ptr(), quotients);
        }
    }
    for score in rest.iter_mut() {
        *score /= total;
    }
}

/// The eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes_of(v: __m256) -> [f32; LANES] {
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
    lanes
}

/// Query heads that share each load of a cache row. Two heads of four
/// positions' scores, or of four blocks of output, are eight sums in
/// registers and need six loads for eight multiply-adds, where one head
/// needed nine.
const HEADS_AT_ONCE: usize = 2;

/// Positions scored in one pass over the query heads.
const POSITIONS_AT_ONCE: usize = 4;

/// Output blocks of eight kept in registers through one pass over the
/// weighted value rows.
const BLOCKS_AT_ONCE: usize = 4;

/// The scores of a row's query heads `queries` (runs of `d`) against the
/// `count` key rows of a chunk (`keys[j * stride..]`): head `h`'s score of
/// row `j` goes to `scores[h * positions + j]`, scaled by `scale`.
///
/// Each score sums its products in eight lanes over the blocks of the
/// head, in order, and then across lanes by [`sum_each`]; how many heads
/// and positions share a pass does not change its rounding.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn score_chunk(
    queries: (&[f32], usize),
    (keys, stride, count): (RowData, usize, usize),
    scale: f32,
    scores: (&mut [f32], usize),
) {
    match keys {
        RowData::F32(keys) => score_rows(queries, (keys, stride, count), scale, scores),
        RowData::F16(keys) => score_rows(queries, (keys, stride, count), scale, scores),
        RowData::Bf16(keys) => score_rows(queries, (keys, stride, count), scale, scores),
        RowData::Q8(keys) => score_rows(queries, (keys, stride, count), scale, scores),
    }
}

/// [`score_chunk`] for keys stored as `L`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn score_rows<L: Lane>(
    (queries, d): (&[f32], usize),
    (keys, stride, count): (&[L], usize, usize),
    scale: f32,
    (scores, positions): (&mut [f32], usize),
) {
    for (h, queries) in queries.chunks(HEADS_AT_ONCE * d).enumerate() {
        let scores = &mut scores[h * HEADS_AT_ONCE * positions..];
        let mut start = 0;
        while start < count {
            let taken = match (queries.len() / d, count - start) {
                (2, POSITIONS_AT_ONCE..) => score_block::<L, 2, POSITIONS_AT_ONCE>,
                (2, _) => score_block::<L, 2, 1>,
                (_, POSITIONS_AT_ONCE..) => score_block::<L, 1, POSITIONS_AT_ONCE>,
                _ => score_block::<L, 1, 1>,
            }(
                queries,
                &keys[start * stride..],
                stride,
                scale,
                (scores, positions, start),
            );
            if h == 0 {
                for row in start..start + taken {
                    prefetch_row_ahead(keys.as_ptr().wrapping_add(row * stride), stride);
                }
            }
            start += taken;
        }
    }
}

/// [`score_rows`] for `H` heads and `P` key rows from `keys`' first;
/// returns `P`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn score_block<L: Lane, const H: usize, const P: usize>(
    queries: &[f32],
    keys: &[L],
    stride: usize,
    scale: f32,
    (scores, positions, start): (&mut [f32], usize, usize),
) -> usize {
    let d = queries.len() / H;
    debug_assert!(queries.len() == H * d && (P - 1) * stride + d <= keys.len());
    // Sum `h * P + p` is head h's score of row p; `sum_each` puts it in lane `h * P + p`.
    let mut sums = [_mm256_setzero_ps(); LANES];
    for block in (0..d).step_by(LANES) {
        // SAFETY: blocks of eight within each head's query and each key
        // row, checked above.
        unsafe {
            let query: [__m256; H] =
                std::array::from_fn(|h| _mm256_loadu_ps(queries.as_ptr().add(h * d + block)));
            for p in 0..P {
                let key = L::eight(keys.as_ptr().add(p * stride + block));
                for (h, query) in query.iter().enumerate() {
                    sums[h * P + p] = _mm256_fmadd_ps(*query, key, sums[h * P + p]);
                }
            }
        }
    }
    // SAFETY: `chunk` spans whole stored rows, an 8-bit row's scale included.
    let row_scales: [f32; P] =
        std::array::from_fn(|p| unsafe { L::row_scale(keys.as_ptr().add(p * stride), d) });
    let lane_scales: [f32; LANES] = std::array::from_fn(|lane| row_scales[lane % P]);
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` and `lane_scales` hold eight floats.
    unsafe {
        let sums = _mm256_mul_ps(sum_each(&sums), _mm256_loadu_ps(lane_scales.as_ptr()));
        let scores = _mm256_mul_ps(sums, _mm256_set1_ps(scale));
        _mm256_storeu_ps(lanes.as_mut_ptr(), scores);
    }
    for h in 0..H {
        scores[h * positions + start..][..P].copy_from_slice(&lanes[h * P..][..P]);
    }
    P
}

/// `out[h * d..]` += Σⱼ `weights[h * positions + j]` · value row `j`
/// (`values[j * stride..]`) for the `count` rows of a chunk, for each of
/// a row's query heads. Every output sums its rows in order, so neither
/// chunking nor how many heads share a pass changes its rounding.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn add_weighted(
    weights: (&[f32], usize),
    (values, stride, count): (RowData, usize, usize),
    out: &mut [f32],
    d: usize,
) {
    match values {
        RowData::F32(values) => weigh_rows(weights, (values, stride, count), out, d),
        RowData::F16(values) => weigh_rows(weights, (values, stride, count), out, d),
        RowData::Bf16(values) => weigh_rows(weights, (values, stride, count), out, d),
        RowData::Q8(values) => weigh_rows(weights, (values, stride, count), out, d),
    }
}

/// [`add_weighted`] for values stored as `L`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weigh_rows<L: Lane>(
    (weights, positions): (&[f32], usize),
    (values, stride, count): (&[L], usize, usize),
    out: &mut [f32],
    d: usize,
) {
    for (h, out) in out.chunks_mut(HEADS_AT_ONCE * d).enumerate() {
        let weights = &weights[h * HEADS_AT_ONCE * positions..];
        let mut part = 0;
        while part < d {
            part += match (out.len() / d, (d - part) / LANES) {
                (2, BLOCKS_AT_ONCE..) => weigh_block::<L, 2, BLOCKS_AT_ONCE>,
                (2, _) => weigh_block::<L, 2, 1>,
                (_, BLOCKS_AT_ONCE..) => weigh_block::<L, 1, BLOCKS_AT_ONCE>,
                _ => weigh_block::<L, 1, 1>,
            }(
                (weights, positions),
                (values, stride, count),
                out,
                (d, part),
                h == 0 && part == 0,
            );
        }
    }
}

/// [`weigh_rows`] for `H` heads and `B` blocks of output from `part`,
/// asking for the value rows ahead when `prefetch` (one pass of the
/// row's does); returns the floats of output done.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weigh_block<L: Lane, const H: usize, const B: usize>(
    (weights, positions): (&[f32], usize),
    (values, stride, count): (&[L], usize, usize),
    out: &mut [f32],
    (d, part): (usize, usize),
    prefetch: bool,
) -> usize {
    debug_assert!(out.len() == H * d && part + B * LANES <= d);
    debug_assert!(count == 0 || (count - 1) * stride + part + B * LANES <= values.len());
    debug_assert!(count == 0 || (H - 1) * positions + count <= weights.len());
    // SAFETY: blocks of eight within each head's output, checked above.
    let mut sums: [[__m256; B]; H] = std::array::from_fn(|h| {
        std::array::from_fn(|b| unsafe {
            _mm256_loadu_ps(out.as_ptr().add(h * d + part + b * LANES))
        })
    });
    for j in 0..count {
        if prefetch {
            prefetch_row_ahead(values.as_ptr().wrapping_add(j * stride), stride);
        }
        // SAFETY: within value row `j` and each head's weights, checked above.
        unsafe {
            let row = values.as_ptr().add(j * stride);
            let value: [__m256; B] = std::array::from_fn(|b| L::eight(row.add(part + b * LANES)));
            let row_scale = L::row_scale(row, d);
            for (h, sums) in sums.iter_mut().enumerate() {
                let weight = *weights.get_unchecked(h * positions + j) * row_scale;
                let weight = _mm256_set1_ps(weight);
                for (sum, value) in sums.iter_mut().zip(&value) {
                    *sum = _mm256_fmadd_ps(weight, *value, *sum);
                }
            }
        }
    }
    for (h, sums) in sums.iter().enumerate() {
        for (b, sum) in sums.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(h * d + part + b * LANES), *sum) };
        }
    }
    B * LANES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_the_order() {
        if !crate::engine::kernels::has_avx2_fma_f16c() {
            return;
        }
        let mut scores: Vec<f32> = (0..13).map(|i| (i as f32 * 0.7).sin() * 5.0).collect();
        let before = scores.clone();
        // SAFETY: this CPU has AVX2, FMA and F16C.
        unsafe { softmax(&mut scores) };
        assert!((scores.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let exact: Vec<f32> = before.iter().map(|s| (s - 5.0).exp()).collect();
        let total: f32 = exact.iter().sum();
        for (got, want) in scores.iter().zip(&exact) {
            assert!((got - want / total).abs() < 1e-6);
        }
    }

    #[test]
    fn softmax_in_registers_gives_the_bits_of_one_score_at_a_time() {
        if !crate::engine::kernels::has_avx2_fma_f16c() {
            return;
        }
        for length in [1, 7, 8, 13, 64, 601] {
            let mut scores: Vec<f32> = (0..length).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
            // Exponentials in padded runs of eight, then a sum and a
            // division score by score.
            let largest = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut expected = Vec::new();
            let mut sums = [0f32; LANES];
            for run in scores.chunks(LANES) {
                let mut lanes = [0f32; LANES];
                lanes[..run.len()].copy_from_slice(run);
                // SAFETY: this CPU has AVX2; `lanes` holds eight floats.
                let weights = unsafe {
                    lanes_of(exp(_mm256_sub_ps(
                        _mm256_loadu_ps(lanes.as_ptr()),
                        _mm256_set1_ps(largest),
                    )))
                };
                expected.extend_from_slice(&weights[..run.len()]);
                for (sum, weight) in sums.iter_mut().zip(&weights[..run.len()]) {
                    *sum += weight;
                }
            }
            let total: f32 = sums.iter().sum();
            for weight in &mut expected {
                *weight /= total;
            }
            // SAFETY: this CPU has AVX2, FMA and F16C.
            unsafe { softmax(&mut scores) };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&scores), bits(&expected), "{length} scores");
        }
    }
}
