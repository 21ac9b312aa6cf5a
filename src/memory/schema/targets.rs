//! What a memory may become: its empty form, and the paths a revision may
//! update or add to, as the schema and the memory so far allow.

use serde_json::{Map, Value};

use super::*;

impl Schema {
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
}
