//! Chain-of-key updating: after each chunk the model lists the memory's keys, names
//! those the chunk bears on and the new ones it calls for, and writes a revision for each.

use super::{chunk_segment, memory_segments, Call, Cok, CokState, Step};
use crate::chunk::Chunk;
use crate::engine::constraint::Grammar;
use crate::error::Result;
use crate::llm::Llm;
use crate::memory::grammar::{new_key_paths, Dialect, LineRules};
use crate::memory::revise::apply_revisions;
use crate::memory::{render_revision, JsonPath, Next, NodeKind, Revision, Schema, Segment};
use serde_json::Value;

const LISTED: &str = "Keys in memory";
const MATCHED: &str = "Keys this chunk matches";
const NEW: &str = "New keys";

/// Other ways a model may head each list, lower case.
const LISTED_ALIASES: [&str; 4] = [
    "keys in the memory",
    "existing keys",
    "memory keys",
    "current keys",
];
const MATCHED_ALIASES: [&str; 4] = [
    "keys the chunk matches",
    "matching keys",
    "matched keys",
    "keys to update",
];
const NEW_ALIASES: [&str; 1] = ["keys to add"];

/// The most revision lines of each kind one constrained step may write.
const MAX_LINES_PER_KIND: usize = 2;

/// The key lists of a chain-of-key output, as the model wrote them; a list
/// the output lacks is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyChain {
    /// The keys the model says the memory has.
    pub listed: Option<Vec<String>>,
    /// The keys it says the chunk bears on.
    pub matched: Option<Vec<String>>,
    /// The keys it says the chunk adds.
    pub new: Option<Vec<String>>,
}

impl KeyChain {
    /// Whether all three lists are there.
    pub fn is_complete(&self) -> bool {
        self.listed.is_some() && self.matched.is_some() && self.new.is_some()
    }
}

/// What the model is asked to write after chunk `index` (from 0).
pub(super) fn request(index: usize) -> String {
    format!(
        "\n## Your answer\nWrite the five parts for chunk {}, and nothing else.\n",
        index + 1
    )
}

/// Read `chunk` into the memory through a key chain and revisions. The
/// revisions are applied as PRISM's are (parsed, checked against the schema,
/// the refused ones counted); the key lists are the model's working, kept
/// with the step but not enforced. The paper first has the model summarize
/// the chunk alone and runs the chain over that summary; here the chain reads
/// the chunk itself, one call per chunk.
pub(super) fn step(
    cok: &Cok,
    schema: &Schema,
    llm: &mut dyn Llm,
    state: &mut CokState,
    chunk: &Chunk,
    chunks: usize,
) -> Result<Step> {
    let mut tail = memory_segments(&state.memory);
    tail.push(chunk_segment(chunk, chunks));
    tail.push(request(chunk.index));
    let prompt = cok.prompt(tail);
    let keys = memory_keys(schema, &state.memory);
    // Listing the keys is the chain's own overhead; the step budget is for the revisions.
    let max_tokens = cok.config.step_tokens + llm.count_tokens(&key_list(&keys))?;
    let max_tokens = super::fit(llm, &prompt, max_tokens)?;
    let grammar = cok
        .config
        .constrained
        .then(|| chain_constraint(schema, &state.memory, &keys, MAX_LINES_PER_KIND));
    let completion = llm.complete(&prompt, max_tokens, grammar.as_ref())?;
    let (chain, revisions) = parse_chain(&completion.text);
    let (applied, rejected) = apply_revisions(&mut state.memory, &revisions, schema, true, None);
    state.counts.revisions_applied += applied.len();
    state.counts.revisions_rejected += rejected.len();
    state.counts.chains_complete += usize::from(chain.is_complete());
    let mut step = Step::of(Call::Revise, Some(chunk.index), &completion);
    step.chain = Some(chain);
    step.applied = applied;
    step.rejected = rejected;
    Ok(step)
}

/// What the preamble says a step writes, with an example shaped by `schema`.
///
/// The example's keys and notes come from a town council's minutes, so that
/// the model can copy its form but nothing in it passes for the document. It
/// used to show `<key>` placeholders, which the grammar forbids and which the
/// small models copied as keys.
pub(super) fn instructions(schema: &Schema) -> String {
    let example = match (
        example_add(schema, "Harbour wall", &[EXAMPLE_OLD_NOTE, EXAMPLE_UPDATE_NOTE]),
        example_add(schema, "Idris Fenn", &[EXAMPLE_NEW_NOTE]),
    ) {
        (Some(old), Some(new)) => format!(
            "For example, from the minutes of a town council:\n{LISTED}: {}\n{MATCHED}: {}\n{}{NEW}: {}\n{}",
            key_list(std::slice::from_ref(&old.path)),
            key_list(std::slice::from_ref(&old.path)),
            render_revision(&Revision::update(old.path.clone(), old.value.clone())),
            key_list(std::slice::from_ref(&new.path)),
            render_revision(&new),
        ),
        _ => String::new(),
    };
    format!(
        "You write five parts, in this order:\n\
         {LISTED}: every key the memory has now, as a JSON list of their paths\n\
         {MATCHED}: the keys from that list that this chunk tells something new about, as a JSON list\n\
         an update line for each matched key, with all its notes: the old ones and the new facts\n\
         {NEW}: the keys this chunk needs that the memory does not have yet, as a JSON list of paths\n\
         an add line for each new key, with its notes\n\
         {example}Use the names, places and events of your chunk; never copy the example."
    )
}

/// The notes of the worked example in [`instructions`]: a key's note, the
/// note a later chunk adds to it, and a new key's note.
const EXAMPLE_OLD_NOTE: &str = "The council set aside 40,000 to repair the harbour wall.";
const EXAMPLE_UPDATE_NOTE: &str = "March storms raised the cost of the repairs to 65,000.";
const EXAMPLE_NEW_NOTE: &str = "A councillor who reported the higher cost of the repairs.";

/// The memory's keys, in the memory's order: the entries of its maps, and
/// its declared properties whose value is not an object. An object property
/// is a section, and its own keys are listed instead. What a key holds is
/// not searched further.
pub fn memory_keys(schema: &Schema, memory: &Value) -> Vec<JsonPath> {
    let mut keys = Vec::new();
    collect_keys(
        schema,
        schema.root(),
        memory,
        &mut JsonPath::root(),
        &mut keys,
    );
    keys
}

fn collect_keys(
    schema: &Schema,
    node: &crate::memory::SchemaNode,
    value: &Value,
    path: &mut JsonPath,
    keys: &mut Vec<JsonPath>,
) {
    let Value::Object(members) = value else {
        return;
    };
    let properties = match &schema.resolve(node).kind {
        NodeKind::Object { properties, .. } => properties.as_slice(),
        _ => &[],
    };
    for (key, member) in members {
        path.push(Segment::Key(key.clone()));
        match properties.iter().find(|(name, _)| name == key) {
            Some((_, child)) if member.is_object() => {
                collect_keys(schema, child, member, path, keys)
            }
            _ => keys.push(path.clone()),
        }
        path.pop();
    }
}

/// Paths as the chain writes them: a JSON list of strings, `", "` between items.
fn key_list(keys: &[JsonPath]) -> String {
    let items: Vec<String> = keys
        .iter()
        .map(|key| json_string(&key.to_string()))
        .collect();
    format!("[{}]", items.join(", "))
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// Split a chain-of-key output into its key lists and the rest, where the
/// revisions are. A list may follow its heading on the same line or the
/// next; headings may carry markdown, numbering, or one of a few other
/// wordings. A list that is not JSON is read as comma-separated names.
pub fn parse_chain(output: &str) -> (KeyChain, String) {
    let mut chain = KeyChain::default();
    let mut rest = String::new();
    let mut lines = output.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((slot, after)) = heading(line) else {
            rest.push_str(line);
            rest.push('\n');
            continue;
        };
        let mut text = after.trim().to_string();
        if text.is_empty() {
            if let Some(next) = lines.next_if(|next| next.trim_start().starts_with('[')) {
                text = next.trim().to_string();
            }
        }
        let list = match slot {
            Slot::Listed => &mut chain.listed,
            Slot::Matched => &mut chain.matched,
            Slot::New => &mut chain.new,
        };
        // A model that repeats a heading has said its piece the first time.
        list.get_or_insert_with(|| key_names(&text));
    }
    (chain, rest)
}

#[derive(Clone, Copy)]
enum Slot {
    Listed,
    Matched,
    New,
}

/// The list a line heads, and what follows the heading; `None` for any other line.
fn heading(line: &str) -> Option<(Slot, &str)> {
    let text = line.trim_start_matches(|c: char| {
        c.is_whitespace() || c.is_ascii_digit() || "-*#>.)[(".contains(c)
    });
    let slots = [
        (Slot::Listed, LISTED, &LISTED_ALIASES[..]),
        (Slot::Matched, MATCHED, &MATCHED_ALIASES[..]),
        (Slot::New, NEW, &NEW_ALIASES[..]),
    ];
    for (slot, label, aliases) in slots {
        for name in std::iter::once(&label).chain(aliases) {
            let starts = text
                .get(..name.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(name));
            if starts {
                let after = &text[name.len()..];
                let after =
                    after.trim_start_matches(|c: char| c.is_whitespace() || ":*]_".contains(c));
                return Some((slot, after));
            }
        }
    }
    None
}

/// The names in a key list: a JSON list of strings, else names between
/// commas (brackets and double quotes dropped). "none" and the like is empty.
fn key_names(text: &str) -> Vec<String> {
    if let Some(start) = text.find('[') {
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        if let Some(Ok(Value::Array(items))) = stream.next() {
            return items
                .into_iter()
                .map(|item| match item {
                    Value::String(name) => name.trim().to_string(),
                    other => other.to_string(),
                })
                .filter(|name| !name.is_empty())
                .collect();
        }
    }
    let inner = text.trim().trim_start_matches('[');
    let inner = inner.rfind(']').map_or(inner, |end| &inner[..end]);
    inner
        .split(',')
        .map(|name| name.trim().trim_matches(|c| c == '"' || c == '`').trim())
        .filter(|name| {
            !name.is_empty()
                && !["none", "nothing", "n/a", "-"]
                    .iter()
                    .any(|word| name.eq_ignore_ascii_case(word))
        })
        .map(str::to_string)
        .collect()
}

/// The constraint of a chain-of-key output (see `chain_grammar`), in Lark
/// and, for servers of the llama.cpp family, in GBNF. A schema whose key
/// pattern GBNF cannot express gets the Lark grammar alone.
pub fn chain_constraint(
    schema: &Schema,
    memory: &Value,
    keys: &[JsonPath],
    max_lines: usize,
) -> Grammar {
    let grammar = |dialect| chain_grammar(schema, memory, keys, max_lines, dialect);
    let lark = grammar(Dialect::Lark).expect("every schema has a Lark rendering");
    match grammar(Dialect::Gbnf) {
        Ok(gbnf) => Grammar::Dialects { lark, gbnf },
        Err(error) => {
            tracing::debug!("the chain grammar has no GBNF rendering: {error}");
            Grammar::Lark(lark)
        }
    }
}

/// The grammar of a chain-of-key output for `memory`, whose keys are
/// `keys`: the key list exactly as the memory has it, a choice among those
/// keys, up to `max_lines` update lines, a list of new keys, and up to
/// `max_lines` add lines, with at least one revision whenever one is possible.
fn chain_grammar(
    schema: &Schema,
    memory: &Value,
    keys: &[JsonPath],
    max_lines: usize,
    dialect: Dialect,
) -> Result<String> {
    let rules = LineRules::new(schema, memory, true, dialect)?;
    let listed = dialect.literal(&format!("{LISTED}: {}\n{MATCHED}: ", key_list(keys)));
    let new_heading = dialect.literal(&format!("{NEW}: "));
    let line_break = dialect.literal("\n");
    let names: Vec<String> = keys
        .iter()
        .map(|key| dialect.literal(&json_string(&key.to_string())))
        .collect();
    let mut grammar = dialect.rule(
        dialect.start(),
        &format!("{listed} matched {line_break} body"),
    );
    grammar += &list_rule(dialect, "matched", &names);
    grammar += &list_rule(dialect, "newkeys", &new_key_paths(schema, memory, dialect)?);
    let updates = format!("updateline{{1,{max_lines}}}");
    let new_keys = format!("{new_heading} newkeys {line_break}");
    let body = match (rules.updates.is_empty(), rules.adds.is_empty()) {
        (false, false) => format!(
            "{updates} {new_keys} addline{{0,{max_lines}}} | {new_keys} addline{{1,{max_lines}}}"
        ),
        (false, true) => format!("{updates} {new_keys}"),
        (true, false) => format!("{new_keys} addline{{1,{max_lines}}}"),
        (true, true) => new_keys,
    };
    grammar += &dialect.rule("body", &body);
    if !rules.updates.is_empty() {
        grammar += &dialect.rule("updateline", &rules.updates.join(" | "));
    }
    if !rules.adds.is_empty() {
        grammar += &dialect.rule("addline", &rules.adds.join(" | "));
    }
    Ok(grammar + &rules.definitions)
}

/// A rule for a JSON list of any of `items`, or of nothing.
fn list_rule(dialect: Dialect, name: &str, items: &[String]) -> String {
    let empty = dialect.literal("[]");
    if items.is_empty() {
        return dialect.rule(name, &empty);
    }
    let item = format!("{name}item");
    dialect.rule(
        name,
        &format!(
            "{empty} | {} {item} ({} {item})* {}",
            dialect.literal("["),
            dialect.literal(", "),
            dialect.literal("]")
        ),
    ) + &dialect.rule(&item, &items.join(" | "))
}

/// An `add` revision at the first place an empty memory can grow, named
/// An `add` at the memory's first place for one, at `new_key` where the
/// model would choose a key, holding `notes`.
fn example_add(schema: &Schema, new_key: &str, notes: &[&str]) -> Option<Revision> {
    let empty = schema.empty_memory();
    let (pattern, node) = schema.add_targets(&empty).into_iter().next()?;
    let path = match &pattern.next {
        Next::NewKey => pattern.prefix.key(new_key),
        Next::Key(name) => pattern.prefix.key(name.clone()),
        Next::Index(index) => pattern.prefix.index(*index),
    };
    Some(Revision::add(path, example_of(schema, node, notes, 0)))
}

/// A value of `node`'s type that carries `notes`: a list holds them all, an
/// object fills each text field, a string joins them.
fn example_of(
    schema: &Schema,
    node: &crate::memory::SchemaNode,
    notes: &[&str],
    depth: usize,
) -> Value {
    match &schema.resolve(node).kind {
        _ if depth > 3 => Value::String(notes.join(" ")),
        NodeKind::Array { items } => notes
            .iter()
            .map(|note| example_of(schema, items, &[note], depth + 1))
            .collect(),
        NodeKind::Object { properties, .. } => Value::Object(
            properties
                .iter()
                .map(|(key, child)| (key.clone(), example_of(schema, child, notes, depth + 1)))
                .collect(),
        ),
        NodeKind::Number | NodeKind::Integer => Value::from(0),
        NodeKind::Boolean => Value::Bool(true),
        _ => Value::String(notes.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::grammar::testing::{accepts, lark_of_gbnf};
    use crate::memory::testing::load;
    use serde_json::json;

    fn strings(names: &[&str]) -> Option<Vec<String>> {
        Some(names.iter().map(|name| name.to_string()).collect())
    }

    #[test]
    fn the_asked_for_form_is_read_whole() {
        let output = r#"Keys in memory: ["$.Voyage", "$.Crew"]
Keys this chunk matches: ["$.Voyage"]
{"op": "update", "path": "$.Voyage", "value": ["The ship sails north into ice."]}
New keys: ["$.'The storm'"]
{"op": "add", "path": "$.'The storm'", "value": ["A gale hits."]}
"#;
        let (chain, rest) = parse_chain(output);
        assert_eq!(
            chain,
            KeyChain {
                listed: strings(&["$.Voyage", "$.Crew"]),
                matched: strings(&["$.Voyage"]),
                new: strings(&["$.'The storm'"]),
            }
        );
        assert!(chain.is_complete());
        let revisions = crate::memory::parse_revisions(&rest);
        assert_eq!(revisions.len(), 2);
        assert!(revisions.iter().all(Result::is_ok));
    }

    #[test]
    fn headings_in_markdown_numbered_or_reworded() {
        let output = "1. **Existing keys:** [\"$.Voyage\"]\n- Matching keys:\n[\"$.Voyage\"]\n### New Keys: none\n";
        let (chain, rest) = parse_chain(output);
        assert_eq!(
            chain,
            KeyChain {
                listed: strings(&["$.Voyage"]),
                matched: strings(&["$.Voyage"]),
                new: Some(Vec::new()),
            }
        );
        assert_eq!(rest, "");
    }

    #[test]
    fn loose_lists_and_repeated_headings() {
        let output = "Keys in memory: [$.Voyage, $.'Walton letters', \"$.Crew\"]\nKeys this chunk matches: []\nKeys in memory: [\"$.Other\"]\n";
        let (chain, _) = parse_chain(output);
        assert_eq!(
            chain.listed,
            strings(&["$.Voyage", "$.'Walton letters'", "$.Crew"])
        );
        assert_eq!(chain.matched, Some(Vec::new()));
        assert_eq!(chain.new, None);
        assert!(!chain.is_complete());
    }

    #[test]
    fn a_broken_key_list_is_not_counted_as_a_broken_revision() {
        // The unterminated list would read as a failed revision attempt if
        // it reached the revision parser.
        let output = "Keys in memory: [\"$.Voyage\nNew keys: [\"$.Storm\"]\n{\"op\": \"add\", \"path\": \"$.Storm\", \"value\": [\"A gale.\"]}\n";
        let (chain, rest) = parse_chain(output);
        assert_eq!(chain.listed, strings(&["$.Voyage"]));
        assert_eq!(chain.new, strings(&["$.Storm"]));
        let revisions = crate::memory::parse_revisions(&rest);
        assert_eq!(revisions.len(), 1);
        assert!(revisions[0].is_ok());
    }

    #[test]
    fn prose_and_nothing_at_all() {
        let (chain, rest) = parse_chain("The chunk says the ship sails north.\n");
        assert_eq!(chain, KeyChain::default());
        assert!(crate::memory::parse_revisions(&rest).is_empty());
        assert_eq!(parse_chain(""), (KeyChain::default(), String::new()));
        // A heading cut short by the token limit still reads as far as it goes.
        let (chain, _) = parse_chain("Keys in memory: [\"$.Voy");
        assert_eq!(chain.listed, strings(&["$.Voy"]));
    }

    #[test]
    fn keys_are_map_entries_and_non_object_properties() {
        let book = load("book.json");
        let memory = json!({"Voyage": ["x"], "Walton letters": ["y"]});
        let keys: Vec<String> = memory_keys(&book, &memory)
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(keys, ["$.Voyage", "$.'Walton letters'"]);

        let sections = load("cok-book.json");
        let mut memory = sections.empty_memory();
        assert!(memory_keys(&sections, &memory).is_empty());
        memory["characters"]["Ann"] = json!(["Captain."]);
        memory["events"]["The storm"] = json!(["A gale."]);
        let keys: Vec<String> = memory_keys(&sections, &memory)
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(keys, ["$.characters.Ann", "$.events.'The storm'"]);

        let code = load("code.json");
        let memory =
            json!({"parse": {"purpose": "p", "input": "i", "output": "o", "procedure": "s"}});
        let keys: Vec<String> = memory_keys(&code, &memory)
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(keys, ["$.parse"]);
    }

    #[test]
    fn the_grammar_forces_the_key_list_and_offers_both_kinds_of_line() {
        let book = load("book.json");
        let memory = json!({"Voyage": ["x"]});
        let keys = memory_keys(&book, &memory);
        let grammar = chain_grammar(&book, &memory, &keys, 2, Dialect::Lark).unwrap();
        assert!(
            grammar.starts_with(
                r#"start: "Keys in memory: [\"$.Voyage\"]\nKeys this chunk matches: " matched "\n" body"#
            ),
            "{grammar}"
        );
        assert!(
            grammar.contains(r#"matcheditem: "\"$.Voyage\"""#),
            "{grammar}"
        );
        assert!(
            grammar.contains(r#"newkeysitem: "\"$.'" KEY "'\"""#),
            "{grammar}"
        );
        assert!(
            grammar.contains("body: updateline{1,2} \"New keys: \" newkeys \"\\n\" addline{0,2} | \"New keys: \" newkeys \"\\n\" addline{1,2}"),
            "{grammar}"
        );
        assert!(grammar.contains("updateline: ") && grammar.contains("addline: "));

        // An empty memory: nothing to list, match or update.
        let empty = json!({});
        let grammar = chain_grammar(&book, &empty, &[], 2, Dialect::Lark).unwrap();
        assert!(grammar.contains("matched: \"[]\"\n"), "{grammar}");
        assert!(grammar.contains("body: \"New keys: \" newkeys \"\\n\" addline{1,2}"));
        assert!(!grammar.contains("updateline"));
    }

    #[test]
    fn chains_parse_alike_in_lark_and_gbnf() {
        let book = load("book.json");
        let memory = json!({"Voyage": ["The ship sails."]});
        let keys = memory_keys(&book, &memory);
        let lark = chain_grammar(&book, &memory, &keys, 2, Dialect::Lark).unwrap();
        let gbnf = chain_grammar(&book, &memory, &keys, 2, Dialect::Gbnf).unwrap();
        assert!(gbnf.starts_with("root ::= "), "{gbnf}");
        let from_gbnf = lark_of_gbnf(&gbnf);
        let head = "Keys in memory: [\"$.Voyage\"]\nKeys this chunk matches: ";
        let update = r#"{"op": "update", "path": "$.Voyage", "value": ["The ship sails north."]}"#;
        let add = r#"{"op": "add", "path": "$.'Ice'", "value": ["The crew meets ice."]}"#;
        let cases = [
            (format!("{head}[\"$.Voyage\"]\n{update}\nNew keys: []\n"), true),
            (
                format!("{head}[]\nNew keys: [\"$.'Ice'\"]\n{add}\n"),
                true,
            ),
            (
                format!("{head}[\"$.Voyage\"]\n{update}\nNew keys: [\"$.'Ice'\"]\n{add}\n"),
                true,
            ),
            // A revision is owed whenever one is possible.
            (format!("{head}[]\nNew keys: []\n"), false),
            // A key the memory does not have.
            (format!("{head}[\"$.Ship\"]\n{update}\nNew keys: []\n"), false),
            // The key list must be the memory's own.
            (
                format!("Keys in memory: []\nKeys this chunk matches: []\nNew keys: [\"$.'Ice'\"]\n{add}\n"),
                false,
            ),
            // Three updates where two are the most.
            (
                format!("{head}[\"$.Voyage\"]\n{update}\n{update}\n{update}\nNew keys: []\n"),
                false,
            ),
        ];
        for (text, expected) in &cases {
            assert_eq!(accepts(&lark, text), *expected, "Lark: {text:?}\n{lark}");
            assert_eq!(
                accepts(&from_gbnf, text),
                *expected,
                "GBNF: {text:?}\n{gbnf}"
            );
        }
    }

    #[test]
    fn a_chain_carries_both_dialects_for_remote_servers() {
        let book = load("book.json");
        let memory = json!({"Voyage": ["x"]});
        let keys = memory_keys(&book, &memory);
        let grammar = chain_constraint(&book, &memory, &keys, 2);
        assert!(
            matches!(&grammar, Grammar::Dialects { lark, gbnf }
                if lark.starts_with("start: ") && gbnf.starts_with("root ::= ")),
            "{grammar:?}"
        );
    }

    #[test]
    fn the_instructions_carry_an_example_shaped_by_the_schema() {
        let text = instructions(&load("cok-book.json"));
        assert!(
            text.contains("Keys in memory: [\"$.characters.'Harbour wall'\"]"),
            "{text}"
        );
        assert!(
            text.contains(r#"{"op": "update", "path": "$.characters.'Harbour wall'", "value": ["The council set aside 40,000 to repair the harbour wall.", "March storms raised the cost of the repairs to 65,000."]}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"{"op": "add", "path": "$.characters.'Idris Fenn'", "value": ["A councillor who reported the higher cost of the repairs."]}"#),
            "{text}"
        );
        assert!(!text.contains('<'), "{text}");
    }
}
