//! The weight formats the integer matmul reads, and their rows reordered at
//! load into interleaved group blocks.

use super::matmul::{Instructions, InterleavedMatmul};
use candle_core::quantized::GgmlDType;
use candle_core::Result;
use std::sync::Arc;

/// Values per block, in weights and inputs alike.
pub(super) const BLOCK: usize = 32;
/// Weight rows whose blocks are interleaved.
pub(crate) const GROUP: usize = 8;

/// A block format the kernel reads.
///
/// In a group block, each f16 field of a stored block comes first for the
/// eight rows in turn (16 bytes), then the values in runs of 32 bytes, the
/// `k`-th holding bytes `4k..4k+4` of every row's values (for Q4_K, of every
/// row's 32 bytes of each pair of sub-blocks in turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
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
    pub(super) fn of(dtype: GgmlDType) -> Option<Format> {
        match dtype {
            GgmlDType::Q4_1 => Some(Format::Q4_1),
            GgmlDType::Q8_0 => Some(Format::Q8_0),
            GgmlDType::Q4K => Some(Format::Q4K),
            GgmlDType::Q6K => Some(Format::Q6K),
            _ => None,
        }
    }

    /// Values in one stored block.
    pub(super) const fn values(self) -> usize {
        match self {
            Format::Q4_1 | Format::Q8_0 => BLOCK,
            Format::Q4K | Format::Q6K => 8 * BLOCK,
        }
    }

    pub(super) const fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
            Format::Q4K => 144,
            Format::Q6K => 210,
        }
    }

    /// Bytes of the block of a group.
    pub(super) const fn group_block_bytes(self) -> usize {
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
    pub(super) fn dequantize_row(self, block: &[u8], r: usize, out: &mut Vec<f32>) {
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
pub(super) const Q6K_VALUES: usize = 16 + 128;

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
pub(super) fn q6k_values(block: &[u8]) -> [i8; 256] {
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
pub(super) fn q4k_scale_and_minimum(packed: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
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
