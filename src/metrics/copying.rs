//! How much of a summary, or of a memory's notes, is copied out of the document: the
//! share of word 8-grams found verbatim in it, and the longest run copied in one piece.

use super::degeneration::words;
use std::collections::{HashMap, HashSet};

/// Word n-grams of this length found in the document count as copied: long
/// enough that no common phrase reaches it, short enough to catch a copied
/// clause.
pub const COPY_NGRAM_WORDS: usize = 8;

/// The copying figures of one text against its document.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Copying {
    /// Words of the text.
    pub words: usize,
    /// The share of the text's word 8-grams that occur in the document, in
    /// 0..=1; 0 when the text has no 8-gram.
    pub copied_8gram_share: f64,
    /// The most consecutive words of the text that occur in the same order
    /// in the document.
    pub longest_copy_words: usize,
}

/// A document's words, indexed for [`DocumentWords::copying`].
pub struct DocumentWords {
    /// Each distinct word as a number, so runs compare as integers.
    ids: HashMap<String, u32>,
    text: Vec<u32>,
    grams: HashSet<Vec<u32>>,
}

impl DocumentWords {
    pub fn new(document: &str) -> Self {
        let mut ids = HashMap::new();
        let text: Vec<u32> = words(document)
            .into_iter()
            .map(|word| {
                let next = ids.len() as u32;
                *ids.entry(word).or_insert(next)
            })
            .collect();
        let grams = text
            .windows(COPY_NGRAM_WORDS)
            .map(<[u32]>::to_vec)
            .collect();
        DocumentWords { ids, text, grams }
    }

    /// Words of the document.
    pub fn len(&self) -> usize {
        self.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// How much of `texts` copies the document. Each text is taken on its
    /// own (the notes of a memory): no n-gram or run spans two of them.
    pub fn copying<S: AsRef<str>>(&self, texts: &[S]) -> Copying {
        let mut figures = Copying::default();
        let (mut grams, mut copied) = (0, 0);
        for text in texts {
            // A word the document lacks gets an id no document word has.
            let unknown = u32::MAX;
            let text: Vec<u32> = words(text.as_ref())
                .iter()
                .map(|word| self.ids.get(word).copied().unwrap_or(unknown))
                .collect();
            figures.words += text.len();
            for gram in text.windows(COPY_NGRAM_WORDS) {
                grams += 1;
                copied += usize::from(self.grams.contains(gram));
            }
            figures.longest_copy_words = figures
                .longest_copy_words
                .max(longest_common_run(&text, &self.text));
        }
        if grams > 0 {
            figures.copied_8gram_share = copied as f64 / grams as f64;
        }
        figures
    }
}

/// The length of the longest run of `text` that occurs in `document`,
/// by dynamic programming over both (one row of `document`'s length).
fn longest_common_run(text: &[u32], document: &[u32]) -> usize {
    let mut previous = vec![0usize; document.len() + 1];
    let mut current = vec![0usize; document.len() + 1];
    let mut longest = 0;
    for &word in text {
        if word == u32::MAX {
            previous.fill(0);
            continue;
        }
        for (at, &other) in document.iter().enumerate() {
            current[at + 1] = if other == word { previous[at] + 1 } else { 0 };
        }
        longest = longest.max(current.iter().copied().max().unwrap_or(0));
        std::mem::swap(&mut previous, &mut current);
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCUMENT: &str = "The keeper lit the lamp at dusk. Fog came down over the rock, \
        and the horn sounded every two minutes through the night.";

    #[test]
    fn a_text_in_its_own_words_copies_nothing() {
        let figures = DocumentWords::new(DOCUMENT)
            .copying(&["At nightfall a lighthouse keeper warned ships through heavy fog."]);
        assert_eq!(figures.words, 10);
        assert_eq!(figures.copied_8gram_share, 0.0);
        // "fog" alone is in the document; no longer run is.
        assert_eq!(figures.longest_copy_words, 1);
    }

    #[test]
    fn a_copied_sentence_counts_whole_whatever_its_case_and_punctuation() {
        let document = DocumentWords::new(DOCUMENT);
        let copied = document.copying(&["FOG came down, over the rock and the horn sounded!"]);
        // 10 words, 3 grams, all in the document.
        assert_eq!(copied.copied_8gram_share, 1.0);
        assert_eq!(copied.longest_copy_words, 10);
    }

    #[test]
    fn the_share_counts_grams_and_the_run_is_the_longest_piece() {
        let document = DocumentWords::new(DOCUMENT);
        // 8 copied words then 4 new ones: 5 grams, the first one copied.
        let half =
            document.copying(&["the keeper lit the lamp at dusk fog and then slept soundly"]);
        assert_eq!(half.words, 12);
        assert!((half.copied_8gram_share - 0.2).abs() < 1e-12);
        assert_eq!(half.longest_copy_words, 8);
    }

    #[test]
    fn notes_are_measured_one_by_one() {
        let document = DocumentWords::new(DOCUMENT);
        // Each note has 4 copied words; joined they would make an 8-word run.
        let notes = ["the keeper lit the", "lamp at dusk fog"];
        let figures = document.copying(&notes);
        assert_eq!(figures.words, 8);
        assert_eq!(figures.copied_8gram_share, 0.0);
        assert_eq!(figures.longest_copy_words, 4);
        assert_eq!(document.copying(&[notes.join(" ")]).longest_copy_words, 8);
    }

    #[test]
    fn short_and_empty_texts_have_no_share() {
        let document = DocumentWords::new(DOCUMENT);
        assert_eq!(document.copying(&["the keeper"]).copied_8gram_share, 0.0);
        assert_eq!(document.copying::<&str>(&[]), Copying::default());
        assert!(
            DocumentWords::new("")
                .copying(&[DOCUMENT])
                .longest_copy_words
                == 0
        );
    }
}
