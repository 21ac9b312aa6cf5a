//! The engine's CPU kernels: integer matmuls on quantized weights, attention,
//! RMS norm and SwiGLU, in AVX2 or AVX-512 where the CPU has them.

pub(crate) mod attention;
#[cfg(target_arch = "x86_64")]
mod exp;
mod matmul;
mod packing;
mod quant;
pub(crate) mod rowwise;
#[cfg(target_arch = "x86_64")]
mod tiles;

pub(crate) use matmul::InterleavedMatmul;
pub(crate) use packing::{Interleaver, GROUP};

use candle_core::{Layout, Storage};
use std::ops::Deref;

/// Whether this CPU runs the vector kernels of [`attention`] and [`matmul`]:
/// x86-64 with AVX2, FMA and F16C (every AVX2 CPU has the last).
pub(crate) fn has_avx2_fma_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The f32 values of a contiguous CPU tensor, read through the guard its
/// `storage_and_layout` gave.
pub(crate) fn cpu_values<'a>(
    (storage, layout): &'a (impl Deref<Target = Storage>, &Layout),
) -> candle_core::Result<&'a [f32]> {
    let Storage::Cpu(storage) = &**storage else {
        candle_core::bail!("reading the values of a tensor that is not on the CPU");
    };
    let count = layout.shape().elem_count();
    Ok(&storage.as_slice::<f32>()?[layout.start_offset()..][..count])
}
