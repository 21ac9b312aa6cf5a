//! Schema generation against a scripted model: a refused reply is sent back
//! with its reason and a later valid one accepted; when every attempt is
//! refused the error says why. Then the grammar on a random model, and the
//! command line's refusal to overwrite a file.

use crate::common::{assert_one_error_line, run_prism, ScriptedLlm};
use crate::constrained::char_model;
use prism::engine::GenerateOptions;
use prism::memory::Schema;
use prism::schema_gen::{generate_schema, schema_grammar, SchemaGenConfig, SchemaRequest};

fn council() -> SchemaRequest {
    SchemaRequest {
        domain: "meeting transcripts of a city council".into(),
        example_query: "What did the council decide about the budget?".into(),
    }
}

fn config(retries: usize) -> SchemaGenConfig {
    SchemaGenConfig {
        retries,
        max_tokens: 512,
        constrained: false,
    }
}

const REFUSED: &str = r#"{"type": "object", "oneOf": [{"type": "object"}]}"#;

const ACCEPTED: &str = r#"Sure! Here is the schema:
{"title": "Council decisions", "description": "What the council decided, by topic.", "type": "object",
 "additionalProperties": {"type": "array", "items": {"type": "string"}}}"#;

#[test]
fn a_refused_reply_is_retried_with_its_reason_and_a_valid_one_accepted() {
    let mut llm = ScriptedLlm::new(&[REFUSED, ACCEPTED]);
    let generated = generate_schema(&mut llm, &council(), &config(3)).unwrap();

    assert_eq!(llm.prompts.len(), 2);
    assert_eq!(generated.attempts.len(), 2);
    let reason = generated.attempts[0].refused.as_deref().unwrap();
    assert!(reason.contains("unsupported keyword `oneOf`"), "{reason}");
    assert_eq!(generated.attempts[1].refused, None);

    let (first, retry) = (&llm.prompts[0], &llm.prompts[1]);
    let shared = first.segments.len() - 1;
    assert_eq!(first.segments[..shared], retry.segments[..shared]);
    assert!(first.segments[shared - 1].contains("city council"));
    let note = retry.segments.last().unwrap();
    assert!(note.contains(reason) && note.contains(REFUSED), "{note}");
    assert!(!first.segments.last().unwrap().contains("refused"));
    // The shots are our own schemas of other domains, inlined and on one line.
    assert!(first.segments[1].contains("\"title\": \"Code retrieval\""));
    assert!(!first.segments[1].contains("$ref"));

    assert_eq!(generated.calls, 2);
    assert!(generated.figures.reused_tokens > first.segments[0].chars().count());

    let keys: Vec<&String> = generated.schema.as_object().unwrap().keys().collect();
    assert_eq!(keys[0], "$schema");
    let schema = Schema::from_value(&generated.schema).unwrap();
    assert_eq!(schema.title(), Some("Council decisions"));
}

#[test]
fn when_every_attempt_is_refused_the_error_gives_the_last_reason() {
    let mut llm = ScriptedLlm::new(&[REFUSED, "no JSON at all", REFUSED, r#"{"type": "object"}"#]);
    let err = generate_schema(&mut llm, &council(), &config(3)).unwrap_err();
    assert_eq!(llm.prompts.len(), 4);
    let message = err.to_string();
    assert!(
        message.contains("no usable schema in 4 attempts"),
        "{message}"
    );
    assert!(message.contains("nowhere to keep notes"), "{message}");
    // Each retry shows the reply just refused.
    assert!(llm.prompts[2]
        .segments
        .last()
        .unwrap()
        .contains("no JSON at all"));
}

#[test]
fn an_empty_domain_is_refused_before_any_call() {
    let mut llm = ScriptedLlm::new(&[ACCEPTED]);
    let request = SchemaRequest {
        domain: "  ".into(),
        ..council()
    };
    let err = generate_schema(&mut llm, &request, &config(0)).unwrap_err();
    assert!(err.to_string().starts_with("domain: "), "{err}");
    assert!(llm.prompts.is_empty());
}

#[test]
fn the_schema_grammar_compiles_and_leads_with_the_title() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = char_model(dir.path());
    let ids = engine.text_prompt("x").unwrap();
    let options = GenerateOptions {
        max_tokens: 12,
        grammar: Some(schema_grammar()),
        ..GenerateOptions::default()
    };
    let generation = engine.generate(&ids, &options).unwrap();
    assert!(
        generation.text.starts_with("{\"title\": \""),
        "{:?}",
        generation.text
    );
}

#[test]
fn an_existing_out_file_is_kept_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("council.json");
    std::fs::write(&out, "keep me").unwrap();
    let result = run_prism(&[
        "schema",
        "generate",
        "--domain",
        "city council meetings",
        "--example-query",
        "What was decided?",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_one_error_line(&result, "pass --force");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
}
