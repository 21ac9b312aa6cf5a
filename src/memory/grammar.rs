//! The grammar of the revision lines a model may write, derived from the
//! schema and the memory as it stands: every line it admits applies cleanly.

mod gbnf;
#[cfg(test)]
pub(crate) mod testing;

use crate::engine::constraint::{fixed_spacing, Grammar};
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
/// How a new map key may be spelled, as a regular expression: no quotes or
/// backslashes, so it needs no escaping inside the path or the JSON line.
const NEW_KEY: &str = "[A-Za-z0-9][A-Za-z0-9 ,_-]{0,40}";

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
    lark_grammar(&RevisionLines::new(schema, memory, updates), max_lines)
}

/// [`revision_grammar`] as a constraint that also carries its GBNF rendering,
/// for servers of the llama.cpp family. A schema whose key pattern GBNF cannot
/// express gets the Lark grammar alone.
///
/// Each value is an inline `%json` schema taken from the memory schema at
/// its path, and the grammar admits no line at all, since a chunk may add
/// nothing. The bounds on lines, string length and list size are a safety
/// net against a model that would write forever, sized not to bind in
/// normal use; [`binds_a_limit`] tells when one did. The same string bound
/// makes the JSON Schema of a whole memory, for methods that have the model
/// write the memory out instead of revising it.
pub fn revision_constraint(
    schema: &Schema,
    memory: &Value,
    updates: bool,
    max_lines: usize,
) -> Grammar {
    let lines = RevisionLines::new(schema, memory, updates);
    let lark = lark_grammar(&lines, max_lines);
    match gbnf::revision_grammar(&lines, max_lines) {
        Ok(gbnf) => Grammar::Dialects { lark, gbnf },
        Err(error) => {
            tracing::debug!("the revision grammar has no GBNF rendering: {error}");
            Grammar::Lark(lark)
        }
    }
}

fn lark_grammar(lines: &RevisionLines, max_lines: usize) -> String {
    if lines.is_empty() {
        // Nothing can change: the only admissible output is no revision at all.
        return "start: \"\"\n".to_string();
    }
    let rules = LineRules::of(lines);
    format!(
        "start: line{{0,{max_lines}}}\nline: {}\n{}",
        [rules.adds, rules.updates].concat().join(" | "),
        rules.definitions,
    )
}

/// Every kind of revision line that fits a memory, in the order the rules
/// of either dialect are numbered: `add` lines, then `update` lines.
pub(crate) struct RevisionLines {
    adds: Vec<LineShape>,
    updates: Vec<LineShape>,
}

/// One kind of revision line: an operation at a path, and what it may write there.
struct LineShape {
    op: Op,
    path: PathText,
    value: Bounded,
}

impl RevisionLines {
    fn new(schema: &Schema, memory: &Value, updates: bool) -> Self {
        let line = |op: Op, path: PathText, node: &SchemaNode| {
            let max_items = (op == Op::Add).then_some(MAX_LIST_ITEMS);
            LineShape {
                op,
                path,
                value: Bounded::of(schema, node, 0, max_items),
            }
        };
        let adds = schema
            .add_targets(memory)
            .into_iter()
            .map(|(pattern, node)| match &pattern.next {
                Next::NewKey => line(Op::Add, PathText::new_key(schema, &pattern.prefix), node),
                Next::Key(name) => line(
                    Op::Add,
                    PathText::fixed(&pattern.prefix.key(name.clone())),
                    node,
                ),
                // A list grows by `add` at the list itself with one new item:
                // unlike its next index, that path stays valid however many lines
                // of the same step add to it, and one item per line is the form
                // the prompt teaches (see `methods::prism::prompt`).
                Next::Index(_) => line(Op::Add, PathText::fixed(&pattern.prefix), node),
            })
            .collect();
        let updates = match updates {
            true => schema
                .update_targets(memory)
                .into_iter()
                .map(|(path, node)| line(Op::Update, PathText::fixed(&path), node))
                .collect(),
            false => Vec::new(),
        };
        RevisionLines { adds, updates }
    }

    fn is_empty(&self) -> bool {
        self.adds.is_empty() && self.updates.is_empty()
    }

    /// Every line, each with the number of its rule.
    fn numbered(&self) -> impl Iterator<Item = (usize, &LineShape)> {
        self.adds.iter().chain(&self.updates).enumerate()
    }
}

/// The language a grammar is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// llguidance's Lark, which this engine, vLLM and prism serve read.
    Lark,
    /// llama.cpp's GBNF, which the llama.cpp family and SGLang read.
    Gbnf,
}

impl Dialect {
    /// The name of the rule a grammar starts from.
    pub fn start(self) -> &'static str {
        match self {
            Dialect::Lark => "start",
            Dialect::Gbnf => "root",
        }
    }

    /// The rule `name` for `body`, with its line break. Names are lower-case
    /// letters and digits only, the spelling both dialects take.
    pub fn rule(self, name: &str, body: &str) -> String {
        match self {
            Dialect::Lark => format!("{name}: {body}\n"),
            Dialect::Gbnf => format!("{name} ::= {body}\n"),
        }
    }

    /// `text` as a string literal.
    pub fn literal(self, text: &str) -> String {
        match self {
            Dialect::Lark => lark_string(text),
            Dialect::Gbnf => gbnf::literal(text),
        }
    }
}

/// The rules of single revision lines that fit a memory, one rule per
/// place a revision may go, for grammars that arrange the lines their own way.
pub(crate) struct LineRules {
    /// Names of the rules for `add` lines.
    pub adds: Vec<String>,
    /// Names of the rules for `update` lines (none unless updates are allowed).
    pub updates: Vec<String>,
    /// The rules themselves and the rules they use, ending in `\n`.
    pub definitions: String,
}

impl LineRules {
    /// The rules in `dialect`; an error when a key pattern of the schema has
    /// no GBNF spelling.
    pub fn new(
        schema: &Schema,
        memory: &Value,
        updates: bool,
        dialect: Dialect,
    ) -> crate::error::Result<Self> {
        let lines = RevisionLines::new(schema, memory, updates);
        match dialect {
            Dialect::Lark => Ok(Self::of(&lines)),
            Dialect::Gbnf => gbnf::line_rules(&lines),
        }
    }

    /// The rules in Lark, with the `KEY` terminal they use.
    fn of(lines: &RevisionLines) -> Self {
        let mut rules = Vec::new();
        let mut adds = Vec::new();
        let mut updates = Vec::new();
        for (index, line) in lines.numbered() {
            let name = format!("r{index}");
            let mut value = line.value.json_schema();
            if let Value::Object(map) = &mut value {
                map.insert("x-guidance".into(), fixed_spacing());
            }
            let value = serde_json::to_string(&value).expect("a JSON value serializes");
            let (head, tail) = line.path.around(line.op);
            let key = line.path.lark_key_between();
            rules.push(format!(
                "{name}: {}{key}{} %json {value} \"}}\\n\"",
                lark_string(&head),
                lark_string(&tail)
            ));
            match line.op {
                Op::Add => adds.push(name),
                Op::Update => updates.push(name),
            }
        }
        LineRules {
            adds,
            updates,
            definitions: format!("{}\nKEY: /{NEW_KEY}/\n", rules.join("\n")),
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

/// Expressions in `dialect` for the path of each key an `add` could create
/// in `memory`, each written as a JSON string (`"$.'" KEY "'"` with its
/// quotes). They use the key rule of [`LineRules::definitions`] where the
/// schema does not spell keys its own way.
pub(crate) fn new_key_paths(
    schema: &Schema,
    memory: &Value,
    dialect: Dialect,
) -> crate::error::Result<Vec<String>> {
    let mut paths = Vec::new();
    for (pattern, _) in schema.add_targets(memory) {
        let path = match &pattern.next {
            Next::NewKey => PathText::new_key(schema, &pattern.prefix),
            Next::Key(name) => PathText::fixed(&pattern.prefix.key(name.clone())),
            Next::Index(_) => continue,
        };
        let key = match dialect {
            Dialect::Lark => path.lark_key_between(),
            Dialect::Gbnf => gbnf::key_between(&path)?,
        };
        paths.push(format!(
            "{}{key}{}",
            dialect.literal(&format!("\"{}", path.before)),
            dialect.literal(&format!("{}\"", path.after))
        ));
    }
    Ok(paths)
}

/// The JSON Schema of a whole memory for constrained decoding: the memory
/// schema with strings bounded as in revisions, lists unbounded (a memory's
/// lists keep growing) but never empty.
pub fn memory_json_schema(schema: &Schema) -> Value {
    Bounded::of(schema, schema.root(), 0, None).json_schema()
}

/// A path as it appears inside the JSON line: fixed text, or text around a new key.
struct PathText {
    before: String,
    after: String,
    /// How the new key is spelled, if the path ends in one.
    key: Option<NewKey>,
}

/// The spelling of a new key.
enum NewKey {
    /// [`NEW_KEY`], the `KEY` terminal of the Lark rules.
    Any,
    /// The schema's own pattern (`propertyNames`), without its anchors.
    Pattern(String),
}

impl PathText {
    fn fixed(path: &JsonPath) -> Self {
        PathText {
            before: json_escape(&path.to_string()),
            after: String::new(),
            key: None,
        }
    }

    /// `prefix.'KEY'`, quoted so any spelling the KEY pattern allows parses.
    /// Where the schema gives keys a pattern of their own (`propertyNames`),
    /// the key follows it instead.
    fn new_key(schema: &Schema, prefix: &JsonPath) -> Self {
        let key = match schema.at_path(prefix).map(|node| &node.kind) {
            Some(NodeKind::Object {
                key_pattern: Some(pattern),
                ..
            }) => NewKey::Pattern(pattern.unanchored().to_string()),
            _ => NewKey::Any,
        };
        PathText {
            before: format!("{}.'", json_escape(&prefix.to_string())),
            after: "'".to_string(),
            key: Some(key),
        }
    }

    /// The fixed text of a line before the key and after it, up to the value.
    fn around(&self, op: Op) -> (String, String) {
        (
            format!("{{\"op\": \"{op}\", \"path\": \"{}", self.before),
            format!("{}\", \"value\": ", self.after),
        )
    }

    /// What goes between the text before and after in Lark: the key's
    /// expression set off by spaces, or one space.
    fn lark_key_between(&self) -> String {
        match &self.key {
            None => " ".to_string(),
            Some(NewKey::Any) => " KEY ".to_string(),
            Some(NewKey::Pattern(pattern)) => format!(" /{}/ ", pattern.replace('/', "\\/")),
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

/// A value as constrained decoding bounds it: the memory schema at one node
/// with references inlined, strings capped, and lists never empty.
struct Bounded {
    kind: BoundedKind,
    /// When present, the value must equal one of these (as well as match `kind`).
    allowed: Option<Vec<Value>>,
}

enum BoundedKind {
    Any,
    /// A string of at most [`MAX_STRING_CHARS`] characters, none of them `<`,
    /// `>` or a line break.
    Note,
    Number,
    Integer,
    Boolean,
    /// At least one item, and at most `max_items` when given.
    List {
        items: Box<Bounded>,
        max_items: Option<usize>,
    },
    Object {
        properties: Vec<(String, Bounded)>,
        required: Vec<String>,
        /// The value of any other key; `None` forbids other keys.
        additional: Option<Box<Bounded>>,
    },
}

impl Bounded {
    /// The bounds of a value at `node`: lists hold at most `max_list_items`
    /// when given. Past a few levels of recursion anything goes (the memory
    /// schema still checks the value when it is applied).
    fn of(schema: &Schema, node: &SchemaNode, depth: usize, max_list_items: Option<usize>) -> Self {
        let node = schema.resolve(node);
        if depth > 6 {
            return Bounded {
                kind: BoundedKind::Any,
                allowed: None,
            };
        }
        let below = |child: &SchemaNode| Bounded::of(schema, child, depth + 1, max_list_items);
        let kind = match &node.kind {
            NodeKind::Any => BoundedKind::Any,
            NodeKind::String => BoundedKind::Note,
            NodeKind::Number => BoundedKind::Number,
            NodeKind::Integer => BoundedKind::Integer,
            NodeKind::Boolean => BoundedKind::Boolean,
            NodeKind::Array { items } => BoundedKind::List {
                items: Box::new(below(items)),
                max_items: max_list_items,
            },
            NodeKind::Object {
                properties,
                required,
                additional,
                ..
            } => BoundedKind::Object {
                properties: properties
                    .iter()
                    .map(|(key, child)| (key.clone(), below(child)))
                    .collect(),
                required: required.clone(),
                additional: additional.as_deref().map(|child| Box::new(below(child))),
            },
            NodeKind::Ref(_) => unreachable!("resolve() follows references"),
        };
        Bounded {
            kind,
            allowed: node.allowed.clone(),
        }
    }

    /// The JSON Schema of these bounds, for llguidance.
    fn json_schema(&self) -> Value {
        let mut out = match &self.kind {
            BoundedKind::Any => json!({}),
            // Angle brackets are left out: prompts show placeholders in them, and
            // a small model would rather copy a placeholder than write its own text.
            // Line breaks are left out too: a note is one line, and with them
            // Qwen2.5-Coder-1.5B copied a whole title page into one string.
            // The length bound sits in the pattern: llguidance drops `maxLength`
            // when a `pattern` is given.
            BoundedKind::Note => json!({
                "type": "string",
                "pattern": format!("^[^<>\\n]{{0,{MAX_STRING_CHARS}}}$"),
            }),
            BoundedKind::Number => json!({"type": "number"}),
            BoundedKind::Integer => json!({"type": "integer"}),
            BoundedKind::Boolean => json!({"type": "boolean"}),
            BoundedKind::List { items, max_items } => {
                let mut list = json!({
                    "type": "array",
                    "items": items.json_schema(),
                    "minItems": 1,
                });
                if let Some(max) = max_items {
                    list["maxItems"] = (*max).into();
                }
                list
            }
            BoundedKind::Object {
                properties,
                required,
                additional,
            } => {
                let properties: Map<String, Value> = properties
                    .iter()
                    .map(|(key, child)| (key.clone(), child.json_schema()))
                    .collect();
                let additional = additional
                    .as_ref()
                    .map_or(Value::Bool(false), |child| child.json_schema());
                json!({
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": additional,
                })
            }
        };
        if let (Some(allowed), Value::Object(map)) = (&self.allowed, &mut out) {
            map.insert("enum".into(), Value::Array(allowed.clone()));
        }
        out
    }
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
    fn the_constraint_carries_the_same_grammar_in_both_dialects() {
        let (schema, memory) = (load("book.json"), json!({"Voyage": ["North."]}));
        let Grammar::Dialects { lark, gbnf } = revision_constraint(&schema, &memory, true, 5)
        else {
            panic!("the book schema has a GBNF rendering");
        };
        assert_eq!(lark, revision_grammar(&schema, &memory, true, 5));
        assert!(gbnf.starts_with("root ::= line{0,5}\n"), "{gbnf}");
        // One rule per kind of line, the same ones in both.
        let kinds = |text: &str, head: &str| {
            let line = text.lines().find_map(|line| line.strip_prefix(head));
            line.map(str::to_string)
        };
        assert_eq!(kinds(&lark, "line: "), kinds(&gbnf, "line ::= "));
        assert_eq!(kinds(&lark, "line: ").as_deref(), Some("r0 | r1 | r2 | r3"));
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
