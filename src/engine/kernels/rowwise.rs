//! RMS norm and SwiGLU row by row on the CPU, to candle's bits or within a few
//! units in the last place of them; other devices and types take candle's ops.

use super::cpu_values;
use crate::engine::pool::written;
use candle_core::{DType, Tensor};
use std::mem::MaybeUninit;

/// Elements [`swiglu`] computes on one thread of the pool at a time.
const SWIGLU_CHUNK: usize = 2048;

/// `silu(gate) · up`, elementwise: `g / (1 + e^-g) · u`, within a few units
/// in the last place of candle's `silu` and then its `mul`. Two f32 tensors
/// on the CPU take one pass on candle's pool; as two candle ops they ran on
/// one thread, 3 ms of a sixteen-sequence SmolLM2 decode step, long enough
/// for the pool's other thread to park before the next matmul woke it.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    if !(f32_on_cpu(gate) && f32_on_cpu(up)) || gate.shape() != up.shape() {
        return candle_nn::ops::silu(gate)? * up;
    }
    let (gate, up) = (gate.contiguous()?, up.contiguous()?);
    let count = gate.elem_count();
    let (gate_storage, up_storage) = (gate.storage_and_layout(), up.storage_and_layout());
    let (gates, ups) = (cpu_values(&gate_storage)?, cpu_values(&up_storage)?);
    let swiglu_chunk = |index: usize, out: &mut [MaybeUninit<f32>]| {
        let at = index * SWIGLU_CHUNK;
        swiglu_values(&gates[at..], &ups[at..], out)
    };
    // SAFETY: `swiglu_values` writes each value of a chunk, its gates and
    // ups being as many.
    let out = unsafe { written(count, SWIGLU_CHUNK, true, swiglu_chunk) };
    Tensor::from_vec(out, gate.shape(), gate.device())
}

/// Rows whose sums of squares [`rms_norm`] adds up side by side.
const NORM_LOCKSTEP: usize = 8;

/// Rows [`rms_norm`] normalizes on the calling thread; more go to the pool,
/// as candle sends more than 32 to rayon's.
const NORM_ROWS_IN_PLACE: usize = 32;

/// candle's RMS norm of each last-dimension row of `x`, scaled by `alpha`,
/// with the same bits. candle adds each row's squares up one after another,
/// each add waiting on the last, on the batch thread while the pool idles.
/// Here several rows' sums advance together, each in candle's order, and the
/// output is written once, uncleared: in a sixteen-sequence decode step the
/// norm's samples fell from 391 to 325, the rest mostly gathering each
/// row's value into the shared register.
pub(crate) fn rms_norm(x: &Tensor, alpha: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let width = x.dim(candle_core::D::Minus1)?;
    if !(f32_on_cpu(x) && f32_on_cpu(alpha)) || alpha.dims1()? != width || width == 0 {
        return candle_nn::ops::rms_norm(x, alpha, eps);
    }
    let x = x.contiguous()?;
    let alpha = alpha.contiguous()?;
    let (x_storage, alpha_storage) = (x.storage_and_layout(), alpha.storage_and_layout());
    let (values, alpha_values) = (cpu_values(&x_storage)?, cpu_values(&alpha_storage)?);
    let normalize = |index: usize, out: &mut [MaybeUninit<f32>]| {
        let rows = &values[index * NORM_LOCKSTEP * width..][..out.len()];
        normalize_rows(rows, alpha_values, eps, out);
    };
    let on_pool = values.len() > NORM_ROWS_IN_PLACE * width;
    // SAFETY: `normalize_rows` writes each value of its whole rows.
    let out = unsafe { written(values.len(), NORM_LOCKSTEP * width, on_pool, normalize) };
    Tensor::from_vec(out, x.shape(), x.device())
}

/// [`rms_norm`] of up to [`NORM_LOCKSTEP`] rows of `alpha.len()` values,
/// in AVX2 registers where the CPU has them (the same operations, so the
/// same bits).
pub(super) fn normalize_rows(rows: &[f32], alpha: &[f32], eps: f32, out: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2.
        return unsafe { normalize_rows_avx2(rows, alpha, eps, out) };
    }
    normalize_rows_portable(rows, alpha, eps, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn normalize_rows_avx2(rows: &[f32], alpha: &[f32], eps: f32, out: &mut [MaybeUninit<f32>]) {
    normalize_rows_portable(rows, alpha, eps, out)
}

#[inline(always)]
fn normalize_rows_portable(rows: &[f32], alpha: &[f32], eps: f32, out: &mut [MaybeUninit<f32>]) {
    let width = alpha.len();
    let count = rows.len() / width;
    let mut sums = [0f32; NORM_LOCKSTEP];
    let mut first = 0;
    while first < count {
        let rest = &rows[first * width..];
        let added = match count - first {
            8.. => sums_of_squares::<8>(rest, width, &mut sums[first..]),
            4..=7 => sums_of_squares::<4>(rest, width, &mut sums[first..]),
            2 | 3 => sums_of_squares::<2>(rest, width, &mut sums[first..]),
            _ => sums_of_squares::<1>(rest, width, &mut sums[first..]),
        };
        first += added;
    }
    for ((row, out), sum) in rows
        .chunks_exact(width)
        .zip(out.chunks_exact_mut(width))
        .zip(sums)
    {
        let m = (sum / width as f32 + eps).sqrt();
        for ((out, &v), &a) in out.iter_mut().zip(row).zip(alpha) {
            out.write(v / m * a);
        }
    }
}

/// The sums of squares of the first `N` rows of `width` values in `rows`
/// into `sums`, each added up in order with the rows side by side, so
/// that `N` adds are under way at once; returns `N`.
#[inline(always)]
fn sums_of_squares<const N: usize>(rows: &[f32], width: usize, sums: &mut [f32]) -> usize {
    let rows: [&[f32]; N] = std::array::from_fn(|r| &rows[r * width..][..width]);
    let mut added = [0f32; N];
    for j in 0..width {
        for (sum, row) in added.iter_mut().zip(rows) {
            let v = row[j];
            *sum += v * v;
        }
    }
    sums[..N].copy_from_slice(&added);
    N
}

/// Whether `t` holds f32 values in the CPU's memory, as the passes written
/// here for the CPU read them.
pub(crate) fn f32_on_cpu(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
}

/// `silu(g) · u` of each gate `g` and up `u` into `out`, every value of
/// which is written when there are as many gates and ups; in vector
/// registers where the CPU has them.
pub(super) fn swiglu_values(gates: &[f32], ups: &[f32], out: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { super::exp::swiglu(gates, ups, out) };
    }
    for ((out, &g), &u) in out.iter_mut().zip(gates).zip(ups) {
        out.write(g / (1.0 + (-g).exp()) * u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn swiglu_is_candles_silu_then_mul_within_a_few_units_in_the_last_place() {
        // One chunk, and several with a part.
        for count in [96, 3 * 1536 + 5] {
            let values = |salt: f32| -> Vec<f32> {
                (0..count)
                    .map(|i| (i as f32 * 0.37 + salt).sin() * 12.0)
                    .collect()
            };
            let gate = Tensor::from_vec(values(0.1), (1, 1, count), &Device::Cpu).unwrap();
            let up = Tensor::from_vec(values(2.3), (1, 1, count), &Device::Cpu).unwrap();
            let expected = (candle_nn::ops::silu(&gate).unwrap() * &up).unwrap();
            let got = swiglu(&gate, &up).unwrap();
            assert_eq!(got.dims(), expected.dims());
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (got, want) in flat(&got).into_iter().zip(flat(&expected)) {
                let ulp = f32::from_bits(want.abs().to_bits() + 1) - want.abs();
                assert!(
                    (got - want).abs() <= 4.0 * ulp,
                    "{got} against {want}, {count} values"
                );
            }
        }
    }

    #[test]
    fn norms_added_up_side_by_side_give_the_bits_of_candles() {
        // Fewer rows than advance together, a part of a pool's job, and
        // enough for the pool; a width the vector registers do not divide.
        for (rows, width) in [(1, 576), (5, 576), (19, 37), (45, 64)] {
            let values: Vec<f32> = (0..rows * width)
                .map(|i| (i as f32 * 0.37).sin() * 3.0 + 0.5)
                .collect();
            let x = Tensor::from_vec(values, (1, rows, width), &Device::Cpu).unwrap();
            let alpha: Vec<f32> = (0..width).map(|i| 1.0 + (i as f32 * 0.11).cos()).collect();
            let alpha = Tensor::from_vec(alpha, width, &Device::Cpu).unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let expected = candle_nn::ops::rms_norm(&x, &alpha, 1e-5).unwrap();
            let got = rms_norm(&x, &alpha, 1e-5).unwrap();
            assert_eq!(got.dims(), expected.dims());
            assert_eq!(flat(&got), flat(&expected), "{rows} rows of {width}");
        }
    }
}
