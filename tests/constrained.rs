//! Constrained decoding on a tiny random model whose vocabulary is single
//! characters: unconstrained greedy output is noise, constrained output parses
//! and validates against the schema.

use crate::common::tiny_engine_with_words;
use prism::engine::constraint::Grammar;
use prism::engine::{Engine, GenerateOptions, StopReason};

/// 62 characters after `<s>` and `</s>`: enough to spell small JSON objects.
const CHARS: &str = "{}[]\":,- 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ";

/// A tiny random model whose tokens are the single characters of [`CHARS`].
pub fn char_model(dir: &std::path::Path) -> Engine {
    tiny_engine_with_words(dir, 11, CHARS.chars().map(String::from), "tiny-chars")
}

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer"}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

fn validates(text: &str) -> bool {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return false;
    };
    let object = value.as_object();
    object.is_some_and(|o| {
        o.len() == 2
            && o.get("name")
                .is_some_and(|n| n.as_str().is_some_and(|s| s.chars().count() <= 8))
            && o.get("age").is_some_and(|a| a.is_i64())
    })
}

#[test]
fn constrained_output_validates_where_unconstrained_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = char_model(dir.path());
    let prompt = engine.text_prompt("person: ").unwrap();
    let free = GenerateOptions {
        max_tokens: 40,
        ..GenerateOptions::default()
    };
    let unconstrained = engine.generate(&prompt, &free).unwrap();
    assert!(
        !validates(&unconstrained.text),
        "noise happened to validate: {:?}",
        unconstrained.text
    );

    let constrained = GenerateOptions {
        max_tokens: 60,
        grammar: Some(Grammar::JsonSchema(schema())),
        ..GenerateOptions::default()
    };
    let generation = engine.generate(&prompt, &constrained).unwrap();
    assert_eq!(
        generation.stop_reason,
        StopReason::EndOfTurn,
        "{:?}",
        generation.text
    );
    assert!(validates(&generation.text), "{:?}", generation.text);
    assert!(generation.usage.mask_seconds > 0.0);
}

#[test]
fn a_regex_and_a_lark_grammar_constrain_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = char_model(dir.path());
    let prompt = engine.text_prompt("x").unwrap();
    let run = |engine: &mut Engine, grammar: Grammar| {
        let options = GenerateOptions {
            max_tokens: 30,
            grammar: Some(grammar),
            ..GenerateOptions::default()
        };
        engine.generate(&prompt, &options).unwrap().text
    };
    let digits = run(&mut engine, Grammar::Regex("[0-9]{3}-[a-c]{2}".into()));
    assert!(
        digits.len() == 6
            && digits.chars().take(3).all(|c| c.is_ascii_digit())
            && &digits[3..4] == "-",
        "{digits:?}"
    );
    let lark = run(
        &mut engine,
        Grammar::Lark("start: \"[\" NUM (\",\" NUM){2} \"]\"\nNUM: /[1-9]/\n".into()),
    );
    let list: Vec<u32> = serde_json::from_str(&lark).unwrap_or_else(|e| panic!("{lark:?}: {e}"));
    assert_eq!(list.len(), 3);
}

#[test]
fn a_broken_grammar_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = char_model(dir.path());
    let prompt = engine.text_prompt("x").unwrap();
    let options = GenerateOptions {
        grammar: Some(Grammar::Lark("start: undefined_rule\n".into())),
        ..GenerateOptions::default()
    };
    let err = engine.generate(&prompt, &options).unwrap_err();
    assert!(err.to_string().starts_with("grammar:"), "{err}");
}

/// A revision grammar over a schema whose keys have a pattern of their own
/// (`propertyNames`) compiles, and every key it lets the model write fits.
#[test]
fn a_revision_grammar_spells_new_keys_as_the_schema_asks() {
    use prism::memory::grammar::revision_grammar;
    use prism::memory::{apply, parse_revisions, Schema};
    let dir = tempfile::tempdir().unwrap();
    let chars = "{}\":,$.' _\n0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNO";
    let mut engine = tiny_engine_with_words(
        dir.path(),
        11,
        chars.chars().map(String::from),
        "tiny-key-chars",
    );
    let schema = Schema::from_value(&serde_json::json!({
        "type": "object",
        "propertyNames": {"pattern": "^[a-z_]{1,6}$"},
        "additionalProperties": {"type": "boolean"},
    }))
    .unwrap();
    // At least one line, so that the test sees a key.
    let grammar = revision_grammar(&schema, &serde_json::json!({}), false, 3).replacen(
        "line{0,3}",
        "line{1,3}",
        1,
    );
    assert!(grammar.contains("/[a-z_]{1,6}/"), "{grammar}");
    let prompt = engine.text_prompt("x").unwrap();
    let options = GenerateOptions {
        max_tokens: 200,
        grammar: Some(Grammar::Lark(grammar)),
        ..GenerateOptions::default()
    };
    let text = engine.generate(&prompt, &options).unwrap().text;
    let revisions: Vec<_> = parse_revisions(&text).into_iter().collect();
    assert!(!revisions.is_empty(), "{text:?}");
    let mut memory = serde_json::json!({});
    for revision in revisions {
        let revision = revision.unwrap_or_else(|e| panic!("{text:?}: {e}"));
        memory = apply(&memory, &revision, &schema).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}
