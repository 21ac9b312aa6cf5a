//! Revising a memory with what a model wrote: each line parsed, screened, checked
//! against the schema and applied in order, each refusal kept with its reason.

use super::grammar::MAX_STRING_CHARS;
use super::{
    apply, parse_revisions, render_revision, Dropped, Op, Redundancy, Rejection, Revision, Schema,
    Screen,
};
use crate::sentences::split_sentences;
use serde_json::Value;

/// Why a revision, or part of one, was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// It did not parse, or did not fit the schema or the memory.
    #[default]
    Invalid,
    /// The memory already said it.
    Duplicate,
    /// It copied the instructions, the examples or the schema.
    Echo,
    /// It copied a long run of the chunk's words instead of noting it in its own.
    Copy,
    /// Its words are mostly not in what was read: it notes the world, not the text.
    Ungrounded,
    /// It speaks as "I" or "we" where notes are in the third person.
    FirstPerson,
}

/// A revision the program refused, with the reason.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Refused {
    /// The revision as parsed; absent when the text did not parse (the reason quotes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default)]
    pub kind: RefusalKind,
    pub reason: String,
}

/// `revision` without the last sentence of each string that reached the
/// grammar's length bound ([`MAX_STRING_CHARS`]) while holding more than one
/// sentence: decoding stopped that sentence mid-word ("I showed him the en"),
/// and a note ending in half a word reads as if it said something else, to
/// the model that condenses the notes as to a person.
fn without_cut_sentences(mut revision: Revision) -> Revision {
    fn trim(value: &mut Value) {
        match value {
            Value::String(text) if text.chars().count() >= MAX_STRING_CHARS => {
                let mut sentences = split_sentences(text);
                if sentences.len() > 1 {
                    sentences.pop();
                    *text = sentences.join(" ");
                }
            }
            Value::Array(items) => items.iter_mut().for_each(trim),
            Value::Object(members) => members.values_mut().for_each(trim),
            _ => {}
        }
    }
    trim(&mut revision.value);
    revision
}

/// Parse the revisions in `output` and apply to `memory` each one that checks
/// out against `schema`, in order; `update`s are refused unless `updates`.
/// With a `screen`, the parts of a revision that the memory already holds or
/// that copy the prompt are taken out first.
/// Returns what was applied and what was refused, with the reasons.
pub fn apply_revisions(
    memory: &mut Value,
    output: &str,
    schema: &Schema,
    updates: bool,
    screen: Option<&Screen>,
) -> (Vec<Revision>, Vec<Refused>) {
    apply_parsed(memory, parse_revisions(output), schema, updates, screen)
}

/// [`apply_revisions`] for revisions already parsed, for a caller that lays
/// them out first.
pub fn apply_parsed(
    memory: &mut Value,
    revisions: Vec<Result<Revision, String>>,
    schema: &Schema,
    updates: bool,
    screen: Option<&Screen>,
) -> (Vec<Revision>, Vec<Refused>) {
    let mut applied = Vec::new();
    let mut rejected = Vec::new();
    for parsed in revisions {
        let revision = match parsed {
            Ok(revision) => without_cut_sentences(revision),
            Err(reason) => {
                rejected.push(Refused {
                    revision: None,
                    kind: RefusalKind::Invalid,
                    reason,
                });
                continue;
            }
        };
        if !updates && revision.op == Op::Update {
            rejected.push(invalid(&revision, Rejection::update_disabled(&revision)));
            continue;
        }
        let revision = match screen {
            Some(screen) => {
                let screened = screen.screen(memory, &revision);
                rejected.extend(
                    screened
                        .dropped
                        .iter()
                        .map(|dropped| redundant(&revision, dropped)),
                );
                match screened.kept {
                    Some(kept) => kept,
                    None => continue,
                }
            }
            None => revision,
        };
        match apply(memory, &revision, schema) {
            Ok(next) => {
                *memory = next;
                applied.push(revision);
            }
            Err(rejection) => rejected.push(invalid(&revision, rejection)),
        }
    }
    (applied, rejected)
}

fn invalid(revision: &Revision, rejection: Rejection) -> Refused {
    Refused {
        revision: Some(render_revision(revision).trim_end().to_string()),
        kind: RefusalKind::Invalid,
        reason: rejection.reason,
    }
}

fn redundant(revision: &Revision, dropped: &Dropped) -> Refused {
    let (kind, why) = match dropped.why {
        Redundancy::Duplicate => (RefusalKind::Duplicate, "duplicate: the memory already says"),
        Redundancy::Echo => (RefusalKind::Echo, "echo: copied from the prompt or schema"),
        Redundancy::Empty => (RefusalKind::Invalid, "empty: says nothing"),
        Redundancy::Copy => (
            RefusalKind::Copy,
            "copy: repeats a long run of the text's words",
        ),
        Redundancy::Ungrounded => (
            RefusalKind::Ungrounded,
            "ungrounded: most of its words are not in what was read",
        ),
        Redundancy::FirstPerson => (
            RefusalKind::FirstPerson,
            "first person: a note tells the text in the third person",
        ),
    };
    Refused {
        revision: Some(render_revision(revision).trim_end().to_string()),
        kind,
        reason: format!(
            "{} {}: {why} {:?}",
            revision.op, revision.path, dropped.text
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::testing::rev;
    use serde_json::json;

    #[test]
    fn a_string_cut_at_the_length_bound_loses_its_unfinished_sentence() {
        let whole = "Mr. Vass arrived on the twentieth. He measured the tower.";
        let filler = " He counted the oil drums.".repeat(MAX_STRING_CHARS / 20);
        let cut = format!("{whole}{filler} I showed him the en");
        assert!(cut.chars().count() >= MAX_STRING_CHARS);
        let revision = rev(Op::Add, "$.events", json!([cut, "Short and whole"]));
        let trimmed = without_cut_sentences(revision);
        let kept = trimmed.value[0].as_str().unwrap();
        assert!(kept.starts_with(whole), "{kept}");
        assert!(kept.ends_with("He counted the oil drums."), "{kept}");
        assert_eq!(trimmed.value[1], "Short and whole");
    }

    #[test]
    fn a_long_single_sentence_is_kept_as_written() {
        let one = format!(
            "The log lists {} and more",
            "casks ".repeat(MAX_STRING_CHARS / 6)
        );
        let revision = rev(Op::Add, "$.events", json!(one));
        assert_eq!(without_cut_sentences(revision).value, json!(one));
    }
}
