//! Engine speed: prefill and decode tokens per second at a given context length, and
//! the time to answer a prompt whose first 90% is cached.

use crate::engine::Engine;
use crate::error::Result;
use std::time::Instant;

/// Token ids below this are left out of random prompts: both model families
/// keep their special tokens at the ends of the vocabulary.
const FIRST_ORDINARY_ID: u32 = 1000;
const LAST_ORDINARY_ID: u32 = 30_000;

/// Figures for one context length.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineFigures {
    pub context_tokens: usize,
    pub prefill_tokens_per_second: f64,
    /// Single-token steps after `context_tokens` tokens of context.
    pub decode_tokens_per_second: f64,
    pub decode_steps: usize,
    /// Seconds to the first token of a prompt whose first 90% is cached…
    pub warm_90_seconds: f64,
    /// …and of the same prompt with nothing cached.
    pub cold_seconds: f64,
    /// The process's peak resident memory so far, model included (Linux's
    /// VmHWM); absent where the system does not say.
    pub peak_rss_bytes: Option<u64>,
}

/// `count` pseudo-random ordinary token ids from `seed`, as llama.cpp's
/// `llama-bench` uses random ids for its prompts. A plain 64-bit LCG
/// (Knuth's MMIX constants), so that `scripts/compare-llama-cpp` draws the very
/// same ids in Python. A vocabulary that ends before the ordinary ids begin
/// (a test's tiny model) gives ids from all of it.
pub fn random_prompt(seed: u64, count: usize, vocab_size: usize) -> Vec<u32> {
    let vocab_end = u32::try_from(vocab_size).unwrap_or(u32::MAX).max(1);
    let (first, end) = if vocab_end > FIRST_ORDINARY_ID {
        (FIRST_ORDINARY_ID, LAST_ORDINARY_ID.min(vocab_end))
    } else {
        (0, vocab_end)
    };
    let span = u64::from(end - first);
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            first + ((state >> 33) % span) as u32
        })
        .collect()
}

/// Measure `engine` at `context_tokens` of context, best of `repeats` runs each.
pub fn measure(
    engine: &mut Engine,
    context_tokens: usize,
    decode_steps: usize,
    repeats: usize,
) -> Result<EngineFigures> {
    let vocab = engine.config().vocab_size;
    let prompt = random_prompt(42, context_tokens, vocab);
    let best = |seconds: &mut f64, elapsed: f64| *seconds = seconds.min(elapsed);

    // Cold prefill and decode: reuse off, so every run computes the whole prompt.
    engine.set_prefix_cache(false);
    let (mut cold, mut decode) = (f64::INFINITY, f64::INFINITY);
    let steps = random_prompt(7, decode_steps, vocab);
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        engine.prefill(&prompt)?;
        best(&mut cold, start.elapsed().as_secs_f64());
        let start = Instant::now();
        engine.extend(&steps)?;
        best(&mut decode, start.elapsed().as_secs_f64());
    }

    // Warm: the cache holds the first 90% of the prompt and a different tail.
    engine.set_prefix_cache(true);
    let shared = context_tokens * 9 / 10;
    let mut primer = prompt[..shared].to_vec();
    primer.extend(random_prompt(99, context_tokens - shared, vocab));
    let mut warm = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        // Only the primer may be cached: the cold runs left the whole prompt
        // in a slot, where the timed prefill would find all of it.
        engine.clear_cache();
        engine.prefill(&primer)?;
        let start = Instant::now();
        engine.prefill(&prompt)?;
        best(&mut warm, start.elapsed().as_secs_f64());
    }

    Ok(EngineFigures {
        context_tokens,
        prefill_tokens_per_second: context_tokens as f64 / cold,
        decode_tokens_per_second: decode_steps as f64 / decode,
        decode_steps,
        warm_90_seconds: warm,
        cold_seconds: cold,
        peak_rss_bytes: std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| peak_rss(&status)),
    })
}

/// Decode speed of several sequences stepping side by side.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SideBySideFigures {
    pub sequences: usize,
    pub context_tokens: usize,
    pub decode_steps: usize,
    /// Tokens of all the sequences together per second of wall time.
    pub decode_tokens_per_second: f64,
}

/// `measure_side_by_side_once` for each count of `sequences`, best of
/// `repeats` runs each. The counts take turns within each round, so that a
/// shared host's slow minutes fall on all of them alike rather than on the
/// one measured then: a ratio of two counts is only as good as that.
pub fn measure_side_by_side(
    engine: &mut Engine,
    sequences: &[usize],
    context_tokens: usize,
    decode_steps: usize,
    repeats: usize,
) -> Result<Vec<SideBySideFigures>> {
    let mut best: Vec<Option<SideBySideFigures>> = vec![None; sequences.len()];
    for _ in 0..repeats.max(1) {
        for (best, &count) in best.iter_mut().zip(sequences) {
            let figures = measure_side_by_side_once(engine, count, context_tokens, decode_steps)?;
            let faster = best.as_ref().is_none_or(|best| {
                figures.decode_tokens_per_second > best.decode_tokens_per_second
            });
            if faster {
                *best = Some(figures);
            }
        }
    }
    Ok(best.into_iter().flatten().collect())
}

/// Decode `decode_steps` tokens in each of `sequences` sequences at once,
/// every one on its own [`Engine::sibling`] and thread after the same
/// `context_tokens`-token prompt, so that their steps batch as they would
/// for runs side by side; timed from when all have their prompt encoded.
fn measure_side_by_side_once(
    engine: &mut Engine,
    sequences: usize,
    context_tokens: usize,
    decode_steps: usize,
) -> Result<SideBySideFigures> {
    let vocab = engine.config().vocab_size;
    let prompt = random_prompt(42, context_tokens, vocab);
    let steps = random_prompt(7, decode_steps, vocab);
    let mut siblings = Vec::with_capacity(sequences);
    for _ in 0..sequences.max(1) {
        siblings.push(engine.sibling()?);
    }
    let ready = std::sync::Barrier::new(siblings.len() + 1);
    let seconds = std::thread::scope(|scope| {
        let workers: Vec<_> = siblings
            .into_iter()
            .map(|mut sibling| {
                let (prompt, steps, ready) = (&prompt, &steps, &ready);
                scope.spawn(move || {
                    let prefilled = sibling.prefill(prompt).map(|_| ());
                    ready.wait();
                    prefilled.and_then(|()| sibling.extend(steps).map(|_| ()))
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        for worker in workers {
            worker.join().map_err(|_| crate::Error::Batch {
                reason: "a benchmark thread panicked".to_string(),
            })??;
        }
        Ok::<f64, crate::Error>(start.elapsed().as_secs_f64())
    })?;
    Ok(SideBySideFigures {
        sequences: sequences.max(1),
        context_tokens,
        decode_steps,
        decode_tokens_per_second: (sequences.max(1) * decode_steps) as f64 / seconds,
    })
}

/// The `VmHWM` line of a `/proc/<pid>/status` text, in bytes.
fn peak_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_prompts_are_reproducible_and_in_range() {
        let prompt = super::random_prompt(42, 1000, 49_152);
        assert_eq!(prompt, super::random_prompt(42, 1000, 49_152));
        assert!(prompt.iter().all(|&id| (1000..30_000).contains(&id)));
        // The first ids, as scripts/compare-llama-cpp computes them too.
        assert_eq!(&prompt[..3], &[4_334, 25_026, 5_538]);
        let tiny = super::random_prompt(42, 1000, 64);
        assert!(tiny.iter().all(|&id| id < 64));
    }

    #[test]
    fn peak_rss_is_read_from_vmhwm() {
        let status = "Name:\tprism\nVmPeak:\t  900000 kB\nVmHWM:\t  123456 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(super::peak_rss(status), Some(123_456 * 1024));
        assert_eq!(super::peak_rss("Name:\tprism\n"), None);
    }
}
