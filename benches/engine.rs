//! Criterion micro-benchmarks of the engine on the default model (fetch it with
//! `scripts/setup` first): prefill at 128, 512 and 2048 tokens, one decode step
//! at 512 and 2048 tokens of context, and a prompt whose first 90% is cached
//! against the same prompt cold.
//!
//!     cargo bench --bench engine
//!
//! `prism bench-engine` reports the same figures as tokens per second, and
//! `scripts/compare-llama-cpp` sets them next to llama.cpp's.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prism::bench::engine::random_prompt;
use prism::engine::source::{resolve, DEFAULT_MODEL};
use prism::engine::{Engine, LoadOptions};
use std::time::Duration;

fn load() -> Option<Engine> {
    match resolve(DEFAULT_MODEL).and_then(|source| Engine::load(&source, &LoadOptions::default())) {
        Ok(engine) => Some(engine),
        Err(err) => {
            eprintln!("skipping engine benchmarks: {err}");
            None
        }
    }
}

fn engine_benches(c: &mut Criterion) {
    let Some(mut engine) = load() else { return };
    let vocab = engine.config().vocab_size;

    let mut prefill = c.benchmark_group("prefill");
    prefill
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    engine.set_prefix_cache(false);
    for tokens in [128, 512, 2048] {
        let prompt = random_prompt(42, tokens, vocab);
        prefill.throughput(Throughput::Elements(tokens as u64));
        prefill.bench_with_input(BenchmarkId::from_parameter(tokens), &prompt, |b, prompt| {
            b.iter(|| engine.prefill(prompt).expect("prefill"))
        });
    }
    prefill.finish();

    let mut decode = c.benchmark_group("decode_step");
    decode.sample_size(20);
    for context in [512, 2048] {
        let prompt = random_prompt(42, context, vocab);
        decode.throughput(Throughput::Elements(1));
        decode.bench_function(BenchmarkId::from_parameter(context), |b| {
            // Each sample starts again from the same context, so the cache never
            // grows far past `context`.
            b.iter_batched(
                || engine.prefill(&prompt).expect("prefill"),
                |_| engine.extend(&[1234]).expect("decode step"),
                criterion::BatchSize::PerIteration,
            )
        });
    }
    decode.finish();

    let mut reuse = c.benchmark_group("prompt_2048_90pct_cached");
    reuse
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let prompt = random_prompt(42, 2048, vocab);
    let mut primer = prompt[..1843].to_vec();
    primer.extend(random_prompt(99, 2048 - 1843, vocab));
    engine.set_prefix_cache(true);
    reuse.bench_function("warm", |b| {
        b.iter_batched(
            || engine.prefill(&primer).expect("primer"),
            |_| engine.prefill(&prompt).expect("prefill"),
            criterion::BatchSize::PerIteration,
        )
    });
    engine.set_prefix_cache(false);
    reuse.bench_function("cold", |b| {
        b.iter(|| engine.prefill(&prompt).expect("prefill"))
    });
    reuse.finish();
}

criterion_group!(benches, engine_benches);
criterion_main!(benches);
