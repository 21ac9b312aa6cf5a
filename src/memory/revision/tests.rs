//! Tests of parsing and applying revisions to a memory.

use super::*;
use crate::memory::render::Amendments;
use crate::memory::schema::Next;
use proptest::prelude::*;
use serde_json::json;

use crate::memory::testing::{load, rev};

fn kind_of(memory: &Value, revision: &Revision, schema: &Schema) -> RejectionKind {
    let before = memory.clone();
    let err = apply(memory, revision, schema).unwrap_err();
    assert_eq!(memory, &before);
    assert!(
        err.reason
            .starts_with(&format!("{} {}: ", revision.op, revision.path)),
        "{err}"
    );
    err.kind
}

#[test]
fn add_creates_and_update_replaces() {
    let schema = load("entity.json");
    let m0 = schema.empty_memory();
    let m1 = apply(
        &m0,
        &rev(
            Op::Add,
            "$.attributes.'Noise Level'",
            json!(["street noise"]),
        ),
        &schema,
    )
    .unwrap();
    assert_eq!(m1, json!({"attributes": {"Noise Level": ["street noise"]}}));
    let m2 = apply(
        &m1,
        &rev(Op::Update, "$.attributes.'Noise Level'", json!(["quiet"])),
        &schema,
    )
    .unwrap();
    assert_eq!(m2, json!({"attributes": {"Noise Level": ["quiet"]}}));
    let m3 = apply(
        &m2,
        &rev(
            Op::Update,
            "$.attributes.'Noise Level'[0]",
            json!("very quiet"),
        ),
        &schema,
    )
    .unwrap();
    assert_eq!(m3, json!({"attributes": {"Noise Level": ["very quiet"]}}));
    let m4 = apply(
        &m3,
        &rev(
            Op::Add,
            "$.attributes.'Noise Level'[1]",
            json!("no traffic"),
        ),
        &schema,
    )
    .unwrap();
    assert_eq!(
        m4,
        json!({"attributes": {"Noise Level": ["very quiet", "no traffic"]}})
    );
}

#[test]
fn add_at_an_existing_list_appends_items_or_one_item() {
    let schema = load("entity.json");
    let m = json!({"attributes": {"Food": ["good"]}});
    let m = apply(
        &m,
        &rev(Op::Add, "$.attributes.Food", json!("cheap")),
        &schema,
    )
    .unwrap();
    let m = apply(
        &m,
        &rev(Op::Add, "$.attributes.Food", json!(["late", "spicy"])),
        &schema,
    )
    .unwrap();
    assert_eq!(
        m,
        json!({"attributes": {"Food": ["good", "cheap", "late", "spicy"]}})
    );
    assert_eq!(
        kind_of(&m, &rev(Op::Add, "$.attributes.Food", json!([1])), &schema),
        RejectionKind::TypeMismatch
    );
    assert_eq!(
        kind_of(&m, &rev(Op::Add, "$.attributes.Food", json!([])), &schema),
        RejectionKind::Other
    );
}

#[test]
fn add_at_an_existing_object_merges_new_keys() {
    let schema = load("cok-book.json");
    let m0 = schema.empty_memory();
    let m1 = apply(
        &m0,
        &rev(
            Op::Add,
            "$.characters",
            json!({"Victor": ["a student"], "Elizabeth": ["his cousin"]}),
        ),
        &schema,
    )
    .unwrap();
    assert_eq!(
        m1["characters"],
        json!({"Victor": ["a student"], "Elizabeth": ["his cousin"]})
    );
    assert_eq!(
        kind_of(
            &m1,
            &rev(Op::Add, "$.characters", json!({"Victor": ["again"]})),
            &schema
        ),
        RejectionKind::PathExists
    );
    assert_eq!(
        kind_of(
            &m1,
            &rev(Op::Add, "$.characters", json!(["not a map"])),
            &schema
        ),
        RejectionKind::PathExists
    );
    assert_eq!(
        kind_of(&m1, &rev(Op::Add, "$", json!({"themes": {}})), &schema),
        RejectionKind::NotAllowed
    );
    assert_eq!(
        kind_of(
            &m1,
            &rev(Op::Add, "$.events", json!({"storm": "not a list"})),
            &schema
        ),
        RejectionKind::TypeMismatch
    );
    let merged = apply(&m1, &rev(Op::Add, "$", json!({"characters": {}})), &schema);
    assert_eq!(merged.unwrap_err().kind, RejectionKind::PathExists);
}

#[test]
fn each_kind_of_rejection() {
    let schema = load("entity.json");
    let m = json!({"attributes": {"Food": ["good"]}});
    let cases = [
        (
            rev(Op::Add, "$.attributes.Food[0]", json!("x")),
            RejectionKind::PathExists,
        ),
        (
            rev(Op::Add, "$.attributes.Food[5]", json!("x")),
            RejectionKind::BadPath,
        ),
        (
            rev(Op::Add, "$.attributes.Food.x", json!("x")),
            RejectionKind::BadPath,
        ),
        (
            rev(Op::Add, "$.attributes[0]", json!("x")),
            RejectionKind::BadPath,
        ),
        (
            rev(Op::Add, "$.attributes.Food[0].x", json!("x")),
            RejectionKind::BadPath,
        ),
        (
            rev(Op::Add, "$.mood", json!("calm")),
            RejectionKind::NotAllowed,
        ),
        (
            rev(Op::Add, "$.attributes.Rooms", json!("big")),
            RejectionKind::TypeMismatch,
        ),
        (
            rev(Op::Add, "$.attributes.Rooms", json!([1, 2])),
            RejectionKind::TypeMismatch,
        ),
        (
            rev(Op::Update, "$.attributes.Rooms", json!(["big"])),
            RejectionKind::PathMissing,
        ),
        (
            rev(Op::Update, "$.attributes.Food[3]", json!("x")),
            RejectionKind::PathMissing,
        ),
        (
            rev(Op::Update, "$.attributes.Food", json!("good")),
            RejectionKind::TypeMismatch,
        ),
        (
            rev(Op::Update, "$", json!({"attributes": {}})),
            RejectionKind::NotAllowed,
        ),
        (
            rev(Op::Add, "$.attributes", json!(["x"])),
            RejectionKind::PathExists,
        ),
    ];
    for (revision, kind) in cases {
        assert_eq!(kind_of(&m, &revision, &schema), kind, "{revision:?}");
    }
    let off = Rejection::update_disabled(&rev(Op::Update, "$.attributes.Food", json!([])));
    assert_eq!(off.kind, RejectionKind::NotAllowed);
    assert!(off.reason.starts_with("update $.attributes.Food: "));
}

#[test]
fn missing_parents_are_created_only_when_their_empty_form_is_valid() {
    let sql = load("sql.json");
    let m = json!({"Singer": {"description": "who sings"}});
    // `columns` is a map: created on the way.
    let m2 = apply(
        &m,
        &rev(Op::Add, "$.Singer.columns.Name", json!("text")),
        &sql,
    )
    .unwrap();
    assert_eq!(
        m2,
        json!({"Singer": {"description": "who sings", "columns": {"Name": "text"}}})
    );
    // A table needs a description, so it cannot appear empty.
    assert_eq!(
        kind_of(
            &m,
            &rev(Op::Add, "$.Concert.columns.Year", json!("int")),
            &sql
        ),
        RejectionKind::PathMissing
    );
    let book = load("book.json");
    let m = apply(
        &json!({}),
        &rev(Op::Add, "$.'Chapter 1'[0]", json!("It rains.")),
        &book,
    )
    .unwrap();
    assert_eq!(m, json!({"Chapter 1": ["It rains."]}));
}

#[test]
fn keys_keep_the_order_they_were_added_in() {
    let schema = load("book.json");
    let mut m = json!({});
    for key in ["zeta", "alpha", "mid"] {
        m = apply(
            &m,
            &rev(Op::Add, &format!("$.{key}"), json!(["x"])),
            &schema,
        )
        .unwrap();
    }
    m = apply(&m, &rev(Op::Update, "$.alpha", json!(["y"])), &schema).unwrap();
    let keys: Vec<&String> = m.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["zeta", "alpha", "mid"]);
}

#[test]
fn serde_shape() {
    let r = rev(Op::Add, "$.attributes.'Noise Level'", json!(["quiet"]));
    let text = serde_json::to_string(&r).unwrap();
    assert_eq!(
        text,
        r#"{"op":"add","path":"$.attributes.'Noise Level'","value":["quiet"]}"#
    );
    assert_eq!(serde_json::from_str::<Revision>(&text).unwrap(), r);
    assert_eq!(
        serde_json::to_string(&RejectionKind::TypeMismatch).unwrap(),
        r#""type_mismatch""#
    );
}

/// Mostly values some schema accepts (sentences, lists of them, function
/// and table records, maps of lists), plus arbitrary JSON.
fn arb_value() -> impl Strategy<Value = Value> {
    let sentence = "[a-z ]{0,8}";
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        sentence.prop_map(Value::String),
    ];
    let arbitrary = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((arb_key(), inner), 0..4)
                .prop_map(|kvs| Value::Object(kvs.into_iter().collect())),
        ]
    });
    let sentences = prop::collection::vec(sentence, 0..3).prop_map(|v| json!(v));
    prop_oneof![
        3 => sentences.clone(),
        2 => sentence.prop_map(Value::String),
        1 => prop::collection::vec((arb_key(), sentences), 0..3)
            .prop_map(|kvs| Value::Object(kvs.into_iter().collect())),
        1 => (sentence, sentence).prop_map(|(a, b)| {
            json!({"purpose": a, "input": b, "output": a, "procedure": b})
        }),
        1 => (sentence, prop::option::of(sentence)).prop_map(|(d, c)| match c {
            Some(c) => json!({"description": d, "columns": {"id": c}}),
            None => json!({"description": d}),
        }),
        2 => arbitrary,
    ]
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("characters"),
        Just("events"),
        Just("other"),
        Just("attributes"),
        Just("columns"),
        Just("description"),
        Just("purpose"),
        Just("a"),
        Just("b c"),
    ]
    .prop_map(str::to_string)
}

fn arb_path() -> impl Strategy<Value = JsonPath> {
    let segment = prop_oneof![
        3 => arb_key().prop_map(Segment::Key),
        1 => (0usize..4).prop_map(Segment::Index),
    ];
    prop::collection::vec(segment, 0..4).prop_map(JsonPath::from_segments)
}

fn arb_revision() -> impl Strategy<Value = Revision> {
    (
        prop_oneof![Just(Op::Add), Just(Op::Update)],
        arb_path(),
        arb_value(),
    )
        .prop_map(|(op, path, value)| Revision { op, path, value })
}

/// One step of a random session: a revision from anywhere, or one aimed
/// at a target the schema offers for the memory as it is then.
#[derive(Debug, Clone)]
enum Step {
    Random(Revision),
    Aimed {
        add: bool,
        pick: usize,
        key: String,
        value: Value,
    },
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        arb_revision().prop_map(Step::Random),
        (any::<bool>(), any::<usize>(), arb_key(), arb_value()).prop_map(
            |(add, pick, key, value)| Step::Aimed {
                add,
                pick,
                key,
                value
            }
        ),
    ]
}

/// Turn a step into a revision; for aimed steps, also say whether the
/// value fits the target's node (and so must be accepted).
fn realize(step: &Step, memory: &Value, schema: &Schema) -> Option<(Revision, bool)> {
    match step {
        Step::Random(revision) => Some((revision.clone(), false)),
        Step::Aimed {
            add: true,
            pick,
            key,
            value,
        } => {
            let targets = schema.add_targets(memory);
            let (pattern, node) = targets.get(pick % targets.len().max(1))?;
            let path = match &pattern.next {
                Next::NewKey => pattern.prefix.key(key.clone()),
                Next::Key(name) => pattern.prefix.key(name.clone()),
                Next::Index(index) => pattern.prefix.index(*index),
            };
            // A new key must also be spelled as the schema asks.
            let fits = schema.validate_node(node, value).is_ok()
                && schema.at_path(&path).is_some()
                && lookup(memory, path.segments()).is_none();
            Some((Revision::add(path, value.clone()), fits))
        }
        Step::Aimed {
            add: false,
            pick,
            value,
            ..
        } => {
            let targets = schema.update_targets(memory);
            let (path, node) = targets.get(pick % targets.len().max(1))?;
            let fits = schema.validate_node(node, value).is_ok();
            Some((Revision::update(path.clone(), value.clone()), fits))
        }
    }
}

fn lookup<'a>(mut value: &'a Value, segments: &[Segment]) -> Option<&'a Value> {
    for segment in segments {
        value = match (value, segment) {
            (Value::Object(map), Segment::Key(key)) => map.get(key)?,
            (Value::Array(list), Segment::Index(index)) => list.get(*index)?,
            _ => return None,
        };
    }
    Some(value)
}

proptest! {
    /// Whatever the model proposes: no panic, a refusal leaves the memory
    /// as it was, an acceptance leaves it valid, a value that fits a
    /// target the schema offers is accepted there, and replaying the
    /// accepted revisions as amendments gives the same memory.
    #[test]
    fn random_revision_sequences_never_panic_and_keep_memory_valid(
        steps in prop::collection::vec(arb_step(), 0..32),
        which in 0usize..5,
    ) {
        let name = ["book.json", "cok-book.json", "entity.json", "sql.json", "code.json"][which];
        let schema = load(name);
        let mut memory = schema.empty_memory();
        let mut amendments = Amendments::new(memory.clone());
        for step in &steps {
            let Some((revision, fits)) = realize(step, &memory, &schema) else {
                continue;
            };
            let before = memory.clone();
            match apply(&memory, &revision, &schema) {
                Ok(next) => {
                    prop_assert_eq!(schema.validate(&next), Ok(()), "{:?}", revision);
                    memory = next;
                    let shown = amendments.segments();
                    amendments.push(revision.clone());
                    prop_assert!(amendments.segments().starts_with(&shown));
                }
                Err(rejection) => {
                    prop_assert!(!fits, "{:?} was refused: {}", revision, rejection);
                    prop_assert_eq!(&memory, &before);
                    prop_assert!(!rejection.reason.is_empty());
                }
            }
        }
        prop_assert_eq!(amendments.effective(&schema), memory);
    }
}

/// A schema that keys functions by name (`propertyNames`): a note keyed by
/// a phrase is refused whether it names the key in its path or merges it.
#[test]
fn a_key_the_schema_does_not_spell_so_is_refused() {
    let schema = Schema::from_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/keyed-code-schema.json"
    ))
    .unwrap();
    let note = json!({"purpose": "p", "input": "i", "output": "o", "procedure": "s"});
    let named = rev(Op::Add, "$.naturalsize", note.clone());
    assert!(apply(&json!({}), &named, &schema).is_ok());
    let phrase = rev(Op::Add, "$.'main package for humanize'", note.clone());
    assert_eq!(
        kind_of(&json!({}), &phrase, &schema),
        RejectionKind::NotAllowed
    );
    let merged = rev(Op::Add, "$", json!({"main package": note}));
    assert!(apply(&json!({}), &merged, &schema).is_err());
}
