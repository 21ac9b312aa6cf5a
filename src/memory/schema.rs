//! The memory schema: a small subset of JSON Schema (draft 2020-12), loaded
//! into a tree that can check a memory, find the type at a path, and describe
//! itself for a prompt.
//!
//! Supported keywords: `type` (one of `object`, `array`, `string`, `number`,
//! `integer`, `boolean`), `properties`, `required`, `additionalProperties`
//! (`true`, `false` or a schema), `items`, `enum`, `title`, `description`,
//! `$defs` (at the root) and local references `"$ref": "#/$defs/Name"`.
//! `$schema`, `$id`, `$comment`, `default` and `examples` are accepted and
//! ignored. Any other keyword is refused with an error that names it, so a
//! schema never silently means less than its author wrote.
//!
//! Choices worth knowing:
//!
//! - Without `type`, a node with `properties` or `additionalProperties` is an
//!   object, one with `items` is an array, and anything else accepts any value.
//! - A missing `additionalProperties` allows any other key with any value, as in
//!   JSON Schema; the schemas shipped in `schemas/` always spell it out.
//! - The memory itself (the root, after following `$ref`) must be an object.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::fmt;
use std::path::Path;

use serde_json::{Map, Value};

use super::path::{is_plain_key, JsonPath, Segment};
use crate::error::{Error, Result};

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
    },
    /// `#/$defs/<name>`; [`Schema::resolve`] follows it.
    Ref(String),
}

/// A loaded schema: the root node and the named definitions it refers to.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    root: SchemaNode,
    defs: Vec<(String, SchemaNode)>,
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

    fn build(value: &Value) -> Result<Schema, String> {
        let Value::Object(map) = value else {
            return Err("a schema file must hold a JSON object".into());
        };
        let mut defs = Vec::new();
        if let Some(raw) = map.get("$defs") {
            let Value::Object(raw) = raw else {
                return Err("#/$defs: must be an object of named schemas".into());
            };
            for (name, def) in raw {
                let pointer = format!("#/$defs/{}", escape_pointer(name));
                defs.push((name.clone(), load_node(def, &pointer, false)?));
            }
        }
        let root = load_node(value, "#", true)?;
        let schema = Schema { root, defs };
        schema.check_refs()?;
        match &schema.resolve(&schema.root).kind {
            NodeKind::Object { .. } => Ok(schema),
            _ => Err("#: the memory must be an object (\"type\": \"object\")".into()),
        }
    }

    /// Every `$ref` names a definition, and no chain of references loops
    /// without reaching a real node.
    fn check_refs(&self) -> Result<(), String> {
        let mut missing = None;
        let mut visit = |node: &SchemaNode| {
            if let NodeKind::Ref(name) = &node.kind {
                if self.def(name).is_none() && missing.is_none() {
                    missing = Some(name.clone());
                }
            }
        };
        walk_nodes(&self.root, &mut visit);
        for (_, def) in &self.defs {
            walk_nodes(def, &mut visit);
        }
        if let Some(name) = missing {
            return Err(format!("$ref to #/$defs/{name}, which is not defined"));
        }
        for (name, _) in &self.defs {
            let mut seen = HashSet::new();
            let mut current = name.as_str();
            while let Some(NodeKind::Ref(next)) = self.def(current).map(|d| &d.kind) {
                if !seen.insert(current) {
                    return Err(format!("#/$defs/{name}: $ref chain loops without a type"));
                }
                current = next;
            }
        }
        Ok(())
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
                        ..
                    },
                    Segment::Key(key),
                ) => match properties.iter().find(|(name, _)| name == key) {
                    Some((_, child)) => child,
                    None => match additional {
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

    /// The memory to start from: the root object with every declared object
    /// or list property present and empty, recursively. Scalar properties are
    /// left out (there is nothing true to put in them yet).
    pub fn empty_memory(&self) -> Value {
        self.empty_value(&self.root)
            .unwrap_or_else(|| Value::Object(Map::new()))
    }

    /// The empty form of a container node (`{}` with its declared containers,
    /// or `[]`); `None` for scalars and `Any`.
    pub fn empty_value(&self, node: &SchemaNode) -> Option<Value> {
        self.empty_within(node, &mut Vec::new())
    }

    /// `expanding` holds the definitions being filled in above this node: a
    /// definition that contains itself is left out the second time round.
    fn empty_within<'a>(
        &'a self,
        node: &'a SchemaNode,
        expanding: &mut Vec<&'a str>,
    ) -> Option<Value> {
        if let NodeKind::Ref(name) = &node.kind {
            if expanding.contains(&name.as_str()) {
                return None;
            }
            expanding.push(name);
            let empty = self.empty_within(
                self.def(name).expect("references are checked at load"),
                expanding,
            );
            expanding.pop();
            return empty;
        }
        match &node.kind {
            NodeKind::Array { .. } => Some(Value::Array(Vec::new())),
            NodeKind::Object { properties, .. } => {
                let mut map = Map::new();
                for (name, child) in properties {
                    if let Some(empty) = self.empty_within(child, expanding) {
                        map.insert(name.clone(), empty);
                    }
                }
                Some(Value::Object(map))
            }
            _ => None,
        }
    }

    /// Every path that exists in `memory` (below the root) with the node that
    /// types it: the places an `update` may replace. Depth-first, in the
    /// memory's own key order. Parts of the memory the schema has no place for
    /// are skipped.
    pub fn update_targets(&self, memory: &Value) -> Vec<(JsonPath, &SchemaNode)> {
        let mut targets = Vec::new();
        self.collect_updates(
            self.resolve(&self.root),
            memory,
            &mut JsonPath::root(),
            &mut targets,
        );
        targets
    }

    fn collect_updates<'a>(
        &'a self,
        node: &'a SchemaNode,
        value: &Value,
        path: &mut JsonPath,
        out: &mut Vec<(JsonPath, &'a SchemaNode)>,
    ) {
        for (segment, child_value) in children_of(value) {
            let Some(child) = self.child(node, &segment) else {
                continue;
            };
            path.push(segment);
            out.push((path.clone(), child));
            self.collect_updates(child, child_value, path, out);
            path.pop();
        }
    }

    /// Where an `add` may create something in `memory`, with the node that
    /// types the new value: for every object, each declared property it lacks
    /// and (when the schema allows other keys) a new key; for every list, its
    /// next index. Depth-first, in the memory's key order.
    ///
    /// Two more forms `apply` accepts are left out so that a decoder has one
    /// way to say each thing: `add` at an existing list with an item or a list
    /// of items (append), and `add` at an existing object with an object of
    /// new keys (merge).
    pub fn add_targets(&self, memory: &Value) -> Vec<(PathPattern, &SchemaNode)> {
        let mut targets = Vec::new();
        self.collect_adds(
            self.resolve(&self.root),
            memory,
            &mut JsonPath::root(),
            &mut targets,
        );
        targets
    }

    fn collect_adds<'a>(
        &'a self,
        node: &'a SchemaNode,
        value: &Value,
        path: &mut JsonPath,
        out: &mut Vec<(PathPattern, &'a SchemaNode)>,
    ) {
        match (&node.kind, value) {
            (
                NodeKind::Object {
                    properties,
                    additional,
                    ..
                },
                Value::Object(map),
            ) => {
                for (name, child) in properties {
                    if !map.contains_key(name) {
                        let pattern = PathPattern {
                            prefix: path.clone(),
                            next: Next::Key(name.clone()),
                        };
                        out.push((pattern, self.resolve(child)));
                    }
                }
                if let Some(child) = additional {
                    let pattern = PathPattern {
                        prefix: path.clone(),
                        next: Next::NewKey,
                    };
                    out.push((pattern, self.resolve(child)));
                }
            }
            (NodeKind::Any, Value::Object(_)) => out.push((
                PathPattern {
                    prefix: path.clone(),
                    next: Next::NewKey,
                },
                node,
            )),
            (NodeKind::Array { items }, Value::Array(list)) => out.push((
                PathPattern {
                    prefix: path.clone(),
                    next: Next::Index(list.len()),
                },
                self.resolve(items),
            )),
            (NodeKind::Any, Value::Array(list)) => out.push((
                PathPattern {
                    prefix: path.clone(),
                    next: Next::Index(list.len()),
                },
                node,
            )),
            _ => return,
        }
        for (segment, child_value) in children_of(value) {
            if let Some(child) = self.child(node, &segment) {
                path.push(segment);
                self.collect_adds(child, child_value, path, out);
                path.pop();
            }
        }
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

    /// The schema as Python-like class definitions, the form a prompt shows:
    ///
    /// ```text
    /// class Memory:
    ///     # <root description>
    ///     attributes: dict[str, list[str]]  # <property description>
    /// ```
    ///
    /// `Memory` comes first, then each nested class in the order it is first
    /// mentioned. Objects with declared properties become classes (named after
    /// their `$defs` entry, else their `title`, else the key that holds them);
    /// maps become `dict[str, T]`, lists `list[T]`, enums `Literal[...]`. A
    /// root that is a plain map is written `Memory = dict[str, T]`. Optional
    /// properties are marked `# optional`. Class and alias descriptions become
    /// comment lines wrapped at 80 columns; a property's description follows
    /// it on its line. Same schema, same text.
    pub fn render_types(&self) -> String {
        TypeRenderer::new(self).render()
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

/// Turn one schema object into a node. `pointer` locates it for errors;
/// `$defs` is accepted only at the root.
fn load_node(value: &Value, pointer: &str, is_root: bool) -> Result<SchemaNode, String> {
    let map = match value {
        Value::Bool(true) => return Ok(SchemaNode::any()),
        Value::Bool(false) => {
            return Err(format!(
                "{pointer}: the schema `false` (nothing allowed) is not supported"
            ))
        }
        Value::Object(map) => map,
        _ => {
            return Err(format!(
                "{pointer}: a schema must be an object or a boolean"
            ))
        }
    };
    for key in map.keys() {
        let known = matches!(
            key.as_str(),
            "type"
                | "properties"
                | "required"
                | "additionalProperties"
                | "items"
                | "enum"
                | "title"
                | "description"
                | "$ref"
        ) || IGNORED_KEYWORDS.contains(&key.as_str())
            || (key == "$defs" && is_root);
        if !known {
            let hint = match key.as_str() {
                "$defs" => " ($defs is supported only at the top level)",
                "definitions" => " (use $defs)",
                _ => "",
            };
            return Err(format!("{pointer}: unsupported keyword `{key}`{hint}"));
        }
    }
    let text = |key: &str| -> Result<Option<String>, String> {
        match map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{pointer}/{key}: must be a string")),
        }
    };
    let title = text("title")?;
    let description = text("description")?;
    let allowed = match map.get("enum") {
        None => None,
        Some(Value::Array(values)) if !values.is_empty() => Some(values.clone()),
        Some(_) => return Err(format!("{pointer}/enum: must be a non-empty list")),
    };

    if let Some(reference) = map.get("$ref") {
        let Some(reference) = reference.as_str() else {
            return Err(format!("{pointer}/$ref: must be a string"));
        };
        let Some(name) = reference.strip_prefix("#/$defs/") else {
            return Err(format!(
                "{pointer}/$ref: `{reference}` is not supported; only local references of the form #/$defs/Name are"
            ));
        };
        for key in [
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "enum",
        ] {
            if map.contains_key(key) {
                return Err(format!(
                    "{pointer}: `{key}` next to `$ref` is not supported"
                ));
            }
        }
        return Ok(SchemaNode {
            title,
            description,
            allowed: None,
            kind: NodeKind::Ref(unescape_pointer(name)),
        });
    }

    let declared = match map.get("type") {
        None => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(Value::Array(_)) => {
            return Err(format!(
                "{pointer}/type: a list of types is not supported; pick one"
            ))
        }
        Some(_) => return Err(format!("{pointer}/type: must be a string")),
    };
    let has_object_keywords = ["properties", "required", "additionalProperties"]
        .iter()
        .any(|k| map.contains_key(*k));
    let inferred = declared.or(if has_object_keywords {
        Some("object")
    } else if map.contains_key("items") {
        Some("array")
    } else {
        None
    });
    let misplaced = |keys: &[&str], kind: &str| -> Result<(), String> {
        match keys.iter().find(|k| map.contains_key(**k)) {
            Some(key) => Err(format!("{pointer}: `{key}` does not apply to type {kind}")),
            None => Ok(()),
        }
    };

    let kind = match inferred {
        None => NodeKind::Any,
        Some(t @ ("string" | "number" | "integer" | "boolean")) => {
            misplaced(&["properties", "required", "additionalProperties", "items"], t)?;
            match t {
                "string" => NodeKind::String,
                "number" => NodeKind::Number,
                "integer" => NodeKind::Integer,
                _ => NodeKind::Boolean,
            }
        }
        Some("array") => {
            misplaced(&["properties", "required", "additionalProperties"], "array")?;
            let items = match map.get("items") {
                None => SchemaNode::any(),
                Some(items) => load_node(items, &format!("{pointer}/items"), false)?,
            };
            NodeKind::Array {
                items: Box::new(items),
            }
        }
        Some("object") => {
            misplaced(&["items"], "object")?;
            let mut properties = Vec::new();
            match map.get("properties") {
                None => {}
                Some(Value::Object(props)) => {
                    for (name, child) in props {
                        let child_pointer = format!("{pointer}/properties/{}", escape_pointer(name));
                        properties.push((name.clone(), load_node(child, &child_pointer, false)?));
                    }
                }
                Some(_) => return Err(format!("{pointer}/properties: must be an object")),
            }
            let required = match map.get("required") {
                None => Vec::new(),
                Some(Value::Array(names)) => names
                    .iter()
                    .map(|n| {
                        n.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| format!("{pointer}/required: must list key names"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => return Err(format!("{pointer}/required: must be a list of key names")),
            };
            let additional = match map.get("additionalProperties") {
                None | Some(Value::Bool(true)) => Some(Box::new(SchemaNode::any())),
                Some(Value::Bool(false)) => None,
                Some(child) => Some(Box::new(load_node(
                    child,
                    &format!("{pointer}/additionalProperties"),
                    false,
                )?)),
            };
            for name in &required {
                let declared = properties.iter().any(|(n, _)| n == name);
                if !declared && additional.is_none() {
                    return Err(format!(
                        "{pointer}/required: `{name}` is required but not allowed by properties"
                    ));
                }
            }
            NodeKind::Object {
                properties,
                required,
                additional,
            }
        }
        Some(other) => {
            return Err(format!(
                "{pointer}/type: unsupported type `{other}` (use object, array, string, number, integer or boolean)"
            ))
        }
    };
    Ok(SchemaNode {
        title,
        description,
        allowed,
        kind,
    })
}

/// Writes the class view of a schema, one class at a time, breadth-first.
struct TypeRenderer<'a> {
    schema: &'a Schema,
    /// Classes and aliases waiting to be written: (name, node).
    queue: VecDeque<(String, &'a SchemaNode)>,
    /// Names handed out so far, so that each is used once.
    taken: BTreeSet<String>,
    /// `$defs` entries already given a name (def name → type name).
    def_names: Vec<(String, String)>,
}

impl<'a> TypeRenderer<'a> {
    fn new(schema: &'a Schema) -> Self {
        TypeRenderer {
            schema,
            queue: VecDeque::new(),
            taken: BTreeSet::new(),
            def_names: Vec::new(),
        }
    }

    fn render(mut self) -> String {
        self.taken.insert("Memory".into());
        let root = &self.schema.root;
        let resolved = self.schema.resolve(root);
        let mut blocks = Vec::new();
        let mut first = String::new();
        if is_class(resolved) {
            self.write_class(&mut first, "Memory", resolved, root.description.as_deref());
        } else {
            push_comment_lines(
                &mut first,
                "",
                root.description
                    .as_deref()
                    .or(resolved.description.as_deref()),
            );
            let expr = self.type_expr(resolved, "Memory");
            first.push_str(&format!("Memory = {expr}\n"));
        }
        blocks.push(first);
        while let Some((name, node)) = self.queue.pop_front() {
            let mut block = String::new();
            let resolved = self.schema.resolve(node);
            if is_class(resolved) {
                self.write_class(&mut block, &name, resolved, None);
            } else {
                push_comment_lines(&mut block, "", resolved.description.as_deref());
                let expr = self.type_expr(resolved, &name);
                block.push_str(&format!("{name} = {expr}\n"));
            }
            blocks.push(block);
        }
        blocks.join("\n")
    }

    /// `doc` overrides the node's own description (used for the root, whose
    /// description may sit next to a `$ref`).
    fn write_class(
        &mut self,
        out: &mut String,
        name: &str,
        node: &'a SchemaNode,
        doc: Option<&str>,
    ) {
        let NodeKind::Object {
            properties,
            required,
            additional,
        } = &node.kind
        else {
            unreachable!("only objects with properties are classes");
        };
        out.push_str(&format!("class {name}:\n"));
        push_comment_lines(out, "    ", doc.or(node.description.as_deref()));
        for (key, child) in properties {
            let hint = camel_case(key);
            let expr = self.type_expr(child, &hint);
            let field = if is_plain_key(key) {
                key.clone()
            } else {
                serde_json::to_string(key).expect("strings serialize")
            };
            let mut notes = Vec::new();
            if !required.contains(key) {
                notes.push("optional".to_string());
            }
            if let Some(description) = &child.description {
                notes.push(one_line(description));
            }
            out.push_str(&format!("    {field}: {expr}"));
            if !notes.is_empty() {
                out.push_str(&format!("  # {}", notes.join("; ")));
            }
            out.push('\n');
        }
        match additional {
            None => {}
            Some(child) => {
                let expr = self.type_expr(child, &format!("{name}Entry"));
                out.push_str(&format!("    # any other key: {expr}"));
                if let Some(description) = &child.description {
                    out.push_str(&format!("; {}", one_line(description)));
                }
                out.push('\n');
            }
        }
    }

    /// The inline type of `node`; classes it needs are queued under a fresh
    /// name (from `hint` when nothing better is known).
    fn type_expr(&mut self, node: &'a SchemaNode, hint: &str) -> String {
        if let Some(allowed) = &node.allowed {
            let choices: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return format!("Literal[{}]", choices.join(", "));
        }
        match &node.kind {
            NodeKind::Any => "Any".into(),
            NodeKind::String => "str".into(),
            NodeKind::Number => "float".into(),
            NodeKind::Integer => "int".into(),
            NodeKind::Boolean => "bool".into(),
            NodeKind::Array { items } => {
                format!("list[{}]", self.type_expr(items, &format!("{hint}Item")))
            }
            NodeKind::Ref(def) => {
                if let Some((_, name)) = self.def_names.iter().find(|(d, _)| d == def) {
                    return name.clone();
                }
                let name = self.fresh_name(&camel_case(def));
                self.def_names.push((def.clone(), name.clone()));
                let target = self
                    .schema
                    .def(def)
                    .expect("references are checked at load");
                self.queue.push_back((name.clone(), target));
                name
            }
            NodeKind::Object { additional, .. } if !is_class(node) => match additional {
                Some(child) => format!(
                    "dict[str, {}]",
                    self.type_expr(child, &format!("{hint}Entry"))
                ),
                None => "dict[str, Never]".into(),
            },
            NodeKind::Object { .. } => {
                let base = node
                    .title
                    .as_deref()
                    .map(camel_case)
                    .filter(|t| !t.is_empty())
                    .unwrap_or_else(|| hint.to_string());
                let name = self.fresh_name(&base);
                self.queue.push_back((name.clone(), node));
                name
            }
        }
    }

    fn fresh_name(&mut self, base: &str) -> String {
        let base = if base.is_empty() { "Item" } else { base };
        let mut name = base.to_string();
        let mut n = 2;
        while !self.taken.insert(name.clone()) {
            name = format!("{base}{n}");
            n += 1;
        }
        name
    }
}

fn is_class(node: &SchemaNode) -> bool {
    matches!(&node.kind, NodeKind::Object { properties, .. } if !properties.is_empty())
}

/// Comment lines for `text`, each paragraph wrapped at [`COMMENT_WIDTH`]
/// columns (a longer word stays whole).
fn push_comment_lines(out: &mut String, indent: &str, text: Option<&str>) {
    let Some(text) = text else {
        return;
    };
    for paragraph in text.lines() {
        let mut line = format!("{indent}#");
        let empty = line.chars().count();
        let mut width = empty;
        for word in paragraph.split_whitespace() {
            let word_width = word.chars().count();
            if width > empty && width + 1 + word_width > COMMENT_WIDTH {
                out.push_str(&line);
                out.push('\n');
                line = format!("{indent}#");
                width = empty;
            }
            line.push(' ');
            line.push_str(word);
            width += 1 + word_width;
        }
        out.push_str(&line);
        out.push('\n');
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `table_name` and `table name` → `TableName`; other characters are dropped.
fn camel_case(text: &str) -> String {
    let mut out = String::new();
    for word in text.split(|c: char| !c.is_ascii_alphanumeric()) {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas")
    }

    fn load(name: &str) -> Schema {
        Schema::from_file(schemas_dir().join(name)).unwrap()
    }

    fn path(text: &str) -> JsonPath {
        JsonPath::parse(text).unwrap()
    }

    #[test]
    fn every_shipped_schema_loads_and_its_empty_memory_validates() {
        let mut names: Vec<_> = std::fs::read_dir(schemas_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        names.sort();
        let stems: Vec<_> = names
            .iter()
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        for expected in ["book", "cok-book", "code", "entity", "sql"] {
            assert!(
                stems.iter().any(|s| s == expected),
                "schemas/{expected}.json is missing"
            );
        }
        for file in names {
            let schema = Schema::from_file(&file).unwrap_or_else(|e| panic!("{e}"));
            assert!(schema.title().is_some(), "{}: no title", file.display());
            assert!(
                schema.description().is_some(),
                "{}: no description",
                file.display()
            );
            let empty = schema.empty_memory();
            schema
                .validate(&empty)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert!(schema.render_types().starts_with(
                if is_class(schema.resolve(schema.root())) {
                    "class Memory:"
                } else {
                    "#"
                }
            ));
        }
    }

    #[test]
    fn the_entity_schema_matches_the_papers_example() {
        let schema = load("entity.json");
        assert_eq!(schema.empty_memory(), json!({"attributes": {}}));
        let memory = json!({"attributes": {"Noise Level": ["quiet at night"]}});
        assert_eq!(schema.validate(&memory), Ok(()));
        let node = schema.at_path(&path("$.attributes.'Noise Level'")).unwrap();
        assert!(matches!(node.kind, NodeKind::Array { .. }));
        let item = schema
            .at_path(&path("$.attributes.'Noise Level'[3]"))
            .unwrap();
        assert_eq!(item.kind, NodeKind::String);
        assert_eq!(schema.at_path(&path("$.other")), None);
        assert_eq!(schema.at_path(&path("$.attributes.x.y")), None);

        let bad = json!({"attributes": {"Noise Level": ["quiet", 3]}});
        assert_eq!(
            schema.validate(&bad),
            Err("$.attributes.'Noise Level'[1]: expected a string, found number 3".into())
        );
        let extra = json!({"attributes": {}, "mood": "calm"});
        let err = schema.validate(&extra).unwrap_err();
        assert!(err.starts_with("$.mood: key not allowed here"), "{err}");
        assert_eq!(
            schema.validate_at(&path("$.attributes.Food"), &json!("good")),
            Err("$.attributes.Food: expected a list, found a string".into())
        );
        assert_eq!(
            schema.validate_at(&path("$.attributes.Food"), &json!(["good"])),
            Ok(())
        );
    }

    #[test]
    fn render_types_shows_classes_maps_and_descriptions() {
        let schema = load("entity.json");
        let text = schema.render_types();
        assert!(text.starts_with("class Memory:\n    # "), "{text}");
        assert!(
            text.contains("\n    attributes: dict[str, list[str]]  # "),
            "{text}"
        );
        assert_eq!(text, schema.render_types());

        let code = load("code.json").render_types();
        assert!(code.contains("Memory = dict[str, Function]\n"), "{code}");
        assert!(code.contains("\nclass Function:\n"), "{code}");
        assert!(code.contains("\n    purpose: str  # "), "{code}");

        let sql = load("sql.json").render_types();
        assert!(sql.contains("Memory = dict[str, Table]\n"), "{sql}");
        assert!(
            sql.contains("    columns: dict[str, str]  # optional; "),
            "{sql}"
        );
    }

    #[test]
    fn render_types_names_nested_classes_and_handles_recursion() {
        let schema = Schema::from_value(&json!({
            "type": "object",
            "description": "Root notes.\nSecond line.",
            "properties": {
                "people": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {
                            "role": {"type": "string", "enum": ["hero", "villain"]},
                            "age": {"type": "integer"}
                        },
                        "required": ["role"],
                        "additionalProperties": false
                    }
                },
                "tree": {"$ref": "#/$defs/Node", "description": "a recursive outline"},
                "table name": {"type": "boolean"}
            },
            "required": ["people"],
            "additionalProperties": false,
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
                    },
                    "additionalProperties": false
                }
            }
        }))
        .unwrap();
        let expected = "\
class Memory:
    # Root notes.
    # Second line.
    people: dict[str, PeopleEntry]
    tree: Node  # optional; a recursive outline
    \"table name\": bool  # optional

class PeopleEntry:
    role: Literal[\"hero\", \"villain\"]
    age: int  # optional

class Node:
    label: str  # optional
    children: list[Node]  # optional
";
        assert_eq!(schema.render_types(), expected);
        let deep = json!({"people": {}, "tree": {"label": "a", "children": [{"label": "b", "children": []}]}});
        assert_eq!(schema.validate(&deep), Ok(()));
        assert_eq!(
            schema
                .at_path(&path("$.tree.children[0].children[5].label"))
                .map(|n| &n.kind),
            Some(&NodeKind::String)
        );
        assert_eq!(
            schema.empty_memory(),
            json!({"people": {}, "tree": {"children": []}})
        );
    }

    #[test]
    fn a_definition_that_contains_itself_has_a_finite_empty_form() {
        let schema = Schema::from_value(&json!({
            "type": "object",
            "properties": {"chain": {"$ref": "#/$defs/Link"}},
            "$defs": {"Link": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Link"}}}}
        }))
        .unwrap();
        assert_eq!(schema.empty_memory(), json!({"chain": {}}));
        assert_eq!(
            schema.validate(&json!({"chain": {"next": {"next": {}}}})),
            Ok(())
        );
        assert!(schema.render_types().contains("chain: Link  # optional\n"));
    }

    #[test]
    fn refuses_what_it_does_not_support_naming_the_keyword() {
        for (schema, needle) in [
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 3}}}),
                "#/properties/a: unsupported keyword `minLength`",
            ),
            (
                json!({"type": "object", "oneOf": []}),
                "unsupported keyword `oneOf`",
            ),
            (json!({"type": "object", "definitions": {}}), "use $defs"),
            (
                json!({"type": "object", "properties": {"a": {"$defs": {}}}}),
                "only at the top level",
            ),
            (
                json!({"type": ["string", "null"]}),
                "a list of types is not supported",
            ),
            (json!({"type": "null"}), "unsupported type `null`"),
            (json!({"type": "string"}), "the memory must be an object"),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}),
                "#/$defs/Missing, which is not defined",
            ),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}),
                "only local references",
            ),
            (
                json!({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}),
                "loops",
            ),
            (
                json!({"type": "string", "items": {}}),
                "`items` does not apply to type string",
            ),
            (
                json!({"type": "object", "required": ["x"], "additionalProperties": false}),
                "`x` is required but not allowed",
            ),
            (json!([1]), "must hold a JSON object"),
        ] {
            let err = Schema::from_value(&schema).unwrap_err().to_string();
            assert!(err.contains(needle), "{schema}: {err}");
        }
    }

    #[test]
    fn from_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.json");
        std::fs::write(&file, r#"{"type": "object", "patternProperties": {}}"#).unwrap();
        let err = Schema::from_file(&file).unwrap_err().to_string();
        assert!(
            err.contains("bad.json") && err.contains("`patternProperties`"),
            "{err}"
        );
        let err = Schema::from_file(dir.path().join("absent.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("absent.json"), "{err}");
    }

    #[test]
    fn targets_list_what_exists_and_what_may_be_created() {
        let schema = load("sql.json");
        let memory = json!({
            "Singer": {"description": "who sings", "columns": {"Name": "text"}},
            "Stadium": {"description": "venues"}
        });
        schema.validate(&memory).unwrap();
        let updates: Vec<String> = schema
            .update_targets(&memory)
            .iter()
            .map(|(p, _)| p.to_string())
            .collect();
        assert_eq!(
            updates,
            [
                "$.Singer",
                "$.Singer.description",
                "$.Singer.columns",
                "$.Singer.columns.Name",
                "$.Stadium",
                "$.Stadium.description"
            ]
        );
        let adds: Vec<String> = schema
            .add_targets(&memory)
            .iter()
            .map(|(p, _)| p.to_string())
            .collect();
        assert_eq!(adds, ["$.*", "$.Singer.columns.*", "$.Stadium.columns"]);

        let entity = load("entity.json");
        let memory = json!({"attributes": {"Food": ["good", "cheap"]}});
        let adds = entity.add_targets(&memory);
        let shown: Vec<String> = adds.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(shown, ["$.attributes.*", "$.attributes.Food[2]"]);
        assert_eq!(adds[1].1.kind, NodeKind::String);
        assert!(adds[0].0.matches(&path("$.attributes.'Noise Level'")));
        assert!(!adds[0].0.matches(&path("$.attributes.a.b")));
        assert!(adds[1].0.matches(&path("$.attributes.Food[2]")));
        assert!(!adds[1].0.matches(&path("$.attributes.Food[1]")));
    }
}
