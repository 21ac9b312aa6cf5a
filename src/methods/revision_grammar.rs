//! The grammar of the revision lines a model may write, derived from the
//! schema and the memory as it stands, for constrained decoding: every line
//! it admits parses as a revision whose value type-checks at its path.
//!
//! The grammar is in llguidance's Lark dialect; each value is an inline
//! `%json` schema taken from the memory schema at that path, with bounds on
//! string length and list size so that a small model cannot write forever.

use crate::engine::constraint::fixed_spacing;
use crate::memory::{JsonPath, Next, NodeKind, Schema, SchemaNode};
use serde_json::{json, Map, Value};

/// The longest string value a constrained revision may hold. With at most
/// three lines of three such strings a step's output stays well inside the
/// default 512-token revision budget, so no line is ever cut off unfinished.
const MAX_STRING_CHARS: usize = 120;
/// The most items a constrained list value may hold.
const MAX_LIST_ITEMS: usize = 3;
/// How a new map key may be spelled: no quotes or backslashes, so it needs no
/// escaping inside the path or the JSON line.
const NEW_KEY: &str = r"/[A-Za-z0-9][A-Za-z0-9 ,_-]{0,40}/";

/// A Lark grammar for between one and `max_lines` revision lines, each of the
/// form `{"op": "add", "path": "$.'Key'", "value": …}` followed by a newline.
/// `update` lines are offered only when `updates` is set.
///
/// Every path offered stays valid while the lines of one step are applied in
/// order, so constrained output is never refused: a new key that an earlier
/// line created, or an existing list, takes `add` as an append (see `apply`).
pub fn revision_grammar(
    schema: &Schema,
    memory: &Value,
    updates: bool,
    max_lines: usize,
) -> String {
    let mut rules = Vec::new();
    let mut alternatives = Vec::new();
    let mut add_rule = |op: &str, path: PathText, node: &SchemaNode| {
        let name = format!("r{}", alternatives.len());
        let mut value = value_schema(schema, node, 0);
        if let Value::Object(map) = &mut value {
            map.insert("x-guidance".into(), fixed_spacing());
        }
        let value = serde_json::to_string(&value).expect("a JSON value serializes");
        let head = lark_string(&format!("{{\"op\": \"{op}\", \"path\": \"{}", path.before));
        let tail = lark_string(&format!("{}\", \"value\": ", path.after));
        let key = if path.new_key { " KEY " } else { " " };
        rules.push(format!("{name}: {head}{key}{tail} %json {value} \"}}\\n\""));
        alternatives.push(name);
    };
    for (pattern, node) in schema.add_targets(memory) {
        match &pattern.next {
            Next::NewKey => add_rule("add", PathText::new_key(&pattern.prefix), node),
            Next::Key(name) => add_rule(
                "add",
                PathText::fixed(&pattern.prefix.key(name.clone())),
                node,
            ),
            // A list grows by `add` at the list itself with a list of new items:
            // unlike its next index, that path stays valid however many lines
            // of the same step add to it.
            Next::Index(_) => {
                if let Some(list) = schema.at_path(&pattern.prefix) {
                    add_rule("add", PathText::fixed(&pattern.prefix), list);
                }
            }
        }
    }
    if updates {
        for (path, node) in schema.update_targets(memory) {
            add_rule("update", PathText::fixed(&path), node);
        }
    }
    if alternatives.is_empty() {
        // Nothing can change: the only admissible output is no revision at all.
        return "start: \"\"\n".to_string();
    }
    format!(
        "start: line{{1,{max_lines}}}\nline: {}\n{}\nKEY: {NEW_KEY}\n",
        alternatives.join(" | "),
        rules.join("\n"),
    )
}

/// A path as it appears inside the JSON line: fixed text, or text around a new key.
struct PathText {
    before: String,
    after: String,
    new_key: bool,
}

impl PathText {
    fn fixed(path: &JsonPath) -> Self {
        PathText {
            before: json_escape(&path.to_string()),
            after: String::new(),
            new_key: false,
        }
    }

    /// `prefix.'KEY'`, quoted so any spelling the KEY pattern allows parses.
    fn new_key(prefix: &JsonPath) -> Self {
        PathText {
            before: format!("{}.'", json_escape(&prefix.to_string())),
            after: "'".to_string(),
            new_key: true,
        }
    }
}

/// `text` as it must appear inside a JSON string.
fn json_escape(text: &str) -> String {
    let quoted = serde_json::to_string(text).expect("a string serializes");
    quoted[1..quoted.len() - 1].to_string()
}

/// `text` as a Lark string literal (Lark reads JSON's escapes).
fn lark_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// The JSON Schema a value at `node` must satisfy, bounded for decoding.
/// References are inlined; past a few levels of recursion anything goes
/// (the memory schema still checks the value when it is applied).
fn value_schema(schema: &Schema, node: &SchemaNode, depth: usize) -> Value {
    let node = schema.resolve(node);
    if depth > 6 {
        return json!({});
    }
    let mut out = match &node.kind {
        NodeKind::Any => json!({}),
        // Angle brackets are left out: prompts show placeholders in them, and
        // a small model would rather copy a placeholder than write its own text.
        // The length bound sits in the pattern: llguidance drops `maxLength`
        // when a `pattern` is given.
        NodeKind::String => json!({
            "type": "string",
            "pattern": format!("^[^<>]{{0,{MAX_STRING_CHARS}}}$"),
        }),
        NodeKind::Number => json!({"type": "number"}),
        NodeKind::Integer => json!({"type": "integer"}),
        NodeKind::Boolean => json!({"type": "boolean"}),
        NodeKind::Array { items } => json!({
            "type": "array",
            "items": value_schema(schema, items, depth + 1),
            "minItems": 1,
            "maxItems": MAX_LIST_ITEMS,
        }),
        NodeKind::Object {
            properties,
            required,
            additional,
        } => {
            let properties: Map<String, Value> = properties
                .iter()
                .map(|(key, child)| (key.clone(), value_schema(schema, child, depth + 1)))
                .collect();
            let additional = match additional {
                Some(child) => value_schema(schema, child, depth + 1),
                None => Value::Bool(false),
            };
            json!({
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": additional,
            })
        }
        NodeKind::Ref(_) => unreachable!("resolve() follows references"),
    };
    if let (Some(allowed), Value::Object(map)) = (&node.allowed, &mut out) {
        map.insert("enum".into(), Value::Array(allowed.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Schema;

    fn load(name: &str) -> Schema {
        Schema::from_file(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("schemas")
                .join(name),
        )
        .unwrap()
    }

    #[test]
    fn an_empty_book_memory_offers_new_keys_only() {
        let grammar = revision_grammar(&load("book.json"), &json!({}), true, 3);
        assert!(
            grammar.starts_with("start: line{1,3}\nline: r0\n"),
            "{grammar}"
        );
        assert!(grammar
            .contains(r#"r0: "{\"op\": \"add\", \"path\": \"$.'" KEY "'\", \"value\": " %json "#));
        assert!(grammar.contains(r#""maxItems":3"#));
        assert!(
            grammar.contains(r#""pattern":"^[^<>]{0,120}$""#),
            "{grammar}"
        );
        assert!(!grammar.contains("update"));
    }

    #[test]
    fn existing_paths_can_be_updated_when_updates_are_on() {
        let memory = json!({"Voyage": ["The ship sails north."]});
        let with = revision_grammar(&load("book.json"), &memory, true, 2);
        assert!(
            with.contains(r#""{\"op\": \"update\", \"path\": \"$.Voyage"#),
            "{with}"
        );
        let without = revision_grammar(&load("book.json"), &memory, false, 2);
        assert!(!without.contains("update"));
    }

    #[test]
    fn references_are_inlined() {
        let grammar = revision_grammar(&load("code.json"), &json!({}), true, 2);
        assert!(
            grammar.contains(r#""purpose""#) && grammar.contains(r#""procedure""#),
            "{grammar}"
        );
    }
}
