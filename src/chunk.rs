//! Splits a document into consecutive chunks that each fit a token budget, as
//! counted by the caller's tokenizer.

use serde::{Deserialize, Serialize};

use crate::document::FILE_HEADER;
use crate::{Error, Result};

/// One piece of a document, ready to be put into a prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Position of this chunk in the document, from 0.
    pub index: usize,
    /// The exact slice `document[start_byte..end_byte()]`, trailing whitespace included.
    pub text: String,
    /// `count_tokens(&text)`, as the caller's tokenizer counted it.
    pub tokens: usize,
    /// Byte offset of `text` in the document.
    pub start_byte: usize,
}

impl Chunk {
    /// Byte offset just past this chunk in the document.
    pub fn end_byte(&self) -> usize {
        self.start_byte + self.text.len()
    }
}

/// Split `text` into chunks of at most `chunk_tokens` tokens each, counting with
/// `count_tokens`.
///
/// An empty `text` gives no chunks. `chunk_tokens` must be at least 1; checking it
/// against the model's context (with room for the prompt around it) is the caller's job.
///
/// Chunks are exact slices of the document: every byte, separators included,
/// lands in exactly one chunk, so concatenating the chunk texts in order gives the
/// document back. A chunk boundary follows whitespace (which stays at the end of
/// the chunk before it) or a full-width sentence end (。！？), except inside a
/// single word too long for the budget, which is cut between two characters.
///
/// 1. The document is cut into *units* at the coarsest boundary that keeps each unit
///    within the budget: files (the headers [`FILE_HEADER`] opens when several
///    files are read as one document), then paragraphs (blank lines), then
///    sentence ends, then whitespace, then characters. Only a unit that is too large
///    is cut finer, so a book becomes mostly whole paragraphs with a few oversized
///    ones in pieces.
/// 2. Units are packed greedily: a chunk takes as many following units as fit.
///    A paragraph that fits the budget is never split, so a chunk ends early when
///    the next paragraph would not fit into what is left of it.
///    Tokenizers are not additive (BPE merges across a join, and a word costs
///    differently after a space than at the start), so the sum of the unit counts
///    is only a first guess; whether a chunk fits is always decided by counting
///    its exact text. Each chunk costs a handful of counts of about its own size
///    (guess, then double or bisect), never a count of the whole prefix.
///
/// A chunk can exceed the budget only when it is one character that alone counts
/// more than the budget.
pub fn split(
    text: &str,
    chunk_tokens: usize,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Result<Vec<Chunk>> {
    if chunk_tokens == 0 {
        return Err(Error::invalid("chunk_tokens", "must be at least 1"));
    }
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut units = Vec::new();
    push_units(
        text,
        0..text.len(),
        Level::File,
        chunk_tokens,
        count_tokens,
        &mut units,
    );
    Ok(pack(text, &units, chunk_tokens, count_tokens))
}

/// A run of the document that is never cut further: `text[start..end]` costs `tokens`.
#[derive(Debug, Clone, Copy)]
struct Unit {
    start: usize,
    end: usize,
    tokens: usize,
}

/// Where a too-large piece of text may be cut, coarsest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    File,
    Paragraph,
    Sentence,
    Word,
    Char,
}

impl Level {
    fn finer(self) -> Option<Level> {
        match self {
            Level::File => Some(Level::Paragraph),
            Level::Paragraph => Some(Level::Sentence),
            Level::Sentence => Some(Level::Word),
            Level::Word => Some(Level::Char),
            Level::Char => None,
        }
    }
}

/// Cut `text[range]` at `level` and append the pieces to `out`, cutting any piece
/// that does not fit the budget at the next finer level.
fn push_units(
    text: &str,
    range: std::ops::Range<usize>,
    level: Level,
    budget: usize,
    count_tokens: &dyn Fn(&str) -> usize,
    out: &mut Vec<Unit>,
) {
    let piece = &text[range.clone()];
    let cuts = cut_points(level, piece);
    if cuts.is_empty() {
        if let Some(finer) = level.finer() {
            // Nothing to cut at this level: go finer without counting the same text twice.
            return push_units(text, range, finer, budget, count_tokens, out);
        }
    }
    let bounds = std::iter::once(0)
        .chain(cuts)
        .chain(std::iter::once(piece.len()));
    let mut start = 0;
    for end in bounds.skip(1) {
        let (abs_start, abs_end) = (range.start + start, range.start + end);
        let tokens = count_tokens(&text[abs_start..abs_end]);
        match level.finer() {
            Some(finer) if tokens > budget => {
                push_units(text, abs_start..abs_end, finer, budget, count_tokens, out)
            }
            _ => out.push(Unit {
                start: abs_start,
                end: abs_end,
                tokens,
            }),
        }
        start = end;
    }
}

/// Byte offsets strictly inside `piece` where it may be cut at `level`, ascending.
///
/// Above the character level a cut always sits at the end of a whitespace run
/// that follows some text, so the whitespace stays with the text before it and a
/// leading run of whitespace never becomes a piece of its own.
fn cut_points(level: Level, piece: &str) -> Vec<usize> {
    let inner_runs =
        || whitespace_runs(piece).filter(|&(start, end)| start > 0 && end < piece.len());
    match level {
        Level::File => inner_runs()
            .filter(|&(_, end)| piece[end..].starts_with(FILE_HEADER))
            .map(|(_, end)| end)
            .collect(),
        Level::Paragraph => inner_runs()
            .filter(|&(start, end)| piece[start..end].matches('\n').count() >= 2)
            .map(|(_, end)| end)
            .collect(),
        Level::Sentence => {
            let mut cuts: Vec<usize> = inner_runs()
                .filter(|&(start, _)| ends_sentence(&piece[..start]))
                .map(|(_, end)| end)
                .collect();
            cuts.extend(unspaced_sentence_ends(piece));
            cuts.sort_unstable();
            cuts.dedup();
            cuts
        }
        Level::Word => inner_runs().map(|(_, end)| end).collect(),
        Level::Char => piece.char_indices().skip(1).map(|(at, _)| at).collect(),
    }
}

/// Maximal runs of whitespace in `text`, as byte ranges.
fn whitespace_runs(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut chars = text.char_indices().peekable();
    std::iter::from_fn(move || {
        let (start, _) = chars.find(|(_, c)| c.is_whitespace())?;
        let mut end = text.len();
        while let Some(&(at, c)) = chars.peek() {
            if !c.is_whitespace() {
                end = at;
                break;
            }
            chars.next();
        }
        Some((start, end))
    })
}

/// Characters that end a sentence when whitespace follows them.
const TERMINATORS: &[char] = &['.', '!', '?', '…'];

/// Full-width terminators, which end a sentence even with no space after them
/// (Chinese and Japanese put none).
const WIDE_TERMINATORS: &[char] = &['。', '！', '？'];

/// Closing quotes and brackets that may sit between a terminator and the space.
const CLOSERS: &[char] = &[
    '"', '\'', ')', ']', '}', '»', '”', '’', '」', '』', '）', '》',
];

/// Words that take a period without ending the sentence ("Mr. Darcy", "Fig. 3").
/// Kept to titles and reference words that almost never close a sentence; "etc."
/// and "Inc." are left out because they often do.
const ABBREVIATIONS: &[&str] = &[
    "Mr", "Mrs", "Ms", "Dr", "Prof", "Sr", "Jr", "St", "Mt", "Capt", "Col", "Gen", "Lt", "Sgt",
    "Rev", "Hon", "Gov", "Sen", "Rep", "vs", "cf", "viz", "approx", "Fig", "fig", "Vol", "vol",
    "No", "pp", "Eq", "al", "ca",
];

/// Whether `before`, the text up to a whitespace run, ends a sentence.
fn ends_sentence(before: &str) -> bool {
    let closed = before.trim_end_matches(CLOSERS);
    let stem = closed.trim_end_matches(TERMINATORS);
    let terminators = &closed[stem.len()..];
    if terminators.is_empty() {
        // Full-width terminators followed by a space are sentence ends as well.
        return closed.ends_with(WIDE_TERMINATORS);
    }
    if terminators != "." {
        // "!", "?", "?!", "..." end a sentence.
        return true;
    }
    // A single period after an abbreviation, an initial ("J. Smith") or a dotted
    // short form ("e.g.", "i.e.", "U.S.") usually does not.
    let word = stem
        .rsplit(char::is_whitespace)
        .next()
        .unwrap_or_default()
        .trim_start_matches(|c: char| !c.is_alphanumeric());
    !is_abbreviation(word)
}

fn is_abbreviation(word: &str) -> bool {
    if ABBREVIATIONS.contains(&word) {
        return true;
    }
    let mut chars = word.chars();
    if let (Some(first), None) = (chars.next(), chars.next()) {
        return first.is_uppercase();
    }
    // "e.g", "i.e", "U.S", "a.m": single letters joined by periods.
    word.contains('.') && word.split('.').all(|part| part.chars().count() == 1)
}

/// Cut points right after a full-width terminator (and any closers) that is
/// followed directly by more text.
fn unspaced_sentence_ends(piece: &str) -> impl Iterator<Item = usize> + '_ {
    piece
        .char_indices()
        .filter(|&(_, c)| WIDE_TERMINATORS.contains(&c))
        .filter_map(move |(at, c)| {
            let rest = &piece[at + c.len_utf8()..];
            let after = rest.trim_start_matches(WIDE_TERMINATORS);
            let after = after.trim_start_matches(CLOSERS);
            let cut = piece.len() - after.len();
            let next = after.chars().next()?;
            (!next.is_whitespace()).then_some(cut)
        })
}

/// Pack `units` greedily into chunks whose exact text fits `budget`.
fn pack(
    text: &str,
    units: &[Unit],
    budget: usize,
    count_tokens: &dyn Fn(&str) -> usize,
) -> Vec<Chunk> {
    // prefix[k] = estimated tokens of units[..k], the sum of their own counts.
    let mut prefix = Vec::with_capacity(units.len() + 1);
    prefix.push(0usize);
    for unit in units {
        let last = *prefix.last().expect("prefix starts non-empty");
        prefix.push(last.saturating_add(unit.tokens));
    }

    let mut chunks = Vec::new();
    let mut first = 0;
    while first < units.len() {
        let (end, tokens) = if units[first].tokens > budget {
            // One character that alone counts more than the budget goes out on its own.
            (first + 1, units[first].tokens)
        } else {
            longest_fit(text, units, &prefix, first, budget, count_tokens)
        };
        let start = units[first].start;
        chunks.push(Chunk {
            index: chunks.len(),
            text: text[start..units[end - 1].end].to_string(),
            tokens,
            start_byte: start,
        });
        first = end;
    }
    chunks
}

/// The end `e` of the longest run `units[first..e]` found to fit `budget` when
/// its joined text is counted, and that count. `units[first]` must fit alone.
///
/// Counts are not monotone in general (a longer text can tokenize shorter), so
/// this finds *an* end that fits with the next end not fitting, which for real
/// tokenizers is the longest one.
fn longest_fit(
    text: &str,
    units: &[Unit],
    prefix: &[usize],
    first: usize,
    budget: usize,
    count_tokens: &dyn Fn(&str) -> usize,
) -> (usize, usize) {
    let start = units[first].start;
    let count = |end: usize| count_tokens(&text[start..units[end - 1].end]);

    // Invariant: units[first..fit] fit, counted together at `fit_tokens`;
    // units[first..over] do not, once `over` is known.
    let (mut fit, mut fit_tokens) = (first + 1, units[first].tokens);
    let mut over = None;

    // First guess: as many units as fit by the sum of their own counts.
    let limit = prefix[first].saturating_add(budget);
    let guess = prefix.partition_point(|&sum| sum <= limit) - 1;
    if guess > fit {
        let tokens = count(guess);
        if tokens <= budget {
            (fit, fit_tokens) = (guess, tokens);
        } else {
            over = Some(guess);
        }
    }

    // The guess fit: try one more unit, then twice as many each time, but never
    // more than double the bytes that fit, so each count stays about chunk-sized.
    let mut step = 1;
    while over.is_none() && fit < units.len() {
        let reach = start + 2 * (units[fit - 1].end - start);
        let by_bytes = units.partition_point(|unit| unit.end <= reach);
        let end = (fit + step).min(by_bytes).clamp(fit + 1, units.len());
        let tokens = count(end);
        if tokens <= budget {
            (fit, fit_tokens) = (end, tokens);
            step *= 2;
        } else {
            over = Some(end);
        }
    }

    // Bisect between the last end that fit and the first that did not.
    if let Some(mut over) = over {
        while over - fit > 1 {
            let middle = fit + (over - fit) / 2;
            let tokens = count(middle);
            if tokens <= budget {
                (fit, fit_tokens) = (middle, tokens);
            } else {
                over = middle;
            }
        }
    }
    (fit, fit_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;

    /// Whitespace-separated words: additive, so packing is easy to predict.
    fn words(text: &str) -> usize {
        text.split_whitespace().count()
    }

    /// About four characters a token, rounded up: cheaper joined than apart.
    fn quarter_chars(text: &str) -> usize {
        text.chars().count().div_ceil(4)
    }

    fn texts(chunks: &[Chunk]) -> Vec<&str> {
        chunks.iter().map(|chunk| chunk.text.as_str()).collect()
    }

    /// What every split must satisfy, whatever the counter.
    fn check(text: &str, budget: usize, count: &dyn Fn(&str) -> usize, chunks: &[Chunk]) {
        let joined: String = texts(chunks).concat();
        assert_eq!(joined, text, "chunks reassemble the text");
        let mut at = 0;
        for (index, chunk) in chunks.iter().enumerate() {
            assert_eq!(chunk.index, index);
            assert_eq!(chunk.start_byte, at);
            assert!(!chunk.text.is_empty(), "chunk {index} is empty");
            assert_eq!(chunk.tokens, count(&chunk.text), "chunk {index} count");
            assert!(
                chunk.tokens <= budget || chunk.text.chars().count() == 1,
                "chunk {index} has {} tokens > {budget}: {:?}",
                chunk.tokens,
                chunk.text
            );
            at = chunk.end_byte();
        }
    }

    #[test]
    fn zero_budget_is_an_error() {
        let err = split("text", 0, &words).unwrap_err();
        assert!(err.to_string().contains("chunk_tokens"), "{err}");
    }

    #[test]
    fn empty_text_has_no_chunks() {
        assert!(split("", 10, &words).unwrap().is_empty());
    }

    #[test]
    fn small_text_is_one_chunk() {
        let text = "\n\nLeading blank lines.\n\nAnd a second paragraph.\n";
        let chunks = split(text, 100, &words).unwrap();
        assert_eq!(texts(&chunks), [text]);
        assert_eq!(chunks[0].tokens, 7);
    }

    #[test]
    fn paragraphs_pack_greedily() {
        // Paragraphs of 2, 2, 3 and 1 words; a budget of 4 holds the first two.
        let text = "a b\n\nc d\n\ne f g\n \n\nh";
        let chunks = split(text, 4, &words).unwrap();
        assert_eq!(texts(&chunks), ["a b\n\nc d\n\n", "e f g\n \n\nh"]);
        assert_eq!(chunks[1].start_byte, 10);
        check(text, 4, &words, &chunks);
    }

    #[test]
    fn a_file_that_fits_is_not_split_across_chunks() {
        // Files of 5 and 10 words: packing by paragraphs alone would fill the
        // first chunk with the second file's first paragraph.
        let first = format!("{FILE_HEADER}a ===\nx\n\n");
        let second = format!("{FILE_HEADER}b ===\nu\n\nv w x y z\n");
        let text = format!("{first}{second}");
        let chunks = split(&text, 10, &words).unwrap();
        assert_eq!(texts(&chunks), [first.as_str(), second.as_str()]);
        check(&text, 10, &words, &chunks);
        // A file over the budget is cut at its paragraphs as before.
        let chunks = split(&text, 3, &words).unwrap();
        assert!(chunks.len() > 2);
        check(&text, 3, &words, &chunks);
    }

    #[test]
    fn single_newlines_do_not_separate_paragraphs() {
        // Hard-wrapped prose: one paragraph over budget, cut at sentences.
        let text = "One two\nthree. Four five\nsix. Seven.";
        let chunks = split(text, 3, &words).unwrap();
        assert_eq!(
            texts(&chunks),
            ["One two\nthree. ", "Four five\nsix. ", "Seven."]
        );
    }

    #[test]
    fn long_paragraph_splits_at_sentence_ends() {
        let text = "He ran! Did she? \"Yes.\" (Fine.) Done";
        let chunks = split(text, 2, &words).unwrap();
        assert_eq!(
            texts(&chunks),
            ["He ran! ", "Did she? ", "\"Yes.\" (Fine.) ", "Done"]
        );
    }

    #[test]
    fn abbreviations_and_decimals_do_not_end_sentences() {
        let text = "Mr. Darcy paid 3.14 pounds, e.g. to Dr. J. Smith. Then he left.";
        let cuts = cut_points(Level::Sentence, text);
        let pieces: Vec<&str> = std::iter::once(0)
            .chain(cuts.iter().copied())
            .zip(cuts.iter().copied().chain(std::iter::once(text.len())))
            .map(|(a, b)| &text[a..b])
            .collect();
        assert_eq!(
            pieces,
            [
                "Mr. Darcy paid 3.14 pounds, e.g. to Dr. J. Smith. ",
                "Then he left."
            ]
        );
    }

    #[test]
    fn wide_terminators_cut_without_spaces() {
        let text = "我来了。他走了！「好。」然后";
        let cuts = cut_points(Level::Sentence, text);
        let at = |s: &str| text.find(s).unwrap();
        assert_eq!(cuts, [at("他"), at("「"), at("然")]);
    }

    #[test]
    fn long_sentence_splits_at_whitespace() {
        let text = "one two three four five six seven";
        let chunks = split(text, 3, &words).unwrap();
        assert_eq!(
            texts(&chunks),
            ["one two three ", "four five six ", "seven"]
        );
    }

    #[test]
    fn long_word_splits_between_characters() {
        // A 7-character word; with `quarter_chars` a budget of 1 holds 4 characters.
        let text = "東京東京東京東 end";
        let chunks = split(text, 1, &quarter_chars).unwrap();
        assert_eq!(texts(&chunks), ["東京東京", "東京東 ", "end"]);
        check(text, 1, &quarter_chars, &chunks);
    }

    #[test]
    fn a_character_over_budget_stands_alone() {
        // A counter that charges 5 for an emoji: it cannot fit a budget of 2.
        let count = |text: &str| text.chars().map(|c| if c == '🙂' { 5 } else { 1 }).sum();
        let text = "ab🙂cd";
        let chunks = split(text, 2, &count).unwrap();
        assert_eq!(texts(&chunks), ["ab", "🙂", "cd"]);
        check(text, 2, &count, &chunks);
    }

    #[test]
    fn chunks_are_counted_joined_not_summed() {
        // Quadratic cost: each one-word paragraph counts 1 alone, but n words
        // together cost n², so only 3 fit a budget of 9 (summing would allow 9).
        let squared = |text: &str| words(text) * words(text);
        let text = "w\n\n".repeat(10);
        let chunks = split(&text, 9, &squared).unwrap();
        assert!(chunks
            .iter()
            .all(|chunk| words(&chunk.text) == 3 || chunk.index == 3));
        check(&text, 9, &squared, &chunks);

        // Sub-additive: "ab " costs 1 alone, but four of them together cost only 3,
        // so a chunk holds 13 of them (39 chars, 10 tokens), not the 10 the sum allows.
        let text = "ab ".repeat(40);
        let chunks = split(&text, 10, &quarter_chars).unwrap();
        assert_eq!(chunks[0].text, "ab ".repeat(13));
        assert_eq!(chunks[0].tokens, 10);
        check(&text, 10, &quarter_chars, &chunks);
    }

    #[test]
    fn book_sized_text_is_counted_a_bounded_number_of_times() {
        // ~600k characters of prose in paragraphs, plus one huge paragraph
        // without sentence ends and one huge word, each of which forces finer units.
        let mut text = String::new();
        for paragraph in 0..2_000 {
            for sentence in 0..5 {
                text.push_str(&format!(
                    "Sentence {sentence} of paragraph {paragraph} goes on. "
                ));
            }
            text.push_str("\n\n");
        }
        text.push_str(&"runon ".repeat(20_000));
        text.push_str("\n\n");
        text.push_str(&"x".repeat(20_000));
        let counted_chars = Cell::new(0usize);
        let count = |piece: &str| {
            counted_chars.set(counted_chars.get() + piece.len());
            quarter_chars(piece)
        };
        let chunks = split(&text, 2_000, &count).unwrap();
        check(&text, 2_000, &quarter_chars, &chunks);
        // Counting the whole prefix for every chunk would be ~90 × 350k ≈ 30M bytes.
        assert!(
            counted_chars.get() < 12 * text.len(),
            "counted {} bytes for a {}-byte text",
            counted_chars.get(),
            text.len()
        );
        // Full chunks: all but the last are close to the budget.
        let last = chunks.len() - 1;
        assert!(chunks[..last].iter().all(|chunk| chunk.tokens > 1_900));
    }

    /// Text made of words, sentence ends, quotes, blank lines, CRLF and
    /// multi-byte characters.
    fn document() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                4 => "[a-zA-Zé東🙂]{1,12}",
                3 => Just(" ".to_string()),
                1 => Just("\n".to_string()),
                1 => Just("\n\n".to_string()),
                1 => Just("\r\n".to_string()),
                1 => "[.!?…。][\"”)]?",
                1 => Just("Mr.".to_string()),
                1 => Just("3.14".to_string()),
                1 => "[ \t\u{a0}\u{3000}]{1,3}",
            ],
            0..200,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn words_counter(text in document(), budget in 1usize..30) {
            let chunks = split(&text, budget, &words).unwrap();
            check(&text, budget, &words, &chunks);
        }

        #[test]
        fn quarter_chars_counter(text in document(), budget in 1usize..30) {
            let chunks = split(&text, budget, &quarter_chars).unwrap();
            check(&text, budget, &quarter_chars, &chunks);
        }

        #[test]
        fn erratic_counter(text in document(), budget in 1usize..30) {
            // Neither additive nor monotone in the text's length.
            let erratic = |piece: &str| words(piece) + piece.len() % 3;
            let chunks = split(&text, budget, &erratic).unwrap();
            check(&text, budget, &erratic, &chunks);
        }

        #[test]
        fn any_string(text in "\\PC{0,300}", budget in 1usize..10) {
            let chunks = split(&text, budget, &quarter_chars).unwrap();
            check(&text, budget, &quarter_chars, &chunks);
        }
    }
}
