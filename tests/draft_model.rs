//! Draft-model decoding (`EngineConfig::draft_model`): a small model drafts
//! tokens that the target checks in one pass. Greedy output must be the
//! target's, token for token; a draft with another tokenizer is refused.

use crate::common::{
    assert_ends_with_one_error_line, run_prism, write_tiny_model, TinyArch, TINY_VOCAB,
};
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, GenerateOptions, OpenError};
use std::path::Path;

fn source(dir: &Path, name: &str) -> ModelSource {
    ModelSource::HfDir {
        dir: dir.to_path_buf(),
        name: name.into(),
    }
}

fn config(target: &ModelSource, draft: Option<&ModelSource>) -> EngineConfig {
    EngineConfig {
        draft_model: draft.cloned(),
        ..EngineConfig::new(target.clone())
    }
}

fn open(target: &ModelSource, draft: Option<&ModelSource>) -> Engine {
    Engine::open(&config(target, draft)).expect("the models load")
}

/// A tiny model of `arch` written with `seed` into a new directory of `root`.
fn tiny(root: &Path, arch: TinyArch, seed: u64) -> ModelSource {
    let dir = root.join(format!("{arch:?}-{seed}"));
    std::fs::create_dir(&dir).unwrap();
    write_tiny_model(&dir, arch, seed);
    source(&dir, &format!("tiny-{arch:?}-{seed}"))
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![0, 5, 9, 13, 2, 40, 7],
        vec![0, 5, 9, 13, 2, 40, 7, 22, 31],
        (2..TINY_VOCAB as u32).step_by(3).collect(),
    ]
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    }
}

/// The target alone and with `draft`: the same tokens, stops and token
/// counts for each prompt, in turn on each engine (so later prompts start
/// from cached prefixes, the draft's too). Returns the drafted engine's
/// accepted model drafts.
fn same_greedy_output(target: &ModelSource, draft: &ModelSource) -> usize {
    let mut alone = open(target, None);
    let mut drafted = open(target, Some(draft));
    assert_eq!(
        drafted.identity().draft_model.as_deref(),
        Some(draft.name())
    );
    let mut accepted = 0;
    for prompt in prompts() {
        let expected = alone.generate(&prompt, &greedy(40)).unwrap();
        let got = drafted.generate(&prompt, &greedy(40)).unwrap();
        assert_eq!(expected.tokens, got.tokens, "prompt {prompt:?}");
        assert_eq!(expected.stop_reason, got.stop_reason);
        assert_eq!(expected.usage.output_tokens, got.usage.output_tokens);
        assert_eq!(expected.usage.decode_steps, got.usage.decode_steps);
        assert_eq!(expected.usage.reused_tokens, got.usage.reused_tokens);
        let usage = &got.usage;
        assert_eq!(
            usage.accepted_drafts,
            usage.accepted_lookup_drafts + usage.accepted_model_drafts,
            "every accepted draft is counted under its source"
        );
        accepted += usage.accepted_model_drafts;
    }
    accepted
}

#[test]
fn greedy_output_with_itself_as_draft_is_the_models() {
    let root = tempfile::tempdir().unwrap();
    let target = tiny(root.path(), TinyArch::Llama, 17);
    let accepted = same_greedy_output(&target, &target);
    assert!(accepted > 0, "the model as its own draft had none kept");
}

#[test]
fn greedy_output_with_another_model_as_draft_is_the_targets() {
    let root = tempfile::tempdir().unwrap();
    let target = tiny(root.path(), TinyArch::Llama, 17);
    // Other weights, and another architecture, over the same tokenizer.
    same_greedy_output(&target, &tiny(root.path(), TinyArch::Llama, 18));
    same_greedy_output(&target, &tiny(root.path(), TinyArch::Qwen2, 19));
}

/// Under sampling the drafts go through rejection sampling; a model
/// drafting for itself has (all but rounding) the target's distribution,
/// so nearly every draft is kept, and the same seed gives the same output.
#[test]
fn sampled_drafts_of_the_same_model_are_kept() {
    let root = tempfile::tempdir().unwrap();
    let target = tiny(root.path(), TinyArch::Qwen2, 23);
    let mut options = greedy(60);
    options.sampling.temperature = 0.8;
    options.sampling.top_k = Some(20);
    options.sampling.repeat_penalty = 1.1;
    options.sampling.seed = 5;
    let mut drafted = open(&target, Some(&target));
    let prompt = &prompts()[2];
    let first = drafted.generate(prompt, &options).unwrap();
    let usage = &first.usage;
    assert!(
        usage.accepted_model_drafts * 2 > usage.output_tokens,
        "{} of {} tokens were kept drafts",
        usage.accepted_model_drafts,
        usage.output_tokens
    );
    assert_eq!(
        usage.accepted_lookup_drafts, 0,
        "the tiny model checks no lookup drafts"
    );
    drafted.clear_cache();
    let again = drafted.generate(prompt, &options).unwrap();
    assert_eq!(first.tokens, again.tokens, "seeded: the same tokens");
}

/// A copy of the tiny model's directory whose tokenizer swaps two words.
fn with_swapped_words(root: &Path) -> ModelSource {
    let dir = root.join("swapped");
    std::fs::create_dir(&dir).unwrap();
    write_tiny_model(&dir, TinyArch::Llama, 17);
    let path = dir.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = &mut tokenizer["model"]["vocab"];
    vocab["w2"] = 3.into();
    vocab["w3"] = 2.into();
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    source(&dir, "tiny-swapped")
}

#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let target = tiny(root.path(), TinyArch::Llama, 17);
    let swapped = with_swapped_words(root.path());
    let err = Engine::open(&config(&target, Some(&swapped)))
        .err()
        .expect("refused");
    match &err {
        OpenError::DraftModel(prism::Error::DraftTokenizerMismatch { model, draft, .. }) => {
            assert_eq!(
                (model.as_str(), draft.as_str()),
                ("tiny-Llama-17", "tiny-swapped")
            );
        }
        other => panic!("not a tokenizer mismatch: {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.starts_with("draft_model tiny-swapped cannot draft for tiny-Llama-17"),
        "{message}"
    );
}

#[test]
fn the_cli_drafts_with_a_draft_model_and_refuses_a_mismatched_one() {
    let root = tempfile::tempdir().unwrap();
    let ModelSource::HfDir { dir: target, .. } = tiny(root.path(), TinyArch::Llama, 17) else {
        unreachable!("tiny models are directories")
    };
    let target = target.to_str().unwrap();
    let generate = |draft: &str| {
        run_prism(&[
            "generate",
            "--model",
            target,
            "--draft-model",
            draft,
            "--prompt",
            "w2 w3 w4 w5",
            "--max-tokens",
            "12",
            "--json",
        ])
    };
    let (success, stdout, stderr) = generate(target);
    assert!(success, "{stderr}");
    assert!(stderr.contains("drafting with"), "{stderr}");
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let total = &last["total"];
    let accepted = total["accepted_model_drafts"].as_u64().unwrap_or(0);
    assert!(accepted > 0, "{stdout}");
    assert_eq!(
        total["accepted_drafts"].as_u64(),
        Some(accepted),
        "{stdout}"
    );

    let ModelSource::HfDir { dir: swapped, .. } = with_swapped_words(root.path()) else {
        unreachable!("tiny models are directories")
    };
    assert_ends_with_one_error_line(
        &generate(swapped.to_str().unwrap()),
        "--draft-model swapped cannot draft for",
    );
}

/// The pair the check is for passes it, and a model of another family
/// does not: Qwen2.5-Coder-0.5B may draft for the 1.5B, SmolLM2 may not.
#[test]
fn qwen_coder_small_and_large_share_a_tokenizer_and_smollm2_does_not() {
    use crate::common::fetched_model;
    use prism::engine::prompt_format::PromptFormat;
    use prism::engine::speculative::tokenizer_difference;
    let format = |file: &str| {
        PromptFormat::load(&ModelSource::Gguf {
            path: fetched_model(file),
            name: file.into(),
        })
        .unwrap()
    };
    let small = format("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let large = format("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    let smollm2 = format("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        tokenizer_difference(large.tokenizer(), small.tokenizer()),
        None
    );
    let difference = tokenizer_difference(large.tokenizer(), smollm2.tokenizer());
    assert!(difference.is_some_and(|reason| reason.contains("vocabularies")));
}
