//! Matmuls with Q4_1, Q8_0, Q4_K and Q6_K weights on the CPU, from the
//! file's bytes reordered once at load.

use super::packing::{Format, Interleaver, BLOCK, GROUP};
use super::quant::{reused, Input, InputBlock, PairBlock, Prepared, TwoRows, PREPARED};
use super::rowwise::f32_on_cpu;
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Result, Tensor};
use std::sync::Arc;

/// Input rows multiplied with one unpacked group block.
pub(super) const TILE: usize = 8;

/// The instructions a kernel is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Instructions {
    /// AVX2 with FMA and F16C: bytes multiply into 16-bit pair sums, then widen.
    Avx2,
    /// AVX-512 VNNI on 256-bit registers: bytes multiply and sum in one step.
    Avx512Vnni,
    /// [`Instructions::Avx512Vnni`], and for two or more input rows,
    /// 512-bit registers that hold two rows' products with a group block
    /// ([`tiles::pairs`](super::tiles::pairs)).
    Avx512Pairs,
}

impl Instructions {
    pub(super) fn of_this_cpu() -> Option<Instructions> {
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
    /// One group, one input row a register lane set
    /// ([`tiles::vnni`](super::tiles::vnni), [`tiles::avx2`](super::tiles::avx2)).
    Rows,
    /// One group, two input rows a register ([`tiles::pairs`](super::tiles::pairs)).
    Pairs,
    /// Two neighbouring groups a register, one input row at a time
    /// ([`tiles::wide`](super::tiles::wide)).
    TwoGroups,
}

/// A Q4_1, Q8_0, Q4_K or Q6_K weight `(rows, width)` on the CPU, its rows
/// interleaved in groups.
///
/// Small models are stored in Q4_1 (SmolLM2's 576-wide rows are too narrow
/// for K-quants), for which candle has only a slow generic CPU loop, and their
/// embedding tables in Q8_0, whose 576-wide rows candle's fast kernel does not
/// take. For the K-quants of larger models candle's kernels keep a second,
/// repacked copy of every weight and trailed llama.cpp's decode by 30-40%.
/// As llama.cpp does, each input row is quantized to 8 bits in blocks of 32
/// and multiplied with the weights in integer arithmetic. The input blocks
/// that meet one K-quant block (256 values) share a scale, as llama.cpp's
/// Q8_K inputs do, so that the block's sub-block sums add up in integers.
///
/// The blocks of every eight weight rows are interleaved, four bytes of each
/// row in turn, so that one 8-lane register holds four values of each of
/// eight rows. A block's dot products with one input row then accumulate
/// exactly, lane by lane, and are scaled to floats once for eight rows, where
/// a row-by-row layout needs a float conversion, a scaling and a horizontal
/// sum per row. The same kernel serves prompts and decode steps, and one
/// input row's results do not depend on the rows multiplied beside it. The
/// reordered copy replaces the file's bytes: the same size for Q4_1, Q8_0 and
/// Q6_K, 3% larger for Q4_K (unpacked scales).
#[derive(Debug, Clone)]
pub(crate) struct InterleavedMatmul {
    /// Group after group of [`GROUP`] rows, each group block after block.
    /// An `Arc` of the `Vec` the groups were written into, since moving
    /// them into an `Arc<[u8]>` would copy every byte of the weight.
    pub(super) interleaved: Arc<Vec<u8>>,
    pub(super) format: Format,
    pub(super) rows: usize,
    pub(super) width: usize,
    pub(super) instructions: Instructions,
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
        // One function on purpose: the pool pass, its preparation jobs and the
        // unsafe writes of each run's columns share invariants (every job
        // prepared before any tile reads, each group written by one run) that
        // are easiest to check when they sit together.
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

    /// [`quantize`](super::quant::quantize), in vector instructions where
    /// the kernels run, with one scale for the input blocks that meet one
    /// weight block.
    fn quantize(&self, row: &[f32], blocks: &mut [InputBlock]) {
        let span = self.format.values();
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `new` checked this CPU for AVX2, FMA and F16C.
        unsafe {
            super::tiles::quantize(row, span, blocks)
        }
        #[cfg(not(target_arch = "x86_64"))]
        super::quant::quantize(row, span, blocks)
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
            use super::tiles::{avx2, pairs, vnni, wide};
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

/// Runs of groups a matmul's columns are split into for the pool's threads
/// to claim.
const RUNS: usize = 64;

/// Input rows up to which Q4_1 and Q8_0 matmuls take two groups at once
/// ([`tiles::wide`](super::tiles::wide)) rather than two rows a register
/// ([`tiles::pairs`](super::tiles::pairs)): one tile. Timed pass by pass in
/// one SmolLM2 decode (8-bit cache, two threads, the kinds of pass
/// alternated), a pass took 6-11% less time for one to five rows and 3.5-6%
/// less for eight; sixteen rows, as two tiles of eight, took 3-6% more.
const TWO_GROUP_ROWS: usize = TILE;

/// Input pairs multiplied with one unpacked group block by the
/// [`tiles::pairs`](super::tiles::pairs) kernels.
pub(super) const PAIR_TILE: usize = 8;

#[cfg(test)]
mod tests {
    use super::super::packing::{q4k_scale_and_minimum, q6k_values};
    use super::super::quant::quantize;
    use super::*;
    use candle_core::quantized::GgmlDType;

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
                super::super::rowwise::swiglu_values(&gates, &ups, computed.spare_capacity_mut());
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
