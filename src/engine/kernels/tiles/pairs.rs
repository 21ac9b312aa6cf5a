//! Kernels that multiply a group block with two input rows in one
//! 512-bit register.

use super::super::matmul::PAIR_TILE;
use super::super::packing::{Format, GROUP};
use super::super::quant::PairBlock;
use super::{eight_bytes, eight_signed_bytes, paired, prefetch_ahead, q6k_block_values};
use std::arch::x86_64::*;

/// The permutation that puts each of eight 32-bit lanes twice, side by side.
#[inline]
#[target_feature(enable = "avx512f")]
fn doubling() -> __m512i {
    _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
}

/// 32 bytes at `at` as 64: each 4-byte lane twice, side by side.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn doubled(at: *const u8) -> __m512i {
    // SAFETY: the caller's 32 bytes are readable.
    double(unsafe { _mm256_loadu_si256(at.cast()) })
}

/// Each 32-bit lane of `eight` twice, side by side.
#[inline]
#[target_feature(enable = "avx512f")]
fn double(eight: __m256i) -> __m512i {
    _mm512_permutexvar_epi32(doubling(), _mm512_castsi256_si512(eight))
}

/// Eight f16 at `at`, widened, each twice side by side.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn doubled_f16(at: *const u8) -> __m512 {
    // SAFETY: the caller's 16 bytes are readable.
    let eight = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) };
    _mm512_permutexvar_ps(doubling(), _mm512_castps256_ps512(eight))
}

/// A pair's two 4-byte fields in every 64-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn both<T: Copy>(field: &[T; 2]) -> __m512i {
    const { assert!(size_of::<[T; 2]>() == 8) };
    // SAFETY: the two fields are 8 readable bytes.
    _mm512_set1_epi64(unsafe { field.as_ptr().cast::<i64>().read_unaligned() })
}

/// [`both`] for float fields.
#[inline]
#[target_feature(enable = "avx512f")]
fn both_f32(field: &[f32; 2]) -> __m512 {
    _mm512_castsi512_ps(both(field))
}

/// Each lane's sums of products of `values` with `input`'s quants,
/// for the block's first and second sixteen values, in two chains
/// that halve the wait on each multiply-add's result.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn half_sums(values: &[__m512i; 8], input: &PairBlock) -> [__m512i; 2] {
    let mut sums = [_mm512_setzero_si512(); 2];
    for k in 0..4 {
        for (half, sum) in sums.iter_mut().enumerate() {
            let at = 4 * half + k;
            *sum = _mm512_dpbusd_epi32(*sum, values[at], both(&input.quants[at]));
        }
    }
    sums
}

/// Stores each pair's sums in `out`: the first row's eight, then the second's.
#[inline]
#[target_feature(enable = "avx512f")]
fn store<const P: usize>(sums: [__m512; P], out: &mut [f32]) {
    let rows_apart = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (sums, out) in sums.iter().zip(out.chunks_exact_mut(2 * GROUP)) {
        let apart = _mm512_permutexvar_ps(rows_apart, *sums);
        // SAFETY: `out` holds the sixteen floats written.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), apart) };
    }
}

/// Calls `f(p)` for each pair `p < P` of a tile, unrolled, as
/// [`super::each_row`] does for rows.
#[inline(always)]
fn each_pair<const P: usize>(mut f: impl FnMut(usize)) {
    const { assert!(P <= PAIR_TILE) };
    macro_rules! pairs {
        ($($p:literal)*) => { $( if $p < P { f($p) } )* };
    }
    pairs!(0 1 2 3 4 5 6 7);
}

/// [`by_rows`] for tiles of up to [`PAIR_TILE`] pairs.
macro_rules! by_pairs {
    ($name:ident, $tile:ident) => {
        by_rows!(
            $name,
            $tile,
            "avx512f,avx512bw,avx512vnni,avx2,f16c,fma",
            PairBlock,
            PAIR_TILE
        );
    };
}

by_pairs!(q4_1, q4_1_tile);

/// The 256-bit kernel's Q4_1 sums, two input rows a register.
///
/// In the kernels of this file each 32-bit lane pair holds one weight row's
/// four values, once for each input row, and the inputs' [`PairBlock`]
/// fields are 8-byte broadcasts. One byte multiply-add then does the work
/// of two 256-bit ones, and the float work after each block is shared by
/// two rows: with sixteen rows the 256-bit kernel reached 57 GMAC/s on one
/// core of the Xeon measured, a third of what its byte multiply-adds
/// allow, and this one 131 (weights in cache). Every lane does the 256-bit
/// kernel's float operations in the same order on the same exact integer
/// sums, so a row's results are the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
unsafe fn q4_1_tile<const P: usize>(
    group: &[u8],
    pairs: &[&[PairBlock]],
    out: &mut [f32],
    streamed: bool,
) {
    let pairs: &[&[PairBlock]; P] = pairs.try_into().expect("P input pairs");
    let nibbles = _mm512_set1_epi8(0x0F);
    let mut sums = [_mm512_setzero_ps(); P];
    for (b, block) in group
        .chunks_exact(Format::Q4_1.group_block_bytes())
        .enumerate()
    {
        let at = block.as_ptr();
        prefetch_ahead(at, Format::Q4_1.group_block_bytes(), streamed);
        let (scales, minimums) = (doubled_f16(at), doubled_f16(at.add(16)));
        let mut low = [_mm512_setzero_si512(); 4];
        let mut high = [_mm512_setzero_si512(); 4];
        for k in 0..4 {
            let packed = doubled(at.add(32 + 32 * k));
            low[k] = _mm512_and_si512(packed, nibbles);
            high[k] = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), nibbles);
        }
        let inputs: [&PairBlock; P] = std::array::from_fn(|p| &pairs[p][b]);
        let mut first = [_mm512_setzero_si512(); P];
        let mut second = [_mm512_setzero_si512(); P];
        // Every pair's k-th multiply-adds side by side, so that the
        // core sees independent ones next to each other: four to
        // sixteen input rows ran about 5-10% faster than with each
        // pair's chain written out in turn.
        for k in 0..4 {
            each_pair::<P>(|p| {
                let quants = &inputs[p].quants;
                first[p] = _mm512_dpbusd_epi32(first[p], low[k], both(&quants[k]));
                second[p] = _mm512_dpbusd_epi32(second[p], high[k], both(&quants[4 + k]));
            });
        }
        each_pair::<P>(|p| {
            let input = inputs[p];
            let dots = _mm512_cvtepi32_ps(_mm512_add_epi32(first[p], second[p]));
            let scale = _mm512_mul_ps(scales, both_f32(&input.scales));
            sums[p] = _mm512_fmadd_ps(dots, scale, sums[p]);
            sums[p] = _mm512_fmadd_ps(minimums, both_f32(&input.minimum_weights), sums[p]);
        });
    }
    store(sums, out);
}

by_pairs!(q4k, q4k_tile);

/// The 256-bit kernel's Q4_K sums, two input rows a register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
unsafe fn q4k_tile<const P: usize>(
    group: &[u8],
    pairs: &[&[PairBlock]],
    out: &mut [f32],
    streamed: bool,
) {
    let pairs: &[&[PairBlock]; P] = pairs.try_into().expect("P input pairs");
    let nibbles = _mm512_set1_epi8(0x0F);
    let mut sums = [_mm512_setzero_ps(); P];
    for (b, block) in group
        .chunks_exact(Format::Q4K.group_block_bytes())
        .enumerate()
    {
        let at = block.as_ptr();
        prefetch_ahead(at, Format::Q4K.group_block_bytes(), streamed);
        let mut dots = [_mm512_setzero_si512(); P];
        for j in 0..8 {
            // Each row's sub-block scale in both 16-bit halves of its lanes.
            let scales = double(eight_bytes(at.add(32 + 8 * j)));
            let scales = _mm512_or_si512(scales, _mm512_slli_epi32::<16>(scales));
            // Unpacked in 512-bit registers from doubled loads: unpacking
            // with `block_nibbles` and doubling after read slower (a median
            // of 90 against 100 tok/s over ten alternated Qwen-1.5B prefills).
            let both_blocks = at.add(160 + 256 * (j / 2));
            let values: [__m512i; 8] = std::array::from_fn(|k| {
                let packed = doubled(both_blocks.add(32 * k));
                let packed = if j.is_multiple_of(2) {
                    packed
                } else {
                    _mm512_srli_epi16::<4>(packed)
                };
                _mm512_and_si512(packed, nibbles)
            });
            each_pair::<P>(|p| {
                let input = &pairs[p][8 * b + j];
                let [first, second] = half_sums(&values, input);
                // Sixteen products of a 4-bit value and an input
                // quant stay within 16 signed bits (16·15·127), so
                // the two halves' sums share a lane and one 16-bit
                // pair multiply-add scales and adds both, where a
                // 32-bit multiply waited ten cycles.
                let halves =
                    _mm512_mask_blend_epi16(0xAAAA_AAAA, first, _mm512_slli_epi32::<16>(second));
                dots[p] = _mm512_dpwssd_epi32(dots[p], halves, scales);
            });
        }
        let mut minimums = [_mm512_setzero_si512(); P];
        for k in 0..4 {
            let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(
                _mm_loadl_epi64(at.add(96 + 16 * k).cast()),
                _mm_loadl_epi64(at.add(104 + 16 * k).cast()),
            ));
            let mins = _mm512_permutexvar_epi32(doubling(), _mm512_castsi256_si512(mins));
            each_pair::<P>(|p| {
                let (first, second) = (&pairs[p][8 * b + 2 * k], &pairs[p][8 * b + 2 * k + 1]);
                let totals = [0, 1].map(|r| paired(first.totals[r], second.totals[r]));
                minimums[p] = _mm512_dpwssd_epi32(minimums[p], mins, both(&totals));
            });
        }
        let (d, dmin) = (doubled_f16(at), doubled_f16(at.add(16)));
        each_pair::<P>(|p| {
            let scale = both_f32(&pairs[p][8 * b].scales);
            let (d, dmin) = (_mm512_mul_ps(d, scale), _mm512_mul_ps(dmin, scale));
            sums[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[p]), d, sums[p]);
            sums[p] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(minimums[p]), dmin, sums[p]);
        });
    }
    store(sums, out);
}

by_pairs!(q6k, q6k_tile);

/// The 256-bit kernel's Q6_K sums, two input rows a register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
unsafe fn q6k_tile<const P: usize>(
    group: &[u8],
    pairs: &[&[PairBlock]],
    out: &mut [f32],
    streamed: bool,
) {
    let pairs: &[&[PairBlock]; P] = pairs.try_into().expect("P input pairs");
    let mut sums = [_mm512_setzero_ps(); P];
    for (b, block) in group
        .chunks_exact(Format::Q6K.group_block_bytes())
        .enumerate()
    {
        let at = block.as_ptr();
        prefetch_ahead(at, Format::Q6K.group_block_bytes(), streamed);
        let mut dots = [_mm512_setzero_si512(); P];
        let mut offsets = [_mm512_setzero_si512(); P];
        for j in 0..8 {
            let first_scales = double(eight_signed_bytes(at.add(16 + 16 * j)));
            let second_scales = double(eight_signed_bytes(at.add(24 + 16 * j)));
            let paired_scales = _mm512_or_si512(
                _mm512_and_si512(first_scales, _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32::<16>(second_scales),
            );
            let values = q6k_block_values(at, j).map(|values| double(values));
            each_pair::<P>(|p| {
                let input = &pairs[p][8 * b + j];
                let [first, second] = half_sums(&values, input);
                let dot = _mm512_add_epi32(
                    _mm512_mullo_epi32(first, first_scales),
                    _mm512_mullo_epi32(second, second_scales),
                );
                dots[p] = _mm512_add_epi32(dots[p], dot);
                offsets[p] = _mm512_dpwssd_epi32(offsets[p], paired_scales, both(&input.halves));
            });
        }
        let d = doubled_f16(at);
        each_pair::<P>(|p| {
            let dots = _mm512_sub_epi32(dots[p], _mm512_slli_epi32::<5>(offsets[p]));
            let d = _mm512_mul_ps(d, both_f32(&pairs[p][8 * b].scales));
            sums[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), d, sums[p]);
        });
    }
    store(sums, out);
}

by_pairs!(q8_0, q8_0_tile);

/// The 256-bit VNNI kernel's Q8_0 sums, two input rows a register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
unsafe fn q8_0_tile<const P: usize>(
    group: &[u8],
    pairs: &[&[PairBlock]],
    out: &mut [f32],
    streamed: bool,
) {
    let pairs: &[&[PairBlock]; P] = pairs.try_into().expect("P input pairs");
    let mut sums = [_mm512_setzero_ps(); P];
    for (b, block) in group
        .chunks_exact(Format::Q8_0.group_block_bytes())
        .enumerate()
    {
        let at = block.as_ptr();
        prefetch_ahead(at, Format::Q8_0.group_block_bytes(), streamed);
        let scales = doubled_f16(at);
        let stored: [__m512i; 8] = std::array::from_fn(|k| doubled(at.add(16 + 32 * k)));
        each_pair::<P>(|p| {
            let input = &pairs[p][b];
            let mut first = both(&input.offsets);
            let mut second = _mm512_setzero_si512();
            for k in 0..4 {
                first = _mm512_dpbusd_epi32(first, stored[k], both(&input.quants[k]));
                second = _mm512_dpbusd_epi32(second, stored[4 + k], both(&input.quants[4 + k]));
            }
            let dots = _mm512_cvtepi32_ps(_mm512_add_epi32(first, second));
            let scale = _mm512_mul_ps(scales, both_f32(&input.scales));
            sums[p] = _mm512_fmadd_ps(dots, scale, sums[p]);
        });
    }
    store(sums, out);
}
