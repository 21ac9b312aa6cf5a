//! The memory schema: a small subset of JSON Schema (draft 2020-12), loaded into a
//! tree that can check a memory, find the type at a path, and describe itself for a prompt.

mod example;
mod load;
mod targets;
mod types;

use std::fmt;
use std::path::Path;

use serde_json::Value;

use super::path::{is_plain_key, JsonPath, Segment};
use crate::error::{Error, Result};

pub use example::WorkedExample;

/// One node of a schema: what it accepts, plus its human-readable notes.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaNode {
    pub title: Option<String>,
    pub description: Option<String>,
    /// When present, the value must equal one of these (as well as match `kind`).
    pub allowed: Option<Vec<Value>>,
    pub kind: NodeKind,
}

/// The shape a node accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// Any JSON value.
    Any,
    String,
    /// Any number, integers included.
    Number,
    /// A number with no fractional part.
    Integer,
    Boolean,
    Array {
        items: Box<SchemaNode>,
    },
    Object {
        /// Declared properties, in the order the schema lists them.
        properties: Vec<(String, SchemaNode)>,
        required: Vec<String>,
        /// The schema of keys not in `properties`; `None` forbids them.
        additional: Option<Box<SchemaNode>>,
        /// How every key must be spelled (`propertyNames`), if the schema says.
        key_pattern: Option<KeyPattern>,
    },
    /// `#/$defs/<name>`; [`Schema::resolve`] follows it.
    Ref(String),
}

/// A `propertyNames` pattern: a regular expression a whole key must match.
#[derive(Debug, Clone)]
pub struct KeyPattern {
    /// As the schema wrote it, `^` and `$` included.
    source: String,
    regex: regex::Regex,
}

impl KeyPattern {
    /// The pattern without its anchors, for a grammar terminal, which always
    /// matches whole.
    pub fn unanchored(&self) -> &str {
        &self.source[1..self.source.len() - 1]
    }

    pub fn matches(&self, key: &str) -> bool {
        self.regex.is_match(key)
    }
}

impl PartialEq for KeyPattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl fmt::Display for KeyPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// A loaded schema: the root node and the named definitions it refers to.
///
/// Supported keywords: `type` (one of `object`, `array`, `string`, `number`,
/// `integer`, `boolean`), `properties`, `required`, `additionalProperties`
/// (`true`, `false` or a schema), `propertyNames` with a `pattern` anchored at
/// both ends, `items`, `enum`, `title`, `description`, `$defs` (at the root)
/// and local references `"$ref": "#/$defs/Name"`. `$schema`, `$id`,
/// `$comment`, `default` and `examples` are accepted and ignored. At the top
/// level, `x-worked-example` holds an example of the task for PRISM's prompt
/// (see [`WorkedExample`]). Any other keyword is refused with an error that
/// names it, so a schema never silently means less than its author wrote.
///
/// - Without `type`, a node with `properties` or `additionalProperties` is an
///   object, one with `items` is an array, and anything else accepts any value.
/// - A missing `additionalProperties` allows any other key with any value, as in
///   JSON Schema; the schemas shipped in `schemas/` always spell it out.
/// - The memory itself (the root, after following `$ref`) must be an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    root: SchemaNode,
    defs: Vec<(String, SchemaNode)>,
    worked_example: Option<WorkedExample>,
}

/// Where a revision may `add` something new: a path that exists in the memory
/// now, and the one step allowed below it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PathPattern {
    /// An object or list that exists in the memory.
    pub prefix: JsonPath,
    pub next: Next,
}

/// The step a [`PathPattern`] allows below its prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Next {
    /// Any key the object does not have yet (a map entry).
    NewKey,
    /// This declared property, absent from the object so far.
    Key(String),
    /// The list's next index, which is its current length.
    Index(usize),
}

impl PathPattern {
    /// Whether `path` is one this pattern allows. `NewKey` cannot know the
    /// memory, so it accepts any key; `apply` still refuses existing ones.
    pub fn matches(&self, path: &JsonPath) -> bool {
        let Some((last, init)) = path.segments().split_last() else {
            return false;
        };
        if init != self.prefix.segments() {
            return false;
        }
        match (&self.next, last) {
            (Next::NewKey, Segment::Key(_)) => true,
            (Next::Key(name), Segment::Key(key)) => name == key,
            (Next::Index(next), Segment::Index(index)) => next == index,
            _ => false,
        }
    }
}

impl fmt::Display for PathPattern {
    /// `$.attributes.*` for a new key, else the one concrete path it allows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.next {
            Next::NewKey => write!(f, "{}.*", self.prefix),
            Next::Key(name) => write!(f, "{}", self.prefix.key(name.clone())),
            Next::Index(index) => write!(f, "{}", self.prefix.index(*index)),
        }
    }
}

/// The direct children of a memory value with the path step to each: the keys
/// of an object, the indices of a list, nothing for a scalar.
fn children_of(value: &Value) -> Vec<(Segment, &Value)> {
    match value {
        Value::Object(map) => map
            .iter()
            .map(|(key, child)| (Segment::Key(key.clone()), child))
            .collect(),
        Value::Array(list) => list
            .iter()
            .enumerate()
            .map(|(index, child)| (Segment::Index(index), child))
            .collect(),
        _ => Vec::new(),
    }
}

/// Where [`Schema::render_types`] wraps class and alias comments.
const COMMENT_WIDTH: usize = 80;

/// Keywords that only annotate, and so are accepted and ignored.
const IGNORED_KEYWORDS: &[&str] = &["$schema", "$id", "$comment", "default", "examples"];

impl SchemaNode {
    /// A node that accepts anything.
    pub fn any() -> Self {
        SchemaNode {
            title: None,
            description: None,
            allowed: None,
            kind: NodeKind::Any,
        }
    }
}

impl Schema {
    /// Load a schema file. Errors name the file and, for unsupported keywords,
    /// the keyword and where it sits (as a JSON pointer).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Schema> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::invalid(format!("schema {}", path.display()), e.to_string()))?;
        Schema::build(&value)
            .map_err(|reason| Error::invalid(format!("schema {}", path.display()), reason))
    }

    /// Build a schema from a JSON value (the parsed contents of a schema file).
    pub fn from_value(value: &Value) -> Result<Schema> {
        Schema::build(value).map_err(|reason| Error::invalid("schema", reason))
    }

    /// The root node (possibly a `$ref`; see [`Schema::resolve`]).
    pub fn root(&self) -> &SchemaNode {
        &self.root
    }

    /// The schema's top-level `title`, if any.
    pub fn title(&self) -> Option<&str> {
        self.root.title.as_deref()
    }

    /// The schema's top-level `description`, if any.
    pub fn description(&self) -> Option<&str> {
        self.root.description.as_deref()
    }

    /// The example of the task this schema serves, if it carries one.
    pub fn worked_example(&self) -> Option<&WorkedExample> {
        self.worked_example.as_ref()
    }

    /// The named definition, from `$defs`.
    pub fn def(&self, name: &str) -> Option<&SchemaNode> {
        self.defs.iter().find(|(n, _)| n == name).map(|(_, d)| d)
    }

    /// Follow `$ref`s until a node that is not one. Loading checked that every
    /// reference exists and that chains end.
    pub fn resolve<'a>(&'a self, mut node: &'a SchemaNode) -> &'a SchemaNode {
        while let NodeKind::Ref(name) = &node.kind {
            node = self.def(name).expect("references are checked at load");
        }
        node
    }

    /// Check a whole memory. The reason names the first path that failed.
    pub fn validate(&self, value: &Value) -> Result<(), String> {
        self.check(&self.root, value, &mut JsonPath::root())
    }

    /// Check `value` as the value at `path`; the reason names the path that
    /// failed, starting from `path`.
    pub fn validate_at(&self, path: &JsonPath, value: &Value) -> Result<(), String> {
        let node = self
            .at_path(path)
            .ok_or_else(|| format!("{path}: the schema has no place for this path"))?;
        self.check(node, value, &mut path.clone())
    }

    /// Check `value` against `node`, which belongs to this schema.
    pub fn validate_node(&self, node: &SchemaNode, value: &Value) -> Result<(), String> {
        self.check(node, value, &mut JsonPath::root())
    }

    fn check(&self, node: &SchemaNode, value: &Value, path: &mut JsonPath) -> Result<(), String> {
        let node = self.resolve(node);
        if let Some(allowed) = &node.allowed {
            if !allowed.contains(value) {
                let choices: Vec<String> = allowed.iter().map(Value::to_string).collect();
                return Err(format!(
                    "{path}: expected one of {}, found {value}",
                    choices.join(", ")
                ));
            }
        }
        match (&node.kind, value) {
            (NodeKind::Any, _) => Ok(()),
            (NodeKind::String, Value::String(_)) => Ok(()),
            (NodeKind::Number, Value::Number(_)) => Ok(()),
            (NodeKind::Integer, Value::Number(n)) if is_integer(n) => Ok(()),
            (NodeKind::Boolean, Value::Bool(_)) => Ok(()),
            (NodeKind::Array { items }, Value::Array(values)) => {
                for (index, item) in values.iter().enumerate() {
                    path.push(Segment::Index(index));
                    self.check(items, item, path)?;
                    path.pop();
                }
                Ok(())
            }
            (
                NodeKind::Object {
                    properties,
                    required,
                    additional,
                    key_pattern,
                },
                Value::Object(members),
            ) => {
                for name in required {
                    if !members.contains_key(name) {
                        return Err(format!("{path}: missing required key `{name}`"));
                    }
                }
                for (key, member) in members {
                    let child = match properties.iter().find(|(name, _)| name == key) {
                        Some((_, child)) => child,
                        None => match additional {
                            Some(_) if !fits(key_pattern, key) => {
                                return Err(misspelled_key(&path.key(key.clone()), key_pattern))
                            }
                            Some(child) => child,
                            None => {
                                return Err(format!(
                                    "{}: key not allowed here{}",
                                    path.key(key.clone()),
                                    allowed_keys_hint(properties)
                                ))
                            }
                        },
                    };
                    path.push(Segment::Key(key.clone()));
                    self.check(child, member, path)?;
                    path.pop();
                }
                Ok(())
            }
            (NodeKind::String, _) => Err(mismatch(path, "a string", value)),
            (NodeKind::Number, _) => Err(mismatch(path, "a number", value)),
            (NodeKind::Integer, _) => Err(mismatch(path, "an integer", value)),
            (NodeKind::Boolean, _) => Err(mismatch(path, "true or false", value)),
            (NodeKind::Array { .. }, _) => Err(mismatch(path, "a list", value)),
            (NodeKind::Object { .. }, _) => Err(mismatch(path, "an object", value)),
            (NodeKind::Ref(_), _) => unreachable!("resolved above"),
        }
    }

    /// The node a path leads to, through `properties`, `additionalProperties`
    /// and `items`; `None` when the schema has no place for it. The node
    /// returned is never a `$ref`.
    pub fn at_path(&self, path: &JsonPath) -> Option<&SchemaNode> {
        self.walk(path).ok()
    }

    /// Like [`Schema::at_path`], with the reason a path has no place.
    pub(crate) fn walk(&self, path: &JsonPath) -> Result<&SchemaNode, WalkError> {
        let mut node = self.resolve(&self.root);
        let mut here = JsonPath::root();
        for segment in path.segments() {
            node = match (&node.kind, segment) {
                (NodeKind::Any, _) => node,
                (NodeKind::Array { items }, Segment::Index(_)) => items,
                (
                    NodeKind::Object {
                        properties,
                        additional,
                        key_pattern,
                        ..
                    },
                    Segment::Key(key),
                ) => match properties.iter().find(|(name, _)| name == key) {
                    Some((_, child)) => child,
                    None => match additional {
                        Some(_) if !fits(key_pattern, key) => {
                            return Err(WalkError::NotAllowed(misspelled_key(
                                &here.key(key.clone()),
                                key_pattern,
                            )))
                        }
                        Some(child) => child,
                        None => {
                            return Err(WalkError::NotAllowed(format!(
                                "{}: the schema allows no such key{}",
                                here.key(key.clone()),
                                allowed_keys_hint(properties)
                            )))
                        }
                    },
                },
                (NodeKind::Array { .. }, Segment::Key(key)) => {
                    return Err(WalkError::BadPath(format!(
                        "{here} is a list: address its items as [n], not by key `{key}`"
                    )))
                }
                (NodeKind::Object { .. }, Segment::Index(index)) => {
                    return Err(WalkError::BadPath(format!(
                        "{here} is an object: address it by key, not [{index}]"
                    )))
                }
                (_, _) => {
                    return Err(WalkError::BadPath(format!(
                        "{here} is a {} and has nothing below it",
                        kind_name(&node.kind)
                    )))
                }
            };
            node = self.resolve(node);
            here.push(segment.clone());
        }
        Ok(node)
    }

    /// The resolved node one step below `node`, if the schema has one.
    fn child<'a>(&'a self, node: &'a SchemaNode, segment: &Segment) -> Option<&'a SchemaNode> {
        let child = match (&self.resolve(node).kind, segment) {
            (NodeKind::Any, _) => return Some(self.resolve(node)),
            (NodeKind::Array { items }, Segment::Index(_)) => items.as_ref(),
            (
                NodeKind::Object {
                    properties,
                    additional,
                    ..
                },
                Segment::Key(key),
            ) => match properties.iter().find(|(name, _)| name == key) {
                Some((_, child)) => child,
                None => additional.as_deref()?,
            },
            _ => return None,
        };
        Some(self.resolve(child))
    }
}

/// Why a path has no place in the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WalkError {
    /// The schema has no such key there.
    NotAllowed(String),
    /// The path's shape disagrees with the schema (key into a list, etc.).
    BadPath(String),
}

fn is_integer(n: &serde_json::Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn mismatch(path: &JsonPath, expected: &str, value: &Value) -> String {
    format!("{path}: expected {expected}, found {}", describe(value))
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn kind_name(kind: &NodeKind) -> &'static str {
    match kind {
        NodeKind::Any => "value",
        NodeKind::String => "string",
        NodeKind::Number => "number",
        NodeKind::Integer => "integer",
        NodeKind::Boolean => "boolean",
        NodeKind::Array { .. } => "list",
        NodeKind::Object { .. } => "object",
        NodeKind::Ref(_) => "reference",
    }
}

/// Whether `key` is spelled as `pattern` asks (any key, without one).
fn fits(pattern: &Option<KeyPattern>, key: &str) -> bool {
    pattern.as_ref().is_none_or(|pattern| pattern.matches(key))
}

fn misspelled_key(path: &JsonPath, pattern: &Option<KeyPattern>) -> String {
    let pattern = pattern
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    format!("{path}: the schema's keys here must match {pattern}")
}

fn allowed_keys_hint(properties: &[(String, SchemaNode)]) -> String {
    if properties.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = properties.iter().map(|(n, _)| n.as_str()).collect();
        format!(" (allowed: {})", names.join(", "))
    }
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn unescape_pointer(name: &str) -> String {
    name.replace("~1", "/").replace("~0", "~")
}

/// Call `visit` on `node` and everything below it (not through `$ref`).
fn walk_nodes(node: &SchemaNode, visit: &mut impl FnMut(&SchemaNode)) {
    visit(node);
    match &node.kind {
        NodeKind::Array { items } => walk_nodes(items, visit),
        NodeKind::Object {
            properties,
            additional,
            ..
        } => {
            for (_, child) in properties {
                walk_nodes(child, visit);
            }
            if let Some(child) = additional {
                walk_nodes(child, visit);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
