//! Tests of schema loading, validation and the targets derived from it.

use super::types::is_class;
use super::*;
use serde_json::json;

fn schemas_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

fn load(name: &str) -> Schema {
    Schema::from_file(schemas_dir().join(name)).unwrap()
}

/// The code schema with keys spelled as names and a worked example of its
/// own: the form tried on the code-retrieval tasks (see the README).
fn keyed_code_schema() -> Schema {
    Schema::from_file(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/keyed-code-schema.json"),
    )
    .unwrap()
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
        assert!(schema
            .render_types()
            .starts_with(if is_class(schema.resolve(schema.root())) {
                "class Memory:"
            } else {
                "#"
            }));
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
    let deep =
        json!({"people": {}, "tree": {"label": "a", "children": [{"label": "b", "children": []}]}});
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

/// A keyed schema with one worked example whose revisions are `revisions`.
fn with_example(memory: Value, revisions: Value) -> Value {
    json!({
        "type": "object",
        "additionalProperties": {"type": "object", "properties": {"purpose": {"type": "string"}}, "additionalProperties": false},
        "x-worked-example": {"memory": memory, "text": "def area(r): ...", "revisions": revisions},
    })
}

#[test]
fn a_worked_example_is_kept_when_each_revision_applies_in_turn() {
    let value = with_example(
        json!({}),
        json!([
            {"op": "add", "path": "$.area", "value": {}},
            {"op": "add", "path": "$.area.purpose", "value": "the area of a circle"},
        ]),
    );
    let schema = Schema::from_value(&value).unwrap();
    let example = schema.worked_example().unwrap();
    assert_eq!(example.text, "def area(r): ...");
    assert_eq!(example.query, None);
    assert_eq!(example.revisions.len(), 2);
    assert!(load("book.json").worked_example().is_none());
    let keyed = keyed_code_schema();
    let fixture = keyed.worked_example().expect("the fixture carries one");
    assert!(fixture.text.starts_with("=== File: "), "{}", fixture.text);
}

#[test]
fn a_worked_example_that_would_be_refused_is_refused_with_its_place() {
    for (value, needle) in [
        (
            with_example(json!({"area": {"purpose": 3}}), json!([])),
            "#/x-worked-example/memory",
        ),
        (
            with_example(
                json!({"area": {"purpose": "a"}}),
                json!([{"op": "add", "path": "$.area", "value": {"purpose": "b"}}]),
            ),
            "#/x-worked-example/revisions/0: add $.area",
        ),
        (
            with_example(
                json!({"area": {"purpose": "a"}}),
                json!([{"op": "update", "path": "$.area.purpose", "value": "b"}]),
            ),
            "only add revisions",
        ),
        (
            json!({"type": "object", "x-worked-example": {"memory": {}, "revisions": []}}),
            "missing field `text`",
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "object", "x-worked-example": {}}}}),
            "only at the top level",
        ),
    ] {
        let err = Schema::from_value(&value).unwrap_err().to_string();
        assert!(err.contains(needle), "{err} lacks {needle}");
    }
}

fn identifiers() -> Schema {
    Schema::from_value(&json!({
        "type": "object",
        "propertyNames": {"pattern": "^[a-z_]+$"},
        "additionalProperties": {"type": "integer"},
    }))
    .unwrap()
}

#[test]
fn keys_must_match_the_pattern_of_property_names() {
    let schema = identifiers();
    assert_eq!(schema.validate(&json!({"parse_size": 3})), Ok(()));
    let err = schema.validate(&json!({"main package": 3})).unwrap_err();
    assert!(err.contains("must match ^[a-z_]+$"), "{err}");
    assert!(schema.at_path(&path("$.parse_size")).is_some());
    assert!(schema.at_path(&path("$.'main package'")).is_none());
}

#[test]
fn property_names_is_refused_unless_an_anchored_pattern_every_property_fits() {
    for (names, needle) in [
        (json!({"pattern": "[a-z]+"}), "must be anchored as ^…$"),
        (json!({"pattern": "^[a-z+$"}), "is not a regular expression"),
        (json!({"maxLength": 3}), "a single `pattern`"),
        (
            json!({"pattern": "^[a-z]+$", "maxLength": 3}),
            "a single `pattern`",
        ),
    ] {
        let value = json!({"type": "object", "propertyNames": names});
        let err = Schema::from_value(&value).unwrap_err().to_string();
        assert!(err.contains(needle), "{err} lacks {needle}");
    }
    let declared = json!({
        "type": "object",
        "propertyNames": {"pattern": "^[a-z]+$"},
        "properties": {"Title": {"type": "string"}},
    });
    let err = Schema::from_value(&declared).unwrap_err().to_string();
    assert!(err.contains("`Title` does not match"), "{err}");
    let on_a_list = json!({"type": "object", "properties": {"a": {"type": "array", "propertyNames": {"pattern": "^a$"}}}});
    let err = Schema::from_value(&on_a_list).unwrap_err().to_string();
    assert!(err.contains("`propertyNames` does not apply"), "{err}");
}
