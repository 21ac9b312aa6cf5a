//! Drafted decoding (`Engine::set_draft_tokens`): tokens that followed the
//! same few tokens earlier in the text are checked in one pass with the
//! token before them. The output, the cache left behind and the accounting
//! must be what decoding a token a pass gives; only the speed may differ.

use crate::common::fetched_model;
use prism::engine::chat::ChatMessage;
use prism::engine::constraint::Grammar;
use prism::engine::source::ModelSource;
use prism::engine::{Engine, GenerateOptions, LoadOptions};

const SMOLLM2: (&str, &str) = ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct");
const QWEN: (&str, &str) = (
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct",
);

fn load((file, name): (&str, &str), draft_tokens: usize) -> Engine {
    let source = ModelSource::Gguf {
        path: fetched_model(file),
        name: name.into(),
    };
    let mut engine = Engine::load(&source, &LoadOptions::default()).expect("the model loads");
    engine.set_draft_tokens(draft_tokens);
    engine
}

/// A prompt whose answer repeats the document, so that drafts are found.
fn copying_prompt(engine: &Engine) -> Vec<u32> {
    let log = include_str!("fixtures/keeper-log.txt");
    let excerpt: String = log.chars().take(900).collect();
    engine
        .chat_prompt(&[ChatMessage::user(format!(
            "Copy this text word for word:\n\n{excerpt}"
        ))])
        .unwrap()
}

/// Generate with drafting off and on: the same tokens, text, stop and
/// counts, drafts accepted only when on, and caches that serve the next
/// prompt the same way.
fn drafting_changes_nothing_but_passes(model: (&str, &str), options: GenerateOptions) {
    let mut plain = load(model, 0);
    let mut drafted = load(model, 4);
    let prompt = copying_prompt(&plain);
    let alone = plain.generate(&prompt, &options).unwrap();
    let checked = drafted.generate(&prompt, &options).unwrap();
    assert_eq!(alone.tokens, checked.tokens);
    assert_eq!(alone.text, checked.text);
    assert_eq!(alone.stop_reason, checked.stop_reason);
    assert_eq!(alone.usage.output_tokens, checked.usage.output_tokens);
    assert_eq!(alone.usage.decode_steps, checked.usage.decode_steps);
    assert_eq!(alone.usage.accepted_drafts, 0);
    assert!(
        checked.usage.accepted_drafts > 0,
        "no drafted token was accepted, so nothing was compared: {:?}",
        checked.text
    );

    let mut next = prompt.clone();
    next.extend(&alone.tokens);
    next.extend(&prompt[prompt.len() - 3..]);
    let short = GenerateOptions {
        max_tokens: 4,
        ..GenerateOptions::default()
    };
    let after_alone = plain.generate(&next, &short).unwrap();
    let after_checked = drafted.generate(&next, &short).unwrap();
    assert_eq!(
        after_alone.usage.reused_tokens,
        after_checked.usage.reused_tokens
    );
    assert_eq!(after_alone.tokens, after_checked.tokens);
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    }
}

fn sampled(max_tokens: usize) -> GenerateOptions {
    let mut options = greedy(max_tokens);
    options.sampling.temperature = 0.7;
    options.sampling.seed = 11;
    options
}

#[test]
fn smollm2_greedy_output_is_the_same_with_drafts() {
    drafting_changes_nothing_but_passes(SMOLLM2, greedy(80));
}

#[test]
fn smollm2_sampled_output_is_the_same_with_drafts() {
    drafting_changes_nothing_but_passes(SMOLLM2, sampled(80));
}

#[test]
fn smollm2_constrained_output_is_the_same_with_drafts() {
    let options = GenerateOptions {
        grammar: Some(Grammar::Regex("[A-Za-z0-9 ,.'\n-]{1,300}".into())),
        ..greedy(80)
    };
    drafting_changes_nothing_but_passes(SMOLLM2, options);
}

#[test]
fn qwen2_greedy_and_sampled_output_is_the_same_with_drafts() {
    drafting_changes_nothing_but_passes(QWEN, greedy(60));
    drafting_changes_nothing_but_passes(QWEN, sampled(60));
}
