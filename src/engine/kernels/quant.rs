//! Input rows quantized to 8 bits in blocks for the integer matmul, and the
//! buffers each thread prepares them in.

use super::packing::BLOCK;
use super::rowwise::{normalize_rows, swiglu_values};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;

/// One block of an input row in 8 bits: value `i` is about
/// `scale * quants[i]`, and `halves` are the sums of quants 0-15 and 16-31.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct InputBlock {
    pub(super) scale: f32,
    pub(super) halves: [i16; 2],
    /// `scale · Σ q`, what a Q4_1 block's minimum is multiplied by. Read
    /// where [`tiles::wide`](super::tiles::wide) computed it for each row of
    /// each block, whose scalar arithmetic and broadcast take the vector
    /// ports' turns, a SmolLM2 decode pass took 1-3% less time at one and
    /// four rows.
    pub(super) minimum_weight: f32,
    pub(super) quants: [i8; BLOCK],
}

impl InputBlock {
    /// The sum of the quants.
    pub(super) fn total(&self) -> i32 {
        i32::from(self.halves[0]) + i32::from(self.halves[1])
    }
}

/// Two rows' input blocks and their pair blocks (none when the kernel
/// takes rows one at a time), prepared by one thread.
pub(super) type TwoRows<'a> = (&'a mut [InputBlock], &'a mut [PairBlock]);

/// The rows a matmul multiplies, `width` values each.
#[derive(Clone, Copy)]
pub(super) enum Input<'a> {
    Values(&'a [f32]),
    /// Each row is `silu(gate) · up` of these rows.
    Swiglu(&'a [f32], &'a [f32]),
    /// Each row is the RMS norm of one of `rows`, scaled by `alpha`.
    Normed {
        rows: &'a [f32],
        alpha: &'a [f32],
        eps: f32,
    },
}

impl<'a> Input<'a> {
    /// Rows `rows`, one after another: in place, or computed into
    /// `scratch`, together, so that the norm adds their squares side by side.
    pub(super) fn rows<'s>(
        self,
        rows: Range<usize>,
        width: usize,
        scratch: &'s mut Vec<f32>,
    ) -> &'s [f32]
    where
        'a: 's,
    {
        let span = rows.start * width..rows.end * width;
        let len = span.len();
        match self {
            Input::Values(values) => &values[span],
            // SAFETY: the SwiGLU of as many gates and ups, and the norm of
            // whole rows, write every value of their output.
            Input::Swiglu(gates, ups) => unsafe {
                filled(scratch, len, |out| {
                    swiglu_values(&gates[span.clone()], &ups[span], out)
                })
            },
            // SAFETY: as above.
            Input::Normed { rows, alpha, eps } => unsafe {
                filled(scratch, len, |out| {
                    normalize_rows(&rows[span], alpha, eps, out)
                })
            },
        }
    }
}

/// `scratch`, emptied and then `len` values long as `write` fills them.
///
/// # Safety
/// `write` initializes every value of the `len` it is given.
unsafe fn filled(
    scratch: &mut Vec<f32>,
    len: usize,
    write: impl FnOnce(&mut [std::mem::MaybeUninit<f32>]),
) -> &[f32] {
    scratch.clear();
    scratch.reserve(len);
    write(&mut scratch.spare_capacity_mut()[..len]);
    // SAFETY: as the caller promises.
    unsafe { scratch.set_len(len) };
    scratch
}

/// The same block of two input rows, laid out so that each field the
/// [`tiles::pairs`](super::tiles::pairs) kernels read is one 8-byte load,
/// broadcast to a register's eight 64-bit lanes: the first row's value in
/// each lane's low half, the second's in the high half.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(8))]
pub(super) struct PairBlock {
    /// Quants `4k..4k+4` of the first row, then of the second.
    pub(super) quants: [[[i8; 4]; 2]; 8],
    pub(super) scales: [f32; 2],
    /// Each row's `scale · Σ q`, what a Q4_1 block's minimum is multiplied by.
    pub(super) minimum_weights: [f32; 2],
    /// Each row's `-128 · Σ q`, which takes the 128 off Q8_0's stored weights.
    pub(super) offsets: [i32; 2],
    /// Each row's `Σ q`, what a Q4_K sub-block's minimum is multiplied by.
    pub(super) totals: [i32; 2],
    /// Each row's [`InputBlock::halves`], which Q6_K's sub-block scales multiply.
    pub(super) halves: [[i16; 2]; 2],
}

impl PairBlock {
    pub(super) fn new(first: &InputBlock, second: &InputBlock) -> Self {
        let rows = [first, second];
        PairBlock {
            quants: std::array::from_fn(|k| {
                rows.map(|input| std::array::from_fn(|i| input.quants[4 * k + i]))
            }),
            scales: rows.map(|input| input.scale),
            minimum_weights: rows.map(|input| input.minimum_weight),
            offsets: rows.map(|input| -128 * input.total()),
            totals: rows.map(InputBlock::total),
            halves: rows.map(|input| input.halves),
        }
    }
}

/// Quantize `row` to blocks, rounding halves to even. The blocks of each
/// `span` values share one scale, which makes their largest magnitude 127.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(super) fn quantize(row: &[f32], span: usize, blocks: &mut [InputBlock]) {
    for (values, blocks) in row
        .chunks_exact(span)
        .zip(blocks.chunks_exact_mut(span / BLOCK))
    {
        let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = largest / 127.0;
        let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (values, block) in values.chunks_exact(BLOCK).zip(blocks) {
            block.halves = [0; 2];
            for (i, (quant, value)) in block.quants.iter_mut().zip(values).enumerate() {
                *quant = (value * inverse).round_ties_even() as i8;
                block.halves[i / 16] += i16::from(*quant);
            }
            block.scale = scale;
            block.minimum_weight = scale * block.total() as f32;
        }
    }
}

thread_local! {
    /// The input blocks and pair blocks of the calling thread's matmuls,
    /// kept from one to the next: allocating and clearing them for each
    /// matmul was 2.4% of a sixteen-sequence decode step, on the batch
    /// thread while the pool idled.
    pub(super) static PREPARED: RefCell<(Vec<InputBlock>, Vec<PairBlock>)> = RefCell::default();
}

/// The first `len` items of `buffer`, grown to hold them; whatever they
/// held is left for the caller to overwrite.
pub(super) fn reused<T: Clone + Default>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
    &mut buffer[..len]
}

/// A matmul's prepared input rows: written two rows a job, each job by one
/// thread, and then read by every thread that multiplies them, in one pass
/// of the pool.
pub(super) struct Prepared<'a> {
    inputs: *mut InputBlock,
    pairs: *mut PairBlock,
    /// Input rows, each `blocks` input blocks.
    pub(super) rows: usize,
    pub(super) blocks: usize,
    /// Whether each two rows also have `blocks` pair blocks.
    paired: bool,
    buffers: PhantomData<(&'a mut [InputBlock], &'a mut [PairBlock])>,
}

// SAFETY: threads write through the pointers only to the rows of a job of
// their own, and read them only once every job is done (see the methods).
unsafe impl Sync for Prepared<'_> {}

impl<'a> Prepared<'a> {
    /// The rows of `inputs`, `blocks` blocks each, and of `pairs` where it
    /// is not empty.
    pub(super) fn new(
        inputs: &'a mut [InputBlock],
        pairs: &'a mut [PairBlock],
        blocks: usize,
    ) -> Self {
        Prepared {
            rows: inputs.len() / blocks,
            blocks,
            paired: !pairs.is_empty(),
            inputs: inputs.as_mut_ptr(),
            pairs: pairs.as_mut_ptr(),
            buffers: PhantomData,
        }
    }

    /// Jobs of two rows, the last of one where the rows are odd.
    pub(super) fn jobs(&self) -> usize {
        self.rows.div_ceil(2)
    }

    /// Job `job`'s input blocks and pair blocks (none unless paired).
    ///
    /// # Safety
    /// `job` is below [`Prepared::jobs`], and no other reference to its
    /// rows lives while these do.
    pub(super) unsafe fn job(&self, job: usize) -> TwoRows<'_> {
        let first = 2 * job;
        let count = (self.rows - first).min(2);
        // SAFETY: as the caller promises, inside the buffers.
        unsafe {
            let inputs = std::slice::from_raw_parts_mut(
                self.inputs.add(first * self.blocks),
                count * self.blocks,
            );
            let pairs = match self.paired {
                true => {
                    std::slice::from_raw_parts_mut(self.pairs.add(job * self.blocks), self.blocks)
                }
                false => &mut [],
            };
            (inputs, pairs)
        }
    }

    /// Every row's input blocks, and pair blocks.
    ///
    /// # Safety
    /// No job's rows are borrowed mutably while these live.
    pub(super) unsafe fn all(&self) -> (&[InputBlock], &[PairBlock]) {
        let pairs = if self.paired {
            self.jobs() * self.blocks
        } else {
            0
        };
        // SAFETY: as the caller promises; the buffers hold these many.
        unsafe {
            (
                std::slice::from_raw_parts(self.inputs, self.rows * self.blocks),
                std::slice::from_raw_parts(self.pairs, pairs),
            )
        }
    }
}
