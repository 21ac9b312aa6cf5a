//! The CPU attention kernel: each query row's one pass over the cache rows it
//! sees, portable or in AVX2 and AVX-512 registers.

use crate::engine::kv_cache::{KvDtype, Q8_SCALE_BYTES};
use candle_core::{CpuStorage, Layout, Result, Storage, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Consecutive query rows of one cache that read each widened chunk of its
/// rows together. A prompt's rows share their cache, so a chunk is read
/// and widened once per tile instead of once per row. A tile's scores (its
/// query heads × the positions they see) grow with it: 1.5 MB for eight
/// rows of Qwen2.5-1.5B at 8,192 positions. Four to sixteen rows measured
/// alike on one thread, a quarter faster than one row at 8,192 positions.
pub(crate) const TILE_ROWS: usize = 8;

/// The query rows of `views` (each row's cache and visible positions) in
/// tiles of at most [`TILE_ROWS`] consecutive rows that read the same cache
/// and each see more positions than the one before, as a prompt's rows do.
fn tiles(views: &[(usize, usize)]) -> Vec<Range<usize>> {
    let mut tiles: Vec<Range<usize>> = Vec::with_capacity(views.len());
    for (row, &(cache, visible)) in views.iter().enumerate() {
        match tiles.last_mut() {
            Some(tile)
                if tile.len() < TILE_ROWS
                    && views[tile.end - 1].0 == cache
                    && views[tile.end - 1].1 < visible =>
            {
                tile.end = row + 1
            }
            _ => tiles.push(row..row + 1),
        }
    }
    tiles
}

/// The loops that attend on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Plain Rust, for any CPU and head width.
    Portable,
    /// AVX2 registers of eight floats.
    Avx2,
    /// AVX2's softmax and widening, with the scores and weighted sums in
    /// AVX-512 registers of sixteen.
    Avx512,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub(crate) fn best() -> Kernel {
        if !super::has_avx2_fma_f16c() {
            return Kernel::Portable;
        }
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") {
            return Kernel::Avx512;
        }
        Kernel::Avx2
    }

    /// This kernel, or a narrower one where heads `d` wide are not a whole
    /// number of its registers.
    fn for_width(self, d: usize) -> Kernel {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if d.is_multiple_of(avx512::LANES) => Kernel::Avx512,
            Kernel::Avx512 | Kernel::Avx2 if d.is_multiple_of(avx2::LANES) => Kernel::Avx2,
            _ => Kernel::Portable,
        }
    }
}

/// Attention of CPU query rows `queries` `(rows, heads, 1, d)` in f32, each
/// over a cache of `caches` (f32, f16 or bf16): row `r` attends to the first
/// `visible` positions of `caches[cache]`, where `(cache, visible) =
/// view(r)`, with `kernel` (one that [`Kernel::best`] allows) or a narrower
/// one where `d` asks for it. Returns `(1, rows, heads * d)`.
///
/// One kernel serves prompts and decode steps alike: the query heads that
/// share a key/value head read each cache row together, straight from an
/// f32, f16, bf16 or 8-bit cache. A prompt's rows go a few at a time, so
/// that each chunk of cache rows is read and widened once for all of them.
/// A prompt's masked scores are never computed and no score matrix is kept.
pub(crate) fn attention_on_cpu(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    view: impl Fn(usize) -> (usize, usize) + Sync,
    scale: f64,
    kernel: Kernel,
) -> Result<Tensor> {
    // One function on purpose: the storage guards, the slices borrowed from
    // them and the per-run locks must all outlive the one pass of the pool
    // below, and the checks before it guard the unsafe reads inside it.
    let (count, heads, _, d) = queries.dims4()?;
    let queries = queries.contiguous()?;
    let query_guard = queries.storage_and_layout();
    let guards: Vec<_> = caches
        .iter()
        .map(|(keys, values)| (keys.storage_and_layout(), values.storage_and_layout()))
        .collect();
    let q = match &*query_guard.0 {
        Storage::Cpu(cpu) => &cpu.as_slice::<f32>()?[query_guard.1.start_offset()..],
        _ => candle_core::bail!("attention on the CPU reads CPU storage only"),
    };
    let mut sequences = Vec::with_capacity(caches.len());
    for (keys, values) in &guards {
        sequences.push((
            Rows::new(&keys.0, keys.1, d)?,
            Rows::new(&values.0, values.1, d)?,
        ));
    }
    let views: Vec<(usize, usize)> = (0..count).map(&view).collect();
    for &(cache, visible) in &views {
        match sequences.get(cache) {
            Some((keys, _)) if (1..=keys.positions).contains(&visible) => {}
            _ => candle_core::bail!("a query row sees {visible} positions of cache {cache}"),
        }
    }
    let kv_heads = sequences[0].0.heads;
    let groups = heads / kv_heads.max(1);
    let scale = scale as f32;
    // The vector kernels read whole registers; a head width they cannot
    // split so (none of the supported models has one) takes a narrower one.
    let kernel = kernel.for_width(d);
    let mut out = vec![0f32; count * heads * d];
    let tiles = tiles(&views);
    // Work item `tile * kv_heads + kv_head` is one tile's query heads that
    // share a key/value head. Within a row those are consecutive heads, so
    // their queries and outputs are one run of `groups * d` floats: run
    // `row * kv_heads + kv_head`.
    let attend = |scratch: &mut Scratch, item: usize, outs: &mut [&mut [f32]]| {
        let (rows, kv_head) = (tiles[item / kv_heads].clone(), item % kv_heads);
        let (cache, _) = views[rows.start];
        let (keys, values) = &sequences[cache];
        let seen = views[rows.end - 1].1;
        let tile = Tile {
            rows: rows
                .map(|row| {
                    let run = (row * kv_heads + kv_head) * groups * d;
                    (&q[run..run + groups * d], views[row].1)
                })
                .collect(),
            keys: keys.head(kv_head, seen),
            values: values.head(kv_head, seen),
            scale,
        };
        match kernel {
            // SAFETY: `Kernel::best` found AVX2, FMA and F16C, and AVX-512F
            // for `Avx512`; `for_width` found `d` a whole number of registers.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::attend(&tile, scratch, outs, false) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx2::attend(&tile, scratch, outs, true) },
            _ => tile.attend(scratch, outs),
        }
    };
    // Each run has one writer, so its lock is never contended and can
    // only be poisoned by a panic, which the pool re-raises.
    let runs: Vec<Mutex<&mut [f32]>> = out.chunks_mut(groups * d).map(Mutex::new).collect();
    let run = |indices: Range<usize>| {
        SCRATCH.with_borrow_mut(|scratch| {
            for item in indices {
                let rows = tiles[item / kv_heads].clone();
                let kv_head = item % kv_heads;
                let mut guards: Vec<_> = rows
                    .map(|row| {
                        runs[row * kv_heads + kv_head]
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                    })
                    .collect();
                let mut outs: Vec<&mut [f32]> = guards.iter_mut().map(|run| &mut ***run).collect();
                attend(scratch, item, &mut outs);
            }
        })
    };
    // Always on the pool the matmuls run on, so that no second set of
    // threads competes with its workers for the cores. Even a short
    // sequence's attention goes there: run on one thread, it let the other
    // park, and the projection after it paid to wake it, about 60 µs a
    // layer.
    crate::engine::pool::claimed_on_pool(tiles.len() * kv_heads, run);
    drop(runs);
    drop(guards);
    Tensor::from_vec(out, (1, count, heads * d), queries.device())
}

/// A cache tensor's storage, in the dtype it holds. An 8-bit cache's bytes
/// are the integers of each row followed by the row's scale.
#[derive(Clone, Copy)]
enum RowData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    Q8(&'a [i8]),
}

/// What a cache row's stored elements are multiplied by to give the values
/// they stand for: one for float rows, the scale stored after an 8-bit
/// row's integers. The vector kernels apply it once per score and per
/// weight, not per element, so that it costs a float row nothing and
/// changes none of its bits; the portable loop scales the row as it widens it.
trait RowScale: Copy {
    /// # Safety
    /// `row` starts a stored row of `d` values, its scale included.
    unsafe fn row_scale(_row: *const Self, _d: usize) -> f32 {
        1.0
    }
}

impl RowScale for f32 {}
impl RowScale for f16 {}
impl RowScale for bf16 {}

impl RowScale for i8 {
    unsafe fn row_scale(row: *const i8, d: usize) -> f32 {
        // SAFETY: as the caller promises; the scale's bytes follow the integers.
        let bytes = unsafe { row.add(d).cast::<[u8; Q8_SCALE_BYTES]>().read_unaligned() };
        f32::from_le_bytes(bytes)
    }
}

/// The rows of one cache tensor `(1, kv_heads, positions, width)` as a
/// slice of its storage, whatever its capacity beyond `positions`.
struct Rows<'a> {
    data: RowData<'a>,
    start: usize,
    head_stride: usize,
    row_stride: usize,
    heads: usize,
    positions: usize,
    d: usize,
    /// Stored elements per row: `d`, and an 8-bit row's scale.
    width: usize,
}

impl<'a> Rows<'a> {
    fn new(storage: &'a Storage, layout: &'a Layout, d: usize) -> Result<Self> {
        let (_, heads, positions, width) = layout.shape().dims4()?;
        let stride = layout.stride();
        let row_width = match storage {
            Storage::Cpu(CpuStorage::U8(_)) => KvDtype::Q8.row_width(d),
            _ => d,
        };
        if width != row_width || stride[3] != 1 {
            candle_core::bail!(
                "a cache of shape {:?} and strides {stride:?}",
                layout.dims()
            );
        }
        let Storage::Cpu(cpu) = storage else {
            candle_core::bail!("decode attention reads CPU storage only");
        };
        let data = match cpu {
            CpuStorage::F16(data) => RowData::F16(data),
            CpuStorage::BF16(data) => RowData::Bf16(data),
            // SAFETY: i8 and u8 have the same size and alignment, and every
            // byte is a valid i8.
            CpuStorage::U8(data) => RowData::Q8(unsafe {
                std::slice::from_raw_parts(data.as_ptr().cast::<i8>(), data.len())
            }),
            _ => RowData::F32(cpu.as_slice::<f32>()?),
        };
        Ok(Rows {
            data,
            start: layout.start_offset(),
            head_stride: stride[1],
            row_stride: stride[2],
            heads,
            positions,
            d,
            width,
        })
    }

    /// The first `positions` rows of one head.
    fn head(&self, head: usize, positions: usize) -> HeadRows<'a> {
        let first = self.start + head * self.head_stride;
        let end = match positions {
            0 => first,
            positions => first + (positions - 1) * self.row_stride + self.width,
        };
        let data = match self.data {
            RowData::F32(data) => RowData::F32(&data[first..end]),
            RowData::F16(data) => RowData::F16(&data[first..end]),
            RowData::Bf16(data) => RowData::Bf16(&data[first..end]),
            RowData::Q8(data) => RowData::Q8(&data[first..end]),
        };
        HeadRows {
            data,
            stride: self.row_stride,
            positions,
            d: self.d,
            width: self.width,
        }
    }
}

/// The `positions` rows of one key/value head: row `j` starts at `j * stride`.
struct HeadRows<'a> {
    data: RowData<'a>,
    stride: usize,
    positions: usize,
    d: usize,
    width: usize,
}

impl HeadRows<'_> {
    /// The stored bytes of rows `first..first + count`, scales included.
    #[cfg(target_arch = "x86_64")]
    fn bytes(&self, first: usize, count: usize) -> &[u8] {
        let span = first * self.stride..(first + count - 1) * self.stride + self.width;
        fn as_bytes<T>(values: &[T]) -> &[u8] {
            // SAFETY: the floats and integers a cache holds have no padding,
            // and every byte is a valid u8.
            unsafe {
                std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values))
            }
        }
        match self.data {
            RowData::F32(data) => as_bytes(&data[span]),
            RowData::F16(data) => as_bytes(&data[span]),
            RowData::Bf16(data) => as_bytes(&data[span]),
            RowData::Q8(data) => as_bytes(&data[span]),
        }
    }

    /// Row `j` as f32: in place when the cache is f32, else widened (or
    /// scaled) into `scratch`.
    fn row<'b>(&'b self, j: usize, scratch: &'b mut [f32]) -> &'b [f32] {
        let range = j * self.stride..j * self.stride + self.d;
        match self.data {
            RowData::F32(data) => &data[range],
            RowData::F16(data) => {
                data[range].convert_to_f32_slice(scratch);
                scratch
            }
            RowData::Bf16(data) => {
                data[range].convert_to_f32_slice(scratch);
                scratch
            }
            RowData::Q8(data) => {
                // SAFETY: the row's scale follows its `d` integers in `data`.
                let scale = unsafe { i8::row_scale(data.as_ptr().add(range.start), self.d) };
                for (out, &value) in scratch.iter_mut().zip(&data[range]) {
                    *out = f32::from(value) * scale;
                }
                scratch
            }
        }
    }
}

/// The query heads that share a key/value head, in consecutive query rows
/// of one sequence.
struct Tile<'a> {
    /// Per row, its query heads (`groups * d` floats, head after head) and
    /// how many positions it sees, fewer in an earlier row of a prompt.
    rows: Vec<(&'a [f32], usize)>,
    /// Key and value rows up to the last row's view, the most any row sees.
    keys: HeadRows<'a>,
    values: HeadRows<'a>,
    scale: f32,
}

impl Tile<'_> {
    /// Softmax-weighted sums of the value rows into `outs` (`groups * d`
    /// each, one per row): the portable loop.
    fn attend(&self, scratch: &mut Scratch, outs: &mut [&mut [f32]]) {
        let d = self.keys.d;
        let Scratch { scores, rows } = scratch;
        rows.resize(d, 0.0);
        for (&(queries, positions), out) in self.rows.iter().zip(outs.iter_mut()) {
            let groups = queries.len() / d;
            scores.clear();
            scores.resize(groups * positions, 0.0);
            for j in 0..positions {
                let key = self.keys.row(j, rows);
                for (g, query) in queries.chunks_exact(d).enumerate() {
                    scores[g * positions + j] = dot(query, key) * self.scale;
                }
            }
            softmax_each(scores, positions);
            out.fill(0.0);
            for j in 0..positions {
                let value = self.values.row(j, rows);
                for (g, out) in out.chunks_exact_mut(d).enumerate() {
                    let weight = scores[g * positions + j];
                    for (o, v) in out.iter_mut().zip(value) {
                        *o += weight * v;
                    }
                }
            }
        }
    }
}

/// Cache rows ahead of the one being read whose lines the vector kernels
/// ask memory for. A decode step reads every cache once, straight from
/// memory, and the loads stalled the kernels. With sixteen SmolLM2
/// sequences on two threads a step's attention took 10.9-13.2 ms; asking
/// for each next chunk of 32 rows at once, 10.5-13.5 (median 11.4 of six);
/// asking for the row 32 ahead as each row is read, 9.2-13.2 (median 10.1),
/// probe runs alternated.
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 32;

/// Ask memory for every cache line of the `len` bytes from `start`. A
/// hint: nothing is read into the program, and an address outside it is
/// ignored.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "sse")]
fn prefetch(start: *const u8, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // A byte every 64 and the last touch every line the bytes span.
    for offset in (0..len).step_by(64).chain([len.saturating_sub(1)]) {
        _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset).cast());
    }
}

/// Ask memory for the cache lines that start within the row
/// [`PREFETCH_ROWS`] after the one at `row`, rows `stride` values apart.
/// Called for each row in turn, it asks for every line once: asking for
/// every line a row touches asked for most lines twice, as an 8-bit row
/// (68 bytes) shares a line with each neighbour, and the extra hints cost
/// decode steps 1.5-2% at four and sixteen sequences. Past the cache's end
/// the hint is ignored.
///
/// A plain loop: as a stepped range the per-row bookkeeping compiled to
/// some 35 scalar instructions, as many as the row's vector work, and
/// decode steps took up to 2.9% longer with four sequences and 1.7-3.9%
/// with sixteen.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "sse")]
fn prefetch_row_ahead<L>(row: *const L, stride: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let ahead = row.wrapping_add(PREFETCH_ROWS * stride).cast::<u8>();
    let len = stride * size_of::<L>();
    let mut offset = ahead.addr().next_multiple_of(64) - ahead.addr();
    while offset < len {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(offset).cast());
        offset += 64;
    }
}

thread_local! {
    /// Each thread's attention memory, kept from layer to layer so that a
    /// long prompt's score buffers are not allocated and grown afresh.
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Working memory of one thread of attention.
#[derive(Default)]
struct Scratch {
    /// The scores of a tile's query heads, row after row, head after head.
    scores: Vec<f32>,
    /// Cache rows widened to f32.
    rows: Vec<f32>,
}

/// Turn each run of `positions` scores into its softmax, in place.
fn softmax_each(scores: &mut [f32], positions: usize) {
    for head in scores.chunks_exact_mut(positions) {
        let max = head.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for score in head.iter_mut() {
            *score = (*score - max).exp();
            sum += *score;
        }
        for score in head.iter_mut() {
            *score /= sum;
        }
    }
}

/// A dot product in eight independent lanes, which the compiler keeps in
/// vector registers (a single running sum could not be reordered).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a_blocks, b_blocks) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a_blocks
        .remainder()
        .iter()
        .zip(b_blocks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (a, b) in a_blocks.zip(b_blocks) {
        for lane in 0..8 {
            lanes[lane] += a[lane] * b[lane];
        }
    }
    lanes.iter().sum::<f32>() + tail
}
