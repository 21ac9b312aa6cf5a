//! Work spread over candle's thread pool, the one its matmuls run on: one item per
//! thread, ranges claimed as threads finish, and outputs written chunk by chunk.

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

thread_local! {
    /// Set while the calling thread runs its share of a batch alone
    /// ([`alone_on_this_thread`]).
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with the pool helpers ([`each_on_pool`],
/// [`claimed_on_pool`]) doing all their work on the calling thread, so that
/// several threads can each run a batch of their own through the model at
/// once: none of them waits on candle's pool, whose callers take turns.
pub(crate) fn alone_on_this_thread<R>(f: impl FnOnce() -> R) -> R {
    /// Puts back the flag as it was, even if `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ALONE.set(self.0);
        }
    }
    let _restore = Restore(ALONE.replace(true));
    f()
}

/// Call `f(index, item)` for each of `items` on candle's thread pool, the
/// one the matmuls run on, each item on one thread.
pub(crate) fn each_on_pool<T: Send>(items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
    if ALONE.get() {
        for (index, item) in items.iter_mut().enumerate() {
            f(index, item);
        }
        return;
    }
    let items: Vec<Mutex<&mut T>> = items.iter_mut().map(Mutex::new).collect();
    candle_core::utils::barrier_pool().execute_chunked(items.len(), |indices| {
        for index in indices {
            // Each item has one thread, so its lock is never contended and
            // can only be poisoned by a panic, which the pool re-raises.
            let mut item = items[index].lock().unwrap_or_else(PoisonError::into_inner);
            f(index, &mut item);
        }
    });
}

/// Call `f(range)` for consecutive ranges covering `0..items` on candle's
/// pool, each thread claiming the next range as it finishes one: a half of
/// what is left per thread, down to one item, so that a matmul's last
/// claims are small. candle's `execute_chunked` hands out sixteenths of
/// the items, and in a four-sequence decode step the batch thread waited
/// 5.6% of its samples at the end of passes for the other thread's last
/// sixteenth. Not for a job already on the pool: nested, candle's pool
/// would wait for itself.
pub(crate) fn claimed_on_pool(items: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    claimed_on_pool_after(0, |_| {}, items, f);
}

/// [`claimed_on_pool`], in the same pass of the pool after `job(j)` has
/// been called once for each `j < jobs` by whichever thread claims it:
/// one pass where a pass for the jobs and one for the items took two, each
/// costing 0.75-1.6 µs to hand out and gather on two threads.
pub(crate) fn claimed_on_pool_after(
    jobs: usize,
    job: impl Fn(usize) + Sync,
    items: usize,
    f: impl Fn(std::ops::Range<usize>) + Sync,
) {
    if ALONE.get() {
        (0..jobs).for_each(job);
        if items > 0 {
            f(0..items);
        }
        return;
    }
    let pool = candle_core::utils::barrier_pool();
    let threads = pool.n_workers() + 1;
    let (next_job, jobs_done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let next = AtomicUsize::new(0);
    pool.execute(|_| {
        loop {
            let claimed = next_job.fetch_add(1, Ordering::Relaxed);
            if claimed >= jobs {
                break;
            }
            // Counted even if the job panics, so that no thread waits
            // below forever; the pool re-raises the panic at the end.
            let _counted = Counted(&jobs_done);
            job(claimed);
        }
        while jobs_done.load(Ordering::Acquire) < jobs {
            std::hint::spin_loop();
        }
        let mut start = next.load(Ordering::Relaxed);
        while start < items {
            let size = ((items - start) / (2 * threads)).max(1);
            match next.compare_exchange_weak(
                start,
                start + size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    f(start..start + size);
                    start = next.load(Ordering::Relaxed);
                }
                Err(now) => start = now,
            }
        }
    });
}

/// Adds one to its counter when dropped, releasing what was written before.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// A vector of `len` values that `write` fills chunk by chunk, `chunk`
/// values a call, on candle's pool when `on_pool` and there is more than
/// one chunk. The memory is not cleared first: clearing the outputs of a
/// sixteen-sequence decode step's elementwise passes was 2% of the step,
/// on the batch thread while the pool idled.
///
/// # Safety
/// Each call of `write` initializes every value of the chunk it is given.
pub(crate) unsafe fn written(
    len: usize,
    chunk: usize,
    on_pool: bool,
    write: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    let mut chunks: Vec<&mut [MaybeUninit<f32>]> = out.spare_capacity_mut()[..len]
        .chunks_mut(chunk.max(1))
        .collect();
    if on_pool && chunks.len() > 1 {
        each_on_pool(&mut chunks, |index, chunk| write(index, chunk));
    } else {
        for (index, chunk) in chunks.iter_mut().enumerate() {
            write(index, chunk);
        }
    }
    drop(chunks);
    // SAFETY: the chunks cover the first `len` values, and the caller
    // promised that `write` initialized every value of each.
    unsafe { out.set_len(len) };
    out
}

#[cfg(test)]
mod tests {
    use super::{claimed_on_pool, claimed_on_pool_after};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    #[test]
    fn the_pool_claims_every_item_once() {
        for items in [0, 1, 7, 64, 1000] {
            let claimed = Mutex::new(Vec::new());
            claimed_on_pool(items, |range| {
                assert!(!range.is_empty(), "an empty claim of {items}");
                claimed.lock().unwrap().push(range);
            });
            let mut claimed = claimed.into_inner().unwrap();
            claimed.sort_by_key(|range| range.start);
            let mut next = 0;
            for range in claimed {
                assert_eq!(range.start, next, "{items} items");
                next = range.end;
            }
            assert_eq!(next, items);
        }
    }

    #[test]
    fn each_job_runs_once_before_any_item_of_the_same_pass() {
        for (jobs, items) in [(0, 5), (1, 0), (2, 64), (9, 3)] {
            let runs: Vec<AtomicUsize> = (0..jobs).map(|_| AtomicUsize::new(0)).collect();
            let claimed = AtomicUsize::new(0);
            claimed_on_pool_after(
                jobs,
                |job| {
                    runs[job].fetch_add(1, Ordering::Relaxed);
                },
                items,
                |range| {
                    for (job, runs) in runs.iter().enumerate() {
                        assert_eq!(
                            runs.load(Ordering::Relaxed),
                            1,
                            "job {job} before {range:?}"
                        );
                    }
                    claimed.fetch_add(range.len(), Ordering::Relaxed);
                },
            );
            assert!(runs.iter().all(|runs| runs.load(Ordering::Relaxed) == 1));
            assert_eq!(claimed.into_inner(), items, "{jobs} jobs");
        }
    }
}
