//! The engine's central promise: logits computed with a reused KV prefix equal
//! those of a fresh cache, for every shape of overlap between prompts.

use crate::common::{max_abs_diff, write_tiny_model, TinyArch, TINY_CONTEXT, TINY_VOCAB};
use prism::engine::device::DeviceChoice;
use prism::engine::kv_cache::KvDtype;
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, GenerateOptions, OpenError};
use rand::{Rng, SeedableRng};

const TOLERANCE: f32 = 1e-4;

fn load_tiny(arch: TinyArch, dir: &tempfile::TempDir) -> Engine {
    load_tiny_storing(arch, dir, KvDtype::F32)
}

/// The tiny model on the build's device; an 8-bit cache, which only the CPU
/// kernels read, on the CPU.
fn load_tiny_storing(arch: TinyArch, dir: &tempfile::TempDir, kv_dtype: KvDtype) -> Engine {
    let device = match kv_dtype {
        KvDtype::Q8 => DeviceChoice::Cpu,
        _ => DeviceChoice::Auto,
    };
    load_tiny_on(arch, dir, kv_dtype, device)
}

fn load_tiny_on(
    arch: TinyArch,
    dir: &tempfile::TempDir,
    kv_dtype: KvDtype,
    device: DeviceChoice,
) -> Engine {
    let config = EngineConfig {
        kv_dtype,
        device,
        ..tiny_config(arch, dir)
    };
    Engine::open(&config).expect("tiny model loads")
}

/// The tiny model, written to `dir`, with the engine's defaults.
fn tiny_config(arch: TinyArch, dir: &tempfile::TempDir) -> EngineConfig {
    write_tiny_model(dir.path(), arch, 17);
    EngineConfig::new(ModelSource::HfDir {
        dir: dir.path().to_path_buf(),
        name: format!("tiny-{arch:?}"),
    })
}

/// Between `lengths.start` and `lengths.end - 1` random word ids.
fn random_tokens(rng: &mut rand::rngs::StdRng, lengths: std::ops::Range<usize>) -> Vec<u32> {
    let len = rng.random_range(lengths);
    (0..len)
        .map(|_| rng.random_range(2..TINY_VOCAB as u32))
        .collect()
}

/// Run `second` after `first` on the caching engine and on a fresh one, and
/// compare the logits; returns the reused token count.
fn check_pair(cached: &mut Engine, fresh: &mut Engine, first: &[u32], second: &[u32]) -> usize {
    cached.prefill(first).unwrap();
    let (with_reuse, usage) = cached.prefill(second).unwrap();
    let (without, fresh_usage) = fresh.prefill(second).unwrap();
    assert_eq!(fresh_usage.reused_tokens, 0);
    let diff = max_abs_diff(&with_reuse, &without);
    assert!(
        diff <= TOLERANCE,
        "logits differ by {diff} for {first:?} then {second:?}"
    );
    usage.reused_tokens
}

/// What the engine reuses for `second` right after prefilling `first`: the
/// whole prompt when it is `first` again (its logits are kept), else the common
/// prefix, short of the last token, which must run to produce logits.
fn expected_reuse(first: &[u32], second: &[u32]) -> usize {
    if first == second {
        return second.len();
    }
    let common = first.iter().zip(second).take_while(|(a, b)| a == b).count();
    common.min(second.len() - 1)
}

fn reuse_matches_fresh_cache(arch: TinyArch) {
    reuse_matches_fresh_cache_storing(arch, KvDtype::F32);
}

fn reuse_matches_fresh_cache_storing(arch: TinyArch, kv_dtype: KvDtype) {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut cached = load_tiny_storing(arch, &dir_a, kv_dtype);
    let mut fresh = load_tiny_storing(arch, &dir_b, kv_dtype);
    fresh.set_prefix_cache(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2024);
    for round in 0..40 {
        let first = random_tokens(&mut rng, 1..80);
        let second = match round % 4 {
            // The identical prompt: everything cached, its logits kept.
            0 => first.clone(),
            // Nothing in common.
            1 => {
                let mut other = random_tokens(&mut rng, 1..60);
                other[0] = if first[0] == 2 { 3 } else { 2 };
                other
            }
            // Shorter than what is cached: a strict prefix of the first prompt.
            2 => first[..rng.random_range(1..=first.len())].to_vec(),
            // A shared prefix and a new tail longer than one prefill batch would be in a real model.
            _ => {
                let keep = rng.random_range(0..=first.len());
                let mut second = first[..keep].to_vec();
                second.extend(random_tokens(&mut rng, 1..100));
                second
            }
        };
        let reused = check_pair(&mut cached, &mut fresh, &first, &second);
        assert_eq!(reused, expected_reuse(&first, &second), "round {round}");
    }
}

#[test]
fn llama_logits_with_reuse_equal_a_fresh_cache() {
    reuse_matches_fresh_cache(TinyArch::Llama);
}

#[test]
fn qwen2_logits_with_reuse_equal_a_fresh_cache() {
    reuse_matches_fresh_cache(TinyArch::Qwen2);
}

#[test]
fn reuse_after_generation_covers_the_generated_tokens() {
    for arch in [TinyArch::Llama, TinyArch::Qwen2] {
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut cached = load_tiny(arch, &dir_a);
        let mut fresh = load_tiny(arch, &dir_b);
        fresh.set_prefix_cache(false);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..5 {
            let prompt = random_tokens(&mut rng, 2..40);
            let options = GenerateOptions {
                max_tokens: 12,
                ..GenerateOptions::default()
            };
            let generation = cached.generate(&prompt, &options).unwrap();
            // The cache holds the prompt and every generated token that was fed back.
            let mut follow_up = prompt.clone();
            follow_up.extend(&generation.tokens);
            follow_up.extend(random_tokens(&mut rng, 5..6));
            let (with_reuse, usage) = cached.prefill(&follow_up).unwrap();
            let fed_back = generation.usage.decode_steps;
            assert_eq!(usage.reused_tokens, prompt.len() + fed_back);
            let (without, _) = fresh.prefill(&follow_up).unwrap();
            assert!(max_abs_diff(&with_reuse, &without) <= TOLERANCE);
        }
    }
}

#[test]
fn greedy_generation_is_the_same_with_and_without_reuse() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut cached = load_tiny(TinyArch::Llama, &dir_a);
    let mut fresh = load_tiny(TinyArch::Llama, &dir_b);
    fresh.set_prefix_cache(false);
    let options = GenerateOptions {
        max_tokens: 20,
        ..GenerateOptions::default()
    };
    let prompt: Vec<u32> = (2..40).collect();
    cached.generate(&prompt[..30], &options).unwrap();
    let with_reuse = cached.generate(&prompt, &options).unwrap();
    let without = fresh.generate(&prompt, &options).unwrap();
    assert_eq!(with_reuse.tokens, without.tokens);
    assert_eq!(with_reuse.usage.reused_tokens, 30);
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = load_tiny(TinyArch::Qwen2, &dir);
    let prompt: Vec<u32> = (0..TINY_CONTEXT + 1).map(|i| 2 + (i % 60) as u32).collect();
    let err = engine.prefill(&prompt).unwrap_err();
    assert!(matches!(err, prism::Error::PromptTooLong { .. }), "{err}");
    // The engine is still usable afterwards.
    engine.prefill(&prompt[..10]).unwrap();
}

#[test]
fn an_unknown_architecture_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 1);
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("\"llama\"", "\"gpt_neox\""),
    )
    .unwrap();
    let source = ModelSource::HfDir {
        dir: dir.path().to_path_buf(),
        name: "odd".into(),
    };
    let err = Engine::open(&EngineConfig::new(source)).err().unwrap();
    assert!(
        err.to_string()
            .contains("unsupported architecture `gpt_neox`"),
        "{err}"
    );
}

#[test]
fn a_corrupt_gguf_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00 this is not a model").unwrap();
    let source = ModelSource::Gguf {
        path: path.clone(),
        name: "broken".into(),
    };
    let err = Engine::open(&EngineConfig::new(source)).err().unwrap();
    assert!(
        matches!(err, OpenError::Model(prism::Error::BadModelFile { .. })),
        "{err}"
    );
}

#[test]
fn a_stop_string_ends_generation_and_is_cut_from_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = load_tiny(TinyArch::Llama, &dir);
    let prompt: Vec<u32> = (2..12).collect();
    let free = engine
        .generate(
            &prompt,
            &GenerateOptions {
                max_tokens: 8,
                ..GenerateOptions::default()
            },
        )
        .unwrap();
    let first_word = free
        .text
        .split_whitespace()
        .next()
        .expect("the tiny model writes words")
        .to_string();
    let options = GenerateOptions {
        max_tokens: 8,
        stop: vec![first_word],
        ..GenerateOptions::default()
    };
    let stopped = engine.generate(&prompt, &options).unwrap();
    assert_eq!(stopped.stop_reason, prism::engine::StopReason::StopString);
    assert_eq!(stopped.text, "");
    assert_eq!(stopped.tokens.len(), 1);
}

/// With two cache slots, a prompt that shares only a short prefix with a long
/// cached sequence works in the other slot, so a later prompt that continues
/// the long sequence reuses all of it, with the logits of a fresh cache.
#[test]
fn a_second_slot_keeps_a_long_sequence_for_a_prompt_that_returns_to_it() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let two_slots = EngineConfig {
        cache_slots: 2,
        ..tiny_config(TinyArch::Llama, &dir_a)
    };
    let mut cached = Engine::open(&two_slots).unwrap();
    let mut fresh = load_tiny(TinyArch::Llama, &dir_b);
    fresh.set_prefix_cache(false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let document = random_tokens(&mut rng, 60..61);
    let mut question = document[..4].to_vec();
    question.extend(random_tokens(&mut rng, 10..11));
    for round in 0..3 {
        let mut refine = document.clone();
        refine.extend(random_tokens(&mut rng, 5..6));
        let reused = check_pair(&mut cached, &mut fresh, &question, &refine);
        let expected = if round == 0 { 4 } else { document.len() };
        assert_eq!(reused, expected, "round {round}");
        question.push(2 + round as u32);
    }
    // One slot: the question prompt evicts the document each time.
    let one_slot = EngineConfig {
        cache_slots: 1,
        ..two_slots
    };
    let mut cached = Engine::open(&one_slot).unwrap();
    cached.prefill(&document).unwrap();
    let mut refine = document.clone();
    refine.push(5);
    assert_eq!(check_pair(&mut cached, &mut fresh, &question, &refine), 4);
}

#[test]
fn a_cleared_cache_starts_cold_and_answers_as_a_fresh_engine() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = load_tiny(TinyArch::Qwen2, &dir);
    let mut fresh = load_tiny(TinyArch::Qwen2, &dir);
    let prompt: Vec<u32> = (2..30).collect();
    engine.prefill(&prompt).unwrap();
    engine.clear_cache();
    assert!(engine.cached_tokens().is_empty());
    let (logits, usage) = engine.prefill(&prompt).unwrap();
    assert_eq!(usage.reused_tokens, 0);
    let (expected, _) = fresh.prefill(&prompt).unwrap();
    assert!(max_abs_diff(&logits, &expected) <= TOLERANCE);
}

/// Perplexity scores each token of a window's second half by the logits the
/// model gives after that token's prefix: the same numbers as prefilling each
/// prefix from a fresh cache, so the windowed scoring path adds no error.
#[test]
fn perplexity_matches_the_logits_of_each_prefix() {
    use prism::engine::perplexity::Windows;
    let dir = tempfile::tempdir().unwrap();
    let mut engine = load_tiny(TinyArch::Llama, &dir);
    engine.set_prefix_cache(false);
    let text: Vec<String> = (0..40).map(|i| format!("w{}", 2 + (i * 7) % 60)).collect();
    let text = text.join(" ");
    let windows = Windows {
        context: 16,
        stride: 12,
    };
    let mut reported = Vec::new();
    let result = engine
        .perplexity(&text, windows, &mut |window, running| {
            reported.push((window, running))
        })
        .unwrap();

    let tokens = engine.text_prompt(&text).unwrap();
    let bos = engine
        .tokenizer()
        .bos_token_id()
        .filter(|_| engine.tokenizer().add_bos());
    let mut nll = Vec::new();
    let mut start = 0;
    while start + windows.context <= tokens.len() {
        let mut window = tokens[start..start + windows.context].to_vec();
        if let Some(bos) = bos {
            window[0] = bos;
        }
        for position in windows.context / 2..windows.context - 1 {
            let (logits, _) = engine.prefill(&window[..=position]).unwrap();
            let log_probs = candle_nn::ops::log_softmax(&logits, 0).unwrap();
            let log_probs = log_probs.to_vec1::<f32>().unwrap();
            nll.push(-f64::from(log_probs[window[position + 1] as usize]));
        }
        start += windows.stride;
    }
    let expected = (nll.iter().sum::<f64>() / nll.len() as f64).exp();
    assert_eq!(result.scored_tokens, nll.len());
    assert_eq!(result.windows, reported.len());
    assert_eq!(reported.last().unwrap().0, result.windows);
    assert!(
        (result.perplexity - expected).abs() / expected < 1e-4,
        "{} against {expected}",
        result.perplexity
    );
    assert!(result.standard_error > 0.0);
    // Too short a text for one window is a clear error.
    let err = engine
        .perplexity("w2 w3", windows, &mut |_, _| {})
        .unwrap_err();
    assert!(err.to_string().contains("needs at least"), "{err}");
}

/// The tiny model on the CPU, its sequences side by side: [`side_by_side_matches_alone`].
fn tiny_side_by_side_matches_alone(arch: TinyArch, kv_dtype: KvDtype) {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = load_tiny_on(arch, &dir, kv_dtype, DeviceChoice::Cpu);
    side_by_side_matches_alone(&mut engine, 4);
}

/// `sequences` sibling engines of `engine` decoding at once share batched
/// forward passes; each sequence's logits and greedy tokens must be what it
/// gets alone. On the CPU, whose kernels multiply each row alone; a GPU's
/// batched matmuls round rows otherwise, and a random model's near ties
/// then diverge.
fn side_by_side_matches_alone(engine: &mut Engine, sequences: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let jobs: Vec<(Vec<u32>, Vec<u32>)> = (0..sequences)
        .map(|_| {
            (
                random_tokens(&mut rng, 5..60),
                random_tokens(&mut rng, 8..24),
            )
        })
        .collect();
    let options = GenerateOptions {
        max_tokens: 12,
        ..GenerateOptions::default()
    };
    let alone: Vec<_> = jobs
        .iter()
        .map(|(prompt, steps)| {
            engine.clear_cache();
            engine.prefill(prompt).unwrap();
            let logits = engine.extend(steps).unwrap();
            engine.clear_cache();
            (logits, engine.generate(prompt, &options).unwrap().tokens)
        })
        .collect();
    let siblings: Vec<Engine> = jobs.iter().map(|_| engine.sibling().unwrap()).collect();
    let ready = std::sync::Barrier::new(jobs.len());
    let together: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = siblings
            .into_iter()
            .zip(&jobs)
            .map(|(mut sibling, (prompt, steps))| {
                let (ready, options) = (&ready, &options);
                scope.spawn(move || {
                    sibling.prefill(prompt).unwrap();
                    ready.wait();
                    let logits = sibling.extend(steps).unwrap();
                    sibling.clear_cache();
                    ready.wait();
                    (logits, sibling.generate(prompt, options).unwrap().tokens)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (number, ((alone_logits, alone_tokens), (logits, tokens))) in
        alone.iter().zip(&together).enumerate()
    {
        let diff = max_abs_diff(alone_logits, logits);
        assert!(
            diff <= TOLERANCE,
            "sequence {number}: logits differ by {diff}"
        );
        assert_eq!(alone_tokens, tokens, "sequence {number}: greedy tokens");
    }
}

#[test]
fn llama_sequences_side_by_side_match_each_alone() {
    tiny_side_by_side_matches_alone(TinyArch::Llama, KvDtype::F32);
}

#[test]
fn qwen2_sequences_side_by_side_match_each_alone() {
    tiny_side_by_side_matches_alone(TinyArch::Qwen2, KvDtype::F32);
}

#[test]
fn sequences_side_by_side_with_an_8_bit_cache_match_each_alone() {
    tiny_side_by_side_matches_alone(TinyArch::Qwen2, KvDtype::Q8);
}

/// Sixteen sequences of SmolLM2 (GGUF, Q4_1, on prism's kernels): on a
/// CPU of two threads or more, each thread runs its own eight through the
/// model (passes shared out by thread); on one, one pass takes all sixteen.
/// The tiny models' f32 matmuls are candle's, which round a row by the
/// number of rows beside it, so they are checked at four.
#[test]
fn sixteen_smollm2_sequences_side_by_side_match_each_alone() {
    let source = ModelSource::Gguf {
        path: crate::common::fetched_model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        name: "smollm2-135m-instruct".into(),
    };
    let config = EngineConfig {
        device: DeviceChoice::Cpu,
        ..EngineConfig::new(source)
    };
    let mut engine = Engine::open(&config).expect("SmolLM2 loads");
    side_by_side_matches_alone(&mut engine, 16);
}

/// A 16-bit cache rounds every key and value, cached or not, so reuse
/// still agrees with a fresh cache of the same dtype to 1e-4.
#[test]
fn with_a_16_bit_cache_reuse_still_equals_a_fresh_cache() {
    reuse_matches_fresh_cache_storing(TinyArch::Llama, KvDtype::F16);
    reuse_matches_fresh_cache_storing(TinyArch::Qwen2, KvDtype::Bf16);
}

/// An 8-bit cache rounds each key and value once, when it is written, so
/// reuse agrees with a fresh 8-bit cache to 1e-4 as well.
#[test]
fn with_an_8_bit_cache_reuse_still_equals_a_fresh_cache() {
    reuse_matches_fresh_cache_storing(TinyArch::Llama, KvDtype::Q8);
    reuse_matches_fresh_cache_storing(TinyArch::Qwen2, KvDtype::Q8);
}

/// Against f32 storage the rounding shows: prompt and decode logits stay
/// within the bound the README gives for `--kv-dtype f16`, `bf16` and `q8`.
#[test]
fn a_rounded_cache_keeps_logits_near_the_f32_ones() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let prompt = random_tokens(&mut rng, 60..61);
    let steps = random_tokens(&mut rng, 10..11);
    // On the CPU, whose activations are f32 (a GPU's are bf16) in every build.
    let dir = tempfile::tempdir().unwrap();
    let mut exact = load_tiny_on(TinyArch::Llama, &dir, KvDtype::F32, DeviceChoice::Cpu);
    let prompt_f32 = exact.prefill(&prompt).unwrap().0;
    let decode_f32 = exact.extend(&steps).unwrap();
    for (kv_dtype, bound) in [
        (KvDtype::F16, 1e-3),
        (KvDtype::Bf16, 1e-2),
        (KvDtype::Q8, 1e-2),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut rounded = load_tiny_on(TinyArch::Llama, &dir, kv_dtype, DeviceChoice::Cpu);
        let prompt_diff = max_abs_diff(&prompt_f32, &rounded.prefill(&prompt).unwrap().0);
        let decode_diff = max_abs_diff(&decode_f32, &rounded.extend(&steps).unwrap());
        assert!(prompt_diff > 0.0, "{kv_dtype:?} changed nothing");
        assert!(
            prompt_diff <= bound && decode_diff <= bound,
            "{kv_dtype:?}: prompt logits differ by {prompt_diff}, decode by {decode_diff}"
        );
    }
}

#[test]
fn side_by_side_figures_come_one_per_sequence_count_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = load_tiny(TinyArch::Llama, &dir);
    let figures =
        prism::bench::engine::measure_side_by_side(&mut engine, &[1, 3], 16, 4, 2).unwrap();
    let counts: Vec<usize> = figures.iter().map(|f| f.sequences).collect();
    assert_eq!(counts, [1, 3]);
    for f in &figures {
        assert_eq!((f.context_tokens, f.decode_steps), (16, 4));
        assert!(f.decode_tokens_per_second.is_finite() && f.decode_tokens_per_second > 0.0);
    }
}
