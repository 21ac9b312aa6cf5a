//! `e^x` eight floats at a time, for attention's softmax and the MLP's SiLU.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// `e^x` in each lane, within two units in the last place for `x` from -87
/// to 88. Below, where `e^x` leaves the normal floats, the result is about
/// 2^-126 instead of smaller; above, where it nears the largest float, it
/// is `e^88`.
///
/// `x = n·ln 2 + r` with `|r|` ≤ ln 2 / 2; `e^r` is a polynomial (Cephes'
/// `expf` coefficients) and `2^n` is built in the exponent bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn exp(x: __m256) -> __m256 {
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    const POLYNOMIAL: [f32; 6] = [
        1.987_569_1e-4,
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ];
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HIGH), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LOW), r);
    let mut p = _mm256_set1_ps(POLYNOMIAL[0]);
    for c in &POLYNOMIAL[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let e_r = _mm256_fmadd_ps(
        p,
        _mm256_mul_ps(r, r),
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let exponent = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    _mm256_mul_ps(e_r, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(exponent)))
}

/// `silu(g) · u = g / (1 + e^-g) · u` for each gate and up value into
/// `out` (every value of it when the three are as long), eight at a time
/// and the last few by the same steps. With libm's `expf` one value at a
/// time it took 2 ms of a sixteen-sequence SmolLM2 decode step.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn swiglu(gates: &[f32], ups: &[f32], out: &mut [MaybeUninit<f32>]) {
    let eight = |gates: &[f32; 8], ups: &[f32; 8]| -> __m256 {
        // SAFETY: eight floats each; the caller promises the features.
        unsafe {
            let (g, u) = (
                _mm256_loadu_ps(gates.as_ptr()),
                _mm256_loadu_ps(ups.as_ptr()),
            );
            let silu = _mm256_div_ps(
                g,
                _mm256_add_ps(
                    _mm256_set1_ps(1.0),
                    exp(_mm256_sub_ps(_mm256_setzero_ps(), g)),
                ),
            );
            _mm256_mul_ps(silu, u)
        }
    };
    let count = out.len().min(gates.len()).min(ups.len());
    let (runs, _) = out[..count].as_chunks_mut::<8>();
    let (gate_runs, _) = gates[..count].as_chunks::<8>();
    let (up_runs, _) = ups[..count].as_chunks::<8>();
    for ((out, gates), ups) in runs.iter_mut().zip(gate_runs).zip(up_runs) {
        // SAFETY: room for eight floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().cast(), eight(gates, ups)) };
    }
    let done = runs.len() * 8;
    if done < count {
        let mut lanes = [[0f32; 8]; 3];
        lanes[0][..count - done].copy_from_slice(&gates[done..count]);
        lanes[1][..count - done].copy_from_slice(&ups[done..count]);
        // SAFETY: eight floats.
        unsafe { _mm256_storeu_ps(lanes[2].as_mut_ptr(), eight(&lanes[0], &lanes[1])) };
        for (out, &value) in out[done..count].iter_mut().zip(&lanes[2]) {
            out.write(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within_ulps(got: f32, want: f32, ulps: f32) -> bool {
        let ulp = f32::from_bits(want.abs().to_bits() + 1) - want.abs();
        (got - want).abs() <= ulps * ulp
    }

    #[test]
    fn exp_is_within_two_units_in_the_last_place() {
        if !crate::engine::kernels::has_avx2_fma_f16c() {
            return;
        }
        let xs: Vec<f32> = (0..159_000).map(|i| 88.0 - (i as f32) * 0.001_1).collect();
        for run in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: this CPU has AVX2, FMA and F16C; eight floats each.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp(_mm256_loadu_ps(run.as_ptr()))) };
            for (x, got) in run.iter().zip(got) {
                assert!(
                    within_ulps(got, x.exp(), 2.0),
                    "e^{x}: {got} against {}",
                    x.exp()
                );
            }
        }
    }

    #[test]
    fn swiglu_is_within_a_few_units_in_the_last_place_of_the_scalar_formula() {
        if !crate::engine::kernels::has_avx2_fma_f16c() {
            return;
        }
        // Eight-value runs and a part, across the gates' whole useful range.
        let count = 8 * 1000 + 5;
        let gates: Vec<f32> = (0..count)
            .map(|i| (i as f32 * 0.37).sin() * 100.0)
            .collect();
        let ups: Vec<f32> = (0..count)
            .map(|i| (i as f32 * 0.11 + 2.3).cos() * 3.0)
            .collect();
        let mut out = vec![MaybeUninit::new(f32::NAN); count];
        // SAFETY: this CPU has AVX2, FMA and F16C.
        unsafe { swiglu(&gates, &ups, &mut out) };
        // SAFETY: every value was initialized, to NaN where nothing wrote it.
        let out: Vec<f32> = out
            .iter()
            .map(|value| unsafe { value.assume_init() })
            .collect();
        for ((&g, &u), &got) in gates.iter().zip(&ups).zip(&out) {
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                within_ulps(got, want, 4.0) || (got - want).abs() < 1e-30,
                "g {g}, u {u}: {got} against {want}"
            );
        }
    }
}
