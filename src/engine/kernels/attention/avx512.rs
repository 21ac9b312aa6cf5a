//! The score and weighting loops of the vector kernel in 16-lane AVX-512
//! registers, for heads whose width is a whole number of sixteens.

use super::{prefetch_row_ahead, RowData, RowScale};
use half::{bf16, f16};
use std::arch::x86_64::*;

/// Floats in one AVX-512 register.
pub(super) const LANES: usize = 16;

/// Query heads scored in one pass: four heads of four positions are the
/// sixteen sums [`sum_each`] adds across lanes at once.
const SCORE_HEADS: usize = 4;

/// Positions scored in one pass.
const SCORE_POSITIONS: usize = 4;

/// Query heads weighted in one pass: six heads of four output blocks are 24
/// sums, which leave room in the 32 registers for a row's four blocks and a
/// weight. Every model prism ships shares a key/value head among at most
/// seven query heads.
const WEIGH_HEADS: usize = 6;

/// Output blocks of sixteen kept in registers through one pass.
const WEIGH_BLOCKS: usize = 4;

/// A value of a cache the loops read sixteen at a time, as f32.
trait Lane: RowScale {
    /// The sixteen values from `at`, widened exactly.
    ///
    /// # Safety
    /// Sixteen values are readable from `at`, and the CPU has AVX-512F.
    unsafe fn sixteen(at: *const Self) -> __m512;
}

impl Lane for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sixteen(at: *const f32) -> __m512 {
        // SAFETY: as the caller promises.
        unsafe { _mm512_loadu_ps(at) }
    }
}

impl Lane for f16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sixteen(at: *const f16) -> __m512 {
        // SAFETY: as the caller promises.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(at.cast())) }
    }
}

impl Lane for bf16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sixteen(at: *const bf16) -> __m512 {
        // SAFETY: as the caller promises. A bf16 is the top half of an f32.
        let halves = unsafe { _mm512_cvtepu16_epi32(_mm256_loadu_si256(at.cast())) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(halves))
    }
}

impl Lane for i8 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sixteen(at: *const i8) -> __m512 {
        // SAFETY: as the caller promises.
        let bytes = unsafe { _mm_loadu_si128(at.cast()) };
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))
    }
}

/// The lane sums of sixteen registers, `sums[r]` in lane `r`. Each
/// register's lanes add in the same tree whatever its place: halves, then
/// quarters, then pairs, then the last two.
#[inline]
#[target_feature(enable = "avx512f")]
fn sum_each(sums: &[__m512; 16]) -> __m512 {
    // Blocks 0-1 of each hold register 2i's sixteen lanes folded to eight,
    // blocks 2-3 register 2i + 1's.
    let eights: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (sums[2 * i], sums[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    });
    // Block k of fours[i] holds register 4i + k folded to four lanes.
    let fours: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (eights[2 * i], eights[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    });
    // Block k of twos[i]: register 8i + k in two lanes, then 8i + 4 + k.
    let twos: [__m512; 2] = std::array::from_fn(|i| {
        let (a, b) = (fours[2 * i], fours[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    });
    // Lane 4k + j holds register 4j + k; the permutation puts it in lane 4j + k.
    let transposed = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(twos[0], twos[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(twos[0], twos[1]),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, transposed)
}

/// The scores of a row's query heads `queries` (runs of `d`) against the
/// `count` key rows of a chunk (`keys[j * stride..]`): head `h`'s score of
/// row `j` goes to `scores[h * positions + j]`, scaled by `scale`.
///
/// The 32 registers hold the scores of up to four query heads at four
/// positions, or (in [`add_weighted`]) up to six heads' whole output blocks,
/// so that each cache row is loaded and widened once for all the heads that
/// share it, where the AVX2 loops of two heads at a time load it again for
/// every pair. Every score sums its products lane by lane over the head's
/// blocks, in order, and then across lanes in one fixed tree
/// ([`sum_each`]); every output adds its rows in order. How heads and
/// positions share a pass therefore never changes a result, and a prompt
/// row still gets the bits a decode step would.
///
/// # Safety
/// The CPU has AVX-512F, and `d` is a multiple of [`LANES`].
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn score_chunk(
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
#[target_feature(enable = "avx512f")]
fn score_rows<L: Lane>(
    (queries, d): (&[f32], usize),
    (keys, stride, count): (&[L], usize, usize),
    scale: f32,
    (scores, positions): (&mut [f32], usize),
) {
    for (h, queries) in queries.chunks(SCORE_HEADS * d).enumerate() {
        let scores = (&mut scores[h * SCORE_HEADS * positions..], positions);
        let keys = (keys, stride, count);
        // The first pass over the chunk asks for the rows ahead.
        let prefetch = h == 0;
        match queries.len() / d {
            4 => score_run::<L, 4>(queries, keys, scale, scores, prefetch),
            3 => score_run::<L, 3>(queries, keys, scale, scores, prefetch),
            2 => score_run::<L, 2>(queries, keys, scale, scores, prefetch),
            _ => score_run::<L, 1>(queries, keys, scale, scores, prefetch),
        }
    }
}

/// [`score_rows`] for `H` heads over every row of the chunk, in one loop
/// the blocks are inlined into. Called through a pointer per block of four
/// rows instead, three heads' scores of 8-bit rows took 15.3 ns a row on
/// one thread with the rows in L1, against 8.5 ns in this loop; in decode
/// steps, whose rows come from memory, sixteen sequences' passes took
/// about 1-2% less.
#[inline]
#[target_feature(enable = "avx512f")]
fn score_run<L: Lane, const H: usize>(
    queries: &[f32],
    (keys, stride, count): (&[L], usize, usize),
    scale: f32,
    (scores, positions): (&mut [f32], usize),
    prefetch: bool,
) {
    let mut start = 0;
    while start < count {
        let block = (&mut *scores, positions, start);
        let taken = if count - start >= SCORE_POSITIONS {
            score_block::<L, H, SCORE_POSITIONS>(
                queries,
                &keys[start * stride..],
                stride,
                scale,
                block,
            )
        } else {
            score_block::<L, H, 1>(queries, &keys[start * stride..], stride, scale, block)
        };
        if prefetch {
            for row in start..start + taken {
                prefetch_row_ahead(keys.as_ptr().wrapping_add(row * stride), stride);
            }
        }
        start += taken;
    }
}

/// [`score_rows`] for `H` heads and `P` key rows from `keys`' first;
/// returns `P`.
#[inline]
#[target_feature(enable = "avx512f")]
fn score_block<L: Lane, const H: usize, const P: usize>(
    queries: &[f32],
    keys: &[L],
    stride: usize,
    scale: f32,
    (scores, positions, start): (&mut [f32], usize, usize),
) -> usize {
    let d = queries.len() / H;
    debug_assert!(H * P <= 16 && queries.len() == H * d && (P - 1) * stride + d <= keys.len());
    // Sum `h * P + p` is head h's score of row p; `sum_each` puts it in lane `h * P + p`.
    let mut sums = [_mm512_setzero_ps(); 16];
    for block in (0..d).step_by(LANES) {
        // SAFETY: blocks of sixteen within each head's query and each key
        // row, checked above.
        unsafe {
            let key: [__m512; P] =
                std::array::from_fn(|p| L::sixteen(keys.as_ptr().add(p * stride + block)));
            for h in 0..H {
                let query = _mm512_loadu_ps(queries.as_ptr().add(h * d + block));
                for (p, key) in key.iter().enumerate() {
                    sums[h * P + p] = _mm512_fmadd_ps(query, *key, sums[h * P + p]);
                }
            }
        }
    }
    // SAFETY: `chunk` spans whole stored rows, an 8-bit row's scale included.
    let row_scales: [f32; P] =
        std::array::from_fn(|p| unsafe { L::row_scale(keys.as_ptr().add(p * stride), d) });
    let lane_scales: [f32; LANES] = std::array::from_fn(|lane| row_scales[lane % P]);
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` and `lane_scales` hold sixteen floats.
    unsafe {
        let sums = _mm512_mul_ps(sum_each(&sums), _mm512_loadu_ps(lane_scales.as_ptr()));
        let scores = _mm512_mul_ps(sums, _mm512_set1_ps(scale));
        _mm512_storeu_ps(lanes.as_mut_ptr(), scores);
    }
    for h in 0..H {
        scores[h * positions + start..][..P].copy_from_slice(&lanes[h * P..][..P]);
    }
    P
}

/// `out[h * d..]` += Σⱼ `weights[h * positions + j]` · value row `j`
/// (`values[j * stride..]`) for the `count` rows of a chunk, for each of a
/// row's query heads.
///
/// # Safety
/// The CPU has AVX-512F, and `d` is a multiple of [`LANES`].
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn add_weighted(
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
#[target_feature(enable = "avx512f")]
fn weigh_rows<L: Lane>(
    (weights, positions): (&[f32], usize),
    (values, stride, count): (&[L], usize, usize),
    out: &mut [f32],
    d: usize,
) {
    for (h, out) in out.chunks_mut(WEIGH_HEADS * d).enumerate() {
        let weights = &weights[h * WEIGH_HEADS * positions..];
        let mut part = 0;
        while part < d {
            part += match (out.len() / d, (d - part) / LANES) {
                (6, WEIGH_BLOCKS..) => weigh_block::<L, 6, WEIGH_BLOCKS>,
                (6, _) => weigh_block::<L, 6, 1>,
                (5, WEIGH_BLOCKS..) => weigh_block::<L, 5, WEIGH_BLOCKS>,
                (5, _) => weigh_block::<L, 5, 1>,
                (4, WEIGH_BLOCKS..) => weigh_block::<L, 4, WEIGH_BLOCKS>,
                (4, _) => weigh_block::<L, 4, 1>,
                (3, WEIGH_BLOCKS..) => weigh_block::<L, 3, WEIGH_BLOCKS>,
                (3, _) => weigh_block::<L, 3, 1>,
                (2, WEIGH_BLOCKS..) => weigh_block::<L, 2, WEIGH_BLOCKS>,
                (2, _) => weigh_block::<L, 2, 1>,
                (_, WEIGH_BLOCKS..) => weigh_block::<L, 1, WEIGH_BLOCKS>,
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
/// asking for the value rows ahead when `prefetch` (one pass of the row's
/// does); returns the floats of output done.
#[inline]
#[target_feature(enable = "avx512f")]
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
    // SAFETY: blocks of sixteen within each head's output, checked above.
    let mut sums: [[__m512; B]; H] = std::array::from_fn(|h| {
        std::array::from_fn(|b| unsafe {
            _mm512_loadu_ps(out.as_ptr().add(h * d + part + b * LANES))
        })
    });
    for j in 0..count {
        if prefetch {
            prefetch_row_ahead(values.as_ptr().wrapping_add(j * stride), stride);
        }
        // SAFETY: within value row `j` and each head's weights, checked above.
        unsafe {
            let row = values.as_ptr().add(j * stride);
            let value: [__m512; B] = std::array::from_fn(|b| L::sixteen(row.add(part + b * LANES)));
            let row_scale = L::row_scale(row, d);
            for (h, sums) in sums.iter_mut().enumerate() {
                let weight = *weights.get_unchecked(h * positions + j) * row_scale;
                let weight = _mm512_set1_ps(weight);
                for (sum, value) in sums.iter_mut().zip(&value) {
                    *sum = _mm512_fmadd_ps(weight, *value, *sum);
                }
            }
        }
    }
    for (h, sums) in sums.iter().enumerate() {
        for (b, sum) in sums.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * d + part + b * LANES), *sum) };
        }
    }
    B * LANES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_each_puts_each_registers_total_in_its_lane() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        // Whole numbers, so every order of adding gives the same total.
        let values: Vec<[f32; LANES]> = (0..16)
            .map(|r| std::array::from_fn(|lane| (r * 100 + lane * lane) as f32))
            .collect();
        let mut lanes = [0f32; LANES];
        // SAFETY: the CPU has AVX-512F, and each array holds sixteen floats.
        unsafe {
            let sums: [__m512; 16] = std::array::from_fn(|r| _mm512_loadu_ps(values[r].as_ptr()));
            _mm512_storeu_ps(lanes.as_mut_ptr(), sum_each(&sums));
        }
        let expected: Vec<f32> = values.iter().map(|row| row.iter().sum()).collect();
        assert_eq!(lanes.to_vec(), expected);
    }
}
