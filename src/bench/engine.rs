//! Engine speed: prefill and decode tokens per second at a given context
//! length, and the time to answer a prompt whose first 90% is cached.
//!
//! Prompts are seeded random token ids, as llama.cpp's `llama-bench` uses, so
//! that `scripts/compare-llama-cpp` can feed llama.cpp exactly the same ids.

use crate::engine::Engine;
use crate::error::Result;
use rand::{Rng, SeedableRng};
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
}

/// `count` random ordinary token ids from `seed`; `scripts/compare-llama-cpp` draws the same.
pub fn random_prompt(seed: u64, count: usize, vocab_size: usize) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let last = LAST_ORDINARY_ID.min(vocab_size as u32);
    (0..count)
        .map(|_| rng.random_range(FIRST_ORDINARY_ID..last))
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
        for &token in &steps {
            engine.extend(&[token])?;
        }
        best(&mut decode, start.elapsed().as_secs_f64());
    }

    // Warm: the cache holds the first 90% of the prompt and a different tail.
    engine.set_prefix_cache(true);
    let shared = context_tokens * 9 / 10;
    let mut primer = prompt[..shared].to_vec();
    primer.extend(random_prompt(99, context_tokens - shared, vocab));
    let mut warm = f64::INFINITY;
    for _ in 0..repeats.max(1) {
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
    })
}
