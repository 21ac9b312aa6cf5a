//! Revising a memory with what a model wrote: every line is parsed, screened
//! for what the memory already holds or what copies the prompt, checked
//! against the schema and applied in order. What is refused is kept with its
//! reason, so a run can count duplicates, echoes and invalid lines apart.

use super::{
    apply, parse_revisions, render_revision, Dropped, Op, Redundancy, Rejection, Revision, Schema,
    Screen,
};
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
    let mut applied = Vec::new();
    let mut rejected = Vec::new();
    for parsed in parse_revisions(output) {
        let revision = match parsed {
            Ok(revision) => revision,
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
