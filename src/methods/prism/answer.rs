//! PRISM's final answer, written from the memory alone.

use super::prompt::EMPTY_MEMORY;
use super::{Prism, PrismState};
use crate::error::Result;
use crate::llm::{Llm, Prompt};
use crate::methods::length::{self, condense, words, CONDENSE_SYSTEM};
use crate::methods::AnswerForm;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

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
/// The most people a cast sentence names, those the notes mention most:
/// in place on Frankenstein's first 25k tokens the cast named 21, a
/// quarter of the summary, more than a reader keeps apart.
pub(super) const MAX_CAST: usize = 8;
/// A note on who someone is longer than this is left out of the cast: it
/// tells what they did, which the other notes tell.
const MAX_ROLE_WORDS: usize = 12;
/// Names longer than this are titles or institutions, not people: the
/// Sabotage manual's people call kept "Project Gutenberg Literary Archive
/// Foundation" and "United States. Office of Strategic Services".
const MAX_NAME_WORDS: usize = 4;
/// Words that make a name an institution's, not a person's: on the
/// Sabotage manual the summary's cast sentence opened with "Strategic
/// Services and Office of Strategic Services", which the notes write as
/// names.
const INSTITUTION_WORDS: &[&str] = &[
    "Agency",
    "Archive",
    "Army",
    "Association",
    "Bank",
    "Board",
    "Bureau",
    "College",
    "Committee",
    "Company",
    "Corporation",
    "Council",
    "Department",
    "Foundation",
    "Government",
    "Institute",
    "Ministry",
    "Navy",
    "Office",
    "Service",
    "Services",
    "Society",
    "University",
];

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
///
/// Only names the other notes use as names are cast ([`Mentions::casts`]):
/// on a manual without people, the people call filed the things the manual
/// is about ("Fuel lines", "Turbines") and its publisher's staff, and a
/// cast of eighteen of them took a quarter of the summary.
pub(super) fn cast_and_notes(memory: &Value, budget: usize) -> (String, Vec<String>) {
    let Value::Object(members) = memory else {
        return (String::new(), memory_notes(memory));
    };
    let (named, told): (Vec<_>, Vec<_>) = members.iter().partition(|(_, value)| value.is_object());
    let notes: Vec<String> = told
        .into_iter()
        .flat_map(|(key, value)| memory_notes(&serde_json::json!({ key: value })))
        .collect();
    let mentions = Mentions::new(&notes);
    let mut left = budget;
    let cast: Vec<String> = named
        .into_iter()
        .filter_map(|(key, value)| {
            let sentence = cast_sentence(key, value.as_object()?, &mentions, left)?;
            left = left.saturating_sub(words(&sentence));
            Some(sentence)
        })
        .collect();
    (cast.join(" "), notes)
}

/// "The people in it include A (who A is), B and C (who C is).": the
/// members of `named` the notes mention most, in that order, at most
/// [`MAX_CAST`] of them, within `budget` words but at least one. A member
/// whose role would not fit is named without it, so that a long role does
/// not keep a main character out.
fn cast_sentence(
    key: &str,
    named: &serde_json::Map<String, Value>,
    mentions: &Mentions,
    budget: usize,
) -> Option<String> {
    let opening = format!("The {key} in it include");
    let all: Vec<&str> = named.keys().map(String::as_str).collect();
    let names: Vec<&str> = all
        .iter()
        .copied()
        .filter(|name| !first_name_of_one(name, &all))
        .collect();
    let mut ranked: Vec<(usize, &str, &Value)> = named
        .iter()
        .filter(|(name, _)| names.contains(&name.as_str()) && mentions.casts(name, &names))
        .map(|(name, notes)| (mentions.count(name, &names), name.as_str(), notes))
        .collect();
    // A stable sort keeps memory order among equals.
    ranked.sort_by_key(|(mentioned, _, _)| std::cmp::Reverse(*mentioned));
    let mut spent = words(&opening) + 1;
    let mut entries = Vec::new();
    for (_, name, notes) in ranked.into_iter().take(MAX_CAST) {
        let introduced = introduce(name, notes);
        let entry = match spent + words(&introduced) <= budget || entries.is_empty() {
            true => introduced,
            false => name.to_string(),
        };
        if spent + words(&entry) > budget && !entries.is_empty() {
            break;
        }
        spent += words(&entry);
        entries.push(entry);
    }
    let last = entries.pop()?;
    Some(match entries.is_empty() {
        true => format!("{opening} {last}."),
        false => format!("{opening} {} and {last}.", entries.join(", ")),
    })
}

/// Whether `name` opens exactly one longer name of `names`, as "Justine"
/// opens "Justine Moritz": the same person, whom a cast would otherwise
/// name twice (Frankenstein's listed Elizabeth, Justine and Henry each
/// twice). A name that opens two ("Henry" beside "Henry Clerval" and
/// "Henry Frankenstein") could be either, and stays.
fn first_name_of_one(name: &str, names: &[&str]) -> bool {
    let longer = names.iter().filter(|other| {
        other
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(' '))
    });
    longer.count() == 1
}

/// How the notes other than the people's use each word: how often it
/// occurs, whether it is ever capitalized in mid-sentence, which is how
/// prose marks a name ("the skipper, Wenna Cole, waited"), and whether it
/// is ever written in lowercase, which a name is not ("the manual").
struct Mentions {
    counts: HashMap<String, usize>,
    as_names: HashSet<String>,
    in_lowercase: HashSet<String>,
}

impl Mentions {
    fn new(notes: &[String]) -> Mentions {
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut as_names = HashSet::new();
        let mut in_lowercase = HashSet::new();
        for note in notes {
            let mut sentence_start = true;
            for token in note.split_whitespace() {
                let word: String = token
                    .trim_start_matches(|c: char| !c.is_alphanumeric())
                    .chars()
                    .take_while(|c| c.is_alphanumeric())
                    .collect();
                if !word.is_empty() {
                    if !sentence_start && word.starts_with(char::is_uppercase) {
                        as_names.insert(word.clone());
                    }
                    if word.starts_with(char::is_lowercase) {
                        in_lowercase.insert(word.clone());
                    }
                    *counts.entry(word).or_default() += 1;
                }
                sentence_start = ends_sentence(token);
            }
        }
        Mentions {
            counts,
            as_names,
            in_lowercase,
        }
    }

    /// How often the notes name `name`: by the first or last word of the
    /// name that identifies it among `names` ([`identifying_parts`]).
    fn count(&self, name: &str, names: &[&str]) -> usize {
        identifying_parts(name, names)
            .iter()
            .map(|part| self.counts.get(*part).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    }

    /// Whether `name` belongs in the cast: written as a person's name
    /// (capitalized words, with short particles such as "de" only after
    /// the first, so the revision step's misspelt "ida Penhallow" is not
    /// one; at most [`MAX_NAME_WORDS`], none of [`INSTITUTION_WORDS`]), and
    /// used as one in the notes by a word that they never write in
    /// lowercase. On the
    /// Sabotage manual the people call listed the manual itself, "Simple
    /// Sabotage Field Manual", whose words the notes also use as common
    /// nouns ("the manual", "simple sabotage").
    fn casts(&self, name: &str, names: &[&str]) -> bool {
        let parts: Vec<&str> = name.split_whitespace().collect();
        let written_as_name = parts.len() <= MAX_NAME_WORDS
            && parts
                .first()
                .is_some_and(|first| first.starts_with(char::is_uppercase))
            && parts.iter().all(|part| {
                (part.starts_with(char::is_uppercase) && !INSTITUTION_WORDS.contains(part))
                    || (part.len() <= 3 && part.chars().all(char::is_lowercase))
            });
        written_as_name
            && identifying_parts(name, names).iter().any(|part| {
                self.as_names.contains(*part) && !self.in_lowercase.contains(&part.to_lowercase())
            })
    }
}

/// Whether `token` closes a sentence: it ends in a stop, and is not a
/// title or an initial ("Mr.", "J.") that a name follows.
fn ends_sentence(token: &str) -> bool {
    let bare = token.trim_end_matches(['"', '\'', '\u{201d}', ')']);
    let abbreviation = bare.ends_with('.')
        && bare.starts_with(char::is_uppercase)
        && bare.chars().filter(|c| c.is_alphabetic()).count() <= 3;
    bare.ends_with(['.', '!', '?', ':']) && !abbreviation
}

/// The first and last words of `name` that can stand for it: capitalized,
/// longer than an initial, not a title ("Mr."), and not shared with another
/// of `names` ("Duke" names both Duke Senior and Duke Frederick, so only
/// "Senior" and "Frederick" tell them apart). A name whose every part is
/// shared keeps them all.
fn identifying_parts<'a>(name: &'a str, names: &[&str]) -> Vec<&'a str> {
    let parts: Vec<&str> = name.split_whitespace().collect();
    let candidates: Vec<&str> = [parts.first(), parts.last()]
        .into_iter()
        .flatten()
        .copied()
        .filter(|part| {
            part.len() > 2 && part.starts_with(char::is_uppercase) && !part.ends_with('.')
        })
        .collect();
    let shared = |part: &&str| {
        names
            .iter()
            .filter(|other| **other != name)
            .any(|other| other.split_whitespace().any(|word| word == *part))
    };
    let own: Vec<&str> = candidates
        .iter()
        .copied()
        .filter(|part| !shared(part))
        .collect();
    match own.is_empty() {
        true => candidates,
        false => own,
    }
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
