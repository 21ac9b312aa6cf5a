//! A step's notes laid out one sentence to a note, with a sentence that the
//! grammar's length bound split across two lines joined again.

use crate::memory::grammar::MAX_STRING_CHARS;
use crate::memory::{JsonPath, Op, Revision};
use crate::sentences::split_sentences;
use serde_json::Value;

/// `revisions` with each string note an `add` appends made a sentence of its
/// own. Shown a chunk's summary, Qwen2.5-Coder-1.5B copies it into notes
/// several sentences at a time, until a note reaches the grammar's length
/// bound and is cut mid-sentence; it then goes on with the rest of that
/// sentence on the next line ("break forth in malice. Rosalind and…"). A
/// line that opens in lowercase after a note that stopped mid-sentence is
/// joined to it, and a sentence a cut left unfinished that no line goes on
/// with is dropped, as [`crate::memory::revise`] drops one in a single
/// line. Every other revision passes as it is, in its place.
pub(super) fn one_sentence_per_note(
    revisions: Vec<Result<Revision, String>>,
) -> Vec<Result<Revision, String>> {
    let mut laid_out = Vec::new();
    let mut open: Option<Run> = None;
    for revision in revisions {
        match revision {
            Ok(Revision {
                op: Op::Add,
                path,
                value: Value::String(note),
            }) => match &mut open {
                Some(run) if run.path == path && run.goes_on_with(&note) => run.extend(&note),
                _ => {
                    laid_out.extend(open.take().into_iter().flat_map(Run::sentences));
                    open = Some(Run::new(path, &note));
                }
            },
            other => {
                laid_out.extend(open.take().into_iter().flat_map(Run::sentences));
                laid_out.push(other);
            }
        }
    }
    laid_out.extend(open.into_iter().flat_map(Run::sentences));
    laid_out
}

/// Consecutive notes added at one path that together are whole sentences.
struct Run {
    path: JsonPath,
    text: String,
    /// The last note reached the length bound, so its last sentence may be unfinished.
    cut: bool,
}

impl Run {
    fn new(path: JsonPath, note: &str) -> Run {
        Run {
            path,
            text: note.trim().to_string(),
            cut: reaches_the_bound(note),
        }
    }

    /// Whether `note` goes on with a sentence this run left unfinished.
    fn goes_on_with(&self, note: &str) -> bool {
        !ends_a_sentence(&self.text) && note.trim_start().starts_with(char::is_lowercase)
    }

    fn extend(&mut self, note: &str) {
        self.text.push(' ');
        self.text.push_str(note.trim());
        self.cut = reaches_the_bound(note);
    }

    fn sentences(self) -> impl Iterator<Item = Result<Revision, String>> {
        let mut sentences = split_sentences(&self.text);
        if self.cut && sentences.len() > 1 && sentences.last().is_some_and(|s| !ends_a_sentence(s))
        {
            sentences.pop();
        }
        let path = self.path;
        sentences
            .into_iter()
            .filter(|sentence| !trails_off(sentence))
            .map(move |sentence| Ok(Revision::add(path.clone(), Value::String(sentence))))
    }
}

/// The sentences of `summary` after the last one that `noted` covers:
/// what a revision step that stopped early has yet to note. A note covers
/// a sentence when it holds most of the sentence's words, as the model's
/// copies and rewordings of it do. None are left when no note covers any:
/// a step that noted nothing of its summary would not note it when asked
/// again.
pub(super) fn rest_to_note<'a>(summary: &'a [String], noted: &[Revision]) -> &'a [String] {
    const COVERED_SHARE: f64 = 0.6;
    let words = |text: &str| -> Vec<String> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|word| word.len() > 2)
            .map(str::to_lowercase)
            .collect()
    };
    let notes: Vec<Vec<String>> = noted
        .iter()
        .filter_map(|revision| revision.value.as_str())
        .map(words)
        .collect();
    let covered = |sentence: &str| {
        let sentence = words(sentence);
        !sentence.is_empty()
            && notes.iter().any(|note| {
                let held = sentence.iter().filter(|word| note.contains(word)).count();
                held as f64 >= COVERED_SHARE * sentence.len() as f64
            })
    };
    match summary.iter().rposition(|sentence| covered(sentence)) {
        Some(last) => &summary[last + 1..],
        None => &[],
    }
}

/// Whether `sentence` ends in an ellipsis: the model's own mark that it
/// left the sentence unfinished. Qwen2.5-Coder-1.5B wrote such notes on the
/// Sabotage manual ("In part (1), the instructions…", "The text…"), which
/// the final summary merged into sentences that stop mid-clause.
fn trails_off(sentence: &str) -> bool {
    let bare = sentence.trim_end_matches(['"', '\'', '\u{201d}', '\u{2019}', ')']);
    bare.ends_with('\u{2026}') || bare.ends_with("...")
}

fn reaches_the_bound(note: &str) -> bool {
    note.chars().count() >= MAX_STRING_CHARS
}

fn ends_a_sentence(text: &str) -> bool {
    text.trim_end()
        .ends_with(['.', '!', '?', '"', '\'', '\u{201d}', '\u{2019}'])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{parse_revisions, render_revision};

    fn notes(lines: &[(&str, &str)]) -> Vec<Result<Revision, String>> {
        let text: String = lines
            .iter()
            .map(|(path, note)| {
                render_revision(&Revision::add(
                    JsonPath::parse(path).unwrap(),
                    Value::String(note.to_string()),
                ))
            })
            .collect();
        parse_revisions(&text)
    }

    fn values(revisions: &[Result<Revision, String>]) -> Vec<String> {
        revisions
            .iter()
            .map(|revision| {
                let revision = revision.as_ref().unwrap();
                format!(
                    "{} {}",
                    revision.path,
                    revision.value.as_str().unwrap_or("-")
                )
            })
            .collect()
    }

    #[test]
    fn a_note_of_several_sentences_becomes_one_note_each() {
        let laid_out = one_sentence_per_note(notes(&[(
            "$.events",
            "Mr. Vass inspected the tower. He found the glass cracked!",
        )]));
        assert_eq!(
            values(&laid_out),
            [
                "$.events Mr. Vass inspected the tower.",
                "$.events He found the glass cracked!"
            ]
        );
    }

    #[test]
    fn a_sentence_split_across_lines_is_joined_and_an_unfinished_cut_dropped() {
        let cut_head = format!(
            "{} Rosalind then warns that the duke will soon",
            "Celia comforts her cousin Rosalind at court.".repeat(6)
        );
        assert!(reaches_the_bound(&cut_head));
        let cut_tail = format!(
            "break out in anger. {} Celia plans to",
            "They decide to leave for the forest.".repeat(7)
        );
        assert!(reaches_the_bound(&cut_tail));
        let laid_out = one_sentence_per_note(notes(&[
            ("$.events", &cut_head),
            ("$.events", &cut_tail),
            ("$.people.'Celia'", "the duke's daughter"),
            ("$.events", "They reach the forest."),
            (
                "$.events",
                "lowercase after a whole note stays a note of its own.",
            ),
        ]));
        let laid_out = values(&laid_out);
        assert!(laid_out.contains(
            &"$.events Rosalind then warns that the duke will soon break out in anger.".to_string()
        ));
        assert!(!laid_out.iter().any(|note| note.contains("Celia plans to")));
        assert!(!laid_out
            .iter()
            .any(|note| note.starts_with("$.events break")));
        assert_eq!(
            laid_out[laid_out.len() - 3..],
            [
                "$.people.Celia the duke's daughter",
                "$.events They reach the forest.",
                "$.events lowercase after a whole note stays a note of its own."
            ]
        );
    }

    #[test]
    fn a_note_that_trails_off_is_dropped_and_a_whole_one_kept() {
        let laid_out = one_sentence_per_note(notes(&[
            ("$.events", "The tips include: twisting saws…"),
            ("$.events", "Saws are twisted. The text..."),
            ("$.events", "Files are worn out by rapid strokes."),
        ]));
        assert_eq!(
            values(&laid_out),
            [
                "$.events Saws are twisted.",
                "$.events Files are worn out by rapid strokes."
            ]
        );
    }

    #[test]
    fn the_rest_to_note_follows_the_last_sentence_a_note_covers() {
        let summary: Vec<String> = [
            "Charles breaks the ribs of three brothers.",
            "Orlando asks to wrestle Charles.",
            "Orlando throws Charles, and Rosalind gives him a chain.",
            "The Duke banishes Rosalind.",
        ]
        .iter()
        .map(|sentence| sentence.to_string())
        .collect();
        let noted = |texts: &[&str]| -> Vec<Revision> {
            texts
                .iter()
                .map(|text| {
                    Revision::add(
                        JsonPath::parse("$.events").unwrap(),
                        Value::String(text.to_string()),
                    )
                })
                .collect()
        };
        // A reworded copy of the second sentence covers it; the first,
        // skipped, is not asked again.
        let rest = rest_to_note(
            &summary,
            &noted(&["Then Orlando asks to wrestle with Charles."]),
        );
        assert_eq!(rest, &summary[2..]);
        assert!(rest_to_note(&summary, &noted(&["The Duke banishes Rosalind."])).is_empty());
        assert!(rest_to_note(&summary, &noted(&["A gale came."])).is_empty());
    }
}
