//! Reading revisions, or a whole memory, out of raw model output, tolerating the
//! usual mess. Nothing here consults the schema.

use serde_json::{Map, Value};

use super::path::JsonPath;
use super::revision::{Op, Revision};

/// The longest quote of model text an error message carries.
const QUOTE_CHARS: usize = 160;

/// Every revision found in `output`, in order, with an `Err` for each
/// JSON-looking piece that is not one. Never panics.
///
/// The form models are asked for is one JSON object per line:
///
/// ```text
/// {"op": "add", "path": "$.attributes.'Noise Level'", "value": ["quiet"]}
/// {"op": "update", "path": "$.attributes.Food", "value": ["good dinner"]}
/// ```
///
/// `op` is `add` or `update` (any case; `append` reads as add and `replace` or
/// `set` as update), `path` is a [`JsonPath`] in any spelling it accepts, and
/// `value` is any JSON value. Also read:
///
/// - `{"add": {"$.path": value, …}}` and `{"update": {"$.path": value, …}}`;
/// - the PRISM paper's `{"$.path": {"add": value}}` / `{"$.path": {"update": value}}`;
/// - a JSON list of any of these, objects spread over several lines, and
///   several objects on one line;
/// - `{}` or `[]` for "nothing to change".
///
/// Code fences are dropped, and so are lines of prose (lines with no `{` or
/// `[`, or whose brackets do not start JSON and hold no `"` or `{`). Anything
/// that looks like an attempt at JSON but is not a revision comes back as an
/// `Err` quoting the text and saying why, one per attempt, for the caller to
/// count.
pub fn parse_revisions(output: &str) -> Vec<Result<Revision, String>> {
    let text: String = output
        .lines()
        .filter(|line| !line.trim_start().starts_with("```"))
        .map(|line| format!("{line}\n"))
        .collect();
    let mut found = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let line_end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
        match next_value(&text, pos, line_end) {
            Scan::Value { value, end } => {
                found.extend(revisions_in(value, &text[pos..end]));
                pos = end;
            }
            Scan::Broken(error) => {
                found.push(Err(error));
                pos = line_end + 1;
            }
            Scan::Prose => pos = line_end + 1,
        }
    }
    found
}

/// A whole memory read out of model output.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedMemory {
    pub memory: Value,
    /// The object was cut off (the model ran out of tokens) and has been
    /// closed after its last complete member or list item.
    pub was_cut: bool,
}

/// The first JSON object in `output`, as a whole memory. Code fences and prose
/// around it are skipped; an object cut off before its end is closed after
/// the last member or list item written in full. Returns why not when there
/// is no such object. Never panics.
pub fn parse_memory(output: &str) -> Result<ParsedMemory, String> {
    // Joined without a final newline, so that a string cut off at the end
    // reads as cut off, not as a string holding a raw newline.
    let text = output
        .lines()
        .filter(|line| !line.trim_start().starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut first_error = None;
    for (start, _) in text.match_indices('{') {
        let candidate = &text[start..];
        let error = match first_json(candidate) {
            Ok((memory, _)) => {
                return Ok(ParsedMemory {
                    memory,
                    was_cut: false,
                })
            }
            Err(error) => error,
        };
        if error.is_eof() {
            if let Some(memory) =
                close_cut(candidate).and_then(|closed| serde_json::from_str(&closed).ok())
            {
                return Ok(ParsedMemory {
                    memory,
                    was_cut: true,
                });
            }
        }
        first_error.get_or_insert(error);
    }
    Err(match first_error {
        Some(error) => format!("`{}`: not valid JSON: {error}", quote(text.trim())),
        None => format!("`{}`: no JSON object", quote(text.trim())),
    })
}

/// `text`, a JSON value that stops before its end, cut back to its last
/// complete member or list item and closed; `None` when nothing complete is
/// left to keep.
fn close_cut(text: &str) -> Option<String> {
    // The closers still owed, innermost last.
    let mut open: Vec<char> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    // Where the last complete piece ends, and the closers owed there.
    let mut cut: Option<(usize, Vec<char>)> = None;
    for (i, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    in_string = false;
                    // In a list a string is a whole item; in an object it may
                    // be a key still waiting for its value.
                    if open.last() == Some(&']') {
                        cut = Some((i + 1, open.clone()));
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => open.push('}'),
            '[' => open.push(']'),
            '}' | ']' => {
                open.pop();
                if open.is_empty() {
                    return None;
                }
                cut = Some((i + 1, open.clone()));
            }
            ',' => cut = Some((i, open.clone())),
            _ => {}
        }
    }
    let (end, open) = cut?;
    let mut closed = text[..end].trim_end().to_string();
    closed.extend(open.iter().rev());
    Some(closed)
}

enum Scan {
    /// A JSON value starting on this line, ending at byte `end`.
    Value { value: Value, end: usize },
    /// The line tried to be JSON and failed.
    Broken(String),
    /// Nothing on the rest of this line.
    Prose,
}

/// The first JSON value that starts at a `{` or `[` between `pos` and
/// `line_end`. A value may run past the line only when the line alone ends
/// early (a pretty-printed object).
fn next_value(text: &str, pos: usize, line_end: usize) -> Scan {
    let line = &text[pos..line_end];
    let mut first_error = None;
    for (offset, _) in line.match_indices(['{', '[']) {
        let start = pos + offset;
        match first_json(&text[start..line_end]) {
            Ok((value, len)) => {
                return Scan::Value {
                    value,
                    end: start + len,
                }
            }
            Err(error) if error.is_eof() => {
                if let Ok((value, len)) = first_json(&text[start..]) {
                    return Scan::Value {
                        value,
                        end: start + len,
                    };
                }
                first_error.get_or_insert((start, error));
            }
            Err(error) => {
                first_error.get_or_insert((start, error));
            }
        }
    }
    match first_error {
        Some((start, error)) if looks_like_json(&text[start..line_end]) => {
            Scan::Broken(format!("`{}`: not valid JSON: {error}", quote(line.trim())))
        }
        _ => Scan::Prose,
    }
}

/// Parse one JSON value from the start of `text`, returning it and its length
/// in bytes; whatever follows it is left alone.
fn first_json(text: &str) -> Result<(Value, usize), serde_json::Error> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match stream.next() {
        Some(Ok(value)) => Ok((value, stream.byte_offset())),
        Some(Err(error)) => Err(error),
        None => Err(serde::de::Error::custom("no JSON value")),
    }
}

/// Brackets in prose (`[OBJECTS FOR ADD]`, `see [1]`) carry no quotes or
/// braces; an attempt at a revision does.
fn looks_like_json(text: &str) -> bool {
    text.contains('"') || text.contains('{')
}

fn quote(text: &str) -> String {
    if text.chars().count() <= QUOTE_CHARS {
        text.to_string()
    } else {
        let cut: String = text.chars().take(QUOTE_CHARS).collect();
        format!("{cut}…")
    }
}

/// The revisions one parsed value holds.
fn revisions_in(value: Value, source: &str) -> Vec<Result<Revision, String>> {
    let source = quote(source.trim());
    match value {
        Value::Object(map) => from_object(map, &source),
        Value::Array(items) => {
            // A list with no object in it is prose such as "[1]", or an empty answer.
            if !items.iter().any(Value::is_object) {
                return Vec::new();
            }
            items
                .into_iter()
                .flat_map(|item| match item {
                    Value::Object(map) => from_object(map, &source),
                    other => vec![Err(format!(
                        "`{source}`: list item {other} is not a revision object"
                    ))],
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

fn from_object(map: Map<String, Value>, source: &str) -> Vec<Result<Revision, String>> {
    let fail = |reason: String| vec![Err(format!("`{source}`: {reason}"))];
    if map.is_empty() {
        return Vec::new();
    }
    if let Some(op) = map.get("op") {
        return vec![canonical(&map, op).map_err(|reason| format!("`{source}`: {reason}"))];
    }
    // {"add": {"$.path": value}, "update": {...}}
    if map.keys().all(|k| read_op(k).is_some()) {
        let mut found = Vec::new();
        for (key, entries) in map {
            let op = read_op(&key).expect("checked above");
            let Value::Object(entries) = entries else {
                found.extend(fail(format!("`{key}` should map paths to values")));
                continue;
            };
            for (path, value) in entries {
                found.push(
                    revision(op, &path, value).map_err(|reason| format!("`{source}`: {reason}")),
                );
            }
        }
        return found;
    }
    // {"$.path": {"add": value}}
    if map.keys().all(|k| k.trim_start().starts_with('$')) {
        return map
            .into_iter()
            .map(|(path, wrapped)| {
                let single = match wrapped {
                    Value::Object(inner) if inner.len() == 1 => inner.into_iter().next(),
                    _ => None,
                };
                match single.and_then(|(op, value)| Some((read_op(&op)?, value))) {
                    Some((op, value)) => revision(op, &path, value),
                    None => Err(format!(
                        "the value for `{path}` should be {{\"add\": …}} or {{\"update\": …}}"
                    )),
                }
                .map_err(|reason| format!("`{source}`: {reason}"))
            })
            .collect();
    }
    fail("not a revision: expected {\"op\": …, \"path\": …, \"value\": …}".into())
}

/// `{"op": …, "path": …, "value": …}`; other keys are ignored.
fn canonical(map: &Map<String, Value>, op: &Value) -> Result<Revision, String> {
    let op = op
        .as_str()
        .and_then(read_op)
        .ok_or_else(|| format!("unknown op {op}: use \"add\" or \"update\""))?;
    let path = match map.get("path") {
        Some(Value::String(path)) => path,
        Some(other) => return Err(format!("path should be a string, found {other}")),
        None => return Err("missing \"path\"".into()),
    };
    let value = map.get("value").ok_or("missing \"value\"")?;
    revision(op, path, value.clone())
}

fn revision(op: Op, path: &str, value: Value) -> Result<Revision, String> {
    let path = JsonPath::parse(path).map_err(|e| e.to_string())?;
    Ok(Revision { op, path, value })
}

fn read_op(word: &str) -> Option<Op> {
    match word.trim().to_ascii_lowercase().as_str() {
        "add" | "append" => Some(Op::Add),
        "update" | "replace" | "set" => Some(Op::Update),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn rev(op: Op, path: &str, value: Value) -> Revision {
        Revision {
            op,
            path: JsonPath::parse(path).unwrap(),
            value,
        }
    }

    fn oks(output: &str) -> Vec<Revision> {
        parse_revisions(output)
            .into_iter()
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn one_object_per_line() {
        let output = r#"{"op": "add", "path": "$.attributes.'Noise Level'", "value": ["quiet"]}
{"op": "UPDATE", "path": "$.attributes.Food", "value": ["good dinner"]}
"#;
        assert_eq!(
            oks(output),
            [
                rev(Op::Add, "$.attributes.'Noise Level'", json!(["quiet"])),
                rev(Op::Update, "$.attributes.Food", json!(["good dinner"])),
            ]
        );
    }

    #[test]
    fn fences_prose_and_section_headers_are_skipped() {
        let output = r#"Sure! Here are the revisions:

```json
{"op": "add", "path": "$.a", "value": 1}
```
[OBJECTS FOR UPDATE]
{}
[OBJECTS FOR ADD]
- {"op": "append", "path": "$.b", "value": [2]},
See [1] for details.
That's all."#;
        assert_eq!(
            oks(output),
            [
                rev(Op::Add, "$.a", json!(1)),
                rev(Op::Add, "$.b", json!([2]))
            ]
        );
    }

    #[test]
    fn arrays_multi_line_objects_and_several_per_line() {
        let output = r#"[
  {"op": "add", "path": "$.a", "value": "x"},
  {"op": "update", "path": "$.b", "value": "y"}
]
{
  "op": "add",
  "path": "$.c",
  "value": {"k": [1, 2]}
}
{"op": "add", "path": "$.d", "value": 4} {"op": "add", "path": "$.e", "value": 5}"#;
        let paths: Vec<String> = oks(output).iter().map(|r| r.path.to_string()).collect();
        assert_eq!(paths, ["$.a", "$.b", "$.c", "$.d", "$.e"]);
    }

    #[test]
    fn the_other_shapes() {
        let output = r#"{"add": {"$.x": [1], "$.y": "z"}, "update": {"$.w": 2}}
{"$. 'attributes'. 'Noise Level'": {"add": ["Notable street noise"]}}
{"$.attributes.Food": {"update": ["limited breakfast", "exceptional dining"]}}"#;
        assert_eq!(
            oks(output),
            [
                rev(Op::Add, "$.x", json!([1])),
                rev(Op::Add, "$.y", json!("z")),
                rev(Op::Update, "$.w", json!(2)),
                rev(
                    Op::Add,
                    "$.attributes.'Noise Level'",
                    json!(["Notable street noise"])
                ),
                rev(
                    Op::Update,
                    "$.attributes.Food",
                    json!(["limited breakfast", "exceptional dining"])
                ),
            ]
        );
    }

    #[test]
    fn malformed_attempts_are_reported_and_the_rest_still_read() {
        let output = r#"{"op": "add", "path": "$.a", "value": ["unterminated}
{"op": "delete", "path": "$.b", "value": 1}
{"op": "add", "path": "$[", "value": 1}
{"op": "add", "path": "$.c"}
{"path": "$.d", "value": 1}
{"$.e": 5}
[{"op": "add", "path": "$.f", "value": 1}, 7]
{'op': 'add', 'path': '$.g', 'value': None}
{"op": "add", "path": "$.ok", "value": true}
{"op": "add", "path": "$.cut", "value": ["the model ran out of tok"#;
        let results = parse_revisions(output);
        let summary: Vec<String> = results
            .iter()
            .map(|r| match r {
                Ok(r) => format!("ok {}", r.path),
                Err(e) => e.clone(),
            })
            .collect();
        let expect = [
            "not valid JSON",
            "unknown op \"delete\"",
            "bad path `$[`",
            "missing \"value\"",
            "not a revision",
            "should be {\"add\": …}",
            "ok $.f",
            "list item 7 is not a revision object",
            "not valid JSON",
            "ok $.ok",
            "not valid JSON",
        ];
        assert_eq!(summary.len(), expect.len(), "{summary:#?}");
        for (got, want) in summary.iter().zip(expect) {
            assert!(got.contains(want), "{got:?} should contain {want:?}");
        }
        // Errors quote the text they came from.
        assert!(
            summary[1].starts_with("`{\"op\": \"delete\""),
            "{}",
            summary[1]
        );
    }

    #[test]
    fn nothing_to_change() {
        assert!(parse_revisions("").is_empty());
        assert!(parse_revisions("{}\n[]\nNo changes needed.").is_empty());
        assert!(parse_revisions("```\n```").is_empty());
    }

    #[test]
    fn a_memory_is_read_from_fences_and_prose() {
        let output = "Here is the memory:\n```json\n{\"Voyage\": [\"The ship sails.\"]}\n```\nDone {really}.";
        assert_eq!(
            parse_memory(output).unwrap(),
            ParsedMemory {
                memory: json!({"Voyage": ["The ship sails."]}),
                was_cut: false
            }
        );
        // A brace in prose before the object is passed over.
        let parsed = parse_memory("Notes {draft}: {\"a\": [\"x\"]}").unwrap();
        assert_eq!(parsed.memory, json!({"a": ["x"]}));
    }

    #[test]
    fn a_cut_off_memory_keeps_what_was_written_in_full() {
        let cases = [
            (
                r#"{"a": ["x", "y"], "b": ["z", "half a sent"#,
                json!({"a": ["x", "y"], "b": ["z"]}),
            ),
            (
                r#"{"a": ["x, [still] a string", "y"], "b": {"c": ["d"]}, "e"#,
                json!({"a": ["x, [still] a string", "y"], "b": {"c": ["d"]}}),
            ),
            (
                r#"{"a": {"b": ["q\"uote"]}, "c": {"d": "#,
                json!({"a": {"b": ["q\"uote"]}}),
            ),
            (r#"{"a": 1, "b": 2"#, json!({"a": 1})),
        ];
        for (text, want) in cases {
            let parsed = parse_memory(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(parsed.memory, want, "{text}");
            assert!(parsed.was_cut);
        }
    }

    #[test]
    fn no_memory_says_why() {
        assert!(parse_memory("").unwrap_err().contains("no JSON object"));
        assert!(parse_memory("The ship sails north.")
            .unwrap_err()
            .contains("no JSON object"));
        assert!(parse_memory("{\"a\": [1,, 2]}")
            .unwrap_err()
            .contains("not valid JSON"));
        // Cut off before anything was complete.
        assert!(parse_memory("{\"Voyage\": [\"The sh").is_err());
    }

    proptest! {
        #[test]
        fn never_panics_on_any_text(text in "\\PC{0,200}") {
            let _ = parse_revisions(&text);
        }

        #[test]
        fn never_panics_on_json_ish_noise(text in "[{}\\[\\]\"$.:, a-z0-9\n`]{0,120}") {
            let _ = parse_revisions(&text);
            let _ = parse_memory(&text);
        }
    }
}
