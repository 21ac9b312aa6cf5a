//! The tiles that take one input row a set of 256-bit lanes, built once with
//! AVX2 byte multiplies and once with VNNI ones.

use super::*;

/// The kernels for each format, built once for each way of multiplying
/// bytes. Each computes `out[n * GROUP + r]` = row `r` of the group
/// times `inputs[n]`, for up to [`TILE`] input rows; its `tile::<N>`
/// takes exactly `N` rows, so that every row's sums stay in registers.
/// The integer sums of a block are exact and each lane's floats add
/// block after block, so a result does not depend on the tile's other rows.
macro_rules! kernels {
    (
        $features:literal,
        $dot_bytes:ident,
        $dot_pairs:ident,
        $q8_0_weights:ident,
        $q8_0_dot:ident
    ) => {
        use super::*;

        by_rows!(q4_1, q4_1_tile, $features);

        /// Row `r` of a block contributes `d·s·Σ wᵢqᵢ + m·s·Σ qᵢ`,
        /// where `wᵢ` are its 4-bit values, `d` and `m` its scale and
        /// minimum, and `qᵢ` and `s` the input block's.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q4_1_tile<const N: usize>(
            group: &[u8],
            inputs: &[&[InputBlock]],
            out: &mut [f32],
            streamed: bool,
        ) {
            let inputs: &[&[InputBlock]; N] = inputs.try_into().expect("N input rows");
            let nibbles = _mm256_set1_epi8(0x0F);
            let mut sums = [_mm256_setzero_ps(); N];
            for (b, block) in group
                .chunks_exact(Format::Q4_1.group_block_bytes())
                .enumerate()
            {
                let at = block.as_ptr();
                prefetch_ahead(at, Format::Q4_1.group_block_bytes(), streamed);
                let (scales, minimums) = (eight_f16(at), eight_f16(at.add(16)));
                let mut low = [_mm256_setzero_si256(); 4];
                let mut high = [_mm256_setzero_si256(); 4];
                for k in 0..4 {
                    let packed = _mm256_loadu_si256(at.add(32 + 32 * k).cast());
                    low[k] = _mm256_and_si256(packed, nibbles);
                    high[k] = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibbles);
                }
                each_row::<N>(|n| {
                    let input = &inputs[n][b];
                    // Two chains, for the low and high halves, halve the
                    // wait on each multiply-add's result.
                    let mut first = _mm256_setzero_si256();
                    let mut second = _mm256_setzero_si256();
                    for k in 0..4 {
                        first = $dot_bytes(first, low[k], four(&input.quants, k));
                        second = $dot_bytes(second, high[k], four(&input.quants, 4 + k));
                    }
                    let dots = _mm256_cvtepi32_ps(_mm256_add_epi32(first, second));
                    let scale = _mm256_mul_ps(scales, _mm256_set1_ps(input.scale));
                    sums[n] = _mm256_fmadd_ps(dots, scale, sums[n]);
                    let sum = _mm256_set1_ps(input.minimum_weight);
                    sums[n] = _mm256_fmadd_ps(minimums, sum, sums[n]);
                });
            }
            store(sums, out);
        }

        by_rows!(q8_0, q8_0_tile, $features);

        /// Row `r` of a block contributes `d·s·Σ wᵢqᵢ`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q8_0_tile<const N: usize>(
            group: &[u8],
            inputs: &[&[InputBlock]],
            out: &mut [f32],
            streamed: bool,
        ) {
            let inputs: &[&[InputBlock]; N] = inputs.try_into().expect("N input rows");
            let mut sums = [_mm256_setzero_ps(); N];
            for (b, block) in group
                .chunks_exact(Format::Q8_0.group_block_bytes())
                .enumerate()
            {
                let at = block.as_ptr();
                prefetch_ahead(at, Format::Q8_0.group_block_bytes(), streamed);
                let scales = eight_f16(at);
                let stored: [__m256i; 8] =
                    std::array::from_fn(|k| _mm256_loadu_si256(at.add(16 + 32 * k).cast()));
                let weights = $q8_0_weights(&stored);
                each_row::<N>(|n| {
                    let input = &inputs[n][b];
                    let dots = _mm256_cvtepi32_ps($q8_0_dot(&weights, input));
                    let scale = _mm256_mul_ps(scales, _mm256_set1_ps(input.scale));
                    sums[n] = _mm256_fmadd_ps(dots, scale, sums[n]);
                });
            }
            store(sums, out);
        }

        by_rows!(q4k, q4k_tile, $features);

        /// Row `r` of a block contributes `d·s·Σⱼ scⱼ·Σ wᵢqᵢ -
        /// dmin·s·Σⱼ mⱼ·Σ qᵢ` over its sub-blocks `j`, where the input
        /// blocks of one weight block share their scale `s`. Both sums
        /// over `j` are exact in integers; a block needs two floats.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q4k_tile<const N: usize>(
            group: &[u8],
            inputs: &[&[InputBlock]],
            out: &mut [f32],
            streamed: bool,
        ) {
            let inputs: &[&[InputBlock]; N] = inputs.try_into().expect("N input rows");
            let mut sums = [_mm256_setzero_ps(); N];
            for (b, block) in group
                .chunks_exact(Format::Q4K.group_block_bytes())
                .enumerate()
            {
                let at = block.as_ptr();
                prefetch_ahead(at, Format::Q4K.group_block_bytes(), streamed);
                let mut dots = [_mm256_setzero_si256(); N];
                for j in 0..8 {
                    let scales = eight_bytes(at.add(32 + 8 * j));
                    let values = block_nibbles(at.add(160 + 256 * (j / 2)), j);
                    each_row::<N>(|n| {
                        let input = &inputs[n][8 * b + j];
                        let mut first = _mm256_setzero_si256();
                        let mut second = _mm256_setzero_si256();
                        for k in 0..4 {
                            first = $dot_bytes(first, values[k], four(&input.quants, k));
                            second = $dot_bytes(second, values[4 + k], four(&input.quants, 4 + k));
                        }
                        let dot = _mm256_mullo_epi32(_mm256_add_epi32(first, second), scales);
                        dots[n] = _mm256_add_epi32(dots[n], dot);
                    });
                }
                let mut minimums = [_mm256_setzero_si256(); N];
                for k in 0..4 {
                    // Each row's minimums of sub-blocks 2k and 2k + 1,
                    // as the two 16-bit halves of its lane.
                    let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(
                        _mm_loadl_epi64(at.add(96 + 16 * k).cast()),
                        _mm_loadl_epi64(at.add(104 + 16 * k).cast()),
                    ));
                    each_row::<N>(|n| {
                        let (first, second) =
                            (&inputs[n][8 * b + 2 * k], &inputs[n][8 * b + 2 * k + 1]);
                        // A total is at most 32 · 127 in magnitude.
                        let totals = paired(first.total(), second.total());
                        minimums[n] = $dot_pairs(minimums[n], mins, _mm256_set1_epi32(totals));
                    });
                }
                let (d, dmin) = (eight_f16(at), eight_f16(at.add(16)));
                each_row::<N>(|n| {
                    let scale = _mm256_set1_ps(inputs[n][8 * b].scale);
                    let (d, dmin) = (_mm256_mul_ps(d, scale), _mm256_mul_ps(dmin, scale));
                    sums[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[n]), d, sums[n]);
                    sums[n] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(minimums[n]), dmin, sums[n]);
                });
            }
            store(sums, out);
        }

        by_rows!(q6k, q6k_tile, $features);

        /// Row `r` of a block contributes `d·s·Σⱼ (sc₂ⱼ·Σ' (wᵢ - 32)qᵢ +
        /// sc₂ⱼ₊₁·Σ'' (wᵢ - 32)qᵢ)` over its input blocks `j` of 32, which
        /// share their scale `s` and whose halves are sub-blocks with
        /// scales `sc`. The unsigned `wᵢ` go into the byte multiply as
        /// they are, and `32·Σ sc·Σ qᵢ` comes off once per block, from
        /// the inputs' half sums; both sums are exact in integers.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q6k_tile<const N: usize>(
            group: &[u8],
            inputs: &[&[InputBlock]],
            out: &mut [f32],
            streamed: bool,
        ) {
            let inputs: &[&[InputBlock]; N] = inputs.try_into().expect("N input rows");
            let mut sums = [_mm256_setzero_ps(); N];
            for (b, block) in group
                .chunks_exact(Format::Q6K.group_block_bytes())
                .enumerate()
            {
                let at = block.as_ptr();
                prefetch_ahead(at, Format::Q6K.group_block_bytes(), streamed);
                let mut dots = [_mm256_setzero_si256(); N];
                let mut offsets = [_mm256_setzero_si256(); N];
                for j in 0..8 {
                    let first_scales = eight_signed_bytes(at.add(16 + 16 * j));
                    let second_scales = eight_signed_bytes(at.add(24 + 16 * j));
                    // Each row's two scales as the 16-bit halves of its lane.
                    let paired_scales = _mm256_or_si256(
                        _mm256_and_si256(first_scales, _mm256_set1_epi32(0xFFFF)),
                        _mm256_slli_epi32::<16>(second_scales),
                    );
                    let values = q6k_block_values(at, j);
                    each_row::<N>(|n| {
                        let input = &inputs[n][8 * b + j];
                        let mut first = _mm256_setzero_si256();
                        let mut second = _mm256_setzero_si256();
                        for k in 0..4 {
                            first = $dot_bytes(first, values[k], four(&input.quants, k));
                            second = $dot_bytes(second, values[4 + k], four(&input.quants, 4 + k));
                        }
                        let dot = _mm256_add_epi32(
                            _mm256_mullo_epi32(first, first_scales),
                            _mm256_mullo_epi32(second, second_scales),
                        );
                        dots[n] = _mm256_add_epi32(dots[n], dot);
                        let [low, high] = input.halves.map(i32::from);
                        let halves = _mm256_set1_epi32(paired(low, high));
                        offsets[n] = $dot_pairs(offsets[n], paired_scales, halves);
                    });
                }
                let d = eight_f16(at);
                each_row::<N>(|n| {
                    let dots = _mm256_sub_epi32(dots[n], _mm256_slli_epi32::<5>(offsets[n]));
                    let d = _mm256_mul_ps(d, _mm256_set1_ps(inputs[n][8 * b].scale));
                    sums[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), d, sums[n]);
                });
            }
            store(sums, out);
        }
    };
}

pub(in crate::engine::kernels) mod avx2 {
    kernels!(
        "avx2,fma,f16c",
        dot_bytes_avx2,
        dot_pairs_avx2,
        q8_0_weights_avx2,
        q8_0_dot_avx2
    );
}

pub(in crate::engine::kernels) mod vnni {
    kernels!(
        "avx2,fma,f16c,avx512vnni,avx512vl",
        dot_bytes_vnni,
        dot_pairs_vnni,
        q8_0_weights_vnni,
        q8_0_dot_vnni
    );
}
