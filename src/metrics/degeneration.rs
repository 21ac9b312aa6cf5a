//! How far a summary has degenerated, from its text alone and without a model: how
//! much of it repeats itself, and how much copies the method's own prompt.

use crate::sentences::split_sentences;
use std::collections::HashMap;

/// Word n-grams of this length count as a repeat; short enough to catch a
/// sentence said twice, long enough that common phrases (`of the ship`) do not.
const NGRAM_WORDS: usize = 4;

/// Sentences of fewer words than this are too short to call an echo: `He
/// left.` may well be in a prompt's worked example and the document alike.
const ECHO_MIN_WORDS: usize = 4;

/// The share of `text`'s word 4-grams, counted at every position, whose
/// 4-gram occurs more than once in `text`. 0 for fewer than 4 words; a
/// text that says one sentence over and over scores (near) 1.
pub fn repeated_ngram_share(text: &str) -> f64 {
    let words = words(text);
    if words.len() < NGRAM_WORDS {
        return 0.0;
    }
    let grams: Vec<&[String]> = words.windows(NGRAM_WORDS).collect();
    let mut counts: HashMap<&[String], usize> = HashMap::new();
    for gram in &grams {
        *counts.entry(gram).or_default() += 1;
    }
    let repeated = grams.iter().filter(|gram| counts[*gram] > 1).count();
    repeated as f64 / grams.len() as f64
}

/// The share of `summary`'s sentences of at least 4 words that appear word
/// for word inside one of `sources` (the method's prompt texts), once both
/// are lowercased and their punctuation and whitespace made single spaces.
/// Shorter sentences count neither way; 0 when no sentence counts.
pub fn echo_share(summary: &str, sources: &[String]) -> f64 {
    // Padded with spaces, so a sentence matches whole words only.
    let sources: Vec<String> = sources
        .iter()
        .map(|source| format!(" {} ", normalize(source)))
        .collect();
    let mut counted = 0;
    let mut echoed = 0;
    for sentence in split_sentences(summary) {
        let sentence = normalize(&sentence);
        if sentence.split(' ').count() < ECHO_MIN_WORDS {
            continue;
        }
        counted += 1;
        let padded = format!(" {sentence} ");
        if sources.iter().any(|source| source.contains(&padded)) {
            echoed += 1;
        }
    }
    if counted == 0 {
        0.0
    } else {
        echoed as f64 / counted as f64
    }
}

/// The words of `text`, lowercased and without punctuation (`Ship,` and
/// `ship` are one word); pieces with no letter or digit (a dash standing
/// alone) are not words. The copy figures compare words this way too.
pub(crate) fn words(text: &str) -> Vec<String> {
    normalize(text)
        .split(' ')
        .filter(|word| !word.is_empty())
        .map(str::to_string)
        .collect()
}

/// `text` lowercased, every run of characters that are not letters or
/// digits made one space, trimmed. `don't` becomes `don t`, the same in a
/// summary as in a prompt.
fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        } else if !out.is_empty() && !out.ends_with(' ') {
            out.push(' ');
        }
    }
    if out.ends_with(' ') {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn words_are_lowercased_without_punctuation() {
        assert_eq!(
            words("The ship, the SHIP — sails!"),
            ["the", "ship", "the", "ship", "sails"]
        );
        assert_eq!(normalize("  Don't   stop.\n"), "don t stop");
    }

    #[test]
    fn texts_under_four_words_have_no_4_grams() {
        assert_eq!(repeated_ngram_share(""), 0.0);
        assert_eq!(repeated_ngram_share("The ship sails."), 0.0);
    }

    #[test]
    fn distinct_4_grams_score_0() {
        // 6 words, 3 grams, all different.
        assert_eq!(repeated_ngram_share("The ship sails north into ice."), 0.0);
    }

    #[test]
    fn repeated_4_grams_count_at_each_position() {
        // a b c d a b c d: grams abcd, bcda, cdab, dabc, abcd; abcd twice: 2 of 5.
        assert!(close(repeated_ngram_share("a b c d a b c d"), 0.4));
        // Case and punctuation do not tell grams apart: "A, b. C d" is abcd.
        assert!(close(repeated_ngram_share("A, b. C d a b c d"), 0.4));
        // a b c d x a b c d: 6 grams, abcd at positions 0 and 5: 2 of 6.
        assert!(close(repeated_ngram_share("a b c d x a b c d"), 2.0 / 6.0));
    }

    #[test]
    fn one_sentence_said_over_and_over_scores_1() {
        let text = "The ship sails north today. ".repeat(10);
        assert!(close(repeated_ngram_share(&text), 1.0));
        // Followed by one new sentence: 47 + 5 = 52 grams; the 4 that reach
        // into the new words and the 1 inside them are the only ones single.
        let text = format!("{text}Then the crew rests quietly.");
        assert!(close(repeated_ngram_share(&text), 47.0 / 52.0));
    }

    #[test]
    fn echo_counts_sentences_found_in_a_source() {
        let sources = ["You write clear, faithful summaries of documents. You output only the summary, in plain prose.".to_string()];
        // An echo (8 words), a sentence of its own (4 words), one too short to count.
        let summary = "You output ONLY the summary in plain prose. The ship sails north. It sank.";
        assert!(close(echo_share(summary, &sources), 0.5));
    }

    #[test]
    fn echo_matches_whole_words_in_any_source() {
        let sources = [
            "Write the summary.".to_string(),
            "the cat sat on the mat".to_string(),
        ];
        assert!(close(echo_share("The cat sat on the mat.", &sources), 1.0));
        // "he cat sat on" is inside "the cat sat on" only as characters.
        assert!(close(echo_share("He cat sat on the mat.", &sources), 0.0));
        // A sentence longer than any source is not inside it.
        assert!(close(
            echo_share("The cat sat on the mat all day.", &sources),
            0.0
        ));
    }

    #[test]
    fn echo_is_0_without_a_counted_sentence() {
        let sources = ["It sank.".to_string()];
        assert_eq!(echo_share("It sank. He left.", &sources), 0.0);
        assert_eq!(echo_share("", &sources), 0.0);
        assert_eq!(echo_share("The ship sails north today.", &[]), 0.0);
    }
}
