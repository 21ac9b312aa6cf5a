//! The schema written as Python-style class declarations, the compact form
//! in which prompts show it to the model.

use std::collections::{BTreeSet, VecDeque};

use super::*;

impl Schema {
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
            ..
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

pub(super) fn is_class(node: &SchemaNode) -> bool {
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
