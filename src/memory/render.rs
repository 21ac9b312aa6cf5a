//! Memory as prompt text, always the same bytes for the same memory, because the
//! engine reuses its KV cache only up to the first changed token.

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};
use serde_json::Value;

use super::revision::{apply, Revision};
use super::schema::Schema;

/// The memory as one JSON object. Every non-empty object is written one
/// member per line, indented two spaces per level; lists and scalars stay on
/// the member's line. So a map of lists reads one entry per line:
///
/// ```text
/// {
///   "attributes": {
///     "Noise Level": ["street noise at night"],
///     "Food": ["limited breakfast", "good dinner"]
///   }
/// }
/// ```
pub fn render_in_place(memory: &Value) -> String {
    let mut out = String::new();
    write_block(&mut out, memory, 0);
    out.push('\n');
    out
}

/// One revision as the single line a model writes, ending in `\n`:
///
/// ```text
/// {"op": "add", "path": "$.attributes.'Noise Level'", "value": ["quiet"]}
/// ```
pub fn render_revision(revision: &Revision) -> String {
    let mut line = to_line(revision);
    line.push('\n');
    line
}

/// A memory kept as amendments: the base as it was first written, then every
/// accepted revision appended after it. Text already shown to the model never
/// changes, so the cached prefix always reaches the newest revision.
///
/// The caller keeps the effective memory as it goes (applying each revision
/// as it accepts it) and pushes only accepted revisions here.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Amendments {
    pub base: Value,
    pub revisions: Vec<Revision>,
}

impl Amendments {
    pub fn new(base: Value) -> Self {
        Amendments {
            base,
            revisions: Vec::new(),
        }
    }

    /// Record an accepted revision after the others.
    pub fn push(&mut self, revision: Revision) {
        self.revisions.push(revision);
    }

    /// The base rendered in place, then one line per revision, oldest first.
    /// A later revision of a path overrides an earlier one. Pushing a revision
    /// only adds a segment at the end.
    pub fn segments(&self) -> Vec<String> {
        let mut segments = Vec::with_capacity(self.revisions.len() + 1);
        segments.push(render_in_place(&self.base));
        segments.extend(self.revisions.iter().map(render_revision));
        segments
    }

    /// All segments joined: the text a prompt shows.
    pub fn render(&self) -> String {
        self.segments().concat()
    }

    /// The base with every revision applied in order. A revision that no
    /// longer applies (only possible if the list was not built from accepted
    /// revisions) is skipped.
    pub fn effective(&self, schema: &Schema) -> Value {
        self.revisions
            .iter()
            .fold(self.base.clone(), |memory, revision| {
                apply(&memory, revision, schema).unwrap_or(memory)
            })
    }
}

/// Python-style separators on one line: `[1, 2]`, `{"a": 1, "b": 2}`. The
/// methods not overridden write compactly (no newlines, no indentation).
/// Values are written as Python's `json.dumps` writes them by default (non-ASCII
/// kept as is too), the form small models have seen most.
struct SpacedFormatter;

impl Formatter for SpacedFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

/// `value` on one line in the spaced style.
pub fn to_line(value: &impl Serialize) -> String {
    let mut bytes = Vec::new();
    let mut serializer = Serializer::with_formatter(&mut bytes, SpacedFormatter);
    value
        .serialize(&mut serializer)
        .expect("JSON values always serialize");
    String::from_utf8(bytes).expect("serde_json writes UTF-8")
}

fn write_block(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push_str("{\n");
            let inner = "  ".repeat(depth + 1);
            for (i, (key, child)) in map.iter().enumerate() {
                out.push_str(&inner);
                out.push_str(&to_line(key));
                out.push_str(": ");
                write_block(out, child, depth + 1);
                if i + 1 < map.len() {
                    out.push(',');
                }
                out.push('\n');
            }
            out.push_str(&"  ".repeat(depth));
            out.push('}');
        }
        other => out.push_str(&to_line(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::path::JsonPath;
    use crate::memory::revision::Op;
    use proptest::prelude::*;
    use serde_json::json;

    use crate::memory::testing::{load, rev};

    #[test]
    fn in_place_layout() {
        let memory = json!({
            "attributes": {
                "Noise Level": ["street noise at night"],
                "Food": ["limited breakfast", "good dinner"],
                "Ratings": {},
                "Stars": 4,
                "Café": "ünïcode \"quoted\""
            },
            "empty": []
        });
        let expected = r#"{
  "attributes": {
    "Noise Level": ["street noise at night"],
    "Food": ["limited breakfast", "good dinner"],
    "Ratings": {},
    "Stars": 4,
    "Café": "ünïcode \"quoted\""
  },
  "empty": []
}
"#;
        assert_eq!(render_in_place(&memory), expected);
        assert_eq!(render_in_place(&json!({})), "{}\n");
        // The rendering is JSON that reads back to the same memory.
        assert_eq!(serde_json::from_str::<Value>(expected).unwrap(), memory);
    }

    #[test]
    fn revision_line() {
        let r = rev(
            Op::Add,
            "$.attributes.'Noise Level'",
            json!(["quiet", "no traffic"]),
        );
        assert_eq!(
            render_revision(&r),
            "{\"op\": \"add\", \"path\": \"$.attributes.'Noise Level'\", \"value\": [\"quiet\", \"no traffic\"]}\n"
        );
        let r = rev(Op::Update, "$.f", json!({"purpose": "x\ny", "n": 1.5}));
        assert_eq!(
            render_revision(&r),
            "{\"op\": \"update\", \"path\": \"$.f\", \"value\": {\"purpose\": \"x\\ny\", \"n\": 1.5}}\n"
        );
        let back: Revision = serde_json::from_str(&render_revision(&r)).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn amendments_keep_base_then_lines_and_apply_in_order() {
        let schema = load("entity.json");
        let base = json!({"attributes": {"Food": ["good"]}});
        let mut amendments = Amendments::new(base.clone());
        let revisions = [
            rev(Op::Add, "$.attributes.Noise", json!(["loud"])),
            rev(Op::Update, "$.attributes.Food", json!(["great"])),
            rev(Op::Update, "$.attributes.Noise", json!(["quiet"])),
        ];
        let mut current = base;
        let mut previous = amendments.segments();
        for revision in revisions {
            current = apply(&current, &revision, &schema).unwrap();
            amendments.push(revision);
            let segments = amendments.segments();
            assert!(segments.starts_with(&previous));
            assert_eq!(segments.len(), previous.len() + 1);
            assert!(segments.concat().starts_with(&previous.concat()));
            previous = segments;
        }
        assert_eq!(amendments.effective(&schema), current);
        assert_eq!(
            current,
            json!({"attributes": {"Food": ["great"], "Noise": ["quiet"]}})
        );
        assert_eq!(
            amendments.render(),
            "{\n  \"attributes\": {\n    \"Food\": [\"good\"]\n  }\n}\n\
             {\"op\": \"add\", \"path\": \"$.attributes.Noise\", \"value\": [\"loud\"]}\n\
             {\"op\": \"update\", \"path\": \"$.attributes.Food\", \"value\": [\"great\"]}\n\
             {\"op\": \"update\", \"path\": \"$.attributes.Noise\", \"value\": [\"quiet\"]}\n"
        );
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..5)
                    .prop_map(|kvs| Value::Object(kvs.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn rendering_is_deterministic_and_reads_back(value in arb_value()) {
            let memory = json!({"m": value});
            let text = render_in_place(&memory);
            prop_assert_eq!(&text, &render_in_place(&memory.clone()));
            prop_assert!(text.ends_with('\n'));
            let back: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(&back, &memory);
            // Same bytes after a round trip through text, too.
            prop_assert_eq!(render_in_place(&back), text);
        }

        #[test]
        fn a_revision_is_one_line(value in arb_value()) {
            let r = Revision { op: Op::Add, path: JsonPath::root().key("k"), value };
            let line = render_revision(&r);
            prop_assert!(line.ends_with('\n'));
            prop_assert_eq!(line.matches('\n').count(), 1);
        }
    }
}
