//! Revisions, and the pure function that applies one to a memory after checking it
//! against the schema.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::path::{JsonPath, Segment};
use super::schema::{NodeKind, Schema, SchemaNode, WalkError};

/// The two operations a revision can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Create a path that does not exist yet (or append to a list).
    Add,
    /// Replace the value at a path that exists.
    Update,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Add => "add",
            Op::Update => "update",
        })
    }
}

/// One proposed change to the memory. Serializes as
/// `{"op": "add", "path": "$.a.'b c'", "value": …}`, fields in that order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revision {
    pub op: Op,
    pub path: JsonPath,
    pub value: Value,
}

impl Revision {
    pub fn add(path: JsonPath, value: Value) -> Self {
        Revision {
            op: Op::Add,
            path,
            value,
        }
    }

    pub fn update(path: JsonPath, value: Value) -> Self {
        Revision {
            op: Op::Update,
            path,
            value,
        }
    }
}

/// Why a revision was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    /// The path's shape disagrees with the memory or schema (a key into a
    /// list, an index past the end, a step below a string).
    BadPath,
    /// `add` at a path that already exists.
    PathExists,
    /// `update` at a path that does not exist, or `add` below a parent that
    /// is missing and cannot be created empty.
    PathMissing,
    /// The value does not match the schema at the path.
    TypeMismatch,
    /// The schema has no such key, or the operation is not allowed here
    /// (replacing the root, `update` when updates are turned off).
    NotAllowed,
    /// Anything else, such as an append of nothing.
    Other,
}

/// A refused revision: what kind of problem, and a sentence naming the path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub kind: RejectionKind,
    pub reason: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Rejection {}

impl Rejection {
    fn new(kind: RejectionKind, revision: &Revision, reason: impl fmt::Display) -> Self {
        Rejection {
            kind,
            reason: format!("{} {}: {reason}", revision.op, revision.path),
        }
    }

    /// The rejection for an `update` when a run allows `add` only (the
    /// "without updates" ablation). Callers filter with it before `apply`.
    pub fn update_disabled(revision: &Revision) -> Self {
        Rejection::new(
            RejectionKind::NotAllowed,
            revision,
            "updates are turned off for this run; only add is allowed",
        )
    }
}

/// Why a revision was refused, before it is tied to the revision.
type Refusal = (RejectionKind, String);

/// Apply `revision` to `memory`, returning the new memory, or why it was
/// refused. Pure: `memory` is never changed, so a refused revision leaves no
/// trace.
///
/// - `update` at a path that exists replaces the value there. The root cannot
///   be replaced.
/// - `add` at a path that does not exist creates it. The last step is a new key
///   of an object, or the index of a list equal to its length (an append).
///   Missing objects or lists *above* the new path are created empty along the
///   way when the schema says what they are and their empty form is valid (a
///   map, a list, an object with no required scalar); otherwise the revision is
///   refused and the parent has to be added whole first.
/// - `add` at a path that exists is accepted in two cases models rely on: at a
///   list, the value is appended (a list whose every element is a valid item
///   is appended element by element, anything else as one item); at an object,
///   the value must be an object of keys the target does not have yet, which
///   are merged in. Anything else already there is `PathExists`.
///
/// The value always has to match the schema at its path (for an append, the
/// list's `items`).
pub fn apply(memory: &Value, revision: &Revision, schema: &Schema) -> Result<Value, Rejection> {
    let reject = |(kind, reason): Refusal| Rejection::new(kind, revision, reason);
    let path = &revision.path;
    if path.is_root() && revision.op == Op::Update {
        return Err(reject((
            RejectionKind::NotAllowed,
            "the whole memory cannot be replaced; revise a path inside it".into(),
        )));
    }
    let node = schema.walk(path).map_err(|e| match e {
        WalkError::NotAllowed(reason) => reject((RejectionKind::NotAllowed, reason)),
        WalkError::BadPath(reason) => reject((RejectionKind::BadPath, reason)),
    })?;

    let mut next = memory.clone();
    let applied = match (revision.op, lookup_mut(&mut next, path.segments())) {
        (Op::Update, Some(slot)) => schema
            .validate_at(path, &revision.value)
            .map(|()| *slot = revision.value.clone())
            .map_err(|e| (RejectionKind::TypeMismatch, e)),
        (Op::Update, None) => Err((
            RejectionKind::PathMissing,
            "no such path; use add to create it".into(),
        )),
        (Op::Add, Some(Value::Array(list))) => {
            append_to_list(list, node, path, &revision.value, schema)
        }
        (Op::Add, Some(Value::Object(target))) => {
            merge_into_object(target, path, &revision.value, schema)
        }
        (Op::Add, Some(_)) => Err((
            RejectionKind::PathExists,
            "already exists; use update to replace it".into(),
        )),
        (Op::Add, None) => add_new(&mut next, path, &revision.value, schema),
    };
    applied.map_err(reject)?;
    Ok(next)
}

/// `add` to an existing list: `value` is one item, or a non-empty list of
/// items, each valid for the list's item schema.
fn append_to_list(
    list: &mut Vec<Value>,
    node: &SchemaNode,
    path: &JsonPath,
    value: &Value,
    schema: &Schema,
) -> Result<(), Refusal> {
    let items = match &node.kind {
        NodeKind::Array { items } => schema.resolve(items),
        NodeKind::Any => node,
        _ => return Err((RejectionKind::BadPath, "not a list in the schema".into())),
    };
    let appended = match value {
        Value::Array(values) if values.is_empty() => {
            return Err((RejectionKind::Other, "an empty list adds nothing".into()))
        }
        Value::Array(values)
            if values
                .iter()
                .all(|v| schema.validate_node(items, v).is_ok()) =>
        {
            values.clone()
        }
        single => match schema.validate_at(&path.index(list.len()), single) {
            Ok(()) => vec![single.clone()],
            Err(e) => return Err((RejectionKind::TypeMismatch, e)),
        },
    };
    list.extend(appended);
    Ok(())
}

/// `add` to an existing object: `value` must be an object of keys the
/// target does not have yet, each allowed and valid there.
fn merge_into_object(
    target: &mut Map<String, Value>,
    path: &JsonPath,
    value: &Value,
    schema: &Schema,
) -> Result<(), Refusal> {
    let Value::Object(members) = value else {
        return Err((
            RejectionKind::PathExists,
            "already exists; use update to replace it, or add an object of new keys to merge"
                .into(),
        ));
    };
    if members.is_empty() {
        return Err((RejectionKind::Other, "an empty object adds nothing".into()));
    }
    for (key, value) in members {
        if target.contains_key(key) {
            return Err((
                RejectionKind::PathExists,
                format!(
                    "{} already exists; use update to replace it",
                    path.key(key.clone())
                ),
            ));
        }
        let child = path.key(key.clone());
        if let Err(WalkError::NotAllowed(e) | WalkError::BadPath(e)) = schema.walk(&child) {
            return Err((RejectionKind::NotAllowed, e));
        }
        schema
            .validate_at(&child, value)
            .map_err(|e| (RejectionKind::TypeMismatch, e))?;
    }
    for (key, value) in members {
        target.insert(key.clone(), value.clone());
    }
    Ok(())
}

/// `add` at a path that does not exist yet: its parents are made as the
/// schema shapes them, and a list grows only at its end.
fn add_new(
    memory: &mut Value,
    path: &JsonPath,
    value: &Value,
    schema: &Schema,
) -> Result<(), Refusal> {
    let (last, parent) = path
        .segments()
        .split_last()
        .expect("the root always exists");
    schema
        .validate_at(path, value)
        .map_err(|e| (RejectionKind::TypeMismatch, e))?;
    let container = ensure_parent(memory, parent, schema)?;
    match (container, last) {
        (Value::Object(map), Segment::Key(key)) => {
            map.insert(key.clone(), value.clone());
            Ok(())
        }
        (Value::Array(list), Segment::Index(index)) if *index == list.len() => {
            list.push(value.clone());
            Ok(())
        }
        (Value::Array(list), Segment::Index(index)) => Err((
            RejectionKind::BadPath,
            format!(
                "index {index} is past the end of {}, which has {} items; append at [{}]",
                JsonPath::from_segments(parent.to_vec()),
                list.len(),
                list.len()
            ),
        )),
        (other, _) => Err((
            RejectionKind::BadPath,
            format!(
                "{} holds {}, which cannot take this step",
                JsonPath::from_segments(parent.to_vec()),
                short_kind(other)
            ),
        )),
    }
}

/// The value at `segments`, if it exists.
fn lookup_mut<'a>(mut value: &'a mut Value, segments: &[Segment]) -> Option<&'a mut Value> {
    for segment in segments {
        value = match (value, segment) {
            (Value::Object(map), Segment::Key(key)) => map.get_mut(key)?,
            (Value::Array(list), Segment::Index(index)) => list.get_mut(*index)?,
            _ => return None,
        };
    }
    Some(value)
}

/// Walk down to the container at `parent`, creating missing objects and lists
/// on key steps when the schema gives them a valid empty form.
fn ensure_parent<'a>(
    memory: &'a mut Value,
    parent: &[Segment],
    schema: &Schema,
) -> Result<&'a mut Value, (RejectionKind, String)> {
    let mut value = memory;
    let mut here = JsonPath::root();
    for segment in parent {
        here.push(segment.clone());
        value = match (value, segment) {
            (Value::Object(map), Segment::Key(key)) => {
                if !map.contains_key(key) {
                    let empty = creatable_empty(schema, &here).ok_or_else(|| {
                        (
                            RejectionKind::PathMissing,
                            format!("{here} does not exist and cannot be created empty; add it whole first"),
                        )
                    })?;
                    map.insert(key.clone(), empty);
                }
                map.get_mut(key).expect("inserted above")
            }
            (Value::Array(list), Segment::Index(index)) => {
                let len = list.len();
                list.get_mut(*index).ok_or_else(|| {
                    (
                        RejectionKind::PathMissing,
                        format!("{here} does not exist (the list has {len} items)"),
                    )
                })?
            }
            (other, _) => {
                let up = here.parent().expect("pushed above");
                return Err((
                    RejectionKind::BadPath,
                    format!(
                        "{up} holds {}, which cannot take this step",
                        short_kind(other)
                    ),
                ));
            }
        };
    }
    Ok(value)
}

fn creatable_empty(schema: &Schema, path: &JsonPath) -> Option<Value> {
    let node = schema.at_path(path)?;
    let empty = schema.empty_value(node)?;
    schema.validate_node(node, &empty).ok()?;
    Some(empty)
}

fn short_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
