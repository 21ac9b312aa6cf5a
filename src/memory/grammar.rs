//! The grammar of the revision lines a model may write, derived from the
//! schema and the memory as it stands, for constrained decoding: every line
//! it admits parses as a revision whose value type-checks at its path.
//!
//! The grammar is in llguidance's Lark dialect; each value is an inline
//! `%json` schema taken from the memory schema at that path. It admits no
//! revision at all, since a chunk may add nothing. Bounds on the number of
//! lines, string length and list size are a safety net against a model that
//! would write forever; they are sized not to bind in normal use, and
//! [`binds_a_limit`] tells when one did. The same string bound makes the JSON
//! Schema of a whole memory, for methods that have the model write the memory
//! out instead of revising it.

use crate::engine::constraint::fixed_spacing;
use crate::memory::{JsonPath, Next, NodeKind, Op, Revision, Schema, SchemaNode};
use serde_json::{json, Map, Value};

/// The most revision lines one constrained step may write. A line holds one
/// note, and a dense chunk of 2,000 tokens may call for a few dozen.
pub const MAX_LINES: usize = 48;
/// The longest string value a constrained revision may hold: about 45
/// words, twice what the prompt asks of a note. A note cut here loses its
/// end, so the bound sits well above what one note needs, and it keeps a
/// note from becoming a copied paragraph.
pub const MAX_STRING_CHARS: usize = 280;
/// The most items a list an `add` writes may hold. An `update` rewrites a
/// whole list and is not bounded, so that it never cuts what was there.
pub const MAX_LIST_ITEMS: usize = 8;
/// How a new map key may be spelled: no quotes or backslashes, so it needs no
/// escaping inside the path or the JSON line.
const NEW_KEY: &str = r"/[A-Za-z0-9][A-Za-z0-9 ,_-]{0,40}/";

/// A Lark grammar for up to `max_lines` revision lines (none is fine), each of the
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
    let rules = LineRules::new(schema, memory, updates);
    if rules.adds.is_empty() && rules.updates.is_empty() {
        // Nothing can change: the only admissible output is no revision at all.
        return "start: \"\"\n".to_string();
    }
    format!(
        "start: line{{0,{max_lines}}}\nline: {}\n{}",
        [rules.adds, rules.updates].concat().join(" | "),
        rules.definitions,
    )
}

/// The Lark rules of single revision lines that fit a memory, one rule per
/// place a revision may go, for grammars that arrange the lines their own way.
pub(crate) struct LineRules {
    /// Names of the rules for `add` lines.
    pub adds: Vec<String>,
    /// Names of the rules for `update` lines (none unless updates are allowed).
    pub updates: Vec<String>,
    /// The rules themselves and the `KEY` terminal they use, ending in `\n`.
    pub definitions: String,
}

impl LineRules {
    pub fn new(schema: &Schema, memory: &Value, updates: bool) -> Self {
        let mut rules = Vec::new();
        let mut adds = Vec::new();
        let mut update_names = Vec::new();
        let mut add_rule = |op: Op, path: PathText, node: &SchemaNode| {
            let name = format!("r{}", rules.len());
            let max_items = (op == Op::Add).then_some(MAX_LIST_ITEMS);
            let mut value = value_schema(schema, node, 0, max_items);
            if let Value::Object(map) = &mut value {
                map.insert("x-guidance".into(), fixed_spacing());
            }
            let value = serde_json::to_string(&value).expect("a JSON value serializes");
            let head = lark_string(&format!("{{\"op\": \"{op}\", \"path\": \"{}", path.before));
            let tail = lark_string(&format!("{}\", \"value\": ", path.after));
            let key = path.key_between();
            rules.push(format!("{name}: {head}{key}{tail} %json {value} \"}}\\n\""));
            match op {
                Op::Add => adds.push(name),
                Op::Update => update_names.push(name),
            }
        };
        for (pattern, node) in schema.add_targets(memory) {
            match &pattern.next {
                Next::NewKey => add_rule(Op::Add, PathText::new_key(schema, &pattern.prefix), node),
                Next::Key(name) => add_rule(
                    Op::Add,
                    PathText::fixed(&pattern.prefix.key(name.clone())),
                    node,
                ),
                // A list grows by `add` at the list itself with one new item:
                // unlike its next index, that path stays valid however many lines
                // of the same step add to it, and one item per line is the form
                // the prompt teaches (see `methods::prism::prompt`).
                Next::Index(_) => add_rule(Op::Add, PathText::fixed(&pattern.prefix), node),
            }
        }
        if updates {
            for (path, node) in schema.update_targets(memory) {
                add_rule(Op::Update, PathText::fixed(&path), node);
            }
        }
        LineRules {
            adds,
            updates: update_names,
            definitions: format!("{}\nKEY: {NEW_KEY}\n", rules.join("\n")),
        }
    }
}

/// Whether `revision` reached a bound of the grammar: a string of
/// [`MAX_STRING_CHARS`], or an added list of [`MAX_LIST_ITEMS`].
pub fn binds_a_limit(revision: &Revision) -> bool {
    fn long_string(value: &Value) -> bool {
        match value {
            Value::String(text) => text.chars().count() >= MAX_STRING_CHARS,
            Value::Array(items) => items.iter().any(long_string),
            Value::Object(members) => members.values().any(long_string),
            _ => false,
        }
    }
    let full_list = revision.op == Op::Add
        && matches!(&revision.value, Value::Array(items) if items.len() >= MAX_LIST_ITEMS);
    full_list || long_string(&revision.value)
}

/// Lark expressions for the path of each key an `add` could create in
/// `memory`, each written as a JSON string (`"$.'" KEY "'"` with its quotes).
/// They use the `KEY` terminal of [`LineRules::definitions`] where the
/// schema does not spell keys its own way.
pub(crate) fn new_key_paths(schema: &Schema, memory: &Value) -> Vec<String> {
    schema
        .add_targets(memory)
        .into_iter()
        .filter_map(|(pattern, _)| {
            let path = match &pattern.next {
                Next::NewKey => PathText::new_key(schema, &pattern.prefix),
                Next::Key(name) => PathText::fixed(&pattern.prefix.key(name.clone())),
                Next::Index(_) => return None,
            };
            let key = path.key_between();
            Some(format!(
                "{}{key}{}",
                lark_string(&format!("\"{}", path.before)),
                lark_string(&format!("{}\"", path.after))
            ))
        })
        .collect()
}

/// The JSON Schema of a whole memory for constrained decoding: the memory
/// schema with strings bounded as in revisions, lists unbounded (a memory's
/// lists keep growing) but never empty.
pub fn memory_json_schema(schema: &Schema) -> Value {
    value_schema(schema, schema.root(), 0, None)
}

/// A path as it appears inside the JSON line: fixed text, or text around a new key.
struct PathText {
    before: String,
    after: String,
    /// The Lark expression of the new key, if the path ends in one.
    key: Option<String>,
}

impl PathText {
    fn fixed(path: &JsonPath) -> Self {
        PathText {
            before: json_escape(&path.to_string()),
            after: String::new(),
            key: None,
        }
    }

    /// What goes between the text before and after: the key's expression
    /// set off by spaces, or one space.
    fn key_between(&self) -> String {
        self.key
            .as_ref()
            .map_or(" ".to_string(), |key| format!(" {key} "))
    }

    /// `prefix.'KEY'`, quoted so any spelling the KEY pattern allows parses.
    /// Where the schema gives keys a pattern of their own (`propertyNames`),
    /// the key follows it instead.
    fn new_key(schema: &Schema, prefix: &JsonPath) -> Self {
        let key = match schema.at_path(prefix).map(|node| &node.kind) {
            Some(NodeKind::Object {
                key_pattern: Some(pattern),
                ..
            }) => format!("/{}/", pattern.unanchored().replace('/', "\\/")),
            _ => "KEY".to_string(),
        };
        PathText {
            before: format!("{}.'", json_escape(&prefix.to_string())),
            after: "'".to_string(),
            key: Some(key),
        }
    }
}

/// `text` as it must appear inside a JSON string.
fn json_escape(text: &str) -> String {
    let quoted = serde_json::to_string(text).expect("a string serializes");
    quoted[1..quoted.len() - 1].to_string()
}

/// `text` as a Lark string literal (Lark reads JSON's escapes).
pub(crate) fn lark_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// The JSON Schema a value at `node` must satisfy, bounded for decoding: lists
/// hold at least one item and at most `max_list_items` when given.
/// References are inlined; past a few levels of recursion anything goes
/// (the memory schema still checks the value when it is applied).
fn value_schema(
    schema: &Schema,
    node: &SchemaNode,
    depth: usize,
    max_list_items: Option<usize>,
) -> Value {
    let node = schema.resolve(node);
    if depth > 6 {
        return json!({});
    }
    let mut out = match &node.kind {
        NodeKind::Any => json!({}),
        // Angle brackets are left out: prompts show placeholders in them, and
        // a small model would rather copy a placeholder than write its own text.
        // Line breaks are left out too: a note is one line, and with them
        // Qwen2.5-Coder-1.5B copied a whole title page into one string.
        // The length bound sits in the pattern: llguidance drops `maxLength`
        // when a `pattern` is given.
        NodeKind::String => json!({
            "type": "string",
            "pattern": format!("^[^<>\\n]{{0,{MAX_STRING_CHARS}}}$"),
        }),
        NodeKind::Number => json!({"type": "number"}),
        NodeKind::Integer => json!({"type": "integer"}),
        NodeKind::Boolean => json!({"type": "boolean"}),
        NodeKind::Array { items } => {
            let mut list = json!({
                "type": "array",
                "items": value_schema(schema, items, depth + 1, max_list_items),
                "minItems": 1,
            });
            if let Some(max) = max_list_items {
                list["maxItems"] = max.into();
            }
            list
        }
        NodeKind::Object {
            properties,
            required,
            additional,
            ..
        } => {
            let properties: Map<String, Value> = properties
                .iter()
                .map(|(key, child)| {
                    (
                        key.clone(),
                        value_schema(schema, child, depth + 1, max_list_items),
                    )
                })
                .collect();
            let additional = match additional {
                Some(child) => value_schema(schema, child, depth + 1, max_list_items),
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
            grammar.starts_with("start: line{0,3}\nline: r0\n"),
            "{grammar}"
        );
        assert!(grammar
            .contains(r#"r0: "{\"op\": \"add\", \"path\": \"$.'" KEY "'\", \"value\": " %json "#));
        assert!(grammar.contains(r#""maxItems":8"#));
        assert!(
            grammar.contains(r#""pattern":"^[^<>\\n]{0,280}$""#),
            "{grammar}"
        );
        assert!(!grammar.contains("update"));
    }

    #[test]
    fn a_list_grows_one_item_per_line_and_no_line_is_fine() {
        let grammar = revision_grammar(
            &load("summary.json"),
            &json!({"events": [], "people": {}, "setting": [], "themes": []}),
            true,
            4,
        );
        assert!(grammar.starts_with("start: line{0,4}\n"), "{grammar}");
        assert!(
            grammar.contains(
                r#""{\"op\": \"add\", \"path\": \"$.events" "\", \"value\": " %json {"type":"string""#
            ),
            "{grammar}"
        );
    }

    #[test]
    fn limits_bind_only_at_their_bounds() {
        let note = |chars: usize| Value::String("a".repeat(chars));
        let path = JsonPath::parse("$.events").unwrap();
        assert!(!binds_a_limit(&Revision::add(
            path.clone(),
            note(MAX_STRING_CHARS - 1)
        )));
        assert!(binds_a_limit(&Revision::add(
            path.clone(),
            note(MAX_STRING_CHARS)
        )));
        let full = Value::Array(vec![note(5); MAX_LIST_ITEMS]);
        assert!(binds_a_limit(&Revision::add(path.clone(), full.clone())));
        // An update may rewrite a list of any length.
        assert!(!binds_a_limit(&Revision::update(path, full)));
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
