//! The x86 matmul tiles: the helpers their AVX2, VNNI and AVX-512 kernels
//! share, and the AVX2 quantization of input rows.

use super::matmul::TILE;
use super::packing::{Format, GROUP, Q6K_VALUES};
use super::quant::InputBlock;
use std::arch::x86_64::*;

/// `low` and `high`, each within 16 signed bits, as the two 16-bit
/// halves of one integer: the lane layout of the 16-bit pair multiply.
fn paired(low: i32, high: i32) -> i32 {
    (low & 0xFFFF) | (high << 16)
}

/// `acc` plus, in each 32-bit lane, the four products of `weights`'
/// unsigned bytes with `inputs`' signed ones; weights are at most 127.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_bytes_avx2(acc: __m256i, weights: __m256i, inputs: __m256i) -> __m256i {
    // The 16-bit pair sums cannot saturate: 2 · 127 · 127 < 2^15.
    let pairs = _mm256_maddubs_epi16(weights, inputs);
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

#[inline]
#[target_feature(enable = "avx512vnni,avx512vl")]
fn dot_bytes_vnni(acc: __m256i, weights: __m256i, inputs: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, weights, inputs)
}

/// `acc` plus, in each 32-bit lane, the two products of the lane's
/// signed 16-bit halves in `a` and `b`.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_pairs_avx2(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
}

#[inline]
#[target_feature(enable = "avx512vnni,avx512vl")]
fn dot_pairs_vnni(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, a, b)
}

/// A Q8_0 group block's weights `stored` (each `wᵢ + 128`) as the AVX2
/// byte multiply takes them: it takes an unsigned operand and saturates
/// its pair sums, so it multiplies each `|wᵢ|` with `qᵢ` carrying `wᵢ`'s
/// sign. Returns the magnitudes and the signed weights, once per block
/// for all the input rows.
#[inline]
#[target_feature(enable = "avx2")]
fn q8_0_weights_avx2(stored: &[__m256i; 8]) -> [[__m256i; 8]; 2] {
    let signed = stored.map(|stored| _mm256_xor_si256(stored, _mm256_set1_epi8(0x80u8 as i8)));
    [
        signed.map(|signed| _mm256_sign_epi8(signed, signed)),
        signed,
    ]
}

/// Σ `wᵢqᵢ` of each row's lane over a Q8_0 group block, from
/// [`q8_0_weights_avx2`], and an input block.
#[inline]
#[target_feature(enable = "avx2")]
fn q8_0_dot_avx2([magnitudes, signed]: &[[__m256i; 8]; 2], input: &InputBlock) -> __m256i {
    let mut sums = [_mm256_setzero_si256(); 2];
    for k in 0..8 {
        let quants = _mm256_sign_epi8(four(&input.quants, k), signed[k]);
        sums[k / 4] = dot_bytes_avx2(sums[k / 4], magnitudes[k], quants);
    }
    _mm256_add_epi32(sums[0], sums[1])
}

/// [`q8_0_weights_avx2`] for VNNI, whose byte multiply does not
/// saturate: the stored `wᵢ + 128` go in as they are.
#[inline]
#[target_feature(enable = "avx512vnni,avx512vl")]
fn q8_0_weights_vnni(stored: &[__m256i; 8]) -> [__m256i; 8] {
    *stored
}

/// [`q8_0_dot_avx2`] with VNNI: `128·Σ qᵢ` comes off once.
#[inline]
#[target_feature(enable = "avx512vnni,avx512vl")]
fn q8_0_dot_vnni(stored: &[__m256i; 8], input: &InputBlock) -> __m256i {
    let mut first = _mm256_set1_epi32(-128 * input.total());
    let mut second = _mm256_setzero_si256();
    for k in 0..4 {
        first = dot_bytes_vnni(first, stored[k], four(&input.quants, k));
        second = dot_bytes_vnni(second, stored[4 + k], four(&input.quants, 4 + k));
    }
    _mm256_add_epi32(first, second)
}

/// Group blocks ahead of the one being multiplied whose bytes the
/// kernels ask the cache for. A one-row decode step multiplies a Q4_1
/// block (160 bytes) in a few nanoseconds, far less than memory takes to
/// answer: four blocks ahead, SmolLM2 decoded 149-177 tokens/s on two
/// threads where twelve ahead gave 154-245 (alternated runs, f16 cache),
/// and twenty-four ahead a median of 189 against twelve's 152 (sixteen
/// alternated rounds on a busy host, 8-bit cache; Qwen-1.5B no slower).
const PREFETCH_BLOCKS: usize = 24;

/// Group blocks ahead whose bytes are also asked for into the L2 cache
/// only, where a matmul reads each block once, so that most of the
/// nearer hints find them there. Alternated pass by pass with the nearer
/// hints alone, Qwen-1.5B's one-sequence decode steps took 6-9% less
/// time, SmolLM2's about 2% less with one or four sequences, sixteen the
/// same; 96 blocks ahead gained less. A prompt's matmul reads each group
/// once per tile of rows, and there the far hints slowed Qwen-1.5B's
/// prefill by 5-16%.
const FAR_PREFETCH_BLOCKS: usize = 64;

/// Ask for the cache lines of the group block [`PREFETCH_BLOCKS`] after
/// the one at `at`, `bytes` long (past a group's last block, the next
/// group's first), and when `streamed` (each group is read once) for
/// those of the block [`FAR_PREFETCH_BLOCKS`] after it into L2. A decode
/// step streams every weight from memory once, and at sixteen input
/// rows the loads of each block's bytes stalled the kernel.
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch_ahead(at: *const u8, bytes: usize, streamed: bool) {
    // A prefetch is a hint: an address past the weights is ignored.
    let ahead = at.wrapping_add(PREFETCH_BLOCKS * bytes);
    let far = at.wrapping_add(FAR_PREFETCH_BLOCKS * bytes);
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
        if streamed {
            _mm_prefetch::<_MM_HINT_T2>(far.wrapping_add(line).cast());
        }
    }
}

/// Values `4k..4k+4` of an input block, in every lane.
#[inline]
#[target_feature(enable = "avx2")]
fn four(quants: &[i8; 32], k: usize) -> __m256i {
    let bytes = [
        quants[4 * k],
        quants[4 * k + 1],
        quants[4 * k + 2],
        quants[4 * k + 3],
    ];
    _mm256_set1_epi32(i32::from_le_bytes(bytes.map(|q| q as u8)))
}

/// [`super::quant::quantize`] with AVX2, to the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize(row: &[f32], span: usize, blocks: &mut [InputBlock]) {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for (values, blocks) in row
        .chunks_exact(span)
        .zip(blocks.chunks_exact_mut(span / 32))
    {
        let mut largest = _mm256_setzero_ps();
        for eight in values.chunks_exact(8) {
            // SAFETY: `eight` holds eight floats.
            let v = unsafe { _mm256_loadu_ps(eight.as_ptr()) };
            largest = _mm256_max_ps(largest, _mm256_and_ps(v, magnitude));
        }
        let scale = largest_lane(largest) / 127.0;
        let inverse = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
        for (values, block) in values.chunks_exact(32).zip(blocks) {
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                // SAFETY: `values` holds 32 floats.
                let v = unsafe { _mm256_loadu_ps(values[8 * i..].as_ptr()) };
                let scaled = _mm256_mul_ps(v, inverse);
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(scaled))
            });
            let halves = half_totals(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            // Packing works within 128-bit halves; the permutation puts
            // the four groups of each half back in order.
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let ordered =
                _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: `quants` holds 32 bytes.
            unsafe { _mm256_storeu_si256(block.quants.as_mut_ptr().cast(), ordered) };
            block.scale = scale;
            block.halves = halves;
            block.minimum_weight = scale * block.total() as f32;
        }
    }
}

/// The largest of `v`'s lanes. A maximum is exact, so the order in
/// which lanes meet does not change it. Stored and folded lane by lane,
/// this and the half totals cost a third of a quantization's samples.
#[inline]
#[target_feature(enable = "avx2")]
fn largest_lane(v: __m256) -> f32 {
    let four = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    let one = _mm_max_ss(two, _mm_movehdup_ps(two));
    _mm_cvtss_f32(one)
}

/// The totals of the eight lanes of `first` and of `second`. A half's
/// total is at most 16 · 127 in magnitude, so it fits its `i16`.
#[inline]
#[target_feature(enable = "avx2")]
fn half_totals(first: __m256i, second: __m256i) -> [i16; 2] {
    // Lanes 0-1 (and 4-5) hold pairs of `first`, lanes 2-3 (6-7) of `second`.
    let pairs = _mm256_hadd_epi32(first, second);
    let fours = _mm256_hadd_epi32(pairs, pairs);
    let totals = _mm_add_epi32(
        _mm256_castsi256_si128(fours),
        _mm256_extracti128_si256::<1>(fours),
    );
    [
        _mm_cvtsi128_si32(totals) as i16,
        _mm_extract_epi32::<1>(totals) as i16,
    ]
}

/// Eight f16 at `at`, widened.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn eight_f16(at: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(at.cast()))
}

/// Eight bytes at `at`, widened to 32-bit integers.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn eight_bytes(at: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.cast()))
}

/// Eight signed bytes at `at`, widened to 32-bit integers.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn eight_signed_bytes(at: *const u8) -> __m256i {
    _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.cast()))
}

/// The 4-bit values of input block `j` from the 256 bytes at `pair`,
/// which hold blocks `j` and `j ^ 1` in the low and high nibbles.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_nibbles(pair: *const u8, j: usize) -> [__m256i; 8] {
    let nibbles = _mm256_set1_epi8(0x0F);
    std::array::from_fn(|k| {
        // SAFETY: the caller's 256 bytes hold eight runs of 32.
        let packed = unsafe { _mm256_loadu_si256(pair.add(32 * k).cast()) };
        let packed = if j.is_multiple_of(2) {
            packed
        } else {
            _mm256_srli_epi16::<4>(packed)
        };
        _mm256_and_si256(packed, nibbles)
    })
}

/// The 6-bit values of input block `j` of the Q6_K group block at `at`,
/// as eight runs of four values of each row.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q6k_block_values(at: *const u8, j: usize) -> [__m256i; 8] {
    let whole = _mm256_set1_epi8(0x3F);
    let top_two = _mm256_set1_epi8(0xC0u8 as i8);
    let mut values = [_mm256_setzero_si256(); 8];
    for (four_values, values) in values.chunks_exact_mut(4).enumerate() {
        // SAFETY: the caller's group block holds input block `j`'s 192 bytes.
        let run = unsafe { at.add(Q6K_VALUES + 192 * j + 96 * four_values) };
        let stored: [__m256i; 3] =
            // SAFETY: as above, three runs of 32 bytes.
            std::array::from_fn(|m| unsafe { _mm256_loadu_si256(run.add(32 * m).cast()) });
        for m in 0..3 {
            values[m] = _mm256_and_si256(stored[m], whole);
        }
        // Masked first, the 16-bit shifts carry no bits from one byte
        // into the next.
        let parts = stored.map(|s| _mm256_and_si256(s, top_two));
        values[3] = _mm256_or_si256(
            _mm256_or_si256(
                _mm256_srli_epi16::<6>(parts[0]),
                _mm256_srli_epi16::<4>(parts[1]),
            ),
            _mm256_srli_epi16::<2>(parts[2]),
        );
    }
    values
}

/// Calls `f(n)` for each input row `n < N` of a tile, unrolled: with a
/// constant `n` the arrays a kernel indexes by row stay in registers,
/// where a loop kept them on the stack.
#[inline(always)]
fn each_row<const N: usize>(mut f: impl FnMut(usize)) {
    debug_assert!(N <= TILE);
    macro_rules! rows {
        ($($n:literal)*) => { $( if $n < N { f($n) } )* };
    }
    rows!(0 1 2 3 4 5 6 7);
}

/// Stores each input row's eight sums in `out`.
#[inline]
#[target_feature(enable = "avx2")]
fn store<const N: usize>(sums: [__m256; N], out: &mut [f32]) {
    for (sums, out) in sums.iter().zip(out.chunks_exact_mut(GROUP)) {
        // SAFETY: `out` holds the eight floats written.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), *sums) };
    }
}

/// `$name(group, inputs, out, streamed)`: `$tile::<N>` for the `N` rows of
/// `inputs`, asking for blocks far ahead when `streamed`.
/// With `$input` and `$most`, for tiles of up to `$most` inputs of that type.
macro_rules! by_rows {
    ($name:ident, $tile:ident, $features:literal) => {
        by_rows!($name, $tile, $features, InputBlock, TILE);
    };
    ($name:ident, $tile:ident, $features:literal, $input:ty, $most:ident) => {
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(
            group: &[u8],
            inputs: &[&[$input]],
            out: &mut [f32],
            streamed: bool,
        ) {
            match inputs.len() {
                1 => $tile::<1>(group, inputs, out, streamed),
                2 => $tile::<2>(group, inputs, out, streamed),
                3 => $tile::<3>(group, inputs, out, streamed),
                4 => $tile::<4>(group, inputs, out, streamed),
                5 => $tile::<5>(group, inputs, out, streamed),
                6 => $tile::<6>(group, inputs, out, streamed),
                7 => $tile::<7>(group, inputs, out, streamed),
                _ => $tile::<$most>(group, inputs, out, streamed),
            }
        }
    };
}

// Declared after `by_rows!`, which their kernels expand.
mod rows;

pub(super) mod pairs;
pub(super) use rows::{avx2, vnni};
pub(super) mod wide;
