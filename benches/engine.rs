//! Criterion micro-benchmarks of the engine on the default model (fetch it with
//! `scripts/setup` first): prefill at 128, 512 and 2048 tokens, one decode step
//! at 512 and 2048 tokens of context, and a prompt whose first 90% is cached
//! against the same prompt cold.
//!
//!     cargo bench --bench engine
//!
//! `prism bench-engine` reports the same figures as tokens per second, and
//! `scripts/compare-llama-cpp` sets them next to llama.cpp's.

use criterion::{criterion_group, criterion_main, Bencher, BenchmarkId, Criterion, Throughput};
use prism::bench::engine::random_prompt;
use prism::engine::{Engine, EngineConfig};
use prism::models::{resolve, DEFAULT_MODEL};
use std::time::{Duration, Instant};

fn load() -> Option<Engine> {
    prism::engine::allocator::reuse_freed_buffers();
    let opened = resolve(DEFAULT_MODEL)
        .and_then(|source| Engine::open(&EngineConfig::new(source)).map_err(prism::Error::from));
    match opened {
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
    // With reuse on, going back to the context before each step costs only a
    // cache truncation: the prompt's tokens and logits are still held.
    engine.set_prefix_cache(true);
    for context in [512, 2048] {
        let prompt = random_prompt(42, context, vocab);
        decode.throughput(Throughput::Elements(1));
        decode.bench_function(BenchmarkId::from_parameter(context), |b| {
            // Each step starts again from the same context, so the cache never
            // grows past `context` + 1.
            time_after_setup(
                b,
                &mut engine,
                |engine| engine.prefill(&prompt).map(drop),
                |engine| engine.extend(&[1234]).map(drop),
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
        time_after_setup(
            b,
            &mut engine,
            |engine| engine.prefill(&primer).map(drop),
            |engine| engine.prefill(&prompt).map(drop),
        )
    });
    engine.set_prefix_cache(false);
    reuse.bench_function("cold", |b| {
        b.iter(|| engine.prefill(&prompt).expect("prefill"))
    });
    reuse.finish();
}

/// Time `routine` alone, with `setup` run untimed before each call. Both need
/// the engine mutably, which `iter_batched`'s two closures cannot share.
fn time_after_setup(
    b: &mut Bencher,
    engine: &mut Engine,
    setup: impl Fn(&mut Engine) -> prism::Result<()>,
    routine: impl Fn(&mut Engine) -> prism::Result<()>,
) {
    b.iter_custom(|iterations| {
        let mut timed = Duration::ZERO;
        for _ in 0..iterations {
            setup(engine).expect("setup");
            let start = Instant::now();
            routine(engine).expect("timed call");
            timed += start.elapsed();
        }
        timed
    })
}

criterion_group!(benches, engine_benches);
criterion_main!(benches);
