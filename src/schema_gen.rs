//! Memory schemas written by the model (PRISM §3.4) for a query domain; a reply that
//! is not a valid schema is sent back with the reason, a bounded number of times.

use crate::engine::constraint::Grammar;
use crate::error::{Error, Result, Setting};
use crate::llm::{Llm, Prompt};
use crate::memory::render::to_line;
use crate::memory::schema::WorkedExample;
use crate::memory::{shipped, Schema};
use crate::metrics::{Figures, Ledger};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The `$schema` every schema file declares.
const SCHEMA_DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// What the schema is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaRequest {
    /// The query domain: what the documents are and what is asked of them.
    pub domain: String,
    /// One query of that domain.
    pub example_query: String,
}

/// Settings of one schema generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaGenConfig {
    /// Attempts after the first when a reply is refused.
    pub retries: usize,
    /// The most tokens one reply may take.
    pub max_tokens: usize,
    /// Decode replies under [`schema_grammar`].
    pub constrained: bool,
}

/// One reply and why it was refused, if it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub output: String,
    pub refused: Option<String>,
    #[serde(flatten)]
    pub figures: Figures,
}

/// An accepted schema and how it was reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeneratedSchema {
    /// The schema, with `$schema` first, as it goes into a file.
    pub schema: Value,
    /// Every reply in order; the last one was accepted.
    pub attempts: Vec<Attempt>,
    pub calls: usize,
    /// All calls together.
    pub figures: Figures,
    /// The domains of the example schemas the prompt showed.
    pub shots: Vec<String>,
}

/// A hand-made schema from `schemas/` with the domain and query it was made for.
struct Shot {
    /// Shots of one family cover the same domain; the prompt shows one at most.
    family: &'static str,
    /// Words that mark a request as being in this shot's domain.
    keywords: &'static [&'static str],
    domain: &'static str,
    example_query: &'static str,
    schema: &'static str,
}

const SHOTS: &[Shot] = &[
    Shot {
        family: "narrative",
        keywords: &["book", "books", "novel", "novels", "story", "stories", "narrative", "fiction", "chapter", "chapters", "plot"],
        domain: "Summarizing long narrative books. Each document is the next part of the book; the story may jump in time or between points of view.",
        example_query: "Summarize the book: the main events in order, the main characters and what drives them, the setting and the themes.",
        schema: shipped::BOOK,
    },
    Shot {
        family: "code",
        keywords: &["code", "function", "functions", "program", "programs", "repository", "software"],
        domain: "Finding a function in a code repository from a description of what it does. Each document is a piece of the source files.",
        example_query: "Find the exact name of the function that takes a list of paths and a pattern, and returns the paths whose file names match the pattern, sorted.",
        schema: shipped::CODE,
    },
    Shot {
        family: "entity",
        keywords: &["product", "products", "hotel", "hotels", "review", "reviews", "entity", "entities"],
        domain: "Describing one entity, such as a product, a hotel or a person, from the many web pages and reviews that mention it.",
        example_query: "Describe the Harbor View Hotel: its attributes and what guests say about each.",
        schema: shipped::ENTITY,
    },
    Shot {
        family: "tables",
        keywords: &["sql", "table", "tables", "database", "databases", "row", "rows", "column", "columns"],
        domain: "Answering questions over database tables given as text. Each document holds some rows of one or more tables.",
        example_query: "How many singers are older than 40?",
        schema: shipped::SQL,
    },
    Shot {
        family: "narrative",
        keywords: &["book", "books", "novel", "novels", "story", "stories", "narrative", "fiction", "chapter", "chapters", "plot"],
        domain: "Summarizing a novel into fixed sections: characters, events, background, motivations and objectives.",
        example_query: "Summarize the story: who the characters are, what happens to them and why.",
        schema: shipped::COK_BOOK,
    },
];

/// How many example schemas the prompt shows, as in the paper.
const SHOT_COUNT: usize = 3;

/// The example schemas for `request`: of different families, preferring those
/// whose domain the request does not mention, in the order of [`SHOTS`].
fn pick_shots(request: &SchemaRequest) -> Vec<&'static Shot> {
    let text = format!("{} {}", request.domain, request.example_query).to_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .collect();
    let same_domain = |shot: &Shot| shot.keywords.iter().any(|key| words.contains(key));
    let (other, same): (Vec<&Shot>, Vec<&Shot>) = SHOTS.iter().partition(|shot| !same_domain(shot));
    let mut picked: Vec<&Shot> = Vec::new();
    for shot in other.into_iter().chain(same) {
        if picked.len() < SHOT_COUNT && picked.iter().all(|p| p.family != shot.family) {
            picked.push(shot);
        }
    }
    picked
}

/// A shot's schema as the prompt shows it: in the form a constrained reply
/// takes, so that the examples and the grammar agree. That is one line with
/// `", "` and `": "` between items, no `$schema`, `$ref`s replaced by what
/// they name, and keys in the order [`schema_grammar`] asks for.
fn shot_schema(shot: &Shot) -> String {
    let value: Value = serde_json::from_str(shot.schema).expect("the schemas/ files are JSON");
    let defs = value.get("$defs").cloned().unwrap_or(Value::Null);
    let inlined = inline_refs(&value, &defs, 0);
    to_line(&in_key_order(&inlined))
}

/// `value` with every `{"$ref": "#/$defs/X", …}` replaced by definition X
/// (the referring node's own notes win), and `$schema` and `$defs` dropped,
/// as are the keywords a generated schema cannot use (`propertyNames`, a
/// worked example): the shot shows only what the grammar lets a reply write.
fn inline_refs(value: &Value, defs: &Value, depth: usize) -> Value {
    match value {
        Value::Object(map) => {
            let target = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|reference| reference.strip_prefix("#/$defs/"))
                .and_then(|name| defs.get(name));
            let mut out = Map::new();
            // Our schemas do not refer to themselves; the bound only keeps a
            // self-reference from recursing forever.
            if let Some(Value::Object(def)) = target.filter(|_| depth < 8) {
                for (key, child) in def {
                    out.insert(key.clone(), inline_refs(child, defs, depth + 1));
                }
            }
            for (key, child) in map {
                if !matches!(
                    key.as_str(),
                    "$ref" | "$schema" | "$defs" | "propertyNames" | WorkedExample::KEYWORD
                ) {
                    out.insert(key.clone(), inline_refs(child, defs, depth));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| inline_refs(item, defs, depth))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The keywords a generated schema may use, in the order the grammar
/// enforces within a node. `enum`, which [`Schema`] also accepts, is left
/// out: small models use it to pin notes to a few made-up words.
const KEY_ORDER: &[&str] = &[
    "title",
    "description",
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
];

/// `schema` with the keys of every node in [`KEY_ORDER`] (others after them);
/// the names under `properties` keep their order.
fn in_key_order(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let rank = |key: &str| {
        KEY_ORDER
            .iter()
            .position(|k| *k == key)
            .unwrap_or(KEY_ORDER.len())
    };
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by_key(|key| rank(key));
    let mut out = Map::new();
    for key in keys {
        let child = &map[key];
        let ordered = match (key.as_str(), child) {
            ("properties", Value::Object(properties)) => Value::Object(
                properties
                    .iter()
                    .map(|(name, node)| (name.clone(), in_key_order(node)))
                    .collect(),
            ),
            ("additionalProperties" | "items", _) => in_key_order(child),
            _ => child.clone(),
        };
        out.insert(key.clone(), ordered);
    }
    Value::Object(out)
}

/// How deep constrained schemas may nest below the root: enough for every
/// shot (a map of objects holding maps of lists of strings at most) while a
/// small model cannot nest on and on.
const GRAMMAR_DEPTH: usize = 3;
/// The longest constrained `description`.
const MAX_DESCRIPTION_CHARS: usize = 400;

/// A JSON Schema of the schemas [`Schema`] accepts, without `$defs`/`$ref`
/// and nested at most `GRAMMAR_DEPTH` levels: the root is an object with a
/// title and a description; below it, objects, lists and scalars. Decoding
/// under it, even a small model writes a JSON schema; the checks a grammar
/// cannot express (`required` naming declared keys, a memory with room to
/// grow) are still made after.
pub fn schema_grammar() -> Grammar {
    let description = json!({"type": "string", "maxLength": MAX_DESCRIPTION_CHARS});
    let node = |depth: usize| json!({"$ref": format!("#/$defs/node{depth}")});
    let additional = |depth: usize| json!({"anyOf": [{"type": "boolean"}, node(depth)]});
    let names = json!({"type": "array", "items": {"type": "string"}});
    let object_properties = |depth: usize| {
        json!({
            "description": description,
            "type": {"const": "object"},
            "properties": {"type": "object", "additionalProperties": node(depth)},
            "required": names,
            "additionalProperties": additional(depth)
        })
    };
    let scalar = json!({
        "type": "object",
        "properties": {
            "description": description,
            "type": {"enum": ["string", "number", "integer", "boolean"]}
        },
        "required": ["type"],
        "additionalProperties": false
    });
    let mut defs = Map::new();
    defs.insert("node0".into(), scalar.clone());
    for depth in 1..=GRAMMAR_DEPTH {
        let below = depth - 1;
        let list = json!({
            "type": "object",
            "properties": {
                "description": description,
                "type": {"const": "array"},
                "items": node(below)
            },
            "required": ["type", "items"],
            "additionalProperties": false
        });
        let object = json!({
            "type": "object",
            "properties": object_properties(below),
            "required": ["type"],
            "additionalProperties": false
        });
        defs.insert(
            format!("node{depth}"),
            json!({"anyOf": [scalar, list, object]}),
        );
    }
    let mut root = object_properties(GRAMMAR_DEPTH);
    let root_properties = root.as_object_mut().expect("built as an object");
    let mut properties = Map::new();
    properties.insert("title".into(), json!({"type": "string", "maxLength": 80}));
    properties.append(root_properties);
    Grammar::JsonSchema(json!({
        "$defs": defs,
        "type": "object",
        "properties": properties,
        "required": ["title", "description", "type"],
        "additionalProperties": false
    }))
}

const SYSTEM: &str = "You design JSON Schemas for the memory of a reading program. You reply with one JSON Schema and nothing else.";

/// The fixed task description.
fn instructions() -> String {
    format!(
        "## Task\nA program answers queries about some domain by reading many documents, one at a time and only once each. While it reads, it keeps notes in a JSON memory; when it has read everything, it answers the query from the memory alone. A JSON Schema defines what the memory holds. Write that schema for a new domain, given a description of the domain and an example query.\n\n## What makes a good schema\n- The memory must hold everything needed to answer queries like the example, and little else; when unsure, keep more.\n- Every document adds to the memory, so use maps (\"additionalProperties\") and lists (\"items\") that can grow.\n- Keep the details of one thing together in one object.\n- Say in \"description\" fields what belongs where.\n\n## Rules\n- Reply with the schema as one JSON object and nothing else.\n- The top level has \"title\", \"description\" and \"type\": \"object\".\n- Use only these keywords: {}.\n\n## Examples\n",
        KEY_ORDER.join(", ")
    )
}

/// The example domains, queries and schemas.
fn examples(shots: &[&Shot]) -> String {
    shots
        .iter()
        .map(|shot| {
            format!(
                "[Domain]\n{}\n[Example query]\n{}\n[Schema]\n{}\n\n",
                shot.domain,
                shot.example_query,
                shot_schema(shot)
            )
        })
        .collect()
}

/// The prompt for one attempt; `refusal` is the previous reply and why it was
/// refused. Everything before it stays the same across attempts.
fn attempt_prompt(
    request: &SchemaRequest,
    shots: &[&Shot],
    refusal: Option<(&str, &str)>,
) -> Prompt {
    let mut segments = vec![
        instructions(),
        examples(shots),
        format!(
            "## Your turn\n[Domain]\n{}\n[Example query]\n{}\n",
            request.domain.trim(),
            request.example_query.trim()
        ),
    ];
    let mut last = String::new();
    if let Some((output, reason)) = refusal {
        last.push_str(&format!(
            "\nYour previous reply was refused.\nIt was:\n{}\nThe reason: {reason}\nWrite the whole schema again with that fixed.\n",
            output.trim()
        ));
    }
    last.push_str("[Schema]\n");
    segments.push(last);
    Prompt {
        system: Some(SYSTEM.to_string()),
        segments,
        source: None,
        shared_segments: None,
    }
}

/// Ask `llm` for a schema for `request` until one is accepted or the retries
/// run out. The error names the last reason a reply was refused.
pub fn generate_schema(
    llm: &mut dyn Llm,
    request: &SchemaRequest,
    config: &SchemaGenConfig,
) -> Result<GeneratedSchema> {
    for (setting, text) in [
        (Setting::Domain, &request.domain),
        (Setting::ExampleQuery, &request.example_query),
    ] {
        if text.trim().is_empty() {
            return Err(Error::invalid_setting(setting, "is empty"));
        }
    }
    let shots = pick_shots(request);
    let grammar = config.constrained.then(schema_grammar);
    let mut ledger = Ledger::default();
    let mut attempts: Vec<Attempt> = Vec::new();
    for _ in 0..=config.retries {
        let refusal = attempts.last().and_then(|a| {
            a.refused
                .as_deref()
                .map(|reason| (a.output.as_str(), reason))
        });
        let prompt = attempt_prompt(request, &shots, refusal);
        let prompt_tokens = llm.prompt_tokens(&prompt)?;
        let context = llm.context_tokens();
        if prompt_tokens + config.max_tokens > context {
            return Err(Error::invalid(
                "schema generation",
                format!(
                    "the prompt takes {prompt_tokens} tokens, which with {} for the reply do not fit the model's context of {context} tokens",
                    config.max_tokens
                ),
            ));
        }
        let completion = llm.complete(&prompt, config.max_tokens, grammar.as_ref())?;
        ledger.record(&completion.usage);
        let checked = check_schema(&completion.text);
        attempts.push(Attempt {
            output: completion.text,
            refused: checked.as_ref().err().cloned(),
            figures: Figures::of(&completion.usage),
        });
        if let Ok(schema) = checked {
            return Ok(GeneratedSchema {
                schema,
                attempts,
                calls: ledger.calls,
                figures: ledger.figures(),
                shots: shots.iter().map(|shot| shot.domain.to_string()).collect(),
            });
        }
    }
    let reason = attempts
        .last()
        .and_then(|a| a.refused.clone())
        .unwrap_or_default();
    Err(Error::invalid(
        "schema generation",
        format!(
            "no usable schema in {} attempt{}; the last was refused: {reason}",
            attempts.len(),
            if attempts.len() == 1 { "" } else { "s" }
        ),
    ))
}

/// The schema in a reply, with `$schema` first, or why there is none: the
/// first JSON object in the text (code fences and chatter around it are
/// ignored) must load as a [`Schema`] and give the memory somewhere to grow.
pub fn check_schema(reply: &str) -> std::result::Result<Value, String> {
    let Some(open) = reply.find('{') else {
        return Err("the reply holds no JSON object".into());
    };
    let mut values = serde_json::Deserializer::from_str(&reply[open..]).into_iter::<Value>();
    let value = match values.next() {
        Some(Ok(value)) => value,
        Some(Err(error)) if error.is_eof() => {
            return Err("the JSON object is cut off before its end; write a shorter schema".into())
        }
        Some(Err(error)) => return Err(format!("the reply is not valid JSON: {error}")),
        None => return Err("the reply holds no JSON object".into()),
    };
    Schema::from_value(&value).map_err(|error| match error {
        Error::InvalidInput { reason, .. } => reason,
        other => other.to_string(),
    })?;
    let Value::Object(map) = value else {
        unreachable!("a schema that loads is an object")
    };
    let has_properties = map
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|properties| !properties.is_empty());
    let has_map = map
        .get("additionalProperties")
        .is_some_and(Value::is_object);
    if !has_properties && !has_map {
        return Err("the memory has nowhere to keep notes: give the top level \"properties\" or an \"additionalProperties\" schema".into());
    }
    let mut schema = Map::new();
    schema.insert("$schema".into(), SCHEMA_DIALECT.into());
    schema.extend(map.into_iter().filter(|(key, _)| key != "$schema"));
    Ok(Value::Object(schema))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(domain: &str, query: &str) -> SchemaRequest {
        SchemaRequest {
            domain: domain.into(),
            example_query: query.into(),
        }
    }

    #[test]
    fn shots_come_from_other_domains_one_per_family() {
        let council = request(
            "meeting transcripts of a city council",
            "What did the council decide about the budget?",
        );
        let domains: Vec<&str> = pick_shots(&council).iter().map(|s| s.family).collect();
        assert_eq!(domains, ["narrative", "code", "entity"]);

        let novels = request("summarizing novels", "Summarize the story.");
        let domains: Vec<&str> = pick_shots(&novels).iter().map(|s| s.family).collect();
        assert_eq!(domains, ["code", "entity", "tables"]);

        let everything = request("books, code, hotel reviews and sql tables", "anything");
        assert_eq!(pick_shots(&everything).len(), SHOT_COUNT);
    }

    #[test]
    fn every_shot_loads_as_a_schema_after_inlining() {
        for shot in SHOTS {
            let text = shot_schema(shot);
            assert!(!text.contains("$ref") && !text.contains("$defs"), "{text}");
            assert!(
                !text.contains("x-worked-example") && !text.contains("propertyNames"),
                "{text}"
            );
            let value: Value = serde_json::from_str(&text).unwrap();
            Schema::from_value(&value).unwrap();
            check_schema(&text).unwrap();
        }
    }

    #[test]
    fn inlining_keeps_the_referring_nodes_notes() {
        let defs = json!({"Item": {"type": "object", "description": "from the def"}});
        let node = json!({"$ref": "#/$defs/Item", "description": "from the ref"});
        assert_eq!(
            inline_refs(&node, &defs, 0),
            json!({"type": "object", "description": "from the ref"})
        );
    }

    #[test]
    fn keys_follow_the_grammar_order() {
        let schema = json!({"type": "object", "additionalProperties": {"items": {"type": "string"}, "type": "array"}, "description": "d"});
        let ordered = serde_json::to_string(&in_key_order(&schema)).unwrap();
        assert_eq!(
            ordered,
            r#"{"description":"d","type":"object","additionalProperties":{"type":"array","items":{"type":"string"}}}"#
        );
    }

    #[test]
    fn a_good_reply_is_accepted_with_chatter_and_fences() {
        let reply = "Here it is:\n```json\n{\"title\": \"Council\", \"description\": \"Decisions.\", \"type\": \"object\", \"additionalProperties\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}\n```\nDone.";
        let schema = check_schema(reply).unwrap();
        let keys: Vec<&String> = schema.as_object().unwrap().keys().collect();
        assert_eq!(keys[0], "$schema");
        assert_eq!(schema["title"], "Council");
    }

    #[test]
    fn bad_replies_are_refused_with_a_reason() {
        let cases = [
            ("no json here", "no JSON object"),
            ("{\"type\": \"object\", \"properties\": {", "cut off"),
            ("{\"type\": \"object\",, }", "not valid JSON"),
            ("{\"type\": \"object\", \"oneOf\": []}", "unsupported keyword `oneOf`"),
            ("{\"type\": \"array\", \"items\": {}}", "must be an object"),
            ("{\"type\": \"object\"}", "nowhere to keep notes"),
            (
                "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}, \"required\": [\"b\"], \"additionalProperties\": false}",
                "`b` is required",
            ),
        ];
        for (reply, needle) in cases {
            let reason = check_schema(reply).unwrap_err();
            assert!(reason.contains(needle), "{reply:?}: {reason}");
        }
    }

    #[test]
    fn the_grammar_names_every_level() {
        let Grammar::JsonSchema(grammar) = schema_grammar() else {
            panic!("a JSON Schema grammar")
        };
        for depth in 0..=GRAMMAR_DEPTH {
            assert!(grammar["$defs"].get(format!("node{depth}")).is_some());
        }
        assert_eq!(grammar["required"], json!(["title", "description", "type"]));
        let root: Vec<&String> = grammar["properties"].as_object().unwrap().keys().collect();
        assert_eq!(
            root,
            [
                "title",
                "description",
                "type",
                "properties",
                "required",
                "additionalProperties"
            ]
        );
    }
}
