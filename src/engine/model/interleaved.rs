//! Matmuls with Q4_1, Q8_0, Q4_K and Q6_K weights on the CPU, from the
//! file's bytes reordered once at load.
//!
//! Small models are stored in Q4_1 (SmolLM2's 576-wide rows are too narrow
//! for K-quants), for which candle has only a slow generic CPU loop, and their
//! embedding tables in Q8_0, whose 576-wide rows candle's fast kernel does not
//! take. For the K-quants of larger models candle's kernels keep a second,
//! repacked copy of every weight and trailed llama.cpp's decode by 30-40%.
//! As llama.cpp does, each input row is quantized to 8 bits in blocks of 32
//! and multiplied with the weights in integer arithmetic. The input blocks
//! that meet one K-quant block (256 values) share a scale, as llama.cpp's
//! Q8_K inputs do, so that the block's sub-block sums add up in integers.
//!
//! The blocks of every eight weight rows are interleaved, four bytes of each
//! row in turn, so that one 8-lane register holds four values of each of
//! eight rows. A block's dot products with one input row then accumulate
//! exactly, lane by lane, and are scaled to floats once for eight rows, where
//! a row-by-row layout needs a float conversion, a scaling and a horizontal
//! sum per row. The same kernel serves prompts and decode steps, and one
//! input row's results do not depend on the rows multiplied beside it. The
//! reordered copy replaces the file's bytes: the same size for Q4_1, Q8_0 and
//! Q6_K, 3% larger for Q4_K (unpacked scales).

use super::rowwise::{f32_on_cpu, normalize_rows, swiglu_values};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Tensor};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

/// Values per block, in weights and inputs alike.
const BLOCK: usize = 32;
/// Weight rows whose blocks are interleaved.
pub(crate) const GROUP: usize = 8;
/// Input rows multiplied with one unpacked group block.
const TILE: usize = 8;

/// A block format the kernel reads.
///
/// In a group block, each f16 field of a stored block comes first for the
/// eight rows in turn (16 bytes), then the values in runs of 32 bytes, the
/// `k`-th holding bytes `4k..4k+4` of every row's values (for Q4_K, of every
/// row's 32 bytes of each pair of sub-blocks in turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// A scale `d` and a minimum `m`, then 16 bytes whose low nibbles are
    /// values 0-15 and high nibbles values 16-31: value = `d·w + m`.
    Q4_1,
    /// A scale `d`, then 32 signed bytes: value = `d·w`. A group block
    /// keeps each `w + 128`, unsigned, as the VNNI byte multiply takes it.
    Q8_0,
    /// 256 values in eight sub-blocks of 32: a scale `d` and a minimum
    /// `dmin`, 12 bytes packing each sub-block's 6-bit scale `sc` and minimum
    /// `m`, then 128 bytes whose 32-byte runs hold two sub-blocks, the first
    /// in the low nibbles: value = `d·sc·w - dmin·m`. A group block keeps
    /// `sc` and `m` unpacked, a byte each, sub-block by sub-block.
    Q4K,
    /// 256 6-bit values in sixteen sub-blocks of 16, each with a signed
    /// 8-bit scale `sc`, and a scale `d`: value = `d·sc·(w - 32)`. A group
    /// block keeps `d`, the scales sub-block by sub-block, then the values
    /// in 6 bits each, as [`interleave_q6k_block`] lays them out.
    Q6K,
}

impl Format {
    fn of(dtype: GgmlDType) -> Option<Format> {
        match dtype {
            GgmlDType::Q4_1 => Some(Format::Q4_1),
            GgmlDType::Q8_0 => Some(Format::Q8_0),
            GgmlDType::Q4K => Some(Format::Q4K),
            GgmlDType::Q6K => Some(Format::Q6K),
            _ => None,
        }
    }

    /// Values in one stored block.
    const fn values(self) -> usize {
        match self {
            Format::Q4_1 | Format::Q8_0 => BLOCK,
            Format::Q4K | Format::Q6K => 8 * BLOCK,
        }
    }

    const fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
            Format::Q4K => 144,
            Format::Q6K => 210,
        }
    }

    /// Bytes of the block of a group.
    const fn group_block_bytes(self) -> usize {
        match self {
            Format::Q4_1 | Format::Q8_0 => GROUP * self.block_bytes(),
            // d, dmin, the unpacked scales and minimums, the values.
            Format::Q4K => GROUP * (2 + 2 + 8 + 8 + 128),
            // d, the scales, the values.
            Format::Q6K => GROUP * (2 + 16 + 192),
        }
    }

    /// Lay out one block of each of a group's rows as a group block.
    fn interleave_block(self, stored: [&[u8]; GROUP], out: &mut [u8]) {
        let (fields, values) = match self {
            Format::Q6K => return interleave_q6k_block(stored, out),
            Format::Q4_1 => (2, &stored.map(|block| &block[4..])),
            Format::Q8_0 => (1, &stored.map(|block| &block[2..])),
            Format::Q4K => (2, &stored.map(|block| &block[16..])),
        };
        for (r, block) in stored.iter().enumerate() {
            for field in 0..fields {
                out[16 * field + 2 * r..][..2].copy_from_slice(&block[2 * field..2 * field + 2]);
            }
        }
        let mut at = 16 * fields;
        if self == Format::Q4K {
            for (r, block) in stored.iter().enumerate() {
                for j in 0..8 {
                    let (scale, minimum) = q4k_scale_and_minimum(&block[4..16], j);
                    out[at + 8 * j + r] = scale;
                    out[at + 64 + 8 * j + r] = minimum;
                }
            }
            at += 128;
        }
        for k in 0..values[0].len() / 4 {
            for (r, values) in values.iter().enumerate() {
                out[at + 32 * k + 4 * r..][..4].copy_from_slice(&values[4 * k..4 * k + 4]);
            }
        }
        if self == Format::Q8_0 {
            for value in &mut out[at..] {
                *value ^= 0x80;
            }
        }
    }

    /// Row `r` of a group block, dequantized onto `out`.
    fn dequantize_row(self, block: &[u8], r: usize, out: &mut Vec<f32>) {
        let f16_at = |at: usize| half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
        let values_at = |fields: usize, extra: usize, i: usize| {
            block[16 * fields + extra + 32 * (i / 4) + 4 * r + i % 4]
        };
        let d = f16_at(2 * r);
        match self {
            Format::Q4_1 => {
                let m = f16_at(16 + 2 * r);
                let bytes: Vec<u8> = (0..16).map(|i| values_at(2, 0, i)).collect();
                out.extend(bytes.iter().map(|b| d * f32::from(b & 0x0F) + m));
                out.extend(bytes.iter().map(|b| d * f32::from(b >> 4) + m));
            }
            Format::Q8_0 => {
                out.extend((0..32).map(|i| d * f32::from((values_at(1, 0, i) ^ 0x80) as i8)))
            }
            Format::Q6K => out.extend((0..256).map(|v| {
                let scale = block[16 + 8 * (v / 16) + r] as i8;
                let (bytes, k) = q6k_bytes(r, v);
                let w = match k % 4 {
                    3 => (0..3).fold(0, |w, m| w | (block[bytes[m]] >> 6) << (2 * m)),
                    m => block[bytes[m]] & 0x3F,
                };
                d * f32::from(scale) * f32::from(w as i8 - 32)
            })),
            Format::Q4K => {
                let dmin = f16_at(16 + 2 * r);
                for pair in 0..4 {
                    let bytes: Vec<u8> =
                        (0..32).map(|i| values_at(2, 128, 32 * pair + i)).collect();
                    for (j, shift) in [(2 * pair, 0), (2 * pair + 1, 4)] {
                        let scale = d * f32::from(block[32 + 8 * j + r]);
                        let minimum = dmin * f32::from(block[96 + 8 * j + r]);
                        out.extend(
                            bytes
                                .iter()
                                .map(|b| scale * f32::from((b >> shift) & 0x0F) - minimum),
                        );
                    }
                }
            }
        }
    }
}

/// Where a Q6_K group block's values start, after `d` and the scales.
const Q6K_VALUES: usize = 16 + 128;

/// [`Format::interleave_block`] for Q6_K.
///
/// The kernel multiplies 32 bytes at a time holding values `4k..4k + 4` of
/// input block `j` for each of the eight rows (value `4k + i` of row `r` in
/// byte `4r + i`), as for the other formats. Each group of four such
/// registers (`k` = 0-3 and 4-7) is stored in three: the values of the
/// first three in their low six bits, and those of the fourth two bits at a
/// time in their top bits, so that each register costs one mask to unpack
/// and the fourth a few shifts, with no byte stored twice.
fn interleave_q6k_block(stored: [&[u8]; GROUP], out: &mut [u8]) {
    for (r, block) in stored.iter().enumerate() {
        out[2 * r..2 * r + 2].copy_from_slice(&block[208..210]);
        for (s, scale) in block[192..208].iter().enumerate() {
            out[16 + 8 * s + r] = *scale;
        }
        // Each sixteen values (four registers) fill three runs of 32 bytes,
        // as `q6k_bytes` places them, one byte at a time.
        for (sixteen, values) in q6k_values(block).chunks_exact(16).enumerate() {
            let w = |v: usize| (values[v] + 32) as u8;
            let at = Q6K_VALUES + 96 * sixteen + 4 * r;
            for m in 0..3 {
                for i in 0..4 {
                    out[at + 32 * m + i] = w(4 * m + i) | (w(12 + i) >> (2 * m) & 3) << 6;
                }
            }
        }
    }
}

/// The three bytes of a Q6_K group block that can hold value `v` of row
/// `r`, with the register `k` (0-7) of its input block that the value goes
/// to: byte `k % 4` holds it whole, unless `k % 4` is 3 and all three hold
/// two of its bits each, lowest first.
fn q6k_bytes(r: usize, v: usize) -> ([usize; 3], usize) {
    let (j, k, i) = (v / 32, v % 32 / 4, v % 4);
    let run = Q6K_VALUES + 192 * j + 96 * (k / 4) + 4 * r + i;
    ([run, run + 32, run + 64], k)
}

/// The 256 values of a stored Q6_K block, `w - 32`, in order. Each half of
/// 128 values has 64 bytes of low four bits (the first 32 bytes hold its
/// quarters 0 and 2 in their low and high nibbles, the next 32 quarters 1
/// and 3) and 32 bytes holding the top two bits of its four quarters.
fn q6k_values(block: &[u8]) -> [i8; 256] {
    let mut values = [0i8; 256];
    for (half, values) in values.chunks_exact_mut(128).enumerate() {
        let (low, high) = (&block[64 * half..][..64], &block[128 + 32 * half..][..32]);
        for l in 0..32 {
            let (first, second, top) = (low[l], low[32 + l], high[l]);
            let value = |nibble: u8, bits: u8| ((nibble & 0x0F) | (bits & 3) << 4) as i8 - 32;
            values[l] = value(first, top);
            values[32 + l] = value(second, top >> 2);
            values[64 + l] = value(first >> 4, top >> 4);
            values[96 + l] = value(second >> 4, top >> 6);
        }
    }
    values
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K block, from its
/// 12 packed bytes: sub-blocks 0-3 in the low six bits of bytes 0-3 and 4-7,
/// sub-blocks 4-7 in bytes 8-11's nibbles and the top two bits of bytes 0-7.
fn q4k_scale_and_minimum(packed: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// The instructions a kernel is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Instructions {
    /// AVX2 with FMA and F16C: bytes multiply into 16-bit pair sums, then widen.
    Avx2,
    /// AVX-512 VNNI on 256-bit registers: bytes multiply and sum in one step.
    Avx512Vnni,
    /// [`Instructions::Avx512Vnni`], and for two or more input rows,
    /// 512-bit registers that hold two rows' products with a group block
    /// ([`kernel::pairs`]).
    Avx512Pairs,
}

impl Instructions {
    fn of_this_cpu() -> Option<Instructions> {
        if !super::has_avx2_fma_f16c() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
            if is_x86_feature_detected!("avx512bw") {
                return Some(Instructions::Avx512Pairs);
            }
            return Some(Instructions::Avx512Vnni);
        }
        Some(Instructions::Avx2)
    }

    /// How a `format` matmul of `rows` input rows meets its groups.
    fn tiling(self, format: Format, rows: usize) -> Tiling {
        let wide = matches!(format, Format::Q4_1 | Format::Q8_0);
        match self {
            Instructions::Avx512Pairs if wide && rows <= TWO_GROUP_ROWS => Tiling::TwoGroups,
            Instructions::Avx512Pairs if rows >= 2 => Tiling::Pairs,
            _ => Tiling::Rows,
        }
    }
}

/// How a matmul's kernel takes its groups and input rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tiling {
    /// One group, one input row a register lane set ([`kernel::vnni`], [`kernel::avx2`]).
    Rows,
    /// One group, two input rows a register ([`kernel::pairs`]).
    Pairs,
    /// Two neighbouring groups a register, one input row at a time ([`kernel::wide`]).
    TwoGroups,
}

/// A Q4_1, Q8_0, Q4_K or Q6_K weight `(rows, width)` on the CPU, its rows
/// interleaved in groups.
#[derive(Debug, Clone)]
pub(crate) struct InterleavedMatmul {
    /// Group after group of [`GROUP`] rows, each group block after block.
    /// An `Arc` of the `Vec` the groups were written into, since moving
    /// them into an `Arc<[u8]>` would copy every byte of the weight.
    interleaved: Arc<Vec<u8>>,
    format: Format,
    rows: usize,
    width: usize,
    instructions: Instructions,
}

impl InterleavedMatmul {
    /// `None` unless `weight` is a CPU matrix in one of the [`Format`]s whose
    /// rows come in whole groups and this CPU has the AVX2, FMA and F16C the
    /// kernel needs.
    pub(crate) fn new(weight: &QTensor) -> Option<Self> {
        let &[rows, width] = weight.shape().dims() else {
            return None;
        };
        if !weight.device().is_cpu() {
            return None;
        }
        let mut interleaver = Interleaver::new(weight.dtype(), (rows, width))?;
        interleaver.push(&weight.data().ok()?).ok()?;
        interleaver.finish().ok()
    }

    /// The same matmul computed with `instructions` (no more than this
    /// CPU has), to test the kernels against each other.
    #[cfg(test)]
    fn with(&self, instructions: Instructions) -> Self {
        InterleavedMatmul {
            instructions,
            ..self.clone()
        }
    }

    /// The input width: the weight's columns.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Row `row` of the weight, as f32 values: what an embedding lookup reads.
    pub(crate) fn row(&self, row: usize) -> Option<Vec<f32>> {
        if row >= self.rows {
            return None;
        }
        let group_bytes = self.width / self.format.values() * self.format.group_block_bytes();
        let group = &self.interleaved[row / GROUP * group_bytes..][..group_bytes];
        let mut values = Vec::with_capacity(self.width);
        for block in group.chunks_exact(self.format.group_block_bytes()) {
            self.format.dequantize_row(block, row % GROUP, &mut values);
        }
        Some(values)
    }

    /// `x` `(1, seq, width)` times the weight's transpose: `(1, seq, rows)`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.whole(x, None)
    }

    /// The product as one part, each sum added to `added`'s value at its
    /// place where there is one.
    fn whole(&self, x: &Tensor, added: Option<&[f32]>) -> Result<Tensor> {
        Self::one_part(self.multiply(x, &[self.rows], added)?)
    }

    /// The one part of a product computed whole.
    fn one_part(mut parts: Vec<Tensor>) -> Result<Tensor> {
        parts
            .pop()
            .ok_or_else(|| candle_core::Error::Msg("a matmul gave no output".into()))
    }

    /// [`InterleavedMatmul::forward`] cut by columns into consecutive parts
    /// of `widths` columns, `(1, seq, width)` each, written in place: a
    /// stacked weight's projections come out apart without a copy, which
    /// took the pool's other thread idle for a tenth of a sixteen-sequence
    /// decode step. Each width is a whole number of groups, and together
    /// they are the weight's rows.
    pub(crate) fn forward_parts(&self, x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
        self.multiply(x, widths, None)
    }

    /// `residual + x · weightᵀ`, `(1, seq, rows)`, each sum written once
    /// where candle's add would read the product back and write a third
    /// tensor: the residual adds of a sixteen-sequence decode step were
    /// 1.6% of it, on the batch thread while the pool idled. The same bits,
    /// since a float sum does not depend on the order of its two terms.
    pub(crate) fn forward_onto(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let (_, seq, _) = x.dims3()?;
        let residual = self.residual(residual, seq)?;
        let storage = residual.storage_and_layout();
        self.whole(x, Some(super::cpu_values(&storage)?))
    }

    /// [`InterleavedMatmul::forward_onto`] of `silu(gate) · up`, each row's
    /// SwiGLU computed where it is quantized, by the thread that quantizes
    /// it: as a pass of its own it was one more hand-out to the pool per
    /// layer, and its output one more tensor written and read back. `None`
    /// unless `gate` and `up` are f32 on the CPU, of one shape.
    pub(crate) fn swiglu_onto(
        &self,
        gate: &Tensor,
        up: &Tensor,
        residual: &Tensor,
    ) -> Result<Option<Tensor>> {
        if !(f32_on_cpu(gate) && f32_on_cpu(up)) || gate.shape() != up.shape() {
            return Ok(None);
        }
        let seq = self.input_rows(gate)?;
        let residual = self.residual(residual, seq)?;
        let (gate, up) = (gate.contiguous()?, up.contiguous()?);
        let (gates, ups, added) = (
            gate.storage_and_layout(),
            up.storage_and_layout(),
            residual.storage_and_layout(),
        );
        let input = Input::Swiglu(super::cpu_values(&gates)?, super::cpu_values(&ups)?);
        let parts =
            self.multiply_input(input, seq, &[self.rows], Some(super::cpu_values(&added)?))?;
        Self::one_part(parts).map(Some)
    }

    /// [`InterleavedMatmul::forward_parts`] of the RMS norm of `x`'s rows
    /// scaled by `alpha`, each row normed where it is quantized, by the
    /// thread that quantizes it, to the bits of [`rms_norm`]. `None` unless
    /// `x` and `alpha` are f32 on the CPU and `alpha` is as wide as a row.
    ///
    /// [`rms_norm`]: super::rowwise::rms_norm
    pub(crate) fn forward_parts_normed(
        &self,
        x: &Tensor,
        alpha: &Tensor,
        eps: f32,
        widths: &[usize],
    ) -> Result<Option<Vec<Tensor>>> {
        if !(f32_on_cpu(x) && f32_on_cpu(alpha)) || alpha.dims() != [self.width] {
            return Ok(None);
        }
        let seq = self.input_rows(x)?;
        let (x, alpha) = (x.contiguous()?, alpha.contiguous()?);
        let (rows, alpha) = (x.storage_and_layout(), alpha.storage_and_layout());
        let input = Input::Normed {
            rows: super::cpu_values(&rows)?,
            alpha: super::cpu_values(&alpha)?,
            eps,
        };
        self.multiply_input(input, seq, widths, None).map(Some)
    }

    /// The rows of `x` `(1, seq, width)`, once its width is checked.
    fn input_rows(&self, x: &Tensor) -> Result<usize> {
        let (_, seq, width) = x.dims3()?;
        if width != self.width {
            candle_core::bail!(
                "a {:?} matmul {width} wide for a weight {} wide",
                self.format,
                self.width
            );
        }
        Ok(seq)
    }

    /// `residual`, contiguous, once checked to be what a product of `seq`
    /// rows can be added to.
    fn residual(&self, residual: &Tensor, seq: usize) -> Result<Tensor> {
        if residual.dims() != [1, seq, self.rows] || residual.dtype() != DType::F32 {
            candle_core::bail!(
                "a residual of {:?} {:?} for a matmul of {seq} rows by {}",
                residual.dims(),
                residual.dtype(),
                self.rows
            );
        }
        residual.contiguous()
    }

    /// [`InterleavedMatmul::forward_parts`], each sum added to the value at
    /// its place in `added` `(seq, rows)` where there is one.
    fn multiply(&self, x: &Tensor, widths: &[usize], added: Option<&[f32]>) -> Result<Vec<Tensor>> {
        let seq = self.input_rows(x)?;
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let storage = x.storage_and_layout();
        self.multiply_input(
            Input::Values(super::cpu_values(&storage)?),
            seq,
            widths,
            added,
        )
    }

    /// [`InterleavedMatmul::multiply`] of the `seq` rows of `input`.
    fn multiply_input(
        &self,
        input: Input,
        seq: usize,
        widths: &[usize],
        added: Option<&[f32]>,
    ) -> Result<Vec<Tensor>> {
        if widths.iter().sum::<usize>() != self.rows || widths.iter().any(|w| w % GROUP != 0) {
            candle_core::bail!(
                "parts of {widths:?} columns for a {:?} matmul of {} rows",
                self.format,
                self.rows
            );
        }
        let blocks = self.width / BLOCK;
        let tiling = self.instructions.tiling(self.format, seq);
        PREPARED.with_borrow_mut(|(inputs, pairs)| {
            let inputs = reused(inputs, seq * blocks);
            let paired = tiling == Tiling::Pairs;
            let pairs = reused(pairs, if paired { seq.div_ceil(2) * blocks } else { 0 });
            let prepared = Prepared::new(inputs, pairs, blocks);
            // Two jobs or more are prepared in the matmul's own pass of the
            // pool. As a pass of their own, four given rows cost more on
            // the pool than on this thread alone; in the matmul's pass,
            // SmolLM2 decoded four sequences at a median of 492 tok/s
            // against 441 with a pass of their own and 466 with four given
            // rows prepared here, sixteen at 817 against 772 (six
            // alternated rounds).
            let pending = if prepared.jobs() == 1 {
                // SAFETY: the only job, on this thread.
                self.prepare_job(input, 0, unsafe { prepared.job(0) });
                None
            } else {
                Some(input)
            };
            self.multiply_prepared(&prepared, tiling, pending, widths, added)
        })
    }

    /// The product of the rows of `prepared`, taken as `tiling` says, for
    /// [`InterleavedMatmul::multiply`]; where there is a `pending` input,
    /// the same pass of the pool first prepares its rows, two a job.
    fn multiply_prepared(
        &self,
        prepared: &Prepared,
        tiling: Tiling,
        pending: Option<Input>,
        widths: &[usize],
        added: Option<&[f32]>,
    ) -> Result<Vec<Tensor>> {
        let (seq, blocks) = (prepared.rows, prepared.blocks);
        let groups = self.rows / GROUP;
        let group_bytes = self.width / self.format.values() * self.format.group_block_bytes();
        let mut parts: Vec<Vec<f32>> = widths.iter().map(|w| Vec::with_capacity(seq * w)).collect();
        let output = Output::new(&mut parts, widths, added);
        let tile_rows = match tiling {
            Tiling::Pairs => 2 * PAIR_TILE,
            Tiling::Rows | Tiling::TwoGroups => TILE,
        };
        // One tile of rows reads each group once, as a decode step does.
        let streamed = seq <= tile_rows;
        let jobs = pending.map_or(0, |_| prepared.jobs());
        let prepare = |job| {
            if let Some(input) = pending {
                // SAFETY: the pool hands each job to one thread, once.
                self.prepare_job(input, job, unsafe { prepared.job(job) });
            }
        };
        // Groups are split among the cores in runs, and each run writes the
        // columns of its own groups; two groups taken together stay in one run.
        let run = match tiling {
            Tiling::TwoGroups => groups.div_ceil(RUNS).next_multiple_of(2),
            Tiling::Rows | Tiling::Pairs => groups.div_ceil(RUNS),
        };
        crate::engine::pool::claimed_on_pool_after(
            jobs,
            prepare,
            groups.div_ceil(run),
            |indices| {
                // SAFETY: every preparation job has finished, and none runs again.
                let (inputs, pairs) = unsafe { prepared.all() };
                let row = |n: usize| &inputs[n * blocks..][..blocks];
                let pair = |p: usize| &pairs[p * blocks..][..blocks];
                let mut tile_out = [0f32; 2 * PAIR_TILE * GROUP];
                for index in indices {
                    let (mut g, end) = (index * run, groups.min((index + 1) * run));
                    while g < end {
                        let taken = if tiling == Tiling::TwoGroups && g + 1 < end {
                            2
                        } else {
                            1
                        };
                        let group = &self.interleaved[g * group_bytes..][..taken * group_bytes];
                        let columns = [output.columns(g), output.columns(g + taken - 1)];
                        let columns = &columns[..taken];
                        for first in (0..seq).step_by(tile_rows) {
                            let count = tile_rows.min(seq - first);
                            let pairs: [&[PairBlock]; PAIR_TILE];
                            let rows: [&[InputBlock]; TILE];
                            let tile = if tiling == Tiling::Pairs {
                                pairs = std::array::from_fn(|p| {
                                    pair((first / 2 + p).min(seq.div_ceil(2) - 1))
                                });
                                Tile::Pairs(&pairs[..count.div_ceil(2)])
                            } else {
                                rows = std::array::from_fn(|n| row((first + n).min(seq - 1)));
                                match taken {
                                    2 => Tile::TwoGroups(&rows[..count]),
                                    _ => Tile::Rows(&rows[..count]),
                                }
                            };
                            self.dot(group, tile, &mut tile_out, streamed);
                            let sums = tile_out.chunks_exact(taken * GROUP).take(count);
                            for (n, sums) in sums.enumerate() {
                                for (columns, sums) in columns.iter().zip(sums.chunks_exact(GROUP))
                                {
                                    // SAFETY: row `first + n` is below `seq`, and
                                    // these groups belong to this run alone.
                                    unsafe { columns.write(first + n, sums) };
                                }
                            }
                        }
                        g += taken;
                    }
                }
            },
        );
        parts
            .into_iter()
            .zip(widths)
            .map(|(mut part, &width)| {
                // SAFETY: the loop above wrote every row of every group once.
                unsafe { part.set_len(seq * width) };
                Tensor::from_vec(part, (1, seq, width), &Device::Cpu)
            })
            .collect()
    }

    /// Quantize rows `2·job` and `2·job + 1` of `input` (one, for an odd
    /// last) onto their input blocks, and where there are pair blocks lay
    /// the two out as pair blocks, an odd last row paired with itself.
    fn prepare_job(&self, input: Input, job: usize, (inputs, pairs): TwoRows) {
        let blocks = self.width / BLOCK;
        let first_row = 2 * job;
        let mut scratch = Vec::new();
        let count = inputs.len() / blocks;
        let rows = input.rows(first_row..first_row + count, self.width, &mut scratch);
        for (row, quantized) in rows
            .chunks_exact(self.width)
            .zip(inputs.chunks_exact_mut(blocks))
        {
            self.quantize(row, quantized);
        }
        let (first, second) = (&inputs[..blocks], &inputs[inputs.len() - blocks..]);
        for (pair, (a, b)) in pairs.iter_mut().zip(first.iter().zip(second)) {
            *pair = PairBlock::new(a, b);
        }
    }

    /// [`quantize`], in vector instructions where the kernels run, with one
    /// scale for the input blocks that meet one weight block.
    fn quantize(&self, row: &[f32], blocks: &mut [InputBlock]) {
        let span = self.format.values();
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `new` checked this CPU for AVX2, FMA and F16C.
        unsafe {
            kernel::quantize(row, span, blocks)
        }
        #[cfg(not(target_arch = "x86_64"))]
        quantize(row, span, blocks)
    }

    /// The tile of products of `groups` (one group, or two for
    /// [`Tile::TwoGroups`]) with the input rows of `tile`, into `out`:
    /// `out[n * width + c]` is column `c` of the groups times input row `n`,
    /// where `width` is [`GROUP`] for each group taken.
    fn dot(&self, groups: &[u8], tile: Tile, out: &mut [f32], streamed: bool) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `new` checked this CPU for the one-row kernels' features,
        // and `tiling` gives pairs and two groups only on CPUs `of_this_cpu`
        // found with AVX-512 F, BW and VNNI, two groups only for Q4_1 and Q8_0.
        unsafe {
            use kernel::{avx2, pairs, vnni, wide};
            let vnni = self.instructions != Instructions::Avx2;
            match (tile, self.format) {
                (Tile::Rows(rows), Format::Q4_1) if vnni => vnni::q4_1(groups, rows, out, streamed),
                (Tile::Rows(rows), Format::Q4_1) => avx2::q4_1(groups, rows, out, streamed),
                (Tile::Rows(rows), Format::Q8_0) if vnni => vnni::q8_0(groups, rows, out, streamed),
                (Tile::Rows(rows), Format::Q8_0) => avx2::q8_0(groups, rows, out, streamed),
                (Tile::Rows(rows), Format::Q4K) if vnni => vnni::q4k(groups, rows, out, streamed),
                (Tile::Rows(rows), Format::Q4K) => avx2::q4k(groups, rows, out, streamed),
                (Tile::Rows(rows), Format::Q6K) if vnni => vnni::q6k(groups, rows, out, streamed),
                (Tile::Rows(rows), Format::Q6K) => avx2::q6k(groups, rows, out, streamed),
                (Tile::Pairs(two_rows), Format::Q4_1) => {
                    pairs::q4_1(groups, two_rows, out, streamed)
                }
                (Tile::Pairs(two_rows), Format::Q8_0) => {
                    pairs::q8_0(groups, two_rows, out, streamed)
                }
                (Tile::Pairs(two_rows), Format::Q4K) => pairs::q4k(groups, two_rows, out, streamed),
                (Tile::Pairs(two_rows), Format::Q6K) => pairs::q6k(groups, two_rows, out, streamed),
                (Tile::TwoGroups(rows), Format::Q4_1) => wide::q4_1(groups, rows, out, streamed),
                (Tile::TwoGroups(rows), Format::Q8_0) => wide::q8_0(groups, rows, out, streamed),
                (Tile::TwoGroups(_), format) => {
                    unreachable!("no two-group kernel for {format:?}")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (groups, tile, out, streamed);
            unreachable!("InterleavedMatmul::new admits only x86-64 CPUs")
        }
    }
}

/// The input rows of one tile of a matmul, as its kernel takes them.
#[derive(Clone, Copy)]
enum Tile<'a> {
    /// Rows one at a time, against one group ([`Tiling::Rows`]).
    Rows(&'a [&'a [InputBlock]]),
    /// Rows two a register, against one group ([`Tiling::Pairs`]):
    /// `[p]` holds rows `2p` and `2p + 1`.
    Pairs(&'a [&'a [PairBlock]]),
    /// Rows one at a time, against two groups at once ([`Tiling::TwoGroups`]).
    TwoGroups(&'a [&'a [InputBlock]]),
}

thread_local! {
    /// The input blocks and pair blocks of the calling thread's matmuls,
    /// kept from one to the next: allocating and clearing them for each
    /// matmul was 2.4% of a sixteen-sequence decode step, on the batch
    /// thread while the pool idled.
    static PREPARED: RefCell<(Vec<InputBlock>, Vec<PairBlock>)> = RefCell::default();
}

/// The first `len` items of `buffer`, grown to hold them; whatever they
/// held is left for the caller to overwrite.
fn reused<T: Clone + Default>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::default());
    }
    &mut buffer[..len]
}

/// A matmul's prepared input rows: written two rows a job, each job by one
/// thread, and then read by every thread that multiplies them, in one pass
/// of the pool.
struct Prepared<'a> {
    inputs: *mut InputBlock,
    pairs: *mut PairBlock,
    /// Input rows, each `blocks` input blocks.
    rows: usize,
    blocks: usize,
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
    fn new(inputs: &'a mut [InputBlock], pairs: &'a mut [PairBlock], blocks: usize) -> Self {
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
    fn jobs(&self) -> usize {
        self.rows.div_ceil(2)
    }

    /// Job `job`'s input blocks and pair blocks (none unless paired).
    ///
    /// # Safety
    /// `job` is below [`Prepared::jobs`], and no other reference to its
    /// rows lives while these do.
    unsafe fn job(&self, job: usize) -> TwoRows<'_> {
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
    unsafe fn all(&self) -> (&[InputBlock], &[PairBlock]) {
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

/// A matmul's output, parts of `(seq, width)` side by side by columns,
/// which the pool's workers fill at disjoint places: each writes the
/// columns of its own groups. The parts' buffers start uninitialized.
struct Output<'a> {
    /// Each part's buffer, its first group and its width.
    parts: Vec<(*mut f32, usize, usize)>,
    /// Values laid out as the one part, each added to the sum at its place.
    added: Option<&'a [f32]>,
}

// SAFETY: workers write through the pointers only at places no other worker
// writes, and the buffers outlive the pool's work.
unsafe impl Sync for Output<'_> {}

impl<'a> Output<'a> {
    /// Points at the buffers of `parts`, each with room for `widths[i]`
    /// columns of every row; `added`, where there is one, is as long as the
    /// only part.
    fn new(parts: &mut [Vec<f32>], widths: &[usize], added: Option<&'a [f32]>) -> Self {
        let firsts = widths.iter().scan(0, |first, width| {
            *first += width / GROUP;
            Some(*first - width / GROUP)
        });
        debug_assert!(added.is_none() || parts.len() == 1);
        Output {
            parts: parts
                .iter_mut()
                .zip(firsts.zip(widths))
                .map(|(part, (first, &width))| (part.as_mut_ptr(), first, width))
                .collect(),
            added,
        }
    }

    /// Where group `group`'s columns are.
    fn columns(&self, group: usize) -> Columns<'a> {
        // The first part starts at group 0, so some part holds `group`.
        let part = self.parts.partition_point(|&(_, first, _)| first <= group) - 1;
        let (buffer, first, width) = self.parts[part];
        let column = (group - first) * GROUP;
        Columns {
            // Only an address: `wrapping_add` keeps it defined even before
            // anything is written there.
            first: buffer.wrapping_add(column),
            width,
            added: self.added.map(|added| &added[column..]),
        }
    }
}

/// One group's [`GROUP`] columns of an [`Output`] part `width` columns wide.
struct Columns<'a> {
    first: *mut f32,
    width: usize,
    /// The values added to the group's columns, from row 0.
    added: Option<&'a [f32]>,
}

impl Columns<'_> {
    /// Write the group's sums for input row `row` to their columns.
    ///
    /// # Safety
    /// `row` is an input row of the matmul, and no other thread writes
    /// that row of this group meanwhile.
    unsafe fn write(&self, row: usize, sums: &[f32]) {
        let at = row * self.width;
        // SAFETY: as the caller promises, inside the part's buffer.
        let columns = unsafe { self.first.add(at) };
        match self.added {
            // SAFETY: as above, for each of the group's columns.
            None => unsafe { std::ptr::copy_nonoverlapping(sums.as_ptr(), columns, GROUP) },
            Some(added) => {
                for (c, (&sum, &added)) in sums.iter().zip(&added[at..at + GROUP]).enumerate() {
                    // SAFETY: as above, for each of the group's columns.
                    unsafe { columns.add(c).write(sum + added) };
                }
            }
        }
    }
}

/// Builds an [`InterleavedMatmul`] from a weight's stored rows handed over
/// a few groups at a time, as they are read from a file: loading then never
/// holds a whole weight's stored bytes beside its reordered copy.
pub(crate) struct Interleaver {
    format: Format,
    rows: usize,
    width: usize,
    instructions: Instructions,
    interleaved: Vec<u8>,
    /// Bytes of `interleaved` written so far.
    filled: usize,
}

impl Interleaver {
    /// `None` unless `dtype` is one of the [`Format`]s, the `(rows, width)`
    /// weight's rows come in whole groups of whole blocks, and this CPU has
    /// the AVX2, FMA and F16C the kernel needs.
    pub(crate) fn new(dtype: GgmlDType, (rows, width): (usize, usize)) -> Option<Self> {
        let format = Format::of(dtype)?;
        let fits = width > 0 && width.is_multiple_of(format.values()) && rows.is_multiple_of(GROUP);
        let instructions = Instructions::of_this_cpu().filter(|_| fits)?;
        let bytes = rows / GROUP * (width / format.values()) * format.group_block_bytes();
        Some(Interleaver {
            format,
            rows,
            width,
            instructions,
            interleaved: vec![0; bytes],
            filled: 0,
        })
    }

    /// Reorder `stored`, the weight's next rows as the file stores them:
    /// whole groups, no more than are left.
    pub(crate) fn push(&mut self, stored: &[u8]) -> Result<()> {
        let blocks = self.width / self.format.values();
        let group_bytes = GROUP * blocks * self.format.block_bytes();
        let interleaved_bytes =
            stored.len() / group_bytes * blocks * self.format.group_block_bytes();
        let left = self.interleaved.len() - self.filled;
        if !stored.len().is_multiple_of(group_bytes) || interleaved_bytes > left {
            candle_core::bail!(
                "{} bytes of {:?} rows are not whole groups of the {} rows left",
                stored.len(),
                self.format,
                left / (blocks * self.format.group_block_bytes()) * GROUP
            );
        }
        let out = &mut self.interleaved[self.filled..][..interleaved_bytes];
        interleave(stored, blocks, self.format, out);
        self.filled += interleaved_bytes;
        Ok(())
    }

    /// The matmul, once every row has been pushed.
    pub(crate) fn finish(self) -> Result<InterleavedMatmul> {
        if self.filled != self.interleaved.len() {
            candle_core::bail!(
                "a {:?} weight of {} rows was handed over partly",
                self.format,
                self.rows
            );
        }
        Ok(InterleavedMatmul {
            interleaved: Arc::new(self.interleaved),
            format: self.format,
            rows: self.rows,
            width: self.width,
            instructions: self.instructions,
        })
    }
}

/// The stored rows of a matrix in `format`, `blocks` blocks each, with every
/// [`GROUP`] rows interleaved block by block as [`Format`] describes, into
/// `interleaved`.
fn interleave(stored: &[u8], blocks: usize, format: Format, interleaved: &mut [u8]) {
    let block_bytes = format.block_bytes();
    let row_bytes = blocks * block_bytes;
    let groups = stored.len() / row_bytes / GROUP;
    let group_block_bytes = format.group_block_bytes();
    debug_assert_eq!(interleaved.len(), groups * blocks * group_block_bytes);
    // A model's weights are reordered at every load; the cores share it.
    let per_thread = (groups * blocks).div_ceil(candle_core::utils::get_num_threads().max(1));
    std::thread::scope(|scope| {
        for (part, chunk) in interleaved
            .chunks_mut(per_thread.max(1) * group_block_bytes)
            .enumerate()
        {
            scope.spawn(move || {
                for (i, out) in chunk.chunks_exact_mut(group_block_bytes).enumerate() {
                    let index = part * per_thread + i;
                    let (group, block) = (index / blocks, index % blocks);
                    let rows = std::array::from_fn(|r| {
                        let at = (group * GROUP + r) * row_bytes + block * block_bytes;
                        &stored[at..at + block_bytes]
                    });
                    format.interleave_block(rows, out);
                }
            });
        }
    });
}

/// One block of an input row in 8 bits: value `i` is about
/// `scale * quants[i]`, and `halves` are the sums of quants 0-15 and 16-31.
#[derive(Debug, Clone, Copy, Default)]
struct InputBlock {
    scale: f32,
    halves: [i16; 2],
    /// `scale · Σ q`, what a Q4_1 block's minimum is multiplied by. Read
    /// where [`kernel::wide`] computed it for each row of each block, whose
    /// scalar arithmetic and broadcast take the vector ports' turns, a
    /// SmolLM2 decode pass took 1-3% less time at one and four rows.
    minimum_weight: f32,
    quants: [i8; BLOCK],
}

impl InputBlock {
    /// The sum of the quants.
    fn total(&self) -> i32 {
        i32::from(self.halves[0]) + i32::from(self.halves[1])
    }
}

/// Runs of groups a matmul's columns are split into for the pool's threads
/// to claim.
const RUNS: usize = 64;

/// Two rows' input blocks and their pair blocks (none when the kernel
/// takes rows one at a time), prepared by one thread.
type TwoRows<'a> = (&'a mut [InputBlock], &'a mut [PairBlock]);

/// The rows a matmul multiplies, `width` values each.
#[derive(Clone, Copy)]
enum Input<'a> {
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
    fn rows<'s>(self, rows: Range<usize>, width: usize, scratch: &'s mut Vec<f32>) -> &'s [f32]
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

/// Input rows up to which Q4_1 and Q8_0 matmuls take two groups at once
/// ([`kernel::wide`]) rather than two rows a register ([`kernel::pairs`]):
/// one tile. Timed pass by pass in one SmolLM2 decode (8-bit cache, two
/// threads, the kinds of pass alternated), a pass took 6-11% less time for
/// one to five rows and 3.5-6% less for eight; sixteen rows, as two tiles
/// of eight, took 3-6% more.
const TWO_GROUP_ROWS: usize = TILE;

/// Input pairs multiplied with one unpacked group block by the
/// [`kernel::pairs`] kernels.
const PAIR_TILE: usize = 8;

/// The same block of two input rows, laid out so that each field the
/// [`kernel::pairs`] kernels read is one 8-byte load, broadcast to a register's
/// eight 64-bit lanes: the first row's value in each lane's low half, the
/// second's in the high half.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(8))]
struct PairBlock {
    /// Quants `4k..4k+4` of the first row, then of the second.
    quants: [[[i8; 4]; 2]; 8],
    scales: [f32; 2],
    /// Each row's `scale · Σ q`, what a Q4_1 block's minimum is multiplied by.
    minimum_weights: [f32; 2],
    /// Each row's `-128 · Σ q`, which takes the 128 off Q8_0's stored weights.
    offsets: [i32; 2],
    /// Each row's `Σ q`, what a Q4_K sub-block's minimum is multiplied by.
    totals: [i32; 2],
    /// Each row's [`InputBlock::halves`], which Q6_K's sub-block scales multiply.
    halves: [[i16; 2]; 2],
}

impl PairBlock {
    fn new(first: &InputBlock, second: &InputBlock) -> Self {
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
fn quantize(row: &[f32], span: usize, blocks: &mut [InputBlock]) {
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

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::{Format, InputBlock, GROUP, Q6K_VALUES, TILE};
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

    /// [`super::quantize`] with AVX2, to the same bits.
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
                let halves =
                    half_totals(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
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
                                second =
                                    $dot_bytes(second, values[4 + k], four(&input.quants, 4 + k));
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
                                second =
                                    $dot_bytes(second, values[4 + k], four(&input.quants, 4 + k));
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

    pub(super) mod avx2 {
        kernels!(
            "avx2,fma,f16c",
            dot_bytes_avx2,
            dot_pairs_avx2,
            q8_0_weights_avx2,
            q8_0_dot_avx2
        );
    }

    /// Kernels that multiply a group block with two input rows in one
    /// 512-bit register.
    ///
    /// Each 32-bit lane pair holds one weight row's four values, once for
    /// each input row, and the inputs' [`PairBlock`] fields are 8-byte
    /// broadcasts. One byte multiply-add then does the work of two 256-bit
    /// ones, and the float work after each block is shared by two rows:
    /// with sixteen rows the 256-bit kernel reached 57 GMAC/s on one core
    /// of this machine's Xeon, a third of what its byte multiply-adds
    /// allow, and this one 131 (weights in cache). Every lane does
    /// the 256-bit kernel's float operations in the same order on the same
    /// exact integer sums, so a row's results are the same bits.
    ///
    /// [`PairBlock`]: super::PairBlock
    pub(super) mod pairs {
        use super::super::{Format, PairBlock, GROUP, PAIR_TILE};
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
            let rows_apart =
                _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
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
                        let halves = _mm512_mask_blend_epi16(
                            0xAAAA_AAAA,
                            first,
                            _mm512_slli_epi32::<16>(second),
                        );
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
                        let (first, second) =
                            (&pairs[p][8 * b + 2 * k], &pairs[p][8 * b + 2 * k + 1]);
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
                        offsets[p] =
                            _mm512_dpwssd_epi32(offsets[p], paired_scales, both(&input.halves));
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
                        second =
                            _mm512_dpbusd_epi32(second, stored[4 + k], both(&input.quants[4 + k]));
                    }
                    let dots = _mm512_cvtepi32_ps(_mm512_add_epi32(first, second));
                    let scale = _mm512_mul_ps(scales, both_f32(&input.scales));
                    sums[p] = _mm512_fmadd_ps(dots, scale, sums[p]);
                });
            }
            store(sums, out);
        }
    }

    /// Kernels that multiply two neighbouring groups at once, sixteen
    /// weight rows a 512-bit register: the first group's eight in the low
    /// half, the second's in the high half, put together as they are
    /// loaded. Each input row's four quants then reach the multiply-add as
    /// one broadcast, and no weight is unpacked twice for two rows as in
    /// [`pairs`]: a Q4_1 group block took 8.1 ns for one row where
    /// the 256-bit kernel took 10.0, 9.1 for two rows and 12.3 for four
    /// where [`pairs`] took 11.6 and 15.5 (one thread, weights
    /// streamed from 75 MB, medians of six alternated passes). The integer
    /// sums are exact and each lane's floats add in the same order, so the
    /// bits are the other kernels'.
    pub(super) mod wide {
        use super::super::{Format, InputBlock, TILE};
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
                    let values: [__m512i; 4] = std::array::from_fn(|k| {
                        sixty_four(one.add(32 + 32 * k), other.add(32 + 32 * k))
                    });
                    (
                        sixteen_f16(one, other),
                        sixteen_f16(one.add(16), other.add(16)),
                        values,
                    )
                };
                let low = values.map(|packed| _mm512_and_si512(packed, nibbles));
                let high =
                    values.map(|packed| _mm512_and_si512(_mm512_srli_epi16::<4>(packed), nibbles));
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
                    let stored: [__m512i; 8] = std::array::from_fn(|k| {
                        sixty_four(one.add(16 + 32 * k), other.add(16 + 32 * k))
                    });
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
    }

    pub(super) mod vnni {
        kernels!(
            "avx2,fma,f16c,avx512vnni,avx512vl",
            dot_bytes_vnni,
            dot_pairs_vnni,
            q8_0_weights_vnni,
            q8_0_dot_vnni
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `(rows, width)` weight quantized to `dtype` from smooth values.
    fn weight(rows: usize, width: usize, dtype: GgmlDType) -> QTensor {
        let values: Vec<f32> = (0..rows * width)
            .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * (1.0 + (i % 7) as f32))
            .collect();
        let dense = Tensor::from_vec(values, (rows, width), &Device::Cpu).unwrap();
        QTensor::quantize(&dense, dtype).unwrap()
    }

    fn inputs(seq: usize, width: usize) -> Tensor {
        let values: Vec<f32> = (0..seq * width)
            .map(|i| (i as f32 * 0.61).sin() * 3.0)
            .collect();
        Tensor::from_vec(values, (1, seq, width), &Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    fn f16_at(bytes: &[u8], at: usize) -> f64 {
        half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f64()
    }

    /// What the kernel computes, in plain integer and float arithmetic on
    /// the stored (not interleaved) blocks.
    fn reference(weight: &QTensor, x: &Tensor) -> Vec<f32> {
        let (rows, width) = weight.shape().dims2().unwrap();
        let format = Format::of(weight.dtype()).unwrap();
        let data = weight.data().unwrap();
        let mut out = Vec::new();
        for row in values(x).chunks_exact(width) {
            let mut quantized = vec![InputBlock::default(); width / BLOCK];
            quantize(row, format.values(), &mut quantized);
            let row_bytes = width / format.values() * format.block_bytes();
            for w in data.chunks_exact(row_bytes).take(rows) {
                let mut sum = 0f64;
                let blocks = w.chunks_exact(format.block_bytes());
                for (block, inputs) in blocks.zip(quantized.chunks_exact(format.values() / BLOCK)) {
                    sum += reference_block(format, block, inputs);
                }
                out.push(sum as f32);
            }
        }
        out
    }

    /// One stored block times its input blocks, as plain integers and floats.
    fn reference_block(format: Format, block: &[u8], inputs: &[InputBlock]) -> f64 {
        let input = inputs[0];
        let q = |j: usize| i32::from(input.quants[j]);
        let scale = f64::from(input.scale);
        match format {
            Format::Q4_1 => {
                let dot: i32 = (0..16)
                    .map(|j| {
                        let byte = block[4 + j];
                        i32::from(byte & 0x0F) * q(j) + i32::from(byte >> 4) * q(j + 16)
                    })
                    .sum();
                f16_at(block, 0) * scale * f64::from(dot)
                    + f16_at(block, 2) * scale * f64::from(input.total())
            }
            Format::Q8_0 => {
                let dot: i32 = (0..32).map(|j| i32::from(block[2 + j] as i8) * q(j)).sum();
                f16_at(block, 0) * scale * f64::from(dot)
            }
            Format::Q6K => {
                let values = q6k_values(block);
                (0..8)
                    .map(|j| {
                        let input = inputs[j];
                        let half = |h: usize| -> f64 {
                            let dot: i32 = (16 * h..16 * h + 16)
                                .map(|i| i32::from(values[32 * j + i]) * i32::from(input.quants[i]))
                                .sum();
                            f64::from(block[192 + 2 * j + h] as i8) * f64::from(dot)
                        };
                        f16_at(block, 208) * f64::from(input.scale) * (half(0) + half(1))
                    })
                    .sum()
            }
            Format::Q4K => (0..8)
                .map(|j| {
                    let input = inputs[j];
                    let (sc, m) = q4k_scale_and_minimum(&block[4..16], j);
                    let dot: i32 = (0..32)
                        .map(|i| {
                            let byte = block[16 + 32 * (j / 2) + i];
                            i32::from((byte >> (4 * (j % 2))) & 0x0F) * i32::from(input.quants[i])
                        })
                        .sum();
                    f16_at(block, 0) * f64::from(sc) * f64::from(input.scale) * f64::from(dot)
                        - f16_at(block, 2)
                            * f64::from(m)
                            * f64::from(input.scale)
                            * f64::from(input.total())
                })
                .sum(),
        }
    }

    #[test]
    fn the_kernels_compute_the_integer_dot_products_of_the_stored_blocks() {
        for (dtype, width) in [
            (GgmlDType::Q4_1, 96),
            (GgmlDType::Q8_0, 96),
            (GgmlDType::Q4K, 512),
            (GgmlDType::Q6K, 512),
        ] {
            let stored = weight(24, width, dtype);
            let Some(matmul) = InterleavedMatmul::new(&stored) else {
                return; // a CPU without AVX2 never builds this matmul
            };
            // 1, a whole tile, and a tile and a part.
            for seq in [1, 8, 11] {
                let x = inputs(seq, width);
                let expected = reference(&stored, &x);
                for matmul in [matmul.clone(), matmul.with(Instructions::Avx2)] {
                    let out = matmul.forward(&x).unwrap();
                    assert_eq!(out.dims(), &[1, seq, 24]);
                    for (i, (got, want)) in values(&out).iter().zip(&expected).enumerate() {
                        assert!(
                            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{dtype:?} {:?}, {i}: {got} against {want}",
                            matmul.instructions
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn vector_quantization_gives_the_bits_of_the_portable_one() {
        let mut row = values(&inputs(1, 512));
        row[40] = 0.0;
        row[64..96].fill(0.0); // a block of zeros
                               // A block whose scale is 1, with values halfway between two quants.
        row[96..99].copy_from_slice(&[127.0, 2.5, -3.5]);
        row[99..128].fill(0.25);
        row[256..].fill(0.0); // a span of zeros has no scale
                              // Q4_1 inputs have a scale per block, Q4_K ones per eight blocks.
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q4K] {
            let Some(matmul) = InterleavedMatmul::new(&weight(8, 512, dtype)) else {
                return;
            };
            let (mut portable, mut vector) = (
                vec![InputBlock::default(); 16],
                vec![InputBlock::default(); 16],
            );
            quantize(&row, matmul.format.values(), &mut portable);
            matmul.quantize(&row, &mut vector);
            assert_eq!(portable[3].quants[..3], [127, 2, -4]);
            assert_eq!(portable[15].scale, 0.0);
            for (p, v) in portable.iter().zip(&vector) {
                assert_eq!(p.quants, v.quants);
                assert_eq!(p.scale.to_bits(), v.scale.to_bits());
                assert_eq!(p.halves, v.halves);
            }
            let shared = portable[..8].iter().all(|b| b.scale == portable[0].scale);
            assert_eq!(shared, dtype == GgmlDType::Q4K, "{dtype:?}");
        }
    }

    #[test]
    fn parts_are_the_columns_of_the_whole_product() {
        let stored = weight(40, 64, GgmlDType::Q4_1);
        let Some(matmul) = InterleavedMatmul::new(&stored) else {
            return;
        };
        for rows in [1, 5, 19] {
            let x = inputs(rows, 64);
            let whole = matmul.forward(&x).unwrap().squeeze(0).unwrap();
            let parts = matmul.forward_parts(&x, &[8, 24, 8]).unwrap();
            let mut start = 0;
            for part in &parts {
                let width = part.dim(2).unwrap();
                let expected = whole.narrow(1, start, width).unwrap();
                assert_eq!(
                    values(part),
                    values(&expected),
                    "{rows} rows, from column {start}"
                );
                start += width;
            }
        }
        // Parts must be whole groups that add up to the weight's rows.
        let x = inputs(2, 64);
        assert!(matmul.forward_parts(&x, &[4, 36]).is_err());
        assert!(matmul.forward_parts(&x, &[8, 24]).is_err());
    }

    #[test]
    fn a_product_written_onto_a_residual_is_candles_add() {
        let stored = weight(40, 64, GgmlDType::Q4_1);
        let Some(matmul) = InterleavedMatmul::new(&stored) else {
            return;
        };
        for rows in [1, 5, 19] {
            let x = inputs(rows, 64);
            let residual = inputs(rows, 40);
            let expected = (&residual + matmul.forward(&x).unwrap()).unwrap();
            let got = matmul.forward_onto(&x, &residual).unwrap();
            assert_eq!(got.dims(), expected.dims());
            assert_eq!(values(&got), values(&expected), "{rows} rows");
        }
        let x = inputs(2, 64);
        assert!(matmul.forward_onto(&x, &inputs(3, 40)).is_err());
        assert!(matmul.forward_onto(&x, &inputs(2, 32)).is_err());
    }

    #[test]
    fn a_swiglu_quantized_as_it_is_computed_gives_the_bits_of_one_computed_first() {
        for (dtype, width) in [(GgmlDType::Q4_1, 64), (GgmlDType::Q4K, 256)] {
            let Some(matmul) = InterleavedMatmul::new(&weight(40, width, dtype)) else {
                return;
            };
            // One row, one job of two in place, and jobs on the pool.
            for rows in [1, 2, 5, 19] {
                let gate = inputs(rows, width);
                let up = (inputs(rows, width).sin().unwrap() * 2.0).unwrap();
                let residual = inputs(rows, 40);
                let mut computed = Vec::with_capacity(rows * width);
                let (gates, ups) = (values(&gate), values(&up));
                super::swiglu_values(&gates, &ups, computed.spare_capacity_mut());
                // SAFETY: `swiglu_values` wrote every value: the gates and
                // ups are as many as the room.
                unsafe { computed.set_len(rows * width) };
                let computed = Tensor::from_vec(computed, (1, rows, width), &Device::Cpu).unwrap();
                let expected = matmul.forward_onto(&computed, &residual).unwrap();
                let got = matmul.swiglu_onto(&gate, &up, &residual).unwrap().unwrap();
                assert_eq!(values(&got), values(&expected), "{dtype:?}, {rows} rows");
            }
        }
        let Some(matmul) = InterleavedMatmul::new(&weight(40, 64, GgmlDType::Q4_1)) else {
            return;
        };
        let (gate, residual) = (inputs(2, 64), inputs(2, 40));
        let half = gate.to_dtype(DType::F16).unwrap();
        assert!(matmul
            .swiglu_onto(&half, &half, &residual)
            .unwrap()
            .is_none());
        assert!(matmul
            .swiglu_onto(&gate, &inputs(3, 64), &residual)
            .unwrap()
            .is_none());
        assert!(matmul.swiglu_onto(&gate, &gate, &inputs(3, 40)).is_err());
    }

    #[test]
    fn a_norm_quantized_as_it_is_computed_gives_the_bits_of_one_computed_first() {
        for (dtype, width) in [(GgmlDType::Q4_1, 64), (GgmlDType::Q4K, 256)] {
            let Some(matmul) = InterleavedMatmul::new(&weight(40, width, dtype)) else {
                return;
            };
            let alpha = (inputs(1, width).cos().unwrap() + 1.5)
                .unwrap()
                .flatten_all()
                .unwrap();
            // One row, one job of two in place, and jobs on the pool.
            for rows in [1, 2, 5, 19] {
                let x = inputs(rows, width);
                let normed = super::super::rowwise::rms_norm(&x, &alpha, 1e-5).unwrap();
                let expected = matmul.forward_parts(&normed, &[16, 24]).unwrap();
                let got = matmul
                    .forward_parts_normed(&x, &alpha, 1e-5, &[16, 24])
                    .unwrap()
                    .unwrap();
                for (got, expected) in got.iter().zip(&expected) {
                    assert_eq!(values(got), values(expected), "{dtype:?}, {rows} rows");
                }
            }
        }
        let Some(matmul) = InterleavedMatmul::new(&weight(40, 64, GgmlDType::Q4_1)) else {
            return;
        };
        let x = inputs(2, 64);
        let alpha = inputs(1, 64).flatten_all().unwrap();
        let half = alpha.to_dtype(DType::F16).unwrap();
        let normed = |alpha: &Tensor| matmul.forward_parts_normed(&x, alpha, 1e-5, &[40]);
        assert!(normed(&half).unwrap().is_none());
        assert!(normed(&inputs(1, 32).flatten_all().unwrap())
            .unwrap()
            .is_none());
        // A row narrower than the weight is an error, not a fall back.
        assert!(matmul
            .forward_parts_normed(&inputs(2, 32), &alpha, 1e-5, &[40])
            .is_err());
    }

    #[test]
    fn a_row_comes_out_the_same_alone_and_among_others() {
        for (dtype, width) in [
            (GgmlDType::Q4_1, 64),
            (GgmlDType::Q8_0, 64),
            (GgmlDType::Q4K, 256),
            (GgmlDType::Q6K, 256),
        ] {
            let stored = weight(16, width, dtype);
            let Some(matmul) = InterleavedMatmul::new(&stored) else {
                return;
            };
            // Past a tile of pairs, and an odd row left over.
            let x = inputs(19, width);
            let together = values(&matmul.forward(&x).unwrap());
            for n in 0..19 {
                let alone = values(&matmul.forward(&x.narrow(1, n, 1).unwrap()).unwrap());
                assert_eq!(alone, together[n * 16..(n + 1) * 16], "{dtype:?} row {n}");
            }
        }
    }

    #[test]
    fn the_512_bit_kernels_give_the_bits_of_one_row_a_register() {
        let Some(Instructions::Avx512Pairs) = Instructions::of_this_cpu() else {
            return; // this CPU has no 512-bit kernels to compare
        };
        for (dtype, width) in [
            (GgmlDType::Q4_1, 96),
            (GgmlDType::Q8_0, 96),
            (GgmlDType::Q4K, 512),
            (GgmlDType::Q6K, 512),
        ] {
            // Three groups: two taken together and one left over alone.
            let stored = weight(24, width, dtype);
            let matmul = InterleavedMatmul::new(&stored).unwrap();
            // Two groups at once up to `TWO_GROUP_ROWS`, two rows a
            // register past it, over a tile of pairs, and odd rows.
            for seq in [1, 2, 3, TWO_GROUP_ROWS, TWO_GROUP_ROWS + 1, 16, 17, 33] {
                let x = inputs(seq, width);
                let pairs = values(&matmul.forward(&x).unwrap());
                let one_row = matmul.with(Instructions::Avx512Vnni);
                assert_eq!(
                    pairs,
                    values(&one_row.forward(&x).unwrap()),
                    "{dtype:?}, {seq} rows"
                );
            }
        }
    }

    #[test]
    fn it_multiplies_by_the_dequantized_weight_up_to_the_inputs_rounding() {
        for (dtype, width) in [
            (GgmlDType::Q4_1, 128),
            (GgmlDType::Q8_0, 128),
            (GgmlDType::Q4K, 256),
            (GgmlDType::Q6K, 256),
        ] {
            let stored = weight(40, width, dtype);
            let Some(matmul) = InterleavedMatmul::new(&stored) else {
                return;
            };
            let x = inputs(3, width);
            let out = matmul.forward(&x).unwrap().flatten_all().unwrap();
            let dense = stored.dequantize(&Device::Cpu).unwrap();
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
                "{dtype:?}: max difference {diff} at scale {scale}"
            );
        }
    }

    #[test]
    fn a_row_reads_back_as_candle_dequantizes_it() {
        for (dtype, width) in [
            (GgmlDType::Q4_1, 64),
            (GgmlDType::Q8_0, 64),
            (GgmlDType::Q4K, 512),
            (GgmlDType::Q6K, 512),
        ] {
            let stored = weight(16, width, dtype);
            let Some(matmul) = InterleavedMatmul::new(&stored) else {
                return;
            };
            let dense = stored.dequantize(&Device::Cpu).unwrap();
            for row in [0, 5, 15] {
                let expected = values(&dense.get(row).unwrap());
                assert_eq!(matmul.row(row).unwrap(), expected, "{dtype:?} row {row}");
            }
            assert!(matmul.row(16).is_none());
        }
    }

    #[test]
    fn other_types_and_partial_groups_are_left_to_candle() {
        assert!(InterleavedMatmul::new(&weight(8, 256, GgmlDType::Q5K)).is_none());
        assert!(InterleavedMatmul::new(&weight(12, 64, GgmlDType::Q4_1)).is_none());
    }
}
