//! Screening revisions for what adds nothing: a duplicate of the memory, an
//! echo of the prompt, a copy of the chunk, an ungrounded or first-person note.

use std::collections::HashSet;

use serde_json::Value;

use super::path::Segment;
use super::revision::{Op, Revision};
use crate::sentences::split_sentences;

/// Word-set overlap (intersection over union) at which two strings count as
/// the same entry worded slightly differently.
pub const NEAR_DUPLICATE_JACCARD: f64 = 0.85;
/// Share of a string's word 4-grams found in the reference text at which the
/// string counts as copied from it.
pub const ECHO_SHARE: f64 = 0.5;
/// Word-set overlap with a string the memory holds at which a new string
/// shows the model going round in circles (see [`Screen::goes_round`]).
pub const LOOP_JACCARD: f64 = 0.5;
/// Strings shorter than this (in words) are never near-duplicates, and are
/// echoes only when the whole of them is a name in the reference: a name or
/// a date of the document may rightly recur, but not one lifted from a
/// worked example.
const MIN_WORDS: usize = 4;
/// A string that repeats this many consecutive words of the source (the
/// chunk being noted) copies it: a note is in the model's own words, with
/// room for a name, a title or a short quote.
pub const COPY_RUN_WORDS: usize = 12;

/// The share of a string's content words that must occur in what was read
/// (the chunk and what the model was shown of it) for the string to be
/// grounded. A note in the model's own words keeps most of the text's
/// nouns and names; one about the world at large keeps few: "The lighthouse
/// is a source of inspiration for local artists and writers" keeps one of
/// six, "Gull Rock Light is an important landmark in the region" three.
/// The memory does not count: once one such note was kept, its words
/// grounded the next ones.
pub const GROUNDED_SHARE: f64 = 0.6;
/// Content words are at least this long and not in [`COMMON_WORDS`]; two
/// words are the same when their first [`STEM_CHARS`] letters are.
const CONTENT_CHARS: usize = 4;
const STEM_CHARS: usize = 5;
/// Words too common to tell whether a note is about the text.
const COMMON_WORDS: &[&str] = &[
    "about", "after", "also", "been", "before", "being", "from", "have", "into", "more", "most",
    "only", "other", "over", "some", "such", "than", "that", "their", "them", "then", "there",
    "these", "they", "this", "those", "very", "were", "what", "when", "where", "which", "while",
    "will", "with", "would",
];

/// A test a string of a revision fails, refusing the revision whole.
type Failing = fn(&Screen, &str) -> bool;

/// Why a value was screened out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Redundancy {
    /// The memory (or the same revision) already holds it.
    Duplicate,
    /// It copies the prompt's instructions, examples or schema.
    Echo,
    /// It has no words: an empty or blank string says nothing.
    Empty,
    /// It copies a run of [`COPY_RUN_WORDS`] words from the source.
    Copy,
    /// Too few of its content words are in the source or the memory
    /// ([`GROUNDED_SHARE`]).
    Ungrounded,
    /// It speaks as "I" or "we" outside a quotation, where notes on a
    /// summary are in the third person.
    FirstPerson,
}

/// A value taken out of a revision, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Dropped {
    pub text: String,
    pub why: Redundancy,
}

/// What screening left of a revision.
#[derive(Debug, Clone, PartialEq)]
pub struct Screened {
    /// The revision without its redundant list items; `None` when nothing
    /// new is left of it.
    pub kept: Option<Revision>,
    pub dropped: Vec<Dropped>,
}

/// The text a revision must not copy, indexed by word 4-grams, and by the
/// two- and three-word names a new key or a short note could lift from it (a
/// person in a worked example, say).
///
/// [`apply`](super::apply) checks that a revision fits the schema; a screen
/// checks that it says something new. Small models under greedy decoding
/// repeat their last line, or copy the schema's description into the
/// memory; both look valid and both crowd out what the document says.
///
/// Strings are compared as lowercase words with punctuation dropped. A string
/// is a duplicate of an existing one when their words are the same, or, for
/// strings of four or more words, when the two word sets share at least
/// [`NEAR_DUPLICATE_JACCARD`] of their union. A string of four or more words
/// is an echo when at least [`ECHO_SHARE`] of its word 4-grams occur in the
/// reference text, and so is a new key or a shorter string that is a name of
/// two or three capitalized words in the reference (lifted from a worked
/// example). A note whose words are mostly not in what was read is
/// ungrounded: the model writing what it knows of the world. Numbers and
/// booleans pass.
#[derive(Debug, Clone, Default)]
pub struct Screen {
    reference: HashSet<[String; 4]>,
    phrases: HashSet<String>,
    /// Every run of [`COPY_RUN_WORDS`] words of the source, when one is set.
    source: HashSet<Vec<String>>,
    /// The stems of the words of the source and of what else was read.
    read: HashSet<String>,
}

/// Words that speak in the first person.
const FIRST_PERSON: &[&str] = &[
    "I",
    "me",
    "my",
    "mine",
    "myself",
    "we",
    "us",
    "our",
    "ours",
    "ourselves",
];

/// Whether `word` is the first-person word `first`, as written or
/// capitalized at a sentence's start ("We"), but not in capitals ("US").
fn speaks_as(word: &str, first: &str) -> bool {
    let mut chars = word.chars();
    word == first
        || (first != "I"
            && chars
                .next()
                .is_some_and(|c| c.is_uppercase() && first.starts_with(c.to_ascii_lowercase()))
            && chars.as_str() == &first[1..])
}

/// Whether `text` speaks in the first person outside its quotations.
pub fn speaks_in_first_person(text: &str) -> bool {
    text.split(['"', '\u{201c}', '\u{201d}'])
        .step_by(2)
        .flat_map(|unquoted| unquoted.split(|c: char| !c.is_alphabetic()))
        .any(|word| FIRST_PERSON.iter().any(|first| speaks_as(word, first)))
}

impl Screen {
    /// A screen against `reference`: every text the model was shown that is
    /// not the document or the memory.
    pub fn new<'a>(reference: impl IntoIterator<Item = &'a str>) -> Self {
        let mut grams = HashSet::new();
        let mut phrases = HashSet::new();
        for text in reference {
            grams.extend(four_grams(&words(text)));
            phrases.extend(names(text));
        }
        Screen {
            reference: grams,
            phrases,
            source: HashSet::new(),
            read: HashSet::new(),
        }
    }

    /// This screen, also refusing strings that copy a run of
    /// [`COPY_RUN_WORDS`] words from `source`, and, when the model was shown
    /// a summary of it (`shown`) rather than the source itself, strings
    /// whose words are mostly in neither. Shown the source, a model has it
    /// in front of it; shown a summary, it drifted to what it knows of the
    /// world.
    pub fn with_source(&self, source: &str, shown: Option<&str>) -> Screen {
        let source_words = words(source);
        let read = match shown {
            Some(shown) => source_words
                .iter()
                .chain(&words(shown))
                .map(|word| stem(word))
                .collect(),
            None => HashSet::new(),
        };
        Screen {
            source: source_words
                .windows(COPY_RUN_WORDS)
                .map(<[String]>::to_vec)
                .collect(),
            read,
            ..self.clone()
        }
    }

    /// Whether too few of `text`'s content words are in what was read
    /// ([`GROUNDED_SHARE`]); never without a summary shown.
    fn ungrounded(&self, text: &str) -> bool {
        if self.read.is_empty() {
            return false;
        }
        let content: Vec<String> = words(text)
            .into_iter()
            .filter(|word| {
                word.chars().count() >= CONTENT_CHARS && !COMMON_WORDS.contains(&word.as_str())
            })
            .collect();
        if content.is_empty() {
            return false;
        }
        let grounded = content
            .iter()
            .filter(|word| self.read.contains(&stem(word)))
            .count();
        (grounded as f64) < GROUNDED_SHARE * content.len() as f64
    }

    /// Whether `text` speaks in the first person outside its quotations;
    /// never without a summary shown, which tells the source in the third
    /// person (a text told as "I" is still noted as someone's account).
    fn first_person(&self, text: &str) -> bool {
        !self.read.is_empty() && speaks_in_first_person(text)
    }

    /// Whether `text` repeats a run of [`COPY_RUN_WORDS`] words of the source.
    pub fn copies_source(&self, text: &str) -> bool {
        !self.source.is_empty()
            && words(text)
                .windows(COPY_RUN_WORDS)
                .any(|run| self.source.contains(run))
    }

    /// Take out of `revision` what `memory` already holds or what copies the
    /// reference. A list of strings loses only its redundant items; any other
    /// value is dropped whole when one of its strings is an echo, or when all
    /// of its strings are duplicates.
    ///
    /// An `update` is not compared with the value it replaces: rewriting a
    /// list with its old items plus a new one is how the model merges.
    pub fn screen(&self, memory: &Value, revision: &Revision) -> Screened {
        if let Some((key, siblings)) = new_key(memory, revision) {
            let why = if self.is_echo(&words(key)) {
                Some(Redundancy::Echo)
            } else if siblings.keys().any(|sibling| same_name(sibling, key)) {
                Some(Redundancy::Duplicate)
            } else {
                None
            };
            if let Some(why) = why {
                return Screened {
                    kept: None,
                    dropped: vec![Dropped {
                        text: key.clone(),
                        why,
                    }],
                };
            }
        }
        let mut existing = Vec::new();
        let replaced = (revision.op == Op::Update).then(|| revision.path.segments());
        collect_strings(memory, &mut Vec::new(), replaced, &mut existing);
        let mut seen: Vec<Vec<String>> = existing.iter().map(|text| words(text)).collect();

        if let Value::Array(items) = &revision.value {
            if !items.is_empty() && items.iter().all(Value::is_string) {
                return self.screen_list(revision, items, &mut seen);
            }
        }
        let mut strings = Vec::new();
        collect_strings(&revision.value, &mut Vec::new(), None, &mut strings);
        if strings.is_empty() {
            return Screened {
                kept: Some(revision.clone()),
                dropped: Vec::new(),
            };
        }
        if strings.iter().all(|text| words(text).is_empty()) {
            return Screened {
                kept: None,
                dropped: vec![Dropped {
                    text: strings.join(" / "),
                    why: Redundancy::Empty,
                }],
            };
        }
        // One string that echoes the prompt, copies the source or was not
        // read takes the whole value with it.
        let tests: [(Failing, Redundancy); 4] = [
            (Screen::echoes, Redundancy::Echo),
            (Screen::copies_source, Redundancy::Copy),
            (Screen::ungrounded, Redundancy::Ungrounded),
            (Screen::first_person, Redundancy::FirstPerson),
        ];
        for (fails, why) in tests {
            if let Some(text) = strings.iter().find(|text| fails(self, text)) {
                return Screened {
                    kept: None,
                    dropped: vec![Dropped {
                        text: text.clone(),
                        why,
                    }],
                };
            }
        }
        let all_duplicates = strings.iter().all(|text| is_duplicate(&words(text), &seen));
        if all_duplicates {
            return Screened {
                kept: None,
                dropped: vec![Dropped {
                    text: strings.join(" / "),
                    why: Redundancy::Duplicate,
                }],
            };
        }
        Screened {
            kept: Some(revision.clone()),
            dropped: Vec::new(),
        }
    }

    /// Whether `revision` shows the model going round in circles: the screen
    /// would leave nothing of it, or one of its strings shares at least
    /// [`LOOP_JACCARD`] of its words with a string the memory holds. A list
    /// with one old item among new ones is not a loop: the screen drops that
    /// item and keeps the rest. Distinct
    /// notes on one text overlap far less (at most 0.22 between the notes
    /// Qwen2.5-Coder-1.5B kept on the keeper's log), while a greedy model that
    /// has begun to repeat itself rewords the same note (0.55 and up on the
    /// Sabotage manual), so a step can stop at the first such line.
    ///
    /// A note in the first person is not a loop: it is refused when the
    /// step's notes are applied, not while they are decoded. Told to write
    /// on in its place, Qwen2.5-Coder-1.5B rewrote its earlier notes with
    /// words run together until the step stopped.
    pub fn goes_round(&self, memory: &Value, revision: &Revision) -> bool {
        let screened = self.screen(memory, revision);
        let Some(kept) = screened.kept else {
            return screened
                .dropped
                .iter()
                .all(|dropped| dropped.why != Redundancy::FirstPerson);
        };
        let mut existing = Vec::new();
        let replaced = (revision.op == Op::Update).then(|| revision.path.segments());
        collect_strings(memory, &mut Vec::new(), replaced, &mut existing);
        let existing: Vec<Vec<String>> = existing
            .iter()
            .map(|text| words(text))
            .filter(|words| words.len() >= MIN_WORDS)
            .collect();
        let mut strings = Vec::new();
        collect_strings(&kept.value, &mut Vec::new(), None, &mut strings);
        strings
            .iter()
            .map(|text| words(text))
            .filter(|words| words.len() >= MIN_WORDS)
            .any(|new| {
                existing
                    .iter()
                    .any(|old| jaccard(&new, old) >= LOOP_JACCARD)
            })
    }

    fn screen_list(
        &self,
        revision: &Revision,
        items: &[Value],
        seen: &mut Vec<Vec<String>>,
    ) -> Screened {
        let mut kept_items = Vec::new();
        let mut dropped = Vec::new();
        for item in items {
            let text = item.as_str().expect("screen_list takes strings only");
            let item_words = words(text);
            let why = if item_words.is_empty() {
                Some(Redundancy::Empty)
            } else if self.echoes(text) {
                Some(Redundancy::Echo)
            } else if self.copies_source(text) {
                Some(Redundancy::Copy)
            } else if self.ungrounded(text) {
                Some(Redundancy::Ungrounded)
            } else if self.first_person(text) {
                Some(Redundancy::FirstPerson)
            } else if is_duplicate(&item_words, seen) {
                Some(Redundancy::Duplicate)
            } else {
                None
            };
            match why {
                Some(why) => dropped.push(Dropped {
                    text: text.to_string(),
                    why,
                }),
                None => {
                    seen.push(item_words);
                    kept_items.push(item.clone());
                }
            }
        }
        let kept = (!kept_items.is_empty()).then(|| Revision {
            value: Value::Array(kept_items),
            ..revision.clone()
        });
        Screened { kept, dropped }
    }

    /// Whether `text` copies the reference, whole or in one of its sentences:
    /// a note that opens with a worked example's sentence and goes on in its
    /// own words is still a copy.
    fn echoes(&self, text: &str) -> bool {
        if self.is_echo(&words(text)) {
            return true;
        }
        let sentences = split_sentences(text);
        sentences.len() > 1
            && sentences.iter().any(|sentence| {
                let words = words(sentence);
                words.len() >= MIN_WORDS && self.is_echo(&words)
            })
    }

    /// Whether `words` copy the reference: a name of two or three words
    /// that stands in it whole, or a longer text at least [`ECHO_SHARE`] of
    /// whose 4-grams do.
    fn is_echo(&self, words: &[String]) -> bool {
        if words.len() < 2 {
            return false;
        }
        if words.len() < MIN_WORDS {
            return self.phrases.contains(&words.join(" "));
        }
        let grams = four_grams(words);
        let copied = grams
            .iter()
            .filter(|gram| self.reference.contains(*gram))
            .count();
        copied as f64 >= ECHO_SHARE * grams.len() as f64
    }
}

/// The two- and three-word runs of capitalized words in `text` (`idris
/// fenn`, `councillor idris fenn`), as lowercase phrases. Only names count:
/// a short phrase of common words, such as the worked example's "a string",
/// is also what a note on the document rightly says.
fn names(text: &str) -> Vec<String> {
    let is_name = |word: &&str| word.starts_with(|c: char| c.is_uppercase() || c.is_ascii_digit());
    let words: Vec<&str> = spelled_words(text).collect();
    let mut phrases = Vec::new();
    for n in [2, 3] {
        phrases.extend(
            words
                .windows(n)
                .filter(|run| run.iter().all(is_name))
                .map(|run| run.join(" ").to_lowercase()),
        );
    }
    phrases
}

/// Whether `candidate` says what one of `seen` already says.
/// The first key on `revision`'s path that `memory` does not have yet, and
/// the members of the object it would join.
fn new_key<'a>(
    memory: &'a Value,
    revision: &'a Revision,
) -> Option<(&'a String, &'a serde_json::Map<String, Value>)> {
    let mut at = Some(memory);
    for segment in revision.path.segments() {
        let next = match (at, segment) {
            (Some(Value::Object(members)), Segment::Key(key)) => match members.get(key) {
                None => return Some((key, members)),
                found => found,
            },
            (Some(Value::Array(items)), Segment::Index(index)) => items.get(*index),
            _ => None,
        };
        at = next;
    }
    None
}

/// Whether two keys spell one name: a greedy model that has noted "Tomas
/// Reddick" goes on to note "Tomas ReddICK", "Tomas Reddicks" and "Tomas
/// Redddicks", each a new person to the memory. Compared without case,
/// without what is not a letter, with doubled letters as one and without a
/// plural's "s".
fn same_name(a: &str, b: &str) -> bool {
    fn spelling(key: &str) -> String {
        let mut letters: Vec<char> = key
            .chars()
            .filter(|c| c.is_alphabetic())
            .flat_map(char::to_lowercase)
            .collect();
        letters.dedup();
        if letters.len() > 3 && letters.last() == Some(&'s') {
            letters.pop();
        }
        letters.into_iter().collect()
    }
    a != b && spelling(a) == spelling(b)
}

/// Whether `candidate` repeats one of `seen`: the same words, nearly the
/// same word set ([`NEAR_DUPLICATE_JACCARD`]), or only words that one of
/// them holds. The last is the opening of a note written out again
/// ("Simple fuse made by greasing string"), which says nothing the note
/// does not: Qwen2.5-Coder-1.5B, once the amendments showed a dozen notes,
/// began a chunk's revisions by listing their first words again.
fn is_duplicate(candidate: &[String], seen: &[Vec<String>]) -> bool {
    if candidate.is_empty() {
        return false;
    }
    let words: HashSet<&String> = candidate.iter().collect();
    seen.iter().any(|other| {
        if other.as_slice() == candidate {
            return true;
        }
        if candidate.len() < MIN_WORDS || other.len() < MIN_WORDS {
            return false;
        }
        let other: HashSet<&String> = other.iter().collect();
        let shared = words.intersection(&other).count();
        let union = words.len() + other.len() - shared;
        shared == words.len() || shared as f64 >= NEAR_DUPLICATE_JACCARD * union as f64
    })
}

fn jaccard(a: &[String], b: &[String]) -> f64 {
    let a: HashSet<&String> = a.iter().collect();
    let b: HashSet<&String> = b.iter().collect();
    let union = a.union(&b).count();
    if union == 0 {
        return 0.0;
    }
    a.intersection(&b).count() as f64 / union as f64
}

/// Every string in `value`, skipping the subtree at `skip` (a path's segments).
fn collect_strings(
    value: &Value,
    at: &mut Vec<Segment>,
    skip: Option<&[Segment]>,
    out: &mut Vec<String>,
) {
    if skip == Some(at.as_slice()) {
        return;
    }
    match value {
        Value::String(text) => out.push(text.clone()),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                at.push(Segment::Index(index));
                collect_strings(item, at, skip, out);
                at.pop();
            }
        }
        Value::Object(members) => {
            for (key, member) in members {
                at.push(Segment::Key(key.clone()));
                collect_strings(member, at, skip, out);
                at.pop();
            }
        }
        _ => {}
    }
}

/// Lowercase words of `text`, punctuation dropped.
pub fn words(text: &str) -> Vec<String> {
    spelled_words(text).map(str::to_lowercase).collect()
}

/// The words of `text` as written: runs of letters, digits and apostrophes,
/// without apostrophes at either end.
fn spelled_words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(|word| word.trim_matches('\''))
        .filter(|word| !word.is_empty())
}

/// The first [`STEM_CHARS`] letters of `word`: "whitewashes" and
/// "whitewash" are one word.
fn stem(word: &str) -> String {
    word.chars().take(STEM_CHARS).collect()
}

fn four_grams(words: &[String]) -> Vec<[String; 4]> {
    words
        .windows(4)
        .map(|w| [w[0].clone(), w[1].clone(), w[2].clone(), w[3].clone()])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::testing::rev;
    use serde_json::json;

    #[test]
    fn a_note_in_the_first_person_is_refused_where_a_summary_was_shown() {
        let chunk = "Tomas and I took turns through each night wiping the lens.";
        let summary =
            "Tomas said to the keeper that he wiped the lens each night, as the US keepers did.";
        let screen = Screen::new(["You keep notes."]).with_source(chunk, Some(summary));
        let memory = json!({"events": []});
        for first in [
            "Tomas and I wiped the lens.",
            "We wiped the lens each night.",
            "Tomas wiped our lens.",
        ] {
            let screened = screen.screen(&memory, &rev(Op::Add, "$.events", json!(first)));
            assert_eq!(screened.dropped[0].why, Redundancy::FirstPerson, "{first}");
            // Refused when applied, but not a loop to stop decoding at.
            assert!(!screen.goes_round(&memory, &rev(Op::Add, "$.events", json!(first))));
        }
        for third in [
            "Tomas and the keeper wiped the lens each night.",
            "Tomas said \"I wiped the lens\" to the keeper.",
            "The US keepers wiped the lens.",
        ] {
            let screened = screen.screen(&memory, &rev(Op::Add, "$.events", json!(third)));
            assert!(screened.kept.is_some(), "{third}: {screened:?}");
        }
        // Shown the text itself, a note may keep its voice.
        let text_screen = Screen::new(["You keep notes."]).with_source(chunk, None);
        let kept = text_screen.screen(
            &memory,
            &rev(Op::Add, "$.events", json!("Tomas and I wiped the lens.")),
        );
        assert!(kept.kept.is_some());
    }

    #[test]
    fn a_note_that_copies_a_long_run_of_the_source_is_a_copy() {
        let chunk = "On the Wednesday a fog came down so thick that the beam seemed to stop a few yards from the glass, and we sounded the horn.";
        let screen = Screen::new(["You keep notes."]).with_source(chunk, None);
        let memory = json!({"events": []});
        let copied = rev(
            Op::Add,
            "$.events",
            json!("A fog came down so thick that the beam seemed to stop a few yards away."),
        );
        let screened = screen.screen(&memory, &copied);
        assert_eq!(screened.kept, None);
        assert_eq!(screened.dropped[0].why, Redundancy::Copy);
        // Its own words, with a name and a short phrase from the text, pass.
        let own = rev(
            Op::Add,
            "$.events",
            json!("On Wednesday thick fog hid the light, so the keepers sounded the horn."),
        );
        assert!(screen.screen(&memory, &own).kept.is_some());
        // Without a source nothing is a copy.
        assert!(Screen::new(["You keep notes."])
            .screen(&memory, &copied)
            .kept
            .is_some());
    }

    #[test]
    fn a_note_about_the_world_rather_than_what_was_read_is_ungrounded() {
        let chunk = "Tomas Reddick read the letter twice and whitewashed the gallery rail.";
        let shown =
            "The assistant keeper reads the Board's letter; Wenna Cole is the Marigold's skipper.";
        let screen = Screen::new(["You keep notes."]).with_source(chunk, Some(shown));
        let memory = json!({"themes": [], "people": {"Wenna Cole": ["Skipper of the Marigold."]}});
        let note = |text: &str| rev(Op::Add, "$.themes", json!([text]));
        let worldly =
            note("The lighthouse is a source of inspiration for local artists and writers.");
        let screened = screen.screen(&memory, &worldly);
        assert_eq!(screened.kept, None);
        assert_eq!(screened.dropped[0].why, Redundancy::Ungrounded);
        // Its own words count where they are the text's, or what it was shown, or stems of them.
        for grounded in [
            "Tomas whitewashes the rail after reading the letter.",
            "The assistant keeper answers the Board.",
            "Wenna Cole skippers the Marigold.",
        ] {
            assert!(
                screen.screen(&memory, &note(grounded)).kept.is_some(),
                "{grounded}"
            );
        }
    }

    const SCHEMA_TEXT: &str = "Notes under headings you choose; each note is a short sentence that makes sense on its own.";

    fn screen() -> Screen {
        Screen::new([SCHEMA_TEXT])
    }

    #[test]
    fn an_exact_duplicate_item_is_dropped_and_a_new_one_kept() {
        let memory = json!({"Storm": ["A gale tore away the ladder."]});
        let revision = rev(
            Op::Add,
            "$.Storm",
            json!([
                "A gale tore away the ladder!",
                "Rain came through a cracked pane."
            ]),
        );
        let out = screen().screen(&memory, &revision);
        assert_eq!(
            out.kept,
            Some(rev(
                Op::Add,
                "$.Storm",
                json!(["Rain came through a cracked pane."])
            ))
        );
        assert_eq!(
            out.dropped,
            vec![Dropped {
                text: "A gale tore away the ladder!".into(),
                why: Redundancy::Duplicate
            }]
        );
    }

    #[test]
    fn a_near_duplicate_elsewhere_in_the_memory_counts() {
        let memory = json!({"People": ["Tomas Reddick has kept the light for eleven years."]});
        // One word more, under another heading: 9 shared of 10 (0.9).
        let revision = rev(
            Op::Add,
            "$.Keepers",
            json!(["Tomas Reddick has kept the light for eleven long years."]),
        );
        let out = screen().screen(&memory, &revision);
        assert_eq!(out.kept, None);
        assert_eq!(out.dropped[0].why, Redundancy::Duplicate);
    }

    #[test]
    fn the_opening_of_a_note_the_memory_holds_is_a_duplicate() {
        let memory = json!({"events": [
            "A simple fuse is made by greasing a string and rubbing gunpowder into it."
        ]});
        let opening = rev(
            Op::Add,
            "$.events",
            json!(["A simple fuse is made by greasing a string"]),
        );
        let out = screen().screen(&memory, &opening);
        assert_eq!(out.kept, None);
        assert_eq!(out.dropped[0].why, Redundancy::Duplicate);
        let more = rev(
            Op::Add,
            "$.events",
            json!(["A simple fuse is made by greasing a string and soaking it in oil."]),
        );
        assert!(screen().screen(&memory, &more).kept.is_some());
    }

    #[test]
    fn a_repeated_item_within_one_revision_is_dropped() {
        let revision = rev(
            Op::Add,
            "$.Fog",
            json!(["The fog came down.", "The fog came down."]),
        );
        let out = screen().screen(&json!({}), &revision);
        assert_eq!(
            out.kept,
            Some(rev(Op::Add, "$.Fog", json!(["The fog came down."])))
        );
        assert_eq!(out.dropped.len(), 1);
    }

    #[test]
    fn copying_the_schema_is_an_echo() {
        let revision = rev(
            Op::Add,
            "$.Notes",
            json!(["Each note is a short sentence that makes sense on its own."]),
        );
        let out = screen().screen(&json!({}), &revision);
        assert_eq!(out.kept, None);
        assert_eq!(out.dropped[0].why, Redundancy::Echo);
    }

    #[test]
    fn a_new_key_named_after_the_reference_is_an_echo() {
        let screen = Screen::new(["The example names Idris Fenn, a councillor."]);
        let lifted = rev(
            Op::Add,
            "$.people.'Idris Fenn'",
            json!(["A sailor from Scotland."]),
        );
        let out = screen.screen(&json!({"people": {}}), &lifted);
        assert_eq!(out.kept, None);
        assert_eq!(
            out.dropped,
            vec![Dropped {
                text: "Idris Fenn".into(),
                why: Redundancy::Echo
            }]
        );
        // A key the memory already has, or a one-word key, is not screened.
        let memory = json!({"people": {"Idris Fenn": []}});
        assert!(screen.screen(&memory, &lifted).kept.is_some());
        let one_word = rev(Op::Add, "$.people.Fenn", json!(["A sailor from Scotland."]));
        assert!(screen
            .screen(&json!({"people": {}}), &one_word)
            .kept
            .is_some());
    }

    #[test]
    fn a_person_respelt_is_a_duplicate_and_a_new_person_is_not() {
        let memory = json!({"people": {"Tomas Reddick": ["the assistant keeper"]}});
        for respelt in [
            "Tomas ReddICK",
            "Tomas Reddicks",
            "Tomas Redddicks",
            "tomas  reddick",
        ] {
            let path = format!("$.people.'{respelt}'");
            let out = screen().screen(&memory, &rev(Op::Add, &path, json!(["Keeps the light."])));
            assert_eq!(out.kept, None, "{respelt}");
            assert_eq!(
                out.dropped,
                vec![Dropped {
                    text: respelt.into(),
                    why: Redundancy::Duplicate
                }]
            );
        }
        let other = rev(
            Op::Add,
            "$.people.'Tomas Reddy'",
            json!(["Keeps the light."]),
        );
        assert!(screen().screen(&memory, &other).kept.is_some());
    }

    #[test]
    fn a_short_note_lifted_whole_from_the_reference_is_an_echo() {
        let screen = Screen::new(["Councillor Idris Fenn chaired the meeting."]);
        let lifted = rev(Op::Add, "$.events", json!(["Councillor Idris Fenn,"]));
        let out = screen.screen(&json!({}), &lifted);
        assert_eq!(out.kept, None);
        assert_eq!(out.dropped[0].why, Redundancy::Echo);
        // Words of the reference in another order, or with a word of the
        // document's own, are the document's.
        let own = rev(
            Op::Add,
            "$.events",
            json!(["Fenn Idris", "Councillor Fenn resigned"]),
        );
        assert_eq!(screen.screen(&json!({}), &own).kept, Some(own));
    }

    /// Only names count as lifted: "a string" in a worked example is also
    /// what a note on the document's own code rightly says.
    #[test]
    fn a_short_phrase_of_common_words_is_not_an_echo() {
        let screen = Screen::new([
            r#"Revisions: {"tokens": {"input": "sentence, a string", "output": "a list of strings"}}"#,
        ]);
        let note = rev(
            Op::Add,
            "$.ordinal",
            json!({"input": "a number", "output": "a string"}),
        );
        assert_eq!(screen.screen(&json!({}), &note).kept, Some(note));
    }

    #[test]
    fn a_note_that_opens_with_a_copied_sentence_is_an_echo() {
        let screen =
            Screen::new(["Councillor Idris Fenn reported that March storms had raised the cost."]);
        let note = "Councillor Idris Fenn reported that March storms had raised the cost. \
                    The damage reached the coast of the North Sea and the harbour of Marble Bay.";
        let out = screen.screen(&json!({}), &rev(Op::Add, "$.events", json!([note])));
        assert_eq!(out.kept, None);
        assert_eq!(out.dropped[0].why, Redundancy::Echo);
        // One sentence of the document's own beside it is kept.
        let own = "The keeper lit the lamp at dusk. The fog came down at night and stayed.";
        let out = screen.screen(&json!({}), &rev(Op::Add, "$.events", json!([own])));
        assert!(out.kept.is_some());
    }

    #[test]
    fn blank_strings_say_nothing() {
        let blank = rev(Op::Update, "$.people", json!({"events": [""]}));
        let out = screen().screen(&json!({}), &blank);
        assert_eq!(out.kept, None);
        assert_eq!(out.dropped[0].why, Redundancy::Empty);
        let list = rev(Op::Add, "$.events", json!(["  ", "The ladder broke."]));
        let out = screen().screen(&json!({}), &list);
        assert_eq!(
            out.kept.map(|kept| kept.value),
            Some(json!(["The ladder broke."]))
        );
        assert_eq!(out.dropped[0].why, Redundancy::Empty);
    }

    #[test]
    fn an_update_may_restate_the_value_it_replaces() {
        let memory = json!({"Board": ["The Board sent an inspector."]});
        let revision = rev(
            Op::Update,
            "$.Board",
            json!([
                "The Board sent an inspector.",
                "The Board decided to keep the light."
            ]),
        );
        let out = screen().screen(&memory, &revision);
        assert_eq!(out.kept, Some(revision));
        assert!(out.dropped.is_empty());
    }

    #[test]
    fn a_reworded_note_goes_round_and_a_new_one_does_not() {
        let memory = json!({"events": [
            "The purpose of this paper is to characterize simple sabotage and outline its effects."
        ]});
        let reworded = rev(
            Op::Add,
            "$.events",
            json!("The purpose of this paper, written by the author, is to characterize simple sabotage."),
        );
        let new = rev(
            Op::Add,
            "$.events",
            json!("Leaflets and radio broadcasts may spread the suggestions among workers."),
        );
        let duplicate = rev(Op::Add, "$.events", memory["events"][0].clone());
        let screen = screen();
        assert!(screen.goes_round(&memory, &reworded));
        assert!(screen.goes_round(&memory, &duplicate));
        assert!(!screen.goes_round(&memory, &new));
        assert!(screen.screen(&memory, &reworded).dropped.is_empty());
        let old_among_new = rev(
            Op::Add,
            "$.events",
            json!([memory["events"][0].clone(), new.value.clone()]),
        );
        assert!(!screen.goes_round(&memory, &old_among_new));
    }

    #[test]
    fn short_strings_and_non_strings_pass() {
        let memory = json!({"a": ["Port Elnor"], "n": 3});
        let revision = rev(Op::Add, "$.b", json!(["Port Elnor"]));
        // Exactly the same words are a duplicate however short ...
        assert_eq!(screen().screen(&memory, &revision).kept, None);
        // ... but a short string that only overlaps is not.
        let revision = rev(Op::Add, "$.b", json!(["Port Elnor harbour"]));
        assert!(screen().screen(&memory, &revision).kept.is_some());
        let revision = rev(Op::Add, "$.m", json!(3));
        assert!(screen().screen(&memory, &revision).kept.is_some());
    }

    #[test]
    fn an_object_is_dropped_only_when_every_string_is_old() {
        let memory = json!({"x": {"who": "Wenna Cole skippers the Marigold."}});
        let old = rev(
            Op::Add,
            "$.y",
            json!({"who": "Wenna Cole skippers the Marigold."}),
        );
        assert_eq!(screen().screen(&memory, &old).kept, None);
        let mixed = rev(
            Op::Add,
            "$.y",
            json!({"who": "Wenna Cole skippers the Marigold.", "did": "She guided two boats home."}),
        );
        assert_eq!(screen().screen(&memory, &mixed).kept, Some(mixed));
    }
}
