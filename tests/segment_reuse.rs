//! Segment reuse (`--reuse-segments`): runs of a cached sequence taken at
//! new positions, counted apart, and exact when every token is recomputed.

use crate::common::{max_abs_diff, tiny_chat_model};
use candle_core::Tensor;
use prism::engine::segments::SegmentReuse;
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, Usage};
use std::path::Path;

fn engine(dir: &Path, reuse: Option<SegmentReuse>) -> Engine {
    let source = ModelSource::HfDir {
        dir: dir.to_path_buf(),
        name: "tiny".into(),
    };
    Engine::open(&EngineConfig {
        segment_reuse: reuse,
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
