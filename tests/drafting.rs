//! Drafted decoding (`EngineConfig::draft_tokens`): tokens that followed the
//! same few tokens earlier in the text are checked in one pass with the
//! token before them. The output, the cache left behind and the accounting
//! must be what decoding a token a pass gives; only the speed may differ.

use crate::common::fetched_model;
use prism::engine::chat::ChatMessage;
use prism::engine::constraint::Grammar;
use prism::engine::kv_cache::KvDtype;
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, GenerateOptions};

const SMOLLM2: (&str, &str) = ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct");
const QWEN: (&str, &str) = (
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct",
);

fn load(model: (&str, &str), draft_tokens: usize) -> Engine {
    load_with_cache(model, draft_tokens, KvDtype::default())
}

fn load_with_cache((file, name): (&str, &str), draft_tokens: usize, kv_dtype: KvDtype) -> Engine {
    let source = ModelSource::Gguf {
        path: fetched_model(file),
        name: name.into(),
    };
    let config = EngineConfig {
        kv_dtype,
        draft_tokens,
        ..EngineConfig::new(source)
    };
    Engine::open(&config).expect("the model loads")
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

/// SmolLM2 drafting for itself beside lookup drafts: the rounds take
/// whichever source has been kept more often, greedy output (free and under
/// a grammar) is the model's alone, and kept drafts are counted by source.
#[test]
fn smollm2_as_its_own_draft_model_changes_nothing_but_passes() {
    let (file, name) = SMOLLM2;
    let source = ModelSource::Gguf {
        path: fetched_model(file),
        name: name.into(),
    };
    let mut plain = load(SMOLLM2, 4);
    let mut drafted = Engine::open(&EngineConfig {
        draft_model: Some(source.clone()),
        ..EngineConfig::new(source)
    })
    .expect("the model loads");
    let prompt = copying_prompt(&plain);
    let constrained = GenerateOptions {
        grammar: Some(Grammar::Regex("[A-Za-z0-9 ,.'\n-]{1,300}".into())),
        ..greedy(60)
    };
    for options in [greedy(60), constrained] {
        let alone = plain.generate(&prompt, &options).unwrap();
        let checked = drafted.generate(&prompt, &options).unwrap();
        assert_eq!(alone.tokens, checked.tokens);
        assert_eq!(alone.stop_reason, checked.stop_reason);
        assert_eq!(alone.usage.decode_steps, checked.usage.decode_steps);
        let usage = &checked.usage;
        assert!(usage.accepted_model_drafts > 0, "{usage:?}");
        assert_eq!(
            usage.accepted_drafts,
            usage.accepted_lookup_drafts + usage.accepted_model_drafts
        );
    }
}

/// Under sampling and a grammar, SmolLM2's drafts for itself go through
/// rejection sampling under the grammar's mask: most are kept, and the
/// output stays inside the grammar.
#[test]
fn smollm2_sampled_drafts_for_itself_keep_to_the_grammar() {
    let (file, name) = SMOLLM2;
    let source = ModelSource::Gguf {
        path: fetched_model(file),
        name: name.into(),
    };
    let mut drafted = Engine::open(&EngineConfig {
        draft_tokens: 0,
        draft_model: Some(source.clone()),
        ..EngineConfig::new(source)
    })
    .expect("the model loads");
    let prompt = copying_prompt(&drafted);
    let options = GenerateOptions {
        grammar: Some(Grammar::Regex("[a-z ,.]{1,300}".into())),
        ..sampled(60)
    };
    let generation = drafted.generate(&prompt, &options).unwrap();
    let usage = &generation.usage;
    assert!(
        usage.accepted_model_drafts * 2 > usage.output_tokens,
        "{usage:?}"
    );
    assert_eq!(usage.accepted_lookup_drafts, 0, "lookup drafting is off");
    assert!(
        generation
            .text
            .chars()
            .all(|c| c.is_ascii_lowercase() || " ,.".contains(c)),
        "{:?}",
        generation.text
    );
}

/// The pass that checks drafts gives each row the bits of a decode step of
/// that token alone, on both kinds of model the tests fetch and with every
/// way the cache stores keys and values.
#[test]
fn a_pass_of_several_tokens_gives_each_the_bits_of_its_own_step() {
    let cases = [
        (SMOLLM2, KvDtype::F32),
        (SMOLLM2, KvDtype::F16),
        (SMOLLM2, KvDtype::Bf16),
        (SMOLLM2, KvDtype::Q8),
        (QWEN, KvDtype::F32),
    ];
    for (model, kv_dtype) in cases {
        let mut stepped = load_with_cache(model, 0, kv_dtype);
        let mut together = load_with_cache(model, 4, kv_dtype);
        let prompt = copying_prompt(&stepped);
        stepped.prefill(&prompt).unwrap();
        together.prefill(&prompt).unwrap();
        let tokens = &prompt[prompt.len() - 40..prompt.len() - 35];
        let rows = together
            .extend_in_one_pass(tokens)
            .unwrap()
            .expect("prism's kernels run every matmul of these models");
        for (i, &token) in tokens.iter().enumerate() {
            let step = stepped.extend(&[token]).unwrap().to_vec1::<f32>().unwrap();
            let row = rows.get(i).unwrap().to_vec1::<f32>().unwrap();
            let same_bits = step
                .iter()
                .zip(&row)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same_bits,
                "{} {kv_dtype:?}: row {i} differs from its step",
                model.1
            );
        }
    }
}

/// Engines sharing a model check their drafts in the worker's passes,
/// beside the other sequences' steps and prompts: each sequence writes
/// what it writes alone, a token a pass.
#[test]
fn sequences_sharing_a_model_draft_and_write_what_each_writes_alone() {
    let mut plain = load(SMOLLM2, 0);
    let log = include_str!("fixtures/keeper-log.txt");
    let prompts: Vec<Vec<u32>> = [0, 700, 1400]
        .iter()
        .map(|&from| {
            let excerpt: String = log.chars().skip(from).take(600).collect();
            plain
                .chat_prompt(&[ChatMessage::user(format!(
                    "Copy this text word for word:\n\n{excerpt}"
                ))])
                .unwrap()
        })
        .collect();
    let options = greedy(60);
    let alone: Vec<_> = prompts
        .iter()
        .map(|prompt| plain.generate(prompt, &options).unwrap())
        .collect();

    let mut drafted = load(SMOLLM2, 4);
    let siblings: Vec<Engine> = prompts.iter().map(|_| drafted.sibling().unwrap()).collect();
    let together: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = siblings
            .into_iter()
            .zip(&prompts)
            .map(|(mut sibling, prompt)| {
                let options = &options;
                scope.spawn(move || sibling.generate(prompt, options).unwrap())
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (number, (alone, shared)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(alone.tokens, shared.tokens, "sequence {number}: tokens");
        assert_eq!(alone.stop_reason, shared.stop_reason, "sequence {number}");
        assert_eq!(alone.usage.decode_steps, shared.usage.decode_steps);
        assert!(
            shared.usage.accepted_drafts > 0,
            "sequence {number}: no drafted token was accepted: {:?}",
            shared.text
        );
    }
}
