//! Correct-F1, the Chain of Summaries paper's answer score: bag-of-words F1 between a
//! predicted and a reference answer, both normalized as TriviaQA's evaluation does.

use std::collections::HashMap;

/// `text` lowercased, with underscores and punctuation turned into spaces,
/// the articles "a", "an" and "the" dropped, and whitespace collapsed to
/// single spaces.
///
/// Punctuation becomes a space rather than vanishing, as in TriviaQA's
/// script (which the paper's measure derives from), so "1939–1945" or
/// "cut/burn" stay two words. Punctuation here is any character that is not
/// a letter, a digit or whitespace: TriviaQA's ASCII list plus curly quotes,
/// dashes and every other symbol, so that typography never decides a match.
pub fn normalize(text: &str) -> String {
    let spaced: String = text
        .chars()
        .flat_map(char::to_lowercase)
        .map(|c| {
            if c.is_alphanumeric() || c.is_whitespace() {
                c
            } else {
                ' '
            }
        })
        .collect();
    spaced
        .split_whitespace()
        .filter(|word| !matches!(*word, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The F1 of the normalized words of `prediction` against those of
/// `reference`, counting repeated words as often as both have them.
///
/// Two answers that normalize to nothing agree (1.0); one empty answer
/// against a non-empty one scores 0.0.
pub fn token_f1(prediction: &str, reference: &str) -> f64 {
    let predicted = normalize(prediction);
    let expected = normalize(reference);
    let predicted: Vec<&str> = predicted.split_whitespace().collect();
    let expected: Vec<&str> = expected.split_whitespace().collect();
    if predicted.is_empty() || expected.is_empty() {
        return if predicted.is_empty() && expected.is_empty() {
            1.0
        } else {
            0.0
        };
    }
    let mut wanted: HashMap<&str, usize> = HashMap::new();
    for word in &expected {
        *wanted.entry(word).or_default() += 1;
    }
    let mut common = 0usize;
    for word in &predicted {
        if let Some(left) = wanted.get_mut(word).filter(|left| **left > 0) {
            *left -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / predicted.len() as f64;
    let recall = common as f64 / expected.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// The mean of per-question scores; `None` when there are none.
pub fn mean_f1(scores: &[f64]) -> Option<f64> {
    (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn normalize_lowercases_and_collapses_whitespace() {
        assert_eq!(normalize("  Hello \t World\n"), "hello world");
        assert_eq!(normalize(""), "");
        assert_eq!(normalize(" \n\t "), "");
    }

    #[test]
    fn punctuation_becomes_a_word_break() {
        assert_eq!(normalize("Paris, France."), "paris france");
        assert_eq!(normalize("cut/burn;(wires)"), "cut burn wires");
        assert_eq!(normalize("don't"), "don t");
        assert_eq!(normalize("$5.00 & 10%!"), "5 00 10");
        assert_eq!(normalize("?!..."), "");
    }

    #[test]
    fn articles_go_only_as_whole_words() {
        assert_eq!(
            normalize("The cat ate a rat and an apple"),
            "cat ate rat and apple"
        );
        // Words that merely contain an article stay.
        assert_eq!(
            normalize("Theory of anthems in Athens"),
            "theory of anthems in athens"
        );
        // An article glued by punctuation is still a word of its own.
        assert_eq!(normalize("the-end (a)"), "end");
    }

    #[test]
    fn underscores_become_spaces() {
        assert_eq!(normalize("field_manual_1944"), "field manual 1944");
        assert_eq!(normalize("__the__office__"), "office");
    }

    #[test]
    fn unicode_is_lowercased_and_its_punctuation_dropped() {
        assert_eq!(normalize("ÜBER Straße"), "über straße");
        assert_eq!(normalize("“Quoted” — words…"), "quoted words");
        assert_eq!(normalize("1939–1945"), "1939 1945");
        assert_eq!(normalize("東京、大阪。"), "東京 大阪");
        assert_eq!(normalize("ΣΟΦΙΑ"), "σοφια");
    }

    #[test]
    fn f1_of_exact_and_disjoint_answers() {
        assert!(close(token_f1("The Eiffel Tower", "eiffel tower!"), 1.0));
        assert!(close(token_f1("London", "Paris"), 0.0));
    }

    #[test]
    fn f1_matches_a_hand_worked_example() {
        // P = [paris, france], G = [paris]: precision 1/2, recall 1, F1 = 2/3.
        assert!(close(token_f1("Paris, France", "Paris"), 2.0 / 3.0));
        // P = [in, june, 1944], G = [june, 1944]: p = 2/3, r = 1, F1 = 0.8.
        assert!(close(token_f1("in June 1944", "June 1944"), 0.8));
    }

    #[test]
    fn repeated_words_count_only_as_often_as_the_reference_has_them() {
        // P = [cat, cat], G = [cat]: one common word, p = 1/2, r = 1.
        assert!(close(token_f1("cat cat", "the cat"), 2.0 / 3.0));
        // P = [cat, cat], G = [cat, cat, dog]: two common, p = 1, r = 2/3.
        assert!(close(token_f1("cat cat", "cat cat dog"), 0.8));
    }

    #[test]
    fn empty_answers() {
        assert!(close(token_f1("", ""), 1.0));
        // Only articles and punctuation: both normalize to nothing.
        assert!(close(token_f1("The.", "a"), 1.0));
        assert!(close(token_f1("", "Paris"), 0.0));
        assert!(close(token_f1("Paris", "  "), 0.0));
    }

    #[test]
    fn f1_is_symmetric() {
        let pairs = [("a b c", "b c d e"), ("x", "x y"), ("one two", "two")];
        for (a, b) in pairs {
            assert!(close(token_f1(a, b), token_f1(b, a)), "{a} / {b}");
        }
    }

    #[test]
    fn mean_over_questions() {
        assert_eq!(mean_f1(&[]), None);
        assert!(close(mean_f1(&[1.0, 0.0, 0.5]).unwrap(), 0.5));
    }
}
