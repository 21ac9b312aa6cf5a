//! Tiles of two neighbouring groups at once, one input row at a time, in
//! AVX-512 registers.

use super::super::matmul::TILE;
use super::super::packing::Format;
use super::super::quant::InputBlock;
use super::prefetch_ahead;
use std::arch::x86_64::*;

/// Eight 16-bit floats at `first` and eight at `second`, widened.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn sixteen_f16(first: *const u8, second: *const u8) -> __m512 {
    // SAFETY: the caller's 16 bytes at each are readable.
    let halves = unsafe {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(first.cast())),
            _mm_loadu_si128(second.cast()),
        )
    };
    _mm512_cvtph_ps(halves)
}

/// 32 bytes at `first` and 32 at `second`, side by side.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sixty_four(first: *const u8, second: *const u8) -> __m512i {
    // SAFETY: the caller's 32 bytes at each are readable.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(first.cast())),
            _mm256_loadu_si256(second.cast()),
        )
    }
}

/// Quants `4k..4k+4` of `input` in every 32-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn four(input: &InputBlock, k: usize) -> __m512i {
    let quants = &input.quants[4 * k..4 * k + 4];
    _mm512_set1_epi32(i32::from_le_bytes(std::array::from_fn(|i| quants[i] as u8)))
}

/// Chains of multiply-adds a row keeps: two halve the wait on each
/// result where few rows share a block, and more rows need the
/// registers (eight rows with two chains spilled).
const fn chains(rows: usize) -> usize {
    if rows <= 4 {
        2
    } else {
        1
    }
}

/// Calls `f(b, one, other)` for each block `b` of two neighbouring
/// groups, at `one` in the first and `other` in the second (`two`
/// holds the first group's blocks, then the second's), after asking
/// for the blocks ahead of each.
#[inline(always)]
fn each_block_of_two(
    two: &[u8],
    format: Format,
    streamed: bool,
    mut f: impl FnMut(usize, *const u8, *const u8),
) {
    let bytes = format.group_block_bytes();
    let (first, second) = two.split_at(two.len() / 2);
    for (b, (one, other)) in first
        .chunks_exact(bytes)
        .zip(second.chunks_exact(bytes))
        .enumerate()
    {
        let (one, other) = (one.as_ptr(), other.as_ptr());
        // SAFETY: `prefetch_ahead` asks without reading.
        unsafe {
            prefetch_ahead(one, bytes, streamed);
            prefetch_ahead(other, bytes, streamed);
        }
        f(b, one, other);
    }
}

/// Each row's sixteen sums in `out`, row after row.
#[inline]
#[target_feature(enable = "avx512f")]
fn store<const N: usize>(sums: [__m512; N], out: &mut [f32]) {
    for (sum, out) in sums.iter().zip(out.chunks_exact_mut(16)) {
        // SAFETY: `out` holds the sixteen floats written.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), *sum) };
    }
}

by_rows!(q4_1, q4_1_tile, "avx512f,avx512bw,avx512vnni,avx2,f16c,fma");

/// `out[16n + c]`: column `c` of the two groups times input row `n`.
///
/// The kernels of this file multiply two neighbouring groups at once,
/// sixteen weight rows a 512-bit register: the first group's eight in the
/// low half, the second's in the high half, put together as they are
/// loaded. Each input row's four quants then reach the multiply-add as
/// one broadcast, and no weight is unpacked twice for two rows as in
/// [`super::pairs`]: a Q4_1 group block took 8.1 ns for one row where
/// the 256-bit kernel took 10.0, 9.1 for two rows and 12.3 for four
/// where [`super::pairs`] took 11.6 and 15.5 (one thread, weights
/// streamed from 75 MB, medians of six alternated passes). The integer
/// sums are exact and each lane's floats add in the same order, so the
/// bits are the other kernels'.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
unsafe fn q4_1_tile<const N: usize>(
    two: &[u8],
    inputs: &[&[InputBlock]],
    out: &mut [f32],
    streamed: bool,
) {
    let inputs: &[&[InputBlock]; N] = inputs.try_into().expect("N input rows");
    let nibbles = _mm512_set1_epi8(0x0F);
    let mut sums = [_mm512_setzero_ps(); N];
    each_block_of_two(two, Format::Q4_1, streamed, |b, one, other| {
        // SAFETY: each group block is 160 bytes: the scales, the
        // minimums and four runs of 32 packed bytes.
        let (scales, minimums, values) = unsafe {
            let values: [__m512i; 4] =
                std::array::from_fn(|k| sixty_four(one.add(32 + 32 * k), other.add(32 + 32 * k)));
            (
                sixteen_f16(one, other),
                sixteen_f16(one.add(16), other.add(16)),
                values,
            )
        };
        let low = values.map(|packed| _mm512_and_si512(packed, nibbles));
        let high = values.map(|packed| _mm512_and_si512(_mm512_srli_epi16::<4>(packed), nibbles));
        let chains = chains(N);
        let mut dots = [[_mm512_setzero_si512(); 2]; N];
        for k in 0..4 {
            for (dots, input) in dots.iter_mut().zip(inputs) {
                let input = &input[b];
                let (c, d) = ((2 * k) % chains, (2 * k + 1) % chains);
                dots[c] = _mm512_dpbusd_epi32(dots[c], low[k], four(input, k));
                dots[d] = _mm512_dpbusd_epi32(dots[d], high[k], four(input, 4 + k));
            }
        }
        for ((sum, dots), input) in sums.iter_mut().zip(dots).zip(inputs) {
            let input = &input[b];
            let dots = if chains == 2 {
                _mm512_add_epi32(dots[0], dots[1])
            } else {
                dots[0]
            };
            let scale = _mm512_mul_ps(scales, _mm512_set1_ps(input.scale));
            *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, *sum);
            let minimum_weight = _mm512_set1_ps(input.minimum_weight);
            *sum = _mm512_fmadd_ps(minimums, minimum_weight, *sum);
        }
    });
    store(sums, out);
}

by_rows!(q8_0, q8_0_tile, "avx512f,avx512bw,avx512vnni,avx2,f16c,fma");

/// [`q4_1_tile`] for Q8_0, whose stored weights are `wᵢ + 128`:
/// each sum starts at `-128·Σ qᵢ`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
unsafe fn q8_0_tile<const N: usize>(
    two: &[u8],
    inputs: &[&[InputBlock]],
    out: &mut [f32],
    streamed: bool,
) {
    let inputs: &[&[InputBlock]; N] = inputs.try_into().expect("N input rows");
    let mut sums = [_mm512_setzero_ps(); N];
    each_block_of_two(two, Format::Q8_0, streamed, |b, one, other| {
        // SAFETY: each group block is 272 bytes: the scales and
        // eight runs of 32 stored bytes.
        let (scales, stored) = unsafe {
            let stored: [__m512i; 8] =
                std::array::from_fn(|k| sixty_four(one.add(16 + 32 * k), other.add(16 + 32 * k)));
            (sixteen_f16(one, other), stored)
        };
        let chains = chains(N);
        let mut dots: [[__m512i; 2]; N] = std::array::from_fn(|n| {
            [
                _mm512_set1_epi32(-128 * inputs[n][b].total()),
                _mm512_setzero_si512(),
            ]
        });
        for (k, &stored) in stored.iter().enumerate() {
            let c = if chains == 2 { k / 4 } else { 0 };
            for (dots, input) in dots.iter_mut().zip(inputs) {
                dots[c] = _mm512_dpbusd_epi32(dots[c], stored, four(&input[b], k));
            }
        }
        for ((sum, dots), input) in sums.iter_mut().zip(dots).zip(inputs) {
            let input = &input[b];
            let dots = if chains == 2 {
                _mm512_add_epi32(dots[0], dots[1])
            } else {
                dots[0]
            };
            let scale = _mm512_mul_ps(scales, _mm512_set1_ps(input.scale));
            *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, *sum);
        }
    });
    store(sums, out);
}
