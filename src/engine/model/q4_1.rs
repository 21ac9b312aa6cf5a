//! Decode matmuls with Q4_1 weights, read as the file stores them.
//!
//! Small models are stored in Q4_1 (SmolLM2's 576-wide rows are too narrow
//! for K-quants), for which candle has only a slow generic CPU loop. Such
//! weights used to be re-quantized to Q8_0 at load and padded to the width
//! candle's fast kernel takes, so that a decode step read more than twice the
//! bytes of the file from a second copy of the weights. Here, as llama.cpp
//! does for Q4_1, each input row is quantized to 8 bits in blocks of 32 and
//! multiplied with the 4-bit weights in integer arithmetic; every weight
//! block is unpacked once for several input rows.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Tensor};
use std::sync::{Arc, Mutex, PoisonError};

/// Values per block, in weights and inputs alike.
const BLOCK: usize = 32;
/// Bytes of a stored Q4_1 block: its scale and its minimum as f16, then 16
/// bytes of which the low nibbles are values 0-15 and the high ones 16-31.
const BLOCK_BYTES: usize = 20;
/// Input rows multiplied with one unpacked weight block.
const TILE: usize = 4;

/// A Q4_1 weight `(rows, width)` on the CPU.
#[derive(Debug, Clone)]
pub(crate) struct Q4_1Matmul {
    weight: Arc<QTensor>,
    rows: usize,
    width: usize,
}

impl Q4_1Matmul {
    /// `None` unless `weight` is a CPU Q4_1 matrix and this CPU has the
    /// AVX2, FMA and F16C the kernel is written for.
    pub(crate) fn new(weight: Arc<QTensor>) -> Option<Self> {
        let &[rows, width] = weight.shape().dims() else {
            return None;
        };
        let fits = weight.dtype() == GgmlDType::Q4_1
            && weight.device().is_cpu()
            && width.is_multiple_of(BLOCK)
            && super::has_avx2_fma_f16c();
        fits.then_some(Q4_1Matmul {
            weight,
            rows,
            width,
        })
    }

    /// `x` `(1, seq, width)` times the weight's transpose: `(1, seq, rows)`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (_, seq, width) = x.dims3()?;
        if width != self.width {
            candle_core::bail!(
                "a Q4_1 matmul {width} wide for a weight {} wide",
                self.width
            );
        }
        let values = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let blocks = width / BLOCK;
        let mut inputs = vec![InputBlock::default(); seq * blocks];
        for (row, quantized) in values
            .chunks_exact(width)
            .zip(inputs.chunks_exact_mut(blocks))
        {
            quantize(row, quantized);
        }
        let inputs: Vec<&[InputBlock]> = inputs.chunks_exact(blocks).collect();
        let weight = self.weight.data()?;
        let row_bytes = blocks * BLOCK_BYTES;
        // Weight rows are split among the cores in runs; each run's results
        // are `(rows of the run, seq)`, written through its own lock.
        let run = self.rows.div_ceil(64).max(16);
        let mut by_weight_row = vec![0f32; self.rows * seq];
        let runs: Vec<Mutex<&mut [f32]>> = by_weight_row
            .chunks_mut(run * seq)
            .map(Mutex::new)
            .collect();
        candle_core::utils::barrier_pool().execute_chunked(runs.len(), |indices| {
            for index in indices {
                // Each run has one writer, so its lock is never contended
                // and can only be poisoned by a panic candle re-raises.
                let mut out = runs[index].lock().unwrap_or_else(PoisonError::into_inner);
                let first = index * run;
                for (offset, out) in out.chunks_exact_mut(seq).enumerate() {
                    let at = (first + offset) * row_bytes;
                    let row = &weight[at..at + row_bytes];
                    for (tile, out) in inputs.chunks(TILE).zip(out.chunks_mut(TILE)) {
                        // SAFETY: `new` admitted this CPU (`has_avx2_fma_f16c`).
                        unsafe { kernel::dot_rows(row, tile, out) };
                    }
                }
            }
        });
        drop(runs);
        let out = if seq == 1 {
            by_weight_row
        } else {
            let mut by_input_row = vec![0f32; seq * self.rows];
            for (i, values) in by_weight_row.chunks_exact(seq).enumerate() {
                for (r, value) in values.iter().enumerate() {
                    by_input_row[r * self.rows + i] = *value;
                }
            }
            by_input_row
        };
        Tensor::from_vec(out, (1, seq, self.rows), &Device::Cpu)
    }
}

/// One block of an input row in 8 bits: value `i` is about
/// `scale * quants[i]`, and `sum` is `scale` times the sum of the quants.
#[derive(Debug, Clone, Copy, Default)]
struct InputBlock {
    scale: f32,
    sum: f32,
    quants: [i8; BLOCK],
}

/// Quantize `row` to blocks, each scaled so that its largest magnitude is 127.
fn quantize(row: &[f32], blocks: &mut [InputBlock]) {
    for (values, block) in row.chunks_exact(BLOCK).zip(blocks) {
        let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = largest / 127.0;
        let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut total = 0i32;
        for (quant, value) in block.quants.iter_mut().zip(values) {
            *quant = (value * inverse).round() as i8;
            total += i32::from(*quant);
        }
        block.scale = scale;
        block.sum = scale * total as f32;
    }
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::{InputBlock, BLOCK_BYTES, TILE};
    use std::arch::x86_64::*;

    /// `out[r]` = the dot product of the Q4_1 weight row `weight` with the
    /// input row `inputs[r]`, for up to [`TILE`] rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows(weight: &[u8], inputs: &[&[InputBlock]], out: &mut [f32]) {
        match inputs.len() {
            1 => dot_tile::<1>(weight, inputs, out),
            2 => dot_tile::<2>(weight, inputs, out),
            3 => dot_tile::<3>(weight, inputs, out),
            _ => dot_tile::<TILE>(weight, inputs, out),
        }
    }

    /// [`dot_rows`] for exactly `N` rows, so that the compiler keeps every
    /// row's sums in registers.
    ///
    /// A block contributes `d * scale * Σ wᵢ·qᵢ + m * sum`, where `wᵢ` are
    /// its 4-bit values and `d`, `m` its scale and minimum. The integer
    /// sums are exact; the float ones run in eight lanes, each over four of
    /// a block's values, block after block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_tile<const N: usize>(weight: &[u8], inputs: &[&[InputBlock]], out: &mut [f32]) {
        let inputs: &[&[InputBlock]; N] = inputs.try_into().expect("N input rows");
        let nibbles = _mm_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut sums = [_mm256_setzero_ps(); N];
        let mut minimums = [0f32; N];
        for (b, block) in weight.chunks_exact(BLOCK_BYTES).enumerate() {
            // The scale and the minimum, two f16 side by side.
            let header = i32::from_le_bytes([block[0], block[1], block[2], block[3]]);
            let header = _mm_cvtph_ps(_mm_cvtsi32_si128(header));
            let d = _mm_cvtss_f32(header);
            let m = _mm_cvtss_f32(_mm_movehdup_ps(header));
            let packed = _mm_loadu_si128(block.as_ptr().add(4).cast());
            let low = _mm_and_si128(packed, nibbles);
            let high = _mm_and_si128(_mm_srli_epi16::<4>(packed), nibbles);
            let values = _mm256_set_m128i(high, low);
            for r in 0..N {
                let input = &inputs[r][b];
                let quants = _mm256_loadu_si256(input.quants.as_ptr().cast());
                // Unsigned weights times signed inputs, summed in fours.
                let dots = _mm256_madd_epi16(_mm256_maddubs_epi16(values, quants), ones);
                let weight = _mm256_set1_ps(d * input.scale);
                sums[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), weight, sums[r]);
                minimums[r] = m.mul_add(input.sum, minimums[r]);
            }
        }
        for r in 0..N {
            let halves = _mm_add_ps(
                _mm256_castps256_ps128(sums[r]),
                _mm256_extractf128_ps::<1>(sums[r]),
            );
            let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
            let total = _mm_add_ss(pairs, _mm_movehdup_ps(pairs));
            out[r] = _mm_cvtss_f32(total) + minimums[r];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `(rows, width)` Q4_1 weight quantized from smooth values.
    fn weight(rows: usize, width: usize) -> Arc<QTensor> {
        let values: Vec<f32> = (0..rows * width)
            .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * (1.0 + (i % 7) as f32))
            .collect();
        let dense = Tensor::from_vec(values, (rows, width), &Device::Cpu).unwrap();
        Arc::new(QTensor::quantize(&dense, GgmlDType::Q4_1).unwrap())
    }

    fn inputs(seq: usize, width: usize) -> Tensor {
        let values: Vec<f32> = (0..seq * width)
            .map(|i| (i as f32 * 0.61).sin() * 3.0)
            .collect();
        Tensor::from_vec(values, (1, seq, width), &Device::Cpu).unwrap()
    }

    /// What the kernel computes, in plain integer and float arithmetic.
    fn reference(weight: &QTensor, x: &Tensor) -> Vec<f32> {
        let (rows, width) = weight.shape().dims2().unwrap();
        let data = weight.data().unwrap();
        let values = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let blocks = width / BLOCK;
        let mut out = Vec::new();
        for row in values.chunks_exact(width) {
            let mut quantized = vec![InputBlock::default(); blocks];
            quantize(row, &mut quantized);
            for w in data.chunks_exact(blocks * BLOCK_BYTES).take(rows) {
                let mut sum = 0f64;
                for (block, input) in w.chunks_exact(BLOCK_BYTES).zip(&quantized) {
                    let d = half::f16::from_le_bytes([block[0], block[1]]).to_f64();
                    let m = half::f16::from_le_bytes([block[2], block[3]]).to_f64();
                    let dot: i32 = (0..16)
                        .map(|j| {
                            let byte = block[4 + j];
                            i32::from(byte & 0x0F) * i32::from(input.quants[j])
                                + i32::from(byte >> 4) * i32::from(input.quants[j + 16])
                        })
                        .sum();
                    sum += d * f64::from(input.scale) * f64::from(dot) + m * f64::from(input.sum);
                }
                out.push(sum as f32);
            }
        }
        out
    }

    #[test]
    fn the_kernel_computes_the_integer_dot_products_of_its_blocks() {
        let Some(matmul) = Q4_1Matmul::new(weight(70, 96)) else {
            return; // a CPU without AVX2 never builds this matmul
        };
        // 1, a whole tile, and a tile and a part.
        for seq in [1, 4, 6] {
            let x = inputs(seq, 96);
            let out = matmul.forward(&x).unwrap();
            assert_eq!(out.dims(), &[1, seq, 70]);
            let out = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let expected = reference(&matmul.weight, &x);
            for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{i}: {got} against {want}"
                );
            }
        }
    }

    #[test]
    fn it_multiplies_by_the_dequantized_weight_up_to_the_inputs_rounding() {
        let q = weight(40, 128);
        let Some(matmul) = Q4_1Matmul::new(q.clone()) else {
            return;
        };
        let x = inputs(3, 128);
        let out = matmul.forward(&x).unwrap().flatten_all().unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap();
        let expected = x
            .squeeze(0)
            .unwrap()
            .matmul(&dense.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap();
        let largest = |t: Tensor| {
            t.abs()
                .and_then(|t| t.max(0))
                .and_then(|t| t.to_scalar::<f32>())
                .unwrap()
        };
        let scale = largest(expected.clone());
        let diff = largest((out - expected).unwrap());
        assert!(
            diff < 0.01 * scale,
            "max difference {diff} at scale {scale}"
        );
    }

    #[test]
    fn other_types_are_left_to_candle() {
        let dense = Tensor::zeros((4, 64), DType::F32, &Device::Cpu).unwrap();
        let q8 = Arc::new(QTensor::quantize(&dense, GgmlDType::Q8_0).unwrap());
        assert!(Q4_1Matmul::new(q8).is_none());
    }
}
