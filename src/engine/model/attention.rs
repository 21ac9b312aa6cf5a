//! Causal grouped-query attention over a KV cache.
//!
//! On the CPU, one kernel serves prompts and decode steps alike: each query
//! row passes once over the cache rows it may see, with the query heads that
//! share a key/value head reading each row together, straight from an f32,
//! f16, bf16 or 8-bit cache. A prompt's rows go a few at a time, so that each chunk
//! of cache rows is read and widened once for all of them. A prompt's masked
//! scores are never computed and no score matrix is kept. Other devices
//! stack those query heads into one matrix per key/value head and attend
//! with two matmuls.

use crate::engine::kv_cache::{KvDtype, Q8_SCALE_BYTES};
use candle_core::{CpuStorage, DType, Device, Layout, Result, Storage, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

#[cfg(target_arch = "x86_64")]
mod avx512;

/// The additive causal mask for `seq` queries at the last positions of `total`:
/// query `i` (at position `total - seq + i`) sees keys `0..=total - seq + i`.
/// `None` for a single query, which sees everything.
pub fn causal_mask(seq: usize, total: usize, device: &Device) -> Result<Option<Tensor>> {
    if seq <= 1 {
        return Ok(None);
    }
    let start = total - seq;
    let mask: Vec<f32> = (0..seq)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (seq, total), device).map(Some)
}

/// Attend `queries` `(1, heads, seq, d)` to `keys` and `values`
/// `(1, kv_heads, total, d)`; returns `(1, seq, heads * d)`.
pub fn causal_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (_, heads, seq, d) = queries.dims4()?;
    let (_, kv_heads, total, _) = keys.dims4()?;
    let groups = heads / kv_heads;
    // Query head h reads key/value head h / groups, so consecutive heads stack
    // into one (groups * seq, d) matrix per key/value head.
    let queries = queries.reshape((kv_heads, groups * seq, d))?;
    let keys = keys.squeeze(0)?;
    let values = values.squeeze(0)?;
    // (kv_heads, groups * seq, total)
    let mut scores = (queries.matmul(&keys.t()?)? * scale)?;
    if let Some(mask) = mask {
        scores = scores
            .reshape((kv_heads, groups, seq, total))?
            .broadcast_add(mask)?
            .reshape((kv_heads, groups * seq, total))?;
    }
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    // (kv_heads, groups * seq, d) → (heads, seq, d) → (1, seq, heads * d)
    probs
        .matmul(&values)?
        .reshape((heads, seq, d))?
        .transpose(0, 1)?
        .reshape((1, seq, heads * d))
}

/// Consecutive query rows of one cache that read each widened chunk of its
/// rows together. A prompt's rows share their cache, so a chunk is read
/// and widened once per tile instead of once per row. A tile's scores (its
/// query heads × the positions they see) grow with it: 1.5 MB for eight
/// rows of Qwen2.5-1.5B at 8,192 positions. Four to sixteen rows measured
/// alike on one thread, a quarter faster than one row at 8,192 positions.
const TILE_ROWS: usize = 8;

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

/// Attention for the new query rows of several sequences, each over a cache
/// of its own: `queries` is `(rows, heads, 1, head_dim)`, `runs[i]` rows of
/// sequence i after those of the sequences before it, and `caches[i]` holds
/// sequence i's keys and values `(1, kv_heads, positions_i, head_dim)`, its
/// new positions last. Row `r` of a run attends to the positions before the
/// run and to the run's rows up to its own. Returns `(1, rows, heads * head_dim)`.
///
/// A decode step's attention is a few dot products per cached position. As
/// tensor ops (two matmuls, a softmax, reshapes) per sequence its cost was
/// mostly their overhead, more than half a step's time with many sequences;
/// here each query head makes one pass over its cache rows, in place, from
/// an f32, f16 or bf16 cache. Other devices take the tensor-op path.
pub fn batch_attention(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    runs: &[usize],
    scale: f64,
) -> Result<Tensor> {
    let rows = queries.dim(0)?;
    if caches.len() != runs.len() || runs.iter().sum::<usize>() != rows {
        candle_core::bail!(
            "{rows} query rows in runs {runs:?} for {} caches",
            caches.len()
        );
    }
    if !readable_on_cpu(queries, caches) {
        return batch_attention_by_ops(&queries.contiguous()?, caches, runs, scale);
    }
    batch_attention_on_cpu(queries, caches, runs, scale, Kernel::best())
}

/// The loops that attend on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
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
    fn best() -> Kernel {
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
            Kernel::Avx512 | Kernel::Avx2 if d.is_multiple_of(vector::LANES) => Kernel::Avx2,
            _ => Kernel::Portable,
        }
    }
}

/// [`batch_attention`] on tensors [`readable_on_cpu`], with `kernel`.
fn batch_attention_on_cpu(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    runs: &[usize],
    scale: f64,
    kernel: Kernel,
) -> Result<Tensor> {
    let mut views = Vec::with_capacity(queries.dim(0)?);
    for (cache, ((keys, _), &run)) in caches.iter().zip(runs).enumerate() {
        let earlier = keys.dim(2)?.checked_sub(run).ok_or_else(|| {
            candle_core::Error::Msg(format!("a run of {run} rows over a shorter cache"))
        })?;
        views.extend((1..=run).map(|row| (cache, earlier + row)));
    }
    attention_on_cpu(queries, caches, |row| views[row], scale, kernel)
}

/// Whether `batch_attention` and `prompt_attention` can read these tensors
/// in place: f32 queries and an f32, f16, bf16 or 8-bit cache, all on the CPU.
fn readable_on_cpu(queries: &Tensor, caches: &[(Tensor, Tensor)]) -> bool {
    let on_cpu = |t: &Tensor, dtypes: &[DType]| t.device().is_cpu() && dtypes.contains(&t.dtype());
    let cache_dtypes = [DType::F32, DType::F16, DType::BF16, DType::U8];
    on_cpu(queries, &[DType::F32])
        && caches
            .iter()
            .all(|(keys, values)| on_cpu(keys, &cache_dtypes) && on_cpu(values, &cache_dtypes))
}

/// Causal attention for a prompt's `queries` `(1, heads, seq, d)`, the last
/// `seq` positions of `keys` and `values` `(1, kv_heads, total, d)`; returns
/// `(1, seq, heads * d)`. Query `i` attends to positions `..=total - seq + i`.
///
/// On the CPU each query runs the decode kernel over the positions it sees,
/// in tiles of consecutive rows that share each widened chunk of the cache:
/// the masked half of the score matrix is never computed, no score matrix
/// of `heads × seq × total` floats is allocated, a 16-bit cache is read in
/// place, and a prompt token's attention is computed as a generated token's
/// would be. Other devices take the matmul path.
pub fn prompt_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let (_, heads, seq, d) = queries.dims4()?;
    let total = keys.dim(2)?;
    let caches = [(keys.clone(), values.clone())];
    if !readable_on_cpu(queries, &caches) {
        let mask = causal_mask(seq, total, queries.device())?;
        let (keys, values) = (as_floats(keys, DType::F32)?, as_floats(values, DType::F32)?);
        return causal_attention(queries, &keys, &values, mask.as_ref(), scale);
    }
    // Row after row of `heads * d`, as the kernel takes one query per row.
    let rows = queries
        .transpose(1, 2)?
        .contiguous()?
        .reshape((seq, heads, 1, d))?;
    batch_attention_on_cpu(&rows, &caches, &[seq], scale, Kernel::best())
}

/// Attention of CPU query rows `queries` `(rows, heads, 1, d)` in f32, each
/// over a cache of `caches` (f32, f16 or bf16): row `r` attends to the first
/// `visible` positions of `caches[cache]`, where `(cache, visible) =
/// view(r)`, with `kernel` (one that [`Kernel::best`] allows) or a narrower
/// one where `d` asks for it. Returns `(1, rows, heads * d)`.
fn attention_on_cpu(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    view: impl Fn(usize) -> (usize, usize) + Sync,
    scale: f64,
    kernel: Kernel,
) -> Result<Tensor> {
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
            Kernel::Avx2 => unsafe { vector::attend(&tile, scratch, outs, false) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { vector::attend(&tile, scratch, outs, true) },
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

/// [`batch_attention`] as tensor ops, for devices other than the CPU.
fn batch_attention_by_ops(
    queries: &Tensor,
    caches: &[(Tensor, Tensor)],
    runs: &[usize],
    scale: f64,
) -> Result<Tensor> {
    let mut outputs = Vec::with_capacity(caches.len());
    let mut first = 0;
    for ((keys, values), &run) in caches.iter().zip(runs) {
        // (1, heads, run, d), the run's rows as one sequence's queries.
        let query = queries
            .narrow(0, first, run)?
            .transpose(0, 2)?
            .contiguous()?;
        let keys = as_floats(keys, query.dtype())?;
        let values = as_floats(values, query.dtype())?;
        let mask = causal_mask(run, keys.dim(2)?, query.device())?;
        outputs.push(causal_attention(
            &query,
            &keys,
            &values,
            mask.as_ref(),
            scale,
        )?);
        first += run;
    }
    Tensor::cat(&outputs, 1)
}

/// A float cache tensor in `dtype`, for the tensor-op path. An 8-bit
/// cache's bytes are not its values, and only the CPU kernels read it.
fn as_floats(cache: &Tensor, dtype: DType) -> Result<Tensor> {
    if cache.dtype() == DType::U8 {
        candle_core::bail!("an 8-bit KV cache is read by the CPU attention kernels only");
    }
    cache.to_dtype(dtype)
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

/// The AVX2 attention kernel. For a tile of several prompt rows, a 16-bit
/// cache is widened to f32 a chunk of positions at a time, once for all the
/// rows and heads that read it, into a scratch buffer that stays in the L1
/// cache. A decode step's single row reads the 16-bit rows directly,
/// widening each load: the round trip through the buffer cost it more than
/// the conversions it saved. Widening is exact either way, so the cache
/// dtype alone decides the result.
///
/// Two query heads go through a chunk together, so that each load of a
/// cache row serves both: four positions' scores at a time, each in its own
/// register and summed across lanes at the end, and four blocks of each
/// head's output kept in registers through every position of a chunk. The
/// chunks continue the same sums. Every score and output therefore rounds
/// the same however positions, heads and rows are grouped, and a prompt row
/// gets the bits a decode step would. On a CPU with AVX-512 the scores and
/// weighted sums come from [`avx512`]'s loops instead, which read each
/// cache row once for up to four heads' scores or six heads' outputs.
#[cfg(target_arch = "x86_64")]
mod vector {
    use super::{prefetch_row_ahead, HeadRows, RowData, RowScale, Scratch, Tile, PREFETCH_ROWS};
    use crate::engine::model::exp::exp;
    use half::{bf16, f16};
    use std::arch::x86_64::*;

    /// Floats in one AVX register.
    pub(super) const LANES: usize = 8;

    /// Positions widened at a time: 32 rows of a 128-wide head are 16 KB of
    /// f32. A one-thread probe ran sixteen SmolLM2 decode steps' attention
    /// in 43-49 ms with 32 rows against 51-57 with 64, and a Qwen-1.5B
    /// prompt's 10-15% faster too.
    const CHUNK: usize = 32;

    /// The lane sums of eight registers, `sums[r]` in lane `r`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sum_each(sums: &[__m256; 8]) -> __m256 {
        let pairs = [
            _mm256_hadd_ps(sums[0], sums[1]),
            _mm256_hadd_ps(sums[2], sums[3]),
            _mm256_hadd_ps(sums[4], sums[5]),
            _mm256_hadd_ps(sums[6], sums[7]),
        ];
        // Lanes 0-3 now hold the sums of the low halves of registers 0-3
        // (and 4-7 in `high`), lanes 4-7 those of their high halves.
        let low = _mm256_hadd_ps(pairs[0], pairs[1]);
        let high = _mm256_hadd_ps(pairs[2], pairs[3]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(low, high),
            _mm256_permute2f128_ps::<0x31>(low, high),
        )
    }

    /// A value of a cache the kernels read eight at a time, as f32.
    trait Lane: RowScale {
        /// The eight values from `at`, widened exactly.
        ///
        /// # Safety
        /// Eight values are readable from `at`, and the CPU has AVX2 and F16C.
        unsafe fn eight(at: *const Self) -> __m256;
    }

    impl Lane for f32 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(at: *const f32) -> __m256 {
            // SAFETY: as the caller promises.
            unsafe { _mm256_loadu_ps(at) }
        }
    }

    impl Lane for f16 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(at: *const f16) -> __m256 {
            // SAFETY: as the caller promises.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast())) }
        }
    }

    impl Lane for bf16 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(at: *const bf16) -> __m256 {
            // SAFETY: as the caller promises. A bf16 is the top half of an f32.
            let halves = unsafe { _mm256_cvtepu16_epi32(_mm_loadu_si128(at.cast())) };
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(halves))
        }
    }

    impl Lane for i8 {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn eight(at: *const i8) -> __m256 {
            // SAFETY: as the caller promises.
            let bytes = unsafe { _mm_loadl_epi64(at.cast()) };
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))
        }
    }

    /// Rows `first..first + count` of `rows` and their stride: widened to
    /// f32 into `scratch` (`d` apart) when `widen` and the cache is 16-bit,
    /// else in place. A tile of several rows reads each row once per row and
    /// head pair, so widening it once first saves conversions; a single row
    /// (a decode step) is better served by converting as it reads. An 8-bit
    /// cache is always read in place: its scale applies to a score as a
    /// whole, which a widened row could not give a prompt row bit for bit.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn chunk<'a>(
        rows: &HeadRows<'a>,
        (first, count): (usize, usize),
        widen: bool,
        scratch: &'a mut Vec<f32>,
    ) -> (RowData<'a>, usize) {
        let (d, stride) = (rows.d, rows.stride);
        let span = first * stride..(first + count - 1) * stride + rows.width;
        let data = match rows.data {
            RowData::F32(data) => RowData::F32(&data[span]),
            RowData::Q8(data) => RowData::Q8(&data[span]),
            RowData::F16(data) if !widen => RowData::F16(&data[span]),
            RowData::Bf16(data) if !widen => RowData::Bf16(&data[span]),
            RowData::F16(data) => {
                return (RowData::F32(widened(&data[span], (stride, d), scratch)), d)
            }
            RowData::Bf16(data) => {
                return (RowData::F32(widened(&data[span], (stride, d), scratch)), d)
            }
        };
        (data, stride)
    }

    /// The rows of `data` (`d` values each, `stride` apart) widened into
    /// `scratch`, `d` apart.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn widened<'a, L: Lane>(
        data: &[L],
        (stride, d): (usize, usize),
        scratch: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        let count = (data.len() - d) / stride + 1;
        scratch.resize(count * d, 0.0);
        for (j, out) in scratch.chunks_exact_mut(d).enumerate() {
            let row = &data[j * stride..][..d];
            for (values, out) in row.chunks_exact(LANES).zip(out.chunks_exact_mut(LANES)) {
                // SAFETY: both runs hold eight values.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), L::eight(values.as_ptr())) };
            }
        }
        scratch
    }

    /// [`Tile::attend`] with AVX2, and with the scores and weighted sums of
    /// [`super::avx512`] when `wide`. Each row's scores and sums take the
    /// same steps in the same order as they would in a tile of that row alone.
    ///
    /// # Safety
    /// When `wide`, the CPU has AVX-512F and `d` is a multiple of sixteen.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend(
        tile: &Tile,
        scratch: &mut Scratch,
        outs: &mut [&mut [f32]],
        wide: bool,
    ) {
        let (d, positions) = (tile.keys.d, tile.keys.positions);
        let groups = tile
            .rows
            .first()
            .map_or(0, |(queries, _)| queries.len() / d);
        // Row r's head g keeps its scores at `(r * groups + g) * positions`,
        // the first as many as the row sees.
        let Scratch { scores, rows } = scratch;
        // Every score read is written first in this tile, so what an earlier
        // tile left needs no clearing.
        let needed = tile.rows.len() * groups * positions;
        if scores.len() < needed {
            scores.resize(needed, 0.0);
        }
        let scores = &mut scores[..needed];
        let per_row = groups * positions;
        let widen = tile.rows.len() > 1;
        // The kernels ask for rows `PREFETCH_ROWS` ahead as they go; these
        // are the rows before.
        for rows in [&tile.keys, &tile.values] {
            let count = PREFETCH_ROWS.min(rows.positions);
            if count > 0 {
                let bytes = rows.bytes(0, count);
                super::prefetch(bytes.as_ptr(), bytes.len());
            }
        }
        for first in (0..positions).step_by(CHUNK) {
            let count = CHUNK.min(positions - first);
            let (keys, stride) = chunk(&tile.keys, (first, count), widen, rows);
            for (&(queries, seen), scores) in tile.rows.iter().zip(scores.chunks_exact_mut(per_row))
            {
                let keys = (keys, stride, count.min(seen.saturating_sub(first)));
                let scores = (&mut scores[first..], positions);
                match wide {
                    // SAFETY: as the caller promises.
                    true => unsafe {
                        super::avx512::score_chunk((queries, d), keys, tile.scale, scores)
                    },
                    false => score_chunk((queries, d), keys, tile.scale, scores),
                }
            }
        }
        for (&(_, seen), scores) in tile.rows.iter().zip(scores.chunks_exact_mut(per_row)) {
            for scores in scores.chunks_exact_mut(positions) {
                softmax(&mut scores[..seen]);
            }
        }
        for out in outs.iter_mut() {
            out.fill(0.0);
        }
        for first in (0..positions).step_by(CHUNK) {
            let count = CHUNK.min(positions - first);
            let (values, stride) = chunk(&tile.values, (first, count), widen, rows);
            for ((&(_, seen), scores), out) in tile
                .rows
                .iter()
                .zip(scores.chunks_exact(per_row))
                .zip(outs.iter_mut())
            {
                let values = (values, stride, count.min(seen.saturating_sub(first)));
                let weights = (&scores[first..], positions);
                match wide {
                    // SAFETY: as the caller promises.
                    true => unsafe { super::avx512::add_weighted(weights, values, out, d) },
                    false => add_weighted(weights, values, out, d),
                }
            }
        }
    }

    /// Turn `scores` into their softmax, in place, eight at a time. A last
    /// run of fewer than eight is padded, so every score takes the same path.
    ///
    /// The largest score and the quotients are exact, so computing them in
    /// registers gives the bits of a scalar loop; one score at a time, the
    /// divisions took a quarter of a decode step's attention.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn softmax(scores: &mut [f32]) {
        let (runs, rest) = scores.as_chunks_mut::<LANES>();
        let mut largest = _mm256_set1_ps(f32::NEG_INFINITY);
        for run in runs.iter() {
            // SAFETY: `run` holds eight floats.
            largest = _mm256_max_ps(largest, unsafe { _mm256_loadu_ps(run.as_ptr()) });
        }
        let largest = lanes_of(largest)
            .into_iter()
            .chain(rest.iter().copied())
            .fold(f32::NEG_INFINITY, f32::max);
        let largest = _mm256_set1_ps(largest);
        let mut sums = _mm256_setzero_ps();
        for run in runs.iter_mut() {
            // SAFETY: `run` holds eight floats.
            unsafe {
                let weights = exp(_mm256_sub_ps(_mm256_loadu_ps(run.as_ptr()), largest));
                _mm256_storeu_ps(run.as_mut_ptr(), weights);
                sums = _mm256_add_ps(sums, weights);
            }
        }
        if !rest.is_empty() {
            let mut lanes = [0f32; LANES];
            lanes[..rest.len()].copy_from_slice(rest);
            let weights = exp(_mm256_sub_ps(
                // SAFETY: `lanes` holds eight floats.
                unsafe { _mm256_loadu_ps(lanes.as_ptr()) },
                largest,
            ));
            let mut lanes = lanes_of(weights);
            rest.copy_from_slice(&lanes[..rest.len()]);
            lanes[rest.len()..].fill(0.0);
            // SAFETY: as above.
            sums = _mm256_add_ps(sums, unsafe { _mm256_loadu_ps(lanes.as_ptr()) });
        }
        let total: f32 = lanes_of(sums).iter().sum();
        let totals = _mm256_set1_ps(total);
        for run in runs.iter_mut() {
            // SAFETY: `run` holds eight floats.
            unsafe {
                let quotients = _mm256_div_ps(_mm256_loadu_ps(run.as_ptr()), totals);
                _mm256_storeu_ps(run.as_mut_ptr(), quotients);
            }
        }
        for score in rest.iter_mut() {
            *score /= total;
        }
    }

    /// The eight lanes of `v`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lanes_of(v: __m256) -> [f32; LANES] {
        let mut lanes = [0f32; LANES];
        // SAFETY: `lanes` holds eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        lanes
    }

    /// Query heads that share each load of a cache row. Two heads of four
    /// positions' scores, or of four blocks of output, are eight sums in
    /// registers and need six loads for eight multiply-adds, where one head
    /// needed nine.
    const HEADS_AT_ONCE: usize = 2;

    /// Positions scored in one pass over the query heads.
    const POSITIONS_AT_ONCE: usize = 4;

    /// Output blocks of eight kept in registers through one pass over the
    /// weighted value rows.
    const BLOCKS_AT_ONCE: usize = 4;

    /// The scores of a row's query heads `queries` (runs of `d`) against the
    /// `count` key rows of a chunk (`keys[j * stride..]`): head `h`'s score of
    /// row `j` goes to `scores[h * positions + j]`, scaled by `scale`.
    ///
    /// Each score sums its products in eight lanes over the blocks of the
    /// head, in order, and then across lanes by [`sum_each`]; how many heads
    /// and positions share a pass does not change its rounding.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn score_chunk(
        queries: (&[f32], usize),
        (keys, stride, count): (RowData, usize, usize),
        scale: f32,
        scores: (&mut [f32], usize),
    ) {
        match keys {
            RowData::F32(keys) => score_rows(queries, (keys, stride, count), scale, scores),
            RowData::F16(keys) => score_rows(queries, (keys, stride, count), scale, scores),
            RowData::Bf16(keys) => score_rows(queries, (keys, stride, count), scale, scores),
            RowData::Q8(keys) => score_rows(queries, (keys, stride, count), scale, scores),
        }
    }

    /// [`score_chunk`] for keys stored as `L`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn score_rows<L: Lane>(
        (queries, d): (&[f32], usize),
        (keys, stride, count): (&[L], usize, usize),
        scale: f32,
        (scores, positions): (&mut [f32], usize),
    ) {
        for (h, queries) in queries.chunks(HEADS_AT_ONCE * d).enumerate() {
            let scores = &mut scores[h * HEADS_AT_ONCE * positions..];
            let mut start = 0;
            while start < count {
                let taken = match (queries.len() / d, count - start) {
                    (2, POSITIONS_AT_ONCE..) => score_block::<L, 2, POSITIONS_AT_ONCE>,
                    (2, _) => score_block::<L, 2, 1>,
                    (_, POSITIONS_AT_ONCE..) => score_block::<L, 1, POSITIONS_AT_ONCE>,
                    _ => score_block::<L, 1, 1>,
                }(
                    queries,
                    &keys[start * stride..],
                    stride,
                    scale,
                    (scores, positions, start),
                );
                if h == 0 {
                    for row in start..start + taken {
                        prefetch_row_ahead(keys.as_ptr().wrapping_add(row * stride), stride);
                    }
                }
                start += taken;
            }
        }
    }

    /// [`score_rows`] for `H` heads and `P` key rows from `keys`' first;
    /// returns `P`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn score_block<L: Lane, const H: usize, const P: usize>(
        queries: &[f32],
        keys: &[L],
        stride: usize,
        scale: f32,
        (scores, positions, start): (&mut [f32], usize, usize),
    ) -> usize {
        let d = queries.len() / H;
        debug_assert!(queries.len() == H * d && (P - 1) * stride + d <= keys.len());
        // Sum `h * P + p` is head h's score of row p; `sum_each` puts it in lane `h * P + p`.
        let mut sums = [_mm256_setzero_ps(); LANES];
        for block in (0..d).step_by(LANES) {
            // SAFETY: blocks of eight within each head's query and each key
            // row, checked above.
            unsafe {
                let query: [__m256; H] =
                    std::array::from_fn(|h| _mm256_loadu_ps(queries.as_ptr().add(h * d + block)));
                for p in 0..P {
                    let key = L::eight(keys.as_ptr().add(p * stride + block));
                    for (h, query) in query.iter().enumerate() {
                        sums[h * P + p] = _mm256_fmadd_ps(*query, key, sums[h * P + p]);
                    }
                }
            }
        }
        // SAFETY: `chunk` spans whole stored rows, an 8-bit row's scale included.
        let row_scales: [f32; P] =
            std::array::from_fn(|p| unsafe { L::row_scale(keys.as_ptr().add(p * stride), d) });
        let lane_scales: [f32; LANES] = std::array::from_fn(|lane| row_scales[lane % P]);
        let mut lanes = [0f32; LANES];
        // SAFETY: `lanes` and `lane_scales` hold eight floats.
        unsafe {
            let sums = _mm256_mul_ps(sum_each(&sums), _mm256_loadu_ps(lane_scales.as_ptr()));
            let scores = _mm256_mul_ps(sums, _mm256_set1_ps(scale));
            _mm256_storeu_ps(lanes.as_mut_ptr(), scores);
        }
        for h in 0..H {
            scores[h * positions + start..][..P].copy_from_slice(&lanes[h * P..][..P]);
        }
        P
    }

    /// `out[h * d..]` += Σⱼ `weights[h * positions + j]` · value row `j`
    /// (`values[j * stride..]`) for the `count` rows of a chunk, for each of
    /// a row's query heads. Every output sums its rows in order, so neither
    /// chunking nor how many heads share a pass changes its rounding.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn add_weighted(
        weights: (&[f32], usize),
        (values, stride, count): (RowData, usize, usize),
        out: &mut [f32],
        d: usize,
    ) {
        match values {
            RowData::F32(values) => weigh_rows(weights, (values, stride, count), out, d),
            RowData::F16(values) => weigh_rows(weights, (values, stride, count), out, d),
            RowData::Bf16(values) => weigh_rows(weights, (values, stride, count), out, d),
            RowData::Q8(values) => weigh_rows(weights, (values, stride, count), out, d),
        }
    }

    /// [`add_weighted`] for values stored as `L`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn weigh_rows<L: Lane>(
        (weights, positions): (&[f32], usize),
        (values, stride, count): (&[L], usize, usize),
        out: &mut [f32],
        d: usize,
    ) {
        for (h, out) in out.chunks_mut(HEADS_AT_ONCE * d).enumerate() {
            let weights = &weights[h * HEADS_AT_ONCE * positions..];
            let mut part = 0;
            while part < d {
                part += match (out.len() / d, (d - part) / LANES) {
                    (2, BLOCKS_AT_ONCE..) => weigh_block::<L, 2, BLOCKS_AT_ONCE>,
                    (2, _) => weigh_block::<L, 2, 1>,
                    (_, BLOCKS_AT_ONCE..) => weigh_block::<L, 1, BLOCKS_AT_ONCE>,
                    _ => weigh_block::<L, 1, 1>,
                }(
                    (weights, positions),
                    (values, stride, count),
                    out,
                    (d, part),
                    h == 0 && part == 0,
                );
            }
        }
    }

    /// [`weigh_rows`] for `H` heads and `B` blocks of output from `part`,
    /// asking for the value rows ahead when `prefetch` (one pass of the
    /// row's does); returns the floats of output done.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn weigh_block<L: Lane, const H: usize, const B: usize>(
        (weights, positions): (&[f32], usize),
        (values, stride, count): (&[L], usize, usize),
        out: &mut [f32],
        (d, part): (usize, usize),
        prefetch: bool,
    ) -> usize {
        debug_assert!(out.len() == H * d && part + B * LANES <= d);
        debug_assert!(count == 0 || (count - 1) * stride + part + B * LANES <= values.len());
        debug_assert!(count == 0 || (H - 1) * positions + count <= weights.len());
        // SAFETY: blocks of eight within each head's output, checked above.
        let mut sums: [[__m256; B]; H] = std::array::from_fn(|h| {
            std::array::from_fn(|b| unsafe {
                _mm256_loadu_ps(out.as_ptr().add(h * d + part + b * LANES))
            })
        });
        for j in 0..count {
            if prefetch {
                prefetch_row_ahead(values.as_ptr().wrapping_add(j * stride), stride);
            }
            // SAFETY: within value row `j` and each head's weights, checked above.
            unsafe {
                let row = values.as_ptr().add(j * stride);
                let value: [__m256; B] =
                    std::array::from_fn(|b| L::eight(row.add(part + b * LANES)));
                let row_scale = L::row_scale(row, d);
                for (h, sums) in sums.iter_mut().enumerate() {
                    let weight = *weights.get_unchecked(h * positions + j) * row_scale;
                    let weight = _mm256_set1_ps(weight);
                    for (sum, value) in sums.iter_mut().zip(&value) {
                        *sum = _mm256_fmadd_ps(weight, *value, *sum);
                    }
                }
            }
        }
        for (h, sums) in sums.iter().enumerate() {
            for (b, sum) in sums.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(h * d + part + b * LANES), *sum) };
            }
        }
        B * LANES
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn softmax_sums_to_one_and_keeps_the_order() {
            if !crate::engine::model::has_avx2_fma_f16c() {
                return;
            }
            let mut scores: Vec<f32> = (0..13).map(|i| (i as f32 * 0.7).sin() * 5.0).collect();
            let before = scores.clone();
            // SAFETY: this CPU has AVX2, FMA and F16C.
            unsafe { softmax(&mut scores) };
            assert!((scores.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            let exact: Vec<f32> = before.iter().map(|s| (s - 5.0).exp()).collect();
            let total: f32 = exact.iter().sum();
            for (got, want) in scores.iter().zip(&exact) {
                assert!((got - want / total).abs() < 1e-6);
            }
        }

        #[test]
        fn softmax_in_registers_gives_the_bits_of_one_score_at_a_time() {
            if !crate::engine::model::has_avx2_fma_f16c() {
                return;
            }
            for length in [1, 7, 8, 13, 64, 601] {
                let mut scores: Vec<f32> =
                    (0..length).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
                // Exponentials in padded runs of eight, then a sum and a
                // division score by score.
                let largest = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut expected = Vec::new();
                let mut sums = [0f32; LANES];
                for run in scores.chunks(LANES) {
                    let mut lanes = [0f32; LANES];
                    lanes[..run.len()].copy_from_slice(run);
                    // SAFETY: this CPU has AVX2; `lanes` holds eight floats.
                    let weights = unsafe {
                        lanes_of(exp(_mm256_sub_ps(
                            _mm256_loadu_ps(lanes.as_ptr()),
                            _mm256_set1_ps(largest),
                        )))
                    };
                    expected.extend_from_slice(&weights[..run.len()]);
                    for (sum, weight) in sums.iter_mut().zip(&weights[..run.len()]) {
                        *sum += weight;
                    }
                }
                let total: f32 = sums.iter().sum();
                for weight in &mut expected {
                    *weight /= total;
                }
                // SAFETY: this CPU has AVX2, FMA and F16C.
                unsafe { softmax(&mut scores) };
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&scores), bits(&expected), "{length} scores");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention written out one query head at a time with explicit loops.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: usize,
        kv_heads: usize,
        seq: usize,
        total: usize,
        d: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; seq * heads * d];
        for h in 0..heads {
            let kv = h / (heads / kv_heads);
            for i in 0..seq {
                let visible = total - seq + i + 1;
                let scores: Vec<f32> = (0..visible)
                    .map(|j| {
                        (0..d)
                            .map(|x| q[(h * seq + i) * d + x] * k[(kv * total + j) * d + x])
                            .sum::<f32>()
                            / (d as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = weights.iter().sum();
                for x in 0..d {
                    out[(i * heads + h) * d + x] = (0..visible)
                        .map(|j| weights[j] / sum * v[(kv * total + j) * d + x])
                        .sum();
                }
            }
        }
        out
    }

    #[test]
    fn matches_a_naive_loop_with_grouped_heads_and_a_cached_prefix() {
        let (heads, kv_heads, seq, total, d) = (6, 2, 3, 5, 4);
        let values = |n: usize, salt: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + salt).sin()).collect()
        };
        let (q, k, v) = (
            values(heads * seq * d, 0.1),
            values(kv_heads * total * d, 0.7),
            values(kv_heads * total * d, 1.3),
        );
        let dev = Device::Cpu;
        let qt = Tensor::from_vec(q.clone(), (1, heads, seq, d), &dev).unwrap();
        let kt = Tensor::from_vec(k.clone(), (1, kv_heads, total, d), &dev).unwrap();
        let vt = Tensor::from_vec(v.clone(), (1, kv_heads, total, d), &dev).unwrap();
        let mask = causal_mask(seq, total, &dev).unwrap();
        let out = causal_attention(&qt, &kt, &vt, mask.as_ref(), 1.0 / (d as f64).sqrt()).unwrap();
        let out: Vec<f32> = out.flatten_all().unwrap().to_vec1().unwrap();
        let expected = naive(&q, &k, &v, heads, kv_heads, seq, total, d);
        let diff = max_difference(&out, &expected);
        assert!(diff < 1e-5, "max difference {diff}");
    }

    fn max_difference(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    }

    /// Queries `(sequences, heads, 1, d)` and one cache per sequence of
    /// `positions` rows, held in a cache of room for more, as the engine's are.
    fn decode_inputs(
        heads: usize,
        kv_heads: usize,
        positions: &[usize],
        d: usize,
    ) -> (Tensor, Vec<(Tensor, Tensor)>) {
        let dev = Device::Cpu;
        let values = |n: usize, salt: f32| -> Vec<f32> {
            (0..n)
                .map(|i| (i as f32 * 0.37 + salt).sin() * 2.0)
                .collect()
        };
        let count = positions.len();
        let queries =
            Tensor::from_vec(values(count * heads * d, 0.1), (count, heads, 1, d), &dev).unwrap();
        let caches = positions
            .iter()
            .enumerate()
            .map(|(i, &filled)| {
                let room = filled + 3;
                let cache = |salt: f32| {
                    Tensor::from_vec(
                        values(kv_heads * room * d, salt),
                        (1, kv_heads, room, d),
                        &dev,
                    )
                    .unwrap()
                    .narrow(2, 0, filled)
                    .unwrap()
                };
                (cache(0.7 + i as f32), cache(1.3 + i as f32))
            })
            .collect();
        (queries, caches)
    }

    fn flat(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// Each cache's keys and values converted to `dtype`, or for `U8`
    /// stored as an 8-bit cache stores them.
    fn stored_as(caches: &[(Tensor, Tensor)], dtype: DType) -> Vec<(Tensor, Tensor)> {
        let store = |t: &Tensor| {
            if dtype != DType::U8 {
                return t.to_dtype(dtype).unwrap();
            }
            let (_, heads, positions, d) = t.dims4().unwrap();
            let rows = flat(&t.contiguous().unwrap());
            let bytes = crate::engine::kv_cache::quantize_rows(&rows, d);
            Tensor::from_vec(
                bytes,
                (1, heads, positions, d + Q8_SCALE_BYTES),
                &Device::Cpu,
            )
            .unwrap()
        };
        caches.iter().map(|(k, v)| (store(k), store(v))).collect()
    }

    /// The f32 values an 8-bit cache `stored_as` gave stands for.
    fn dequantized(caches: &[(Tensor, Tensor)]) -> Vec<(Tensor, Tensor)> {
        let values = |t: &Tensor| {
            let (_, heads, positions, width) = t.dims4().unwrap();
            let d = width - Q8_SCALE_BYTES;
            let bytes: Vec<u8> = t.flatten_all().unwrap().to_vec1().unwrap();
            let floats: Vec<f32> = bytes
                .chunks_exact(width)
                .flat_map(|row| {
                    let scale = f32::from_le_bytes(row[d..].try_into().unwrap());
                    row[..d].iter().map(move |&b| f32::from(b as i8) * scale)
                })
                .collect();
            Tensor::from_vec(floats, (1, heads, positions, d), &Device::Cpu).unwrap()
        };
        caches.iter().map(|(k, v)| (values(k), values(v))).collect()
    }

    impl Kernel {
        /// Every kernel this CPU runs.
        fn available() -> Vec<Kernel> {
            match Kernel::best() {
                Kernel::Portable => vec![Kernel::Portable],
                Kernel::Avx2 => vec![Kernel::Portable, Kernel::Avx2],
                Kernel::Avx512 => vec![Kernel::Portable, Kernel::Avx2, Kernel::Avx512],
            }
        }
    }

    /// Every kernel, with the query heads of a key/value head in one pass
    /// or split over several (seven heads: four and three scored, six and
    /// one weighted), over cache chunks and their tails.
    ///
    /// An 8-bit cache attends as the f32 values its rows stand for, up to
    /// the order of rounding: a score's scale applies to its sum.
    #[test]
    fn every_kernel_matches_the_matmul_path_for_any_grouping_of_heads() {
        for (heads, kv_heads, d) in [(9, 3, 64), (12, 2, 128), (14, 2, 64), (2, 1, 32)] {
            let (queries, caches) = decode_inputs(heads, kv_heads, &[5, 70], d);
            for dtype in [DType::F16, DType::U8] {
                let caches = stored_as(&caches, dtype);
                let floats = match dtype {
                    DType::U8 => dequantized(&caches),
                    _ => caches.clone(),
                };
                let scale = 1.0 / (d as f64).sqrt();
                let expected =
                    flat(&batch_attention_by_ops(&queries, &floats, &[1, 1], scale).unwrap());
                for kernel in Kernel::available() {
                    let out = batch_attention_on_cpu(&queries, &caches, &[1, 1], scale, kernel);
                    let diff = max_difference(&flat(&out.unwrap()), &expected);
                    assert!(
                        diff < 1e-5,
                        "{kernel:?} on {dtype:?}, {heads}/{kv_heads} heads, d = {d}: {diff}"
                    );
                }
            }
        }
    }

    /// The tensor-op path cannot read an 8-bit cache's bytes as values and
    /// says so instead of attending to them.
    #[test]
    fn the_matmul_path_refuses_an_8_bit_cache() {
        let (queries, caches) = decode_inputs(6, 2, &[5], 64);
        let caches = stored_as(&caches, DType::U8);
        let err = batch_attention_by_ops(&queries, &caches, &[1], 0.125).unwrap_err();
        assert!(err.to_string().contains("8-bit"), "{err}");
    }

    #[test]
    fn decode_attention_matches_the_matmul_path() {
        // d = 20 leaves a tail after the blocks of eight.
        for d in [64, 20] {
            let (queries, caches) = decode_inputs(6, 2, &[5, 45], d);
            let scale = 1.0 / (d as f64).sqrt();
            let out = flat(&batch_attention(&queries, &caches, &[1, 1], scale).unwrap());
            let expected =
                flat(&batch_attention_by_ops(&queries, &caches, &[1, 1], scale).unwrap());
            let diff = max_difference(&out, &expected);
            assert!(diff < 1e-5, "d = {d}: max difference {diff}");
        }
    }

    #[test]
    fn prompt_attention_matches_the_matmul_path_after_a_cached_prefix() {
        // Three prompt rows after 42 cached positions, over a cache with room
        // to spare; d = 20 takes the portable loop.
        for d in [64, 20] {
            let (heads, kv_heads, seq, total) = (6, 2, 3, 45);
            let (rows, caches) = decode_inputs(heads, kv_heads, &[total; 1], d);
            let queries = rows
                .narrow(0, 0, 1)
                .and_then(|one| one.repeat((seq, 1, 1, 1)))
                .and_then(|q| q.affine(0.5, 0.25))
                .and_then(|q| q.reshape((1, heads, seq, d)))
                .unwrap();
            let (keys, values) = &caches[0];
            let scale = 1.0 / (d as f64).sqrt();
            let out = flat(&prompt_attention(&queries, keys, values, scale).unwrap());
            let mask = causal_mask(seq, total, &Device::Cpu).unwrap();
            let expected = causal_attention(&queries, keys, values, mask.as_ref(), scale).unwrap();
            let diff = max_difference(&out, &flat(&expected));
            assert!(diff < 1e-5, "d = {d}: max difference {diff}");
        }
    }

    /// A prompt's rows, attended in tiles, get the very bits each would get
    /// as a decode step over the positions it sees: past several tiles, a
    /// last partial tile and chunk boundaries of the widened cache rows.
    #[test]
    fn a_prompt_row_attends_as_a_decode_step_would() {
        let cases = [
            (DType::F16, 64),
            (DType::F32, 64),
            (DType::BF16, 20),
            (DType::U8, 64),
            (DType::U8, 20),
        ];
        for (dtype, d) in cases {
            let (heads, kv_heads, seq, total) = (6, 2, 2 * TILE_ROWS + 3, 150);
            let (rows, caches) = decode_inputs(heads, kv_heads, &[total; 1], d);
            let [(keys, values)] = <[_; 1]>::try_from(stored_as(&caches, dtype)).unwrap();
            let queries = rows
                .narrow(0, 0, 1)
                .and_then(|one| one.repeat((seq, 1, 1, 1)))
                .and_then(|q| q.affine(0.5, 0.25))
                .and_then(|q| q.transpose(0, 2))
                .unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let prompt = flat(&prompt_attention(&queries, &keys, &values, scale).unwrap());
            for i in 0..seq {
                let seen = total - seq + i + 1;
                let query = queries.narrow(2, i, 1).unwrap().transpose(0, 2).unwrap();
                let cache = [(
                    keys.narrow(2, 0, seen).unwrap(),
                    values.narrow(2, 0, seen).unwrap(),
                )];
                let alone = flat(&batch_attention(&query, &cache, &[1], scale).unwrap());
                assert_eq!(
                    &prompt[i * heads * d..(i + 1) * heads * d],
                    &alone[..],
                    "{dtype:?}, d = {d}, row {i}"
                );
            }
        }
    }

    /// Runs of several rows and of one row in one call get the bits each
    /// sequence gets attended alone.
    #[test]
    fn a_batch_of_runs_attends_each_sequence_as_alone() {
        let (heads, kv_heads, d) = (6, 2, 64);
        let runs = [3, 1, 12];
        let (rows, caches) = decode_inputs(heads, kv_heads, &[7, 40, 90], d);
        let caches = stored_as(&caches, DType::F16);
        // One query row per sequence from `decode_inputs`, varied per run row.
        let queries: Vec<Tensor> = runs
            .iter()
            .enumerate()
            .map(|(i, &run)| {
                let one = rows.narrow(0, i, 1).unwrap();
                let run_rows: Vec<Tensor> = (0..run)
                    .map(|r| one.affine(1.0 - 0.05 * r as f64, 0.01 * r as f64).unwrap())
                    .collect();
                Tensor::cat(&run_rows, 0).unwrap()
            })
            .collect();
        let scale = 1.0 / (d as f64).sqrt();
        let together = flat(
            &batch_attention(&Tensor::cat(&queries, 0).unwrap(), &caches, &runs, scale).unwrap(),
        );
        let mut first = 0;
        for ((queries, cache), &run) in queries.iter().zip(&caches).zip(&runs) {
            let alone = flat(
                &batch_attention(queries, std::slice::from_ref(cache), &[run], scale).unwrap(),
            );
            assert_eq!(
                &together[first..first + alone.len()],
                &alone[..],
                "a run of {run}"
            );
            first += alone.len();
        }
        let by_ops = flat(
            &batch_attention_by_ops(&Tensor::cat(&queries, 0).unwrap(), &caches, &runs, scale)
                .unwrap(),
        );
        let diff = max_difference(&together, &by_ops);
        assert!(diff < 1e-5, "max difference {diff} from the matmul path");
    }

    /// A 16-bit cache gives exactly what an f32 cache holding the same
    /// (rounded) values gives: the kernels that read 16-bit rows in place
    /// compute what the f32 kernel computes on the widened rows.
    #[test]
    fn a_16_bit_cache_reads_as_its_values_widened_to_f32() {
        for dtype in [DType::F16, DType::BF16] {
            for d in [64, 20] {
                let (queries, caches) = decode_inputs(6, 2, &[5, 45], d);
                let stored = stored_as(&caches, dtype);
                let widened = stored_as(&stored, DType::F32);
                let scale = 1.0 / (d as f64).sqrt();
                for kernel in Kernel::available() {
                    let attend = |caches: &[(Tensor, Tensor)]| {
                        flat(
                            &batch_attention_on_cpu(&queries, caches, &[1, 1], scale, kernel)
                                .unwrap(),
                        )
                    };
                    assert_eq!(
                        attend(&stored),
                        attend(&widened),
                        "{dtype:?}, d = {d}, {kernel:?}"
                    );
                }
            }
        }
    }
}
