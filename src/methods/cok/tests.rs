//! Tests of the CoK family's prompts, parsing and memory updates.

use super::*;
use serde_json::json;

fn book() -> Schema {
    crate::memory::Schema::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/book.json"))
        .unwrap()
}

#[test]
fn prose_is_read_as_it_stands() {
    let read = read_memory("```\nThe ship sails.\n```\n", None, &json!(""));
    assert_eq!(read, Ok(json!("The ship sails.")));
    assert!(read_memory("  \n", None, &json!("The ship sails."))
        .unwrap_err()
        .contains("would empty"));
}

#[test]
fn json_must_parse_and_validate() {
    let schema = book();
    let empty = json!({});
    assert_eq!(
        read_memory(r#"{"Voyage": ["The ship sails."]}"#, Some(&schema), &empty),
        Ok(json!({"Voyage": ["The ship sails."]}))
    );
    assert!(
        read_memory(r#"{"Voyage": "a string"}"#, Some(&schema), &empty)
            .unwrap_err()
            .contains("expected")
    );
    assert!(read_memory("The ship sails.", Some(&schema), &empty).is_err());
    assert!(read_memory("[1, 2]", Some(&schema), &empty).is_err());
    let full = json!({"Voyage": ["The ship sails."]});
    assert!(read_memory(r#"{"Voyage": []}"#, Some(&schema), &full).is_err());
}

#[test]
fn rendering_is_stable_and_says_when_empty() {
    assert_eq!(render_memory(&json!("")), "(nothing yet)\n");
    assert_eq!(render_memory(&json!("Prose.\n\n")), "Prose.\n");
    assert_eq!(
        render_memory(&json!({"a": ["b"]})),
        "{\n  \"a\": [\"b\"]\n}\n"
    );
}

#[test]
fn only_text_and_numbers_count_as_content() {
    assert!(holds_nothing(&json!({"a": {}, "b": [], "c": " "})));
    assert!(!holds_nothing(&json!({"a": {"b": [0]}})));
}
