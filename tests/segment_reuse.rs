//! Segment reuse (`--reuse-segments`): runs of a cached sequence taken at
//! new positions, counted apart, and exact when every token is recomputed.

use crate::common::{max_abs_diff, tiny_chat_model};
use candle_core::Tensor;
use prism::engine::segments::SegmentReuse;
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, GenerateOptions, PromptCacheConfig, Usage};
use std::path::Path;

fn engine(dir: &Path, reuse: Option<SegmentReuse>) -> Engine {
    engine_with_disk(dir, reuse, None)
}

/// The tiny model in `dir`, with `reuse` and a prompt cache in `kv` when given.
fn engine_with_disk(dir: &Path, reuse: Option<SegmentReuse>, kv: Option<&Path>) -> Engine {
    let source = ModelSource::HfDir {
        dir: dir.to_path_buf(),
        name: "tiny".into(),
    };
    Engine::open(&EngineConfig {
        segment_reuse: reuse,
        prompt_cache: kv.map(|kv| PromptCacheConfig {
            dir: kv.to_path_buf(),
            budget_bytes: 1 << 30,
        }),
        ..EngineConfig::new(source)
    })
    .unwrap()
}

/// `n` word ids of the tiny model that do not repeat in short runs.
fn word_ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 2 + (i * 7 + i / 62) % 62).collect()
}

/// A 200-token prompt, then the same with 7 tokens put in after its 50th:
/// the last 150 tokens move 7 positions on.
fn edited_prompts() -> (Vec<u32>, Vec<u32>) {
    let first = word_ids(200);
    let edited = [&first[..50], &[60, 61, 62, 63, 60, 61, 62], &first[50..]].concat();
    (first, edited)
}

/// The logits and usage of `edited` after `first`, on an engine with `reuse`.
fn prefill_after_edit(model: &Path, reuse: Option<SegmentReuse>) -> (Tensor, Usage) {
    let (first, edited) = edited_prompts();
    let mut engine = engine(model, reuse);
    engine.prefill(&first).unwrap();
    engine.prefill(&edited).unwrap()
}

#[test]
fn a_run_moved_by_an_edit_is_taken_after_its_first_tokens_and_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    tiny_chat_model(dir.path());
    let reuse = SegmentReuse {
        min_tokens: 16,
        recompute_tokens: 4,
    };
    let (logits, usage) = prefill_after_edit(dir.path(), Some(reuse));
    // 50 tokens of exact prefix; the 150 moved ones less the last (always
    // computed) and the 4 recomputed are taken.
    assert_eq!(usage.prompt_tokens, 207);
    assert_eq!(usage.reused_tokens, 50);
    assert_eq!((usage.segment_tokens, usage.recomputed_tokens), (145, 4));
    let (exact, exact_usage) = prefill_after_edit(dir.path(), None);
    assert_eq!(
        exact_usage.segment_tokens + exact_usage.recomputed_tokens,
        0
    );
    let moved = max_abs_diff(&logits, &exact);
    assert!(
        moved.is_finite() && moved > 0.0,
        "taken rows were computed after other text, so the logits move: {moved}"
    );
}

#[test]
fn every_token_of_a_run_recomputed_gives_the_logits_of_exact_reuse() {
    let dir = tempfile::tempdir().unwrap();
    tiny_chat_model(dir.path());
    let everything = SegmentReuse {
        min_tokens: 16,
        recompute_tokens: usize::MAX,
    };
    let (logits, usage) = prefill_after_edit(dir.path(), Some(everything));
    assert_eq!((usage.segment_tokens, usage.recomputed_tokens), (0, 149));
    let (exact, _) = prefill_after_edit(dir.path(), None);
    let diff = max_abs_diff(&logits, &exact);
    assert!(diff <= 1e-4, "logits differ by {diff}");
}

#[test]
fn a_prompt_with_no_cached_run_is_encoded_as_without_segment_reuse() {
    let dir = tempfile::tempdir().unwrap();
    tiny_chat_model(dir.path());
    let first = word_ids(120);
    let other: Vec<u32> = first.iter().map(|id| 2 + (id * 5) % 62).collect();
    let logits_of = |reuse: Option<SegmentReuse>| {
        let mut engine = engine(dir.path(), reuse);
        engine.prefill(&first).unwrap();
        let (logits, usage) = engine.prefill(&other).unwrap();
        assert_eq!(usage.segment_tokens, 0);
        logits.to_vec1::<f32>().unwrap()
    };
    assert_eq!(logits_of(Some(SegmentReuse::default())), logits_of(None));
}

/// Taken rows are approximate, so the prompt cache on disk keeps only the
/// prefix before them: another process restores the edited prompt up to
/// the edit, not the moved run.
#[test]
fn rows_taken_from_segments_never_reach_the_prompt_cache_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    tiny_chat_model(dir.path());
    let kv = dir.path().join("kv");
    let first = word_ids(600);
    let edited = [&first[..300], &[60, 61, 62, 63, 60, 61, 62], &first[300..]].concat();
    let one_token = GenerateOptions {
        max_tokens: 1,
        ..GenerateOptions::default()
    };
    let mut reusing = engine_with_disk(dir.path(), Some(SegmentReuse::default()), Some(&kv));
    reusing.generate(&first, &one_token).unwrap();
    let edit = reusing.generate(&edited, &one_token).unwrap();
    assert!(edit.usage.segment_tokens > 200, "{:?}", edit.usage);
    let (_, restored) = engine_with_disk(dir.path(), None, Some(&kv))
        .prefill(&edited)
        .unwrap();
    // Up to the edit (an inserted token may happen to match the next one).
    let shared = first
        .iter()
        .zip(&edited)
        .take_while(|(a, b)| a == b)
        .count();
    assert!((300..307).contains(&shared));
    assert_eq!(restored.restored_tokens, shared, "{restored:?}");
}
