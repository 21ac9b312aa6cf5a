//! The summary length every method aims at, and the last step that brings
//! a method's final answer to it, so that methods compare at equal length.
//!
//! A longer summary answers more questions about its document, so a table
//! of methods whose summaries differ in length says little. Every method
//! that writes a summary aims at the same number of words ([`target_words`]),
//! and one whose answer comes out much longer hands it to [`condense`],
//! which merges it part by part, as BooookScore's hierarchical merging does,
//! from the method's own text alone.

use super::baseline::Call;
use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::{Llm, Prompt};

/// The default target is this share of the document's words...
const DOCUMENT_SHARE: f64 = 0.1;
/// ...but at least a paragraph that can name a story's people and events...
pub const MIN_TARGET_WORDS: usize = 120;
/// ...and at most about a page, near BooookScore's 900-token summaries.
pub const MAX_TARGET_WORDS: usize = 600;

/// An answer up to this much longer than its target is left as written.
const SLACK: f64 = 1.25;
/// The most words of text one condensing call reads: more, and
/// Qwen2.5-Coder-1.5B copies its input out instead of condensing it.
const WORDS_PER_CALL: usize = 1200;
/// The fewest words one part of a condensed answer is asked for.
const MIN_PART_WORDS: usize = 40;
/// Rounds of condensing before the answer is kept whatever its length.
const MAX_ROUNDS: usize = 3;

/// The summary length in words a run aims at: `requested` (`--summary-words`),
/// else a tenth of the words in `chunks`, at least [`MIN_TARGET_WORDS`] and
/// at most [`MAX_TARGET_WORDS`].
pub fn target_words(requested: Option<usize>, chunks: &[Chunk]) -> usize {
    requested.unwrap_or_else(|| {
        let words: usize = chunks
            .iter()
            .map(|chunk| chunk.text.split_whitespace().count())
            .sum();
        ((words as f64 * DOCUMENT_SHARE).round() as usize).clamp(MIN_TARGET_WORDS, MAX_TARGET_WORDS)
    })
}

/// The token budget of a summary of about `words` words: English runs about
/// 1.3 tokens a word, and a small model overshoots what it is asked for.
pub fn tokens_for(words: usize) -> usize {
    words * 2 + 40
}

/// What a method's final text is made of, which the condensing prompt names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Notes taken while reading (PRISM's memory).
    Notes,
    /// A summary that came out longer than asked, or summaries of its parts.
    Draft,
}

/// The system turn of every condensing call, whatever the method.
pub const CONDENSE_SYSTEM: &str = "You write clear summaries of documents in plain prose, in your own words and in the third person.";

/// The prompt that condenses `pieces` (part `part` of `parts`) into about
/// `words` words.
pub fn condense_prompt(
    pieces: &[String],
    source: Source,
    words: usize,
    part: usize,
    parts: usize,
) -> Prompt {
    let heading = match source {
        Source::Notes => "Notes taken while reading a document, in order",
        Source::Draft => "A draft summary of a document, in order",
    };
    let listed: String = pieces
        .iter()
        .map(|piece| match source {
            Source::Notes => format!("- {}\n", piece.trim()),
            Source::Draft => format!("{}\n\n", piece.trim()),
        })
        .collect();
    let scope = if parts > 1 {
        format!("part {part} of {parts} of the document (the text above covers only that part)")
    } else {
        "the document".to_string()
    };
    Prompt {
        system: Some(CONDENSE_SYSTEM.to_string()),
        segments: vec![format!(
            "{heading}:\n{listed}\nWrite a summary of {scope} in about {words} words of plain prose, in your own words and in the third person. \
             Tell its main events or points in order and name the people involved; where the text above says \"I\", name the writer. \
             Tell what happens, not what the notes or the document mention. Output only the summary.\n"
        )],
        source: None,
    }
}

/// `text` brought to about `target` words: unchanged when it is within a
/// quarter over, else condensed ([`condense`]).
pub fn to_length(llm: &mut dyn Llm, text: &str, target: usize) -> Result<Condensed> {
    if words(text) as f64 <= target as f64 * SLACK {
        return Ok(Condensed {
            text: text.trim().to_string(),
            calls: Vec::new(),
        });
    }
    condense(llm, &[text.to_string()], Source::Draft, target)
}

/// A condensed answer and the calls that made it.
#[derive(Debug, Clone)]
pub struct Condensed {
    pub text: String,
    pub calls: Vec<Call>,
}

/// Condense `pieces` (notes or drafts, in order) into a summary of about
/// `target` words. Pieces of more than one call's reading are condensed in
/// consecutive parts, each asked for its share of the words; when what was
/// written runs over the target, it is condensed again.
pub fn condense(
    llm: &mut dyn Llm,
    pieces: &[String],
    source: Source,
    target: usize,
) -> Result<Condensed> {
    let mut pieces: Vec<String> = pieces.to_vec();
    let mut source = source;
    let mut calls = Vec::new();
    // The words asked for in all: the target at first, then less by as
    // much as the last round overshot, since a small model asked to
    // shorten a text to a length keeps most of it.
    let mut asked_in_all = target;
    for round in 0..MAX_ROUNDS {
        let groups = group_by_words(&pieces, WORDS_PER_CALL);
        let total: usize = pieces
            .iter()
            .map(|piece| words(piece))
            .sum::<usize>()
            .max(1);
        let mut written = Vec::with_capacity(groups.len());
        for (at, group) in groups.iter().enumerate() {
            let group_words: usize = group.iter().map(|piece| words(piece)).sum();
            let asked = if groups.len() == 1 {
                asked_in_all
            } else {
                (asked_in_all * group_words / total).max(MIN_PART_WORDS)
            };
            let prompt = condense_prompt(group, source, asked, at + 1, groups.len());
            let call = Call::run(llm, &prompt, tokens_for(asked))?;
            let text = whole_sentences(&call);
            if !text.is_empty() {
                written.push(text);
            }
            calls.push(call);
        }
        let joined = written.join("\n\n");
        let last_round = round + 1 == MAX_ROUNDS;
        if words(&joined) as f64 <= target as f64 * SLACK || last_round {
            return Ok(Condensed {
                text: joined,
                calls,
            });
        }
        let overshoot = words(&joined) as f64 / asked_in_all.max(1) as f64;
        asked_in_all = ((target as f64 / overshoot).round() as usize).max(MIN_PART_WORDS);
        pieces = written;
        source = Source::Draft;
    }
    unreachable!("the last round returns")
}

/// What `call` wrote, without a last sentence its token budget cut off.
fn whole_sentences(call: &Call) -> String {
    let text = call.summary();
    if !call.filled_budget() {
        return text.to_string();
    }
    text[..last_sentence_end(text).unwrap_or(text.len())].to_string()
}

/// Words of `text`, as `stats.json` counts them.
pub fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// `pieces` in consecutive groups of at most `limit` words (a longer piece
/// stands alone), balanced so that the groups come out about even.
fn group_by_words(pieces: &[String], limit: usize) -> Vec<Vec<String>> {
    let total: usize = pieces.iter().map(|piece| words(piece)).sum();
    let count = total.div_ceil(limit).max(1);
    let per_group = total.div_ceil(count);
    let mut groups: Vec<Vec<String>> = Vec::with_capacity(count);
    let mut group = Vec::new();
    let mut group_words = 0;
    for piece in pieces {
        let piece_words = words(piece);
        if !group.is_empty() && group_words + piece_words > per_group {
            groups.push(std::mem::take(&mut group));
            group_words = 0;
        }
        group.push(piece.clone());
        group_words += piece_words;
    }
    if !group.is_empty() || groups.is_empty() {
        groups.push(group);
    }
    groups
}

/// Where the last whole sentence of `text` ends: after a `.`, `!` or `?`
/// that closes the text or comes before whitespace, and is not the dot of a
/// list number ("3."), which a text cut at its token budget often ends on.
pub fn last_sentence_end(text: &str) -> Option<usize> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    chars
        .iter()
        .enumerate()
        .rev()
        .find_map(|(at, &(offset, c))| {
            let closes = matches!(c, '.' | '!' | '?')
                && chars
                    .get(at + 1)
                    .is_none_or(|(_, next)| next.is_whitespace());
            let list_number = c == '.'
                && at > 0
                && chars[at - 1].1.is_ascii_digit()
                && chars[..at]
                    .iter()
                    .rev()
                    .find(|(_, earlier)| !earlier.is_ascii_digit())
                    .is_none_or(|(_, earlier)| earlier.is_whitespace());
            (closes && !list_number).then_some(offset + c.len_utf8())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(words: usize) -> Chunk {
        Chunk {
            index: 0,
            text: "word ".repeat(words),
            tokens: words,
            start_byte: 0,
        }
    }

    #[test]
    fn the_target_is_a_tenth_of_the_document_within_bounds() {
        assert_eq!(target_words(None, &[chunk(638)]), 120);
        assert_eq!(target_words(None, &[chunk(2000), chunk(1500)]), 350);
        assert_eq!(target_words(None, &[chunk(90_000)]), 600);
        assert_eq!(target_words(Some(75), &[chunk(90_000)]), 75);
    }

    #[test]
    fn groups_stay_in_order_and_come_out_even() {
        let pieces: Vec<String> = (0..6).map(|i| format!("{i} ").repeat(500)).collect();
        let groups = group_by_words(&pieces, 1200);
        let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
        // 3,000 words need three groups of at most 1,000.
        assert_eq!(sizes, [2, 2, 2]);
        assert_eq!(groups.concat(), pieces);
        assert_eq!(group_by_words(&[], 1200), [Vec::<String>::new()]);
        let long = vec!["w ".repeat(5000)];
        assert_eq!(group_by_words(&long, 1200), [long.clone()]);
    }

    #[test]
    fn a_part_prompt_names_its_part_and_its_words() {
        let prompt = condense_prompt(&["A fog came.".into()], Source::Notes, 80, 2, 3);
        let text = &prompt.segments[0];
        assert!(
            text.starts_with("Notes taken while reading a document, in order:\n- A fog came.\n")
        );
        assert!(text.contains("part 2 of 3 of the document"), "{text}");
        assert!(text.contains("about 80 words"), "{text}");
        let whole = condense_prompt(&["A fog came.".into()], Source::Draft, 120, 1, 1);
        assert!(whole.segments[0].contains("summary of the document in about 120 words"));
    }

    #[test]
    fn a_cut_answer_ends_at_a_sentence_not_a_list_number() {
        let text = "1. Keep tools dull. It slows work.\n2. Jam the locks.\n3.";
        assert_eq!(
            last_sentence_end(text).map(|end| &text[..end]),
            Some("1. Keep tools dull. It slows work.\n2. Jam the locks.")
        );
        let prices = "It cost 3.50 in all. Then it";
        assert_eq!(
            last_sentence_end(prices).map(|end| &prices[..end]),
            Some("It cost 3.50 in all.")
        );
        assert_eq!(last_sentence_end("no end here"), None);
    }
}
