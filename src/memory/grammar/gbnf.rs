//! The revision grammar in llama.cpp's GBNF, for servers of the llama.cpp
//! family, which ignore Lark: the same lines, spelled as llguidance spells them.

use super::{
    Bounded, BoundedKind, LineRules, LineShape, NewKey, PathText, RevisionLines, MAX_STRING_CHARS,
    NEW_KEY,
};
use crate::error::{Error, Result};
use crate::memory::Op;
use regex_syntax::hir::{Class, Hir, HirKind};
use serde_json::Value;
use std::fmt::Write;

/// JSON as llguidance writes it under `fixed_spacing`: `", "` and `": "`
/// between items and no other whitespace, strings escaped only where JSON
/// must (a `\u` escape only for a control character). A note is a string
/// of [`MAX_STRING_CHARS`] characters at most, with no `<`, `>` or line break.
const JSON_RULES: &str = r#"note ::= "\"" note-char{0,MAX} "\""
note-char ::= [^"\\<>\x00-\x1F] | "\\" (["\\bfrt] | "u00" ("0" [0-9b-fB-F] | "1" [0-9a-fA-F]))
string ::= "\"" string-char* "\""
string-char ::= [^"\\\x00-\x1F] | "\\" (["\\bfnrt] | "u00" [01] [0-9a-fA-F])
integer ::= "-"? ("0" | [1-9] [0-9]*)
number ::= integer ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
boolean ::= "true" | "false"
value ::= "null" | boolean | number | string | array | object
array ::= "[" (value (", " value)*)? "]"
object ::= "{" (string ": " value (", " string ": " value)*)? "}"
"#;

/// A GBNF grammar for up to `max_lines` revision lines, accepting what
/// [`super::revision_grammar`] accepts with two exceptions, both checked
/// again when the revision is applied: a key beyond an object's declared
/// properties may repeat a declared one, which GBNF, having no negation,
/// cannot forbid; and a value the schema lists (`enum`) is taken as listed,
/// without the bounds of its type.
pub(super) fn revision_grammar(lines: &RevisionLines, max_lines: usize) -> Result<String> {
    if lines.is_empty() {
        return Ok("root ::= \"\"\n".to_string());
    }
    let rules = line_rules(lines)?;
    Ok(format!(
        "root ::= line{{0,{max_lines}}}\nline ::= {}\n{}",
        [rules.adds, rules.updates].concat().join(" | "),
        rules.definitions,
    ))
}

/// The GBNF rules of single revision lines, named as the Lark ones are,
/// with the `key` rule and the JSON rules they use.
pub(super) fn line_rules(lines: &RevisionLines) -> Result<LineRules> {
    let mut rules = Vec::new();
    let mut adds = Vec::new();
    let mut updates = Vec::new();
    for (index, line) in lines.numbered() {
        let name = format!("r{index}");
        rules.push(format!("{name} ::= {}", line_expression(line)?));
        match line.op {
            Op::Add => adds.push(name),
            Op::Update => updates.push(name),
        }
    }
    Ok(LineRules {
        adds,
        updates,
        definitions: format!(
            "{}\nkey ::= {}\n{}",
            rules.join("\n"),
            regex(NEW_KEY)?,
            JSON_RULES.replace("MAX", &MAX_STRING_CHARS.to_string()),
        ),
    })
}

fn line_expression(line: &LineShape) -> Result<String> {
    let (head, tail) = line.path.around(line.op);
    Ok(format!(
        "{}{}{} {} {}",
        literal(&head),
        key_between(&line.path)?,
        literal(&tail),
        value(&line.value),
        literal("}\n")
    ))
}

/// What goes between a path's text before and after its key: the key's
/// expression set off by spaces, or one space.
pub(super) fn key_between(path: &PathText) -> Result<String> {
    Ok(match &path.key {
        None => " ".to_string(),
        Some(NewKey::Any) => " key ".to_string(),
        Some(NewKey::Pattern(pattern)) => format!(" ({}) ", regex(pattern)?),
    })
}

/// The expression of a bounded value.
fn value(bounded: &Bounded) -> String {
    if let Some(allowed) = &bounded.allowed {
        let choices: Vec<String> = allowed
            .iter()
            .map(|choice| literal(&spaced(choice)))
            .collect();
        return format!("({})", choices.join(" | "));
    }
    match &bounded.kind {
        BoundedKind::Any => "value".to_string(),
        BoundedKind::Note => "note".to_string(),
        BoundedKind::Number => "number".to_string(),
        BoundedKind::Integer => "integer".to_string(),
        BoundedKind::Boolean => "boolean".to_string(),
        BoundedKind::List { items, max_items } => {
            let item = value(items);
            match max_items {
                Some(1) => format!("\"[\" {item} \"]\""),
                Some(max) => format!("\"[\" {item} (\", \" {item}){{0,{}}} \"]\"", max - 1),
                None => format!("\"[\" {item} (\", \" {item})* \"]\""),
            }
        }
        BoundedKind::Object {
            properties,
            required,
            additional,
        } => {
            let mut members: Vec<(String, bool)> = properties
                .iter()
                .map(|(key, child)| {
                    let member = format!(
                        "{} {}",
                        literal(&format!("{}: ", spaced(&Value::String(key.clone())))),
                        value(child)
                    );
                    (member, required.contains(key))
                })
                .collect();
            if let Some(child) = additional {
                let member = format!("string \": \" {}", value(child));
                members.push((format!("{member} (\", \" {member})*"), false));
            }
            sequence(&["\"{\"", &members_in_order(&members, false), "\"}\""])
        }
    }
}

/// Object members in their order, each `(expression, required)`, separated
/// by `", "`, as llguidance orders them: optional ones may be left out, and
/// `after_one` says whether a member already came before these. Empty when
/// there are none.
fn members_in_order(members: &[(String, bool)], after_one: bool) -> String {
    let Some(((member, required), rest)) = members.split_first() else {
        return String::new();
    };
    let rest_after = members_in_order(rest, true);
    match (required, after_one) {
        (true, true) => sequence(&["\", \"", member, &rest_after]),
        (true, false) => sequence(&[member, &rest_after]),
        (false, true) => sequence(&[&format!("(\", \" {member})?"), &rest_after]),
        (false, false) => {
            let with = sequence(&[member, &rest_after]);
            match members_in_order(rest, false).as_str() {
                "" => format!("({with})?"),
                without => format!("({with} | {without})"),
            }
        }
    }
}

/// Expressions one after the other, the empty ones left out.
fn sequence(parts: &[&str]) -> String {
    let parts: Vec<&str> = parts
        .iter()
        .copied()
        .filter(|part| !part.is_empty())
        .collect();
    parts.join(" ")
}

/// `value` as JSON with llguidance's fixed spacing.
fn spaced(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(spaced).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(members) => {
            let members: Vec<String> = members
                .iter()
                .map(|(key, member)| format!("{}: {}", Value::String(key.clone()), spaced(member)))
                .collect();
            format!("{{{}}}", members.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// `text` as a GBNF string literal.
pub(super) fn literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&hex(c)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `c` as a GBNF escape, which reads a code point in any of three widths.
fn hex(c: char) -> String {
    match u32::from(c) {
        code @ 0..=0xFF => format!("\\x{code:02X}"),
        code @ 0x100..=0xFFFF => format!("\\u{code:04X}"),
        code => format!("\\U{code:08X}"),
    }
}

/// A regular expression that matches whole (a key pattern) as a GBNF
/// expression. GBNF has no anchors or look-around, so a pattern that needs
/// them has no rendering.
fn regex(pattern: &str) -> Result<String> {
    let hir = regex_syntax::Parser::new()
        .parse(pattern)
        .map_err(|e| unrenderable(pattern, &e.to_string()))?;
    let mut out = String::new();
    write_hir(&hir, pattern, &mut out)?;
    Ok(out)
}

fn write_hir(hir: &Hir, pattern: &str, out: &mut String) -> Result<()> {
    match hir.kind() {
        HirKind::Empty => out.push_str("\"\""),
        HirKind::Literal(bytes) => {
            let text = std::str::from_utf8(&bytes.0)
                .map_err(|_| unrenderable(pattern, "it matches bytes that are not UTF-8"))?;
            out.push_str(&literal(text));
        }
        HirKind::Class(Class::Unicode(class)) => {
            if class.ranges().is_empty() {
                return Err(unrenderable(pattern, "a class matches no character"));
            }
            out.push('[');
            for range in class.ranges() {
                out.push_str(&class_char(range.start()));
                if range.end() != range.start() {
                    write!(out, "-{}", class_char(range.end())).expect("a String takes writes");
                }
            }
            out.push(']');
        }
        HirKind::Class(Class::Bytes(_)) => {
            return Err(unrenderable(pattern, "it matches bytes, not characters"))
        }
        HirKind::Look(_) => {
            return Err(unrenderable(pattern, "GBNF has no anchors or look-around"))
        }
        HirKind::Repetition(repetition) => {
            out.push('(');
            write_hir(&repetition.sub, pattern, out)?;
            match repetition.max {
                Some(max) => write!(out, "){{{},{max}}}", repetition.min),
                None => write!(out, "){{{},}}", repetition.min),
            }
            .expect("a String takes writes");
        }
        HirKind::Capture(capture) => write_hir(&capture.sub, pattern, out)?,
        HirKind::Concat(parts) => write_group(parts, " ", pattern, out)?,
        HirKind::Alternation(choices) => write_group(choices, " | ", pattern, out)?,
    }
    Ok(())
}

/// `parts` in parentheses, `separator` between them.
fn write_group(parts: &[Hir], separator: &str, pattern: &str, out: &mut String) -> Result<()> {
    out.push('(');
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            out.push_str(separator);
        }
        write_hir(part, pattern, out)?;
    }
    out.push(')');
    Ok(())
}

/// A character inside a GBNF class: letters and digits as they are, the
/// rest escaped, so that none reads as `]`, `^`, `-` or an escape.
fn class_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        hex(c)
    }
}

fn unrenderable(pattern: &str, reason: &str) -> Error {
    Error::invalid(
        format!("key pattern `{pattern}`"),
        format!("no GBNF rendering: {reason}"),
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::{accepts, lark_of_gbnf};
    use super::super::{lark_grammar, MAX_LIST_ITEMS};
    use super::*;
    use crate::memory::testing::load;
    use crate::memory::Schema;
    use serde_json::json;

    /// Each line as both dialects take it, with what they should say.
    fn assert_both<T: AsRef<str>>(
        schema: &Schema,
        memory: &Value,
        updates: bool,
        cases: &[(T, bool)],
    ) {
        let lines = RevisionLines::new(schema, memory, updates);
        let lark = lark_grammar(&lines, 3);
        let gbnf = revision_grammar(&lines, 3).unwrap();
        let from_gbnf = lark_of_gbnf(&gbnf);
        for (text, expected) in cases {
            let text = text.as_ref();
            assert_eq!(accepts(&lark, text), *expected, "Lark: {text:?}\n{lark}");
            assert_eq!(
                accepts(&from_gbnf, text),
                *expected,
                "GBNF: {text:?}\n{gbnf}"
            );
        }
    }

    fn line(op: &str, path: &str, value: &str) -> String {
        format!("{{\"op\": \"{op}\", \"path\": \"{path}\", \"value\": {value}}}\n")
    }

    #[test]
    fn notes_and_people_parse_alike_in_both_dialects() {
        let memory =
            json!({"events": ["The fog lifts."], "people": {}, "setting": [], "themes": []});
        let note = |text: &str| line("add", "$.events", &format!("\"{text}\""));
        let two = note("Ada lights the lamp.") + &note("The boat comes in.");
        let person = line("add", "$.people.'Ada Penhallow'", r#"["keeps the log"]"#);
        let crowd = serde_json::to_string(&vec!["a"; MAX_LIST_ITEMS + 1]).unwrap();
        let cases = [
            (String::new(), true),
            (two, true),
            (person, true),
            (note(r#"She said \"no\" twice."#), true),
            (note(&"a".repeat(MAX_STRING_CHARS)), true),
            (
                line("update", "$.events[0]", "\"The fog lifts at noon.\""),
                true,
            ),
            // A path the schema has no place for.
            (line("add", "$.weather", "\"fog\""), false),
            // No value.
            (
                "{\"op\": \"add\", \"path\": \"$.events\"}\n".to_string(),
                false,
            ),
            (note(&"a".repeat(MAX_STRING_CHARS + 1)), false),
            (note("a <placeholder>"), false),
            (note("a\\nb"), false),
            (line("add", "$.people.'Ada'", "[]"), false),
            (line("add", "$.people.'Ada'", &crowd), false),
            (line("add", "$.people.'Ada \\\"A\\\"'", "[\"x\"]"), false),
            (
                "{\"op\":\"add\",\"path\":\"$.events\",\"value\":\"a\"}\n".to_string(),
                false,
            ),
            (note("no line break").trim_end().to_string(), false),
        ];
        assert_both(&load("summary.json"), &memory, true, &cases);
    }

    #[test]
    fn objects_keep_their_members_order_and_required_ones() {
        let whole = r#"{"purpose": "p", "input": "i", "output": "o", "procedure": "s"}"#;
        let reordered = r#"{"input": "i", "purpose": "p", "output": "o", "procedure": "s"}"#;
        let short = r#"{"purpose": "p", "input": "i", "output": "o"}"#;
        let cases = [
            (line("add", "$.'retry'", whole), true),
            (line("add", "$.'retry'", reordered), false),
            (line("add", "$.'retry'", short), false),
        ];
        assert_both(&load("code.json"), &json!({}), false, &cases);

        let cases = [
            (line("add", "$.'users'", r#"{"description": "d"}"#), true),
            (
                line(
                    "add",
                    "$.'users'",
                    r#"{"description": "d", "columns": {"id": "key", "name": "n"}}"#,
                ),
                true,
            ),
            (
                line("add", "$.'users'", r#"{"columns": {"id": "key"}}"#),
                false,
            ),
            (
                line("add", "$.'users'", r#"{"description": "d", "columns": {}}"#),
                true,
            ),
        ];
        assert_both(&load("sql.json"), &json!({}), false, &cases);
    }

    #[test]
    fn a_key_pattern_of_the_schema_spells_new_keys_in_both() {
        let schema = Schema::from_value(&json!({
            "type": "object",
            "propertyNames": {"pattern": "^[a-z_]{1,6}$"},
            "additionalProperties": {"type": "boolean"},
        }))
        .unwrap();
        let cases = [
            (line("add", "$.'is_on'", "true"), true),
            (line("add", "$.'On'", "true"), false),
            (line("add", "$.'seven_x'", "false"), false),
            (line("add", "$.'on'", "1"), false),
        ];
        assert_both(&schema, &json!({}), false, &cases);
    }

    #[test]
    fn listed_values_are_the_only_ones_either_takes() {
        let schema = Schema::from_value(&json!({
            "type": "object",
            "additionalProperties": {"type": "string", "enum": ["yes", "no"]},
        }))
        .unwrap();
        let cases = [
            (line("add", "$.'Open'", "\"yes\""), true),
            (line("add", "$.'Open'", "\"maybe\""), false),
        ];
        assert_both(&schema, &json!({}), false, &cases);
    }

    #[test]
    fn gbnf_has_a_root_and_a_pattern_it_cannot_spell_is_an_error() {
        let lines = RevisionLines::new(&load("book.json"), &json!({}), true);
        let gbnf = revision_grammar(&lines, 48).unwrap();
        assert!(
            gbnf.starts_with("root ::= line{0,48}\nline ::= r0\n"),
            "{gbnf}"
        );
        assert!(gbnf.contains("note-char{0,280}"), "{gbnf}");
        let err = regex(r"\bword").unwrap_err().to_string();
        assert!(err.contains("no GBNF rendering"), "{err}");
    }
}
