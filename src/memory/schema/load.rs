//! Reading a schema: the JSON value checked keyword by keyword into a tree
//! of [`SchemaNode`]s, with every `$ref` pointing at a definition.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::*;

impl Schema {
    pub(super) fn build(value: &Value) -> Result<Schema, String> {
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
        let mut schema = Schema {
            root,
            defs,
            worked_example: None,
        };
        schema.check_refs()?;
        if !matches!(schema.resolve(&schema.root).kind, NodeKind::Object { .. }) {
            return Err("#: the memory must be an object (\"type\": \"object\")".into());
        }
        if let Some(example) = map.get(WorkedExample::KEYWORD) {
            schema.worked_example = Some(WorkedExample::load(example, &schema)?);
        }
        Ok(schema)
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
    check_keywords(map, pointer, is_root)?;
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
        return Ok(SchemaNode {
            title,
            description,
            allowed: None,
            kind: load_reference(map, reference, pointer)?,
        });
    }
    Ok(SchemaNode {
        title,
        description,
        allowed,
        kind: load_kind(map, pointer)?,
    })
}

/// Refuse a keyword prism does not understand, rather than ignore what it asks.
fn check_keywords(map: &Map<String, Value>, pointer: &str, is_root: bool) -> Result<(), String> {
    for key in map.keys() {
        let known = matches!(
            key.as_str(),
            "type"
                | "properties"
                | "required"
                | "additionalProperties"
                | "propertyNames"
                | "items"
                | "enum"
                | "title"
                | "description"
                | "$ref"
        ) || IGNORED_KEYWORDS.contains(&key.as_str())
            || (is_root && (key == "$defs" || key == WorkedExample::KEYWORD));
        if !known {
            let hint = match key.as_str() {
                "$defs" | WorkedExample::KEYWORD => " (supported only at the top level)",
                "definitions" => " (use $defs)",
                _ => "",
            };
            return Err(format!("{pointer}: unsupported keyword `{key}`{hint}"));
        }
    }
    Ok(())
}

/// A `$ref` node: a local `#/$defs/Name`, with nothing beside it that would
/// constrain the value further.
fn load_reference(
    map: &Map<String, Value>,
    reference: &Value,
    pointer: &str,
) -> Result<NodeKind, String> {
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
        "propertyNames",
        "items",
        "enum",
    ] {
        if map.contains_key(key) {
            return Err(format!(
                "{pointer}: `{key}` next to `$ref` is not supported"
            ));
        }
    }
    Ok(NodeKind::Ref(unescape_pointer(name)))
}

/// The node's type, declared or inferred from its keywords (`properties`
/// means an object, `items` an array), with its children loaded.
fn load_kind(map: &Map<String, Value>, pointer: &str) -> Result<NodeKind, String> {
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
    let has_object_keywords = [
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
    ]
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
    match inferred {
        None => Ok(NodeKind::Any),
        Some(t @ ("string" | "number" | "integer" | "boolean")) => {
            misplaced(
                &["properties", "required", "additionalProperties", "propertyNames", "items"],
                t,
            )?;
            Ok(match t {
                "string" => NodeKind::String,
                "number" => NodeKind::Number,
                "integer" => NodeKind::Integer,
                _ => NodeKind::Boolean,
            })
        }
        Some("array") => {
            misplaced(
                &["properties", "required", "additionalProperties", "propertyNames"],
                "array",
            )?;
            let items = match map.get("items") {
                None => SchemaNode::any(),
                Some(items) => load_node(items, &format!("{pointer}/items"), false)?,
            };
            Ok(NodeKind::Array {
                items: Box::new(items),
            })
        }
        Some("object") => {
            misplaced(&["items"], "object")?;
            load_object(map, pointer)
        }
        Some(other) => Err(format!(
            "{pointer}/type: unsupported type `{other}` (use object, array, string, number, integer or boolean)"
        )),
    }
}

/// An object node: its properties, required keys and what other keys may hold.
fn load_object(map: &Map<String, Value>, pointer: &str) -> Result<NodeKind, String> {
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
    let key_pattern = match map.get("propertyNames") {
        None => None,
        Some(names) => Some(load_key_pattern(
            names,
            &format!("{pointer}/propertyNames"),
        )?),
    };
    if let Some(pattern) = &key_pattern {
        if let Some((name, _)) = properties.iter().find(|(name, _)| !pattern.matches(name)) {
            return Err(format!(
                "{pointer}/properties: `{name}` does not match propertyNames {pattern}"
            ));
        }
    }
    Ok(NodeKind::Object {
        properties,
        required,
        additional,
        key_pattern,
    })
}

/// `propertyNames`, which prism supports as `{"pattern": "^…$"}` only: the
/// anchors make the pattern say what a whole key is, so that the same text
/// serves as a grammar terminal for constrained decoding.
fn load_key_pattern(value: &Value, pointer: &str) -> Result<KeyPattern, String> {
    let source = match value {
        Value::Object(map) if map.len() == 1 => map.get("pattern").and_then(Value::as_str),
        _ => None,
    };
    let Some(source) = source else {
        return Err(format!(
            "{pointer}: only an object with a single `pattern` is supported"
        ));
    };
    if source.len() < 2 || !source.starts_with('^') || !source.ends_with('$') {
        return Err(format!(
            "{pointer}/pattern: `{source}` must be anchored as ^…$ to say what a whole key is"
        ));
    }
    let regex = regex::Regex::new(source)
        .map_err(|e| format!("{pointer}/pattern: `{source}` is not a regular expression: {e}"))?;
    Ok(KeyPattern {
        source: source.to_string(),
        regex,
    })
}
