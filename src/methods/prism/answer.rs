//! PRISM's final answer, written from the memory alone.

use super::prompt::EMPTY_MEMORY;
use super::{Prism, PrismState};
use crate::error::Result;
use crate::llm::{Llm, Prompt};
use crate::methods::length::{self, condense, words, CONDENSE_SYSTEM};
use crate::methods::AnswerForm;
use serde_json::Value;
use std::collections::HashMap;

impl Prism<'_> {
    /// Write the final answer from the memory: the query answered from
    /// the whole memory, or a summary of about the target length that says
    /// who is in the document (`cast_and_notes`) and then condenses the
    /// other notes in order.
    pub fn answer(&self, llm: &mut dyn Llm, state: &PrismState, target: usize) -> Result<String> {
        if self.config.answer_form == AnswerForm::Direct {
            let prompt = self.query_prompt(state);
            let completion = llm.complete(&prompt, self.config.answer_tokens, None)?;
            return Ok(completion.text.trim().to_string());
        }
        let (cast, notes) = cast_and_notes(&state.memory, target / CAST_SHARE);
        if cast.is_empty() && notes.is_empty() {
            let prompt = Prompt {
                system: Some(CONDENSE_SYSTEM.to_string()),
                segments: vec![EMPTY_MEMORY.to_string()],
                source: None,
                shared_segments: Some(0),
            };
            let completion = llm.complete(&prompt, length::tokens_for(target), None)?;
            return Ok(completion.text.trim().to_string());
        }
        let told = match notes.is_empty() {
            true => String::new(),
            false => condense(llm, &notes, target.saturating_sub(words(&cast)).max(1))?.text,
        };
        Ok(format!("{cast} {told}").trim().to_string())
    }
}

/// A summary gives at most this share of its target words to saying who
/// its people are.
const CAST_SHARE: usize = 4;
/// A note on who someone is longer than this is left out of the cast: it
/// tells what they did, which the other notes tell.
const MAX_ROLE_WORDS: usize = 12;

/// The opening of a summary that says who is in the document, and the
/// notes its remainder is condensed from. Each member of the memory kept
/// under names (the people, in the stock schemas) becomes one sentence
/// naming those the other notes mention most, each with their first note
/// ("Tomas Reddick (the assistant keeper)"), in at most `budget` words in
/// all. Condensed with the events instead, four or five people's notes
/// merged into one sentence came out as a scene none of them was in
/// ("Orlando, Charles, Oliver, Rosalind, and Celia engage in comedic
/// interactions"), and the roles were lost or changed ("Tomas Reddick, a
/// night patrol officer").
pub(super) fn cast_and_notes(memory: &Value, budget: usize) -> (String, Vec<String>) {
    let Value::Object(members) = memory else {
        return (String::new(), memory_notes(memory));
    };
    let (named, told): (Vec<_>, Vec<_>) = members.iter().partition(|(_, value)| value.is_object());
    let notes: Vec<String> = told
        .into_iter()
        .flat_map(|(key, value)| memory_notes(&serde_json::json!({ key: value })))
        .collect();
    let text = notes.join(" ");
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        *counts.entry(word).or_default() += 1;
    }
    let mut left = budget;
    let cast: Vec<String> = named
        .into_iter()
        .filter_map(|(key, value)| {
            let sentence = cast_sentence(key, value.as_object()?, &counts, left)?;
            left = left.saturating_sub(words(&sentence));
            Some(sentence)
        })
        .collect();
    (cast.join(" "), notes)
}

/// "The people in it include A (who A is), B and C (who C is).": the
/// members of `named` the notes mention most, in that order, within
/// `budget` words but at least one.
fn cast_sentence(
    key: &str,
    named: &serde_json::Map<String, Value>,
    counts: &HashMap<&str, usize>,
    budget: usize,
) -> Option<String> {
    let opening = format!("The {key} in it include");
    let mut ranked: Vec<(usize, String)> = named
        .iter()
        .map(|(name, notes)| (mentions(name, counts), introduce(name, notes)))
        .collect();
    // A stable sort keeps memory order among equals.
    ranked.sort_by_key(|(mentioned, _)| std::cmp::Reverse(*mentioned));
    let mut spent = words(&opening) + 1;
    let mut entries = Vec::new();
    for (_, entry) in ranked {
        spent += words(&entry);
        if spent > budget && !entries.is_empty() {
            break;
        }
        entries.push(entry);
    }
    let last = entries.pop()?;
    Some(match entries.is_empty() {
        true => format!("{opening} {last}."),
        false => format!("{opening} {} and {last}.", entries.join(", ")),
    })
}

/// How often the notes name someone: by the first or last word of the name
/// that is a name (capitalized, not an initial or a title such as "Mr.").
fn mentions(name: &str, counts: &HashMap<&str, usize>) -> usize {
    let parts: Vec<&str> = name.split_whitespace().collect();
    [parts.first(), parts.last()]
        .into_iter()
        .flatten()
        .filter(|part| {
            part.len() > 2 && part.starts_with(char::is_uppercase) && !part.ends_with('.')
        })
        .map(|part| counts.get(part).copied().unwrap_or(0))
        .max()
        .unwrap_or(0)
}

/// `name`, and who they are in parentheses when their first note says so
/// briefly.
fn introduce(name: &str, notes: &Value) -> String {
    let first = match notes {
        Value::Array(items) => items.iter().find_map(Value::as_str),
        Value::String(note) => Some(note.as_str()),
        _ => None,
    };
    let role = first
        .map(|note| note.trim().trim_end_matches('.').trim())
        .filter(|role| !role.is_empty() && words(role) <= MAX_ROLE_WORDS);
    match role {
        Some(role) => format!("{name} ({role})"),
        None => name.to_string(),
    }
}

/// The notes of a memory, in memory order: every string, led by the key it
/// sits under when that key is deeper than the top level (a person's name,
/// say), so that a note read alone still says what it is about.
pub(super) fn memory_notes(memory: &Value) -> Vec<String> {
    fn walk(value: &Value, key: Option<&str>, depth: usize, notes: &mut Vec<String>) {
        match value {
            Value::String(text) if !text.trim().is_empty() => notes.push(match key {
                Some(key) if depth > 1 => format!("{key}: {}", text.trim()),
                _ => text.trim().to_string(),
            }),
            Value::Array(items) => {
                for item in items {
                    walk(item, key, depth, notes);
                }
            }
            Value::Object(members) => {
                for (name, member) in members {
                    walk(member, Some(name), depth + 1, notes);
                }
            }
            Value::Number(_) | Value::Bool(_) => {
                if let Some(key) = key {
                    notes.push(format!("{key}: {value}"));
                }
            }
            _ => {}
        }
    }
    let mut notes = Vec::new();
    walk(memory, None, 0, &mut notes);
    notes
}
