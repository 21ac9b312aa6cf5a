//! The summary length every method aims at, and the condensing that brings
//! a method's final answer to it, so that methods compare at equal length.

use super::baseline::Call;
use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::{Llm, Prompt, Request, Source};
use crate::sentences::split_sentences;

/// The default target is this share of the document's words...
const DOCUMENT_SHARE: f64 = 0.1;
/// ...but at least a paragraph that can name a story's people and tell its
/// events: PRISM gives up to a quarter to who is in it, and at 120 words
/// the sample's events had 88, four merged sentences, which left its fog
/// out...
pub const MIN_TARGET_WORDS: usize = 150;
/// ...and at most about a page, near BooookScore's 900-token summaries.
pub const MAX_TARGET_WORDS: usize = 600;

/// An answer up to this much longer than its target is left as written.
const SLACK: f64 = 1.25;
/// The words one merged sentence is asked to stay within. Asked only for
/// "one shorter sentence", Qwen2.5-Coder-1.5B wrote 20 to 33 words from
/// short notes but run-on sentences of 60 and more from a play's long
/// ones, and three rounds left a summary at twice its target.
const WORDS_PER_MERGED_SENTENCE: usize = 25;
/// The most words of notes one merge is asked to combine: asked to combine
/// three or four sentences the 1.5B model does, but asked to combine two
/// dozen of a play's notes into one it wrote most of them out again, and
/// three rounds left PRISM's summary of the play at 428 words for a target
/// of 150. Long notes take several rounds instead. At 100 words a merge
/// took five of the sample's notes, kept the first two and dropped the
/// inspector's visit; at 60 it takes about three and keeps what each says.
const MOST_WORDS_PER_MERGE: usize = 60;
/// Rounds of merging before the answer is kept whatever its length: each
/// shortens the text about fourfold, so six bring a long book's notes to a
/// page.
const MAX_ROUNDS: usize = 6;

/// The summary length in words a run aims at: `requested` (`--summary-words`),
/// else a tenth of the words in `chunks`, at least [`MIN_TARGET_WORDS`] and
/// at most [`MAX_TARGET_WORDS`]. Every method aims at it, because a longer
/// summary answers more questions about its document, and a table of
/// methods whose summaries differ in length says little.
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

/// The system turn of every condensing call, whatever the method.
pub const CONDENSE_SYSTEM: &str = "You write clear summaries of documents in plain prose, in your own words and in the third person.";

/// Tokens a merge asked again may not copy in a row from what it merges.
/// Asked to summarize a run of notes in one sentence, Qwen2.5-Coder-1.5B
/// wrote the run out again for one of four of the sample's runs and two of
/// five of a play's. With runs of 10 tokens masked it shortened each, by a
/// third for runs of 100 words; at 8 it shortened more but ran words
/// together to dodge the mask ("GullRock"), and at 12 it copied again.
pub const MERGE_NO_COPY_TOKENS: usize = 10;
/// A merge that kept more than this share of its words did not merge.
const UNMERGED_SHARE: f64 = 0.75;

/// The prompt that merges consecutive `sentences` of a summary into one,
/// copying no run of `no_copy_tokens` tokens when given. Asked to
/// "combine these sentences into one", the 1.5B model copied three of the
/// sample's notes out unchanged; asked to summarize them in one sentence,
/// it did.
pub fn merge_prompt(sentences: &[&str], no_copy_tokens: Option<usize>) -> Prompt {
    Prompt {
        system: Some(CONDENSE_SYSTEM.to_string()),
        segments: vec![format!(
            "Summarize in one sentence of at most {WORDS_PER_MERGED_SENTENCE} words:\n\n{}\n",
            sentences.join(" ")
        )],
        source: Some(Source {
            segment: 0,
            no_copy_tokens,
        }),
        shared_segments: Some(0),
    }
}

/// `text` brought to about `target` words: unchanged when it is within a
/// quarter over, else condensed ([`condense`]); either way without a last
/// sentence its token budget cut off.
pub fn to_length(llm: &mut dyn Llm, text: &str, target: usize) -> Result<Condensed> {
    let text = without_unfinished_sentence(text);
    if words(text) as f64 <= target as f64 * SLACK {
        return Ok(Condensed {
            text: text.trim().to_string(),
            calls: Vec::new(),
        });
    }
    condense(llm, &[text.to_string()], target)
}

/// A condensed answer and the calls that made it.
#[derive(Debug, Clone)]
pub struct Condensed {
    pub text: String,
    pub calls: Vec<Call>,
}

/// Condense `pieces` (notes or a draft, in order) into a summary of about
/// `target` words, by merging each run of consecutive sentences into one.
///
/// A small model asked to shorten a list of notes or a summary to a length
/// copies it out until its token budget runs out, so that only the
/// beginning survives: Qwen2.5-Coder-1.5B did so with every wording tried,
/// notes listed or run together, instruction before or after. Asked to
/// combine three or four sentences into one, it does, so every part of the
/// document keeps its share of the summary. Rounds repeat while the text
/// stays more than a quarter over the target.
pub fn condense(llm: &mut dyn Llm, pieces: &[String], target: usize) -> Result<Condensed> {
    // A note without a closing mark ("Ada: the keeper") still ends where
    // it ends, and a merge prompt shows it as a sentence.
    let mut sentences: Vec<String> = pieces
        .iter()
        .map(|piece| piece.trim())
        .filter(|piece| !piece.is_empty())
        .map(
            |piece| match piece.ends_with(['.', '!', '?', '"', '\u{201d}']) {
                true => piece.to_string(),
                false => format!("{piece}."),
            },
        )
        .collect();
    let mut calls = Vec::new();
    for _ in 0..MAX_ROUNDS {
        // A merge may come back as more than one sentence.
        sentences = sentences
            .iter()
            .flat_map(|text| split_sentences(text))
            .collect();
        let total: usize = sentences.iter().map(|sentence| words(sentence)).sum();
        if total as f64 <= target as f64 * SLACK {
            break;
        }
        let groups = (target / WORDS_PER_MERGED_SENTENCE)
            .max(total.div_ceil(MOST_WORDS_PER_MERGE))
            .max(1);
        let runs = group_by_words(&sentences, total.div_ceil(groups));
        tracing::debug!(
            "condensing {total} words in {} sentences into {} runs for a target of {target}",
            sentences.len(),
            runs.len()
        );
        // A sentence longer than a merged one is shortened on its own, or
        // a round that leaves long sentences standing alone cannot shorten
        // the text further: Sabotage's notes stalled at 740 words for a
        // target of 575, in 28 runs of mostly one sentence.
        let merging: Vec<usize> = (0..runs.len())
            .filter(|&at| runs[at].len() > 1 || words(&runs[at][0]) > WORDS_PER_MERGED_SENTENCE)
            .collect();
        if merging.is_empty() {
            break;
        }
        let mut next: Vec<String> = runs.iter().map(|run| run.join(" ")).collect();
        let merged = merge(llm, &runs, &merging, None)?;
        let unmerged: Vec<usize> = merging
            .iter()
            .zip(&merged)
            .filter(|(&at, call)| {
                words(&whole_sentences(call)) as f64 > words(&next[at]) as f64 * UNMERGED_SHARE
            })
            .map(|(&at, _)| at)
            .collect();
        let again = merge(llm, &runs, &unmerged, Some(MERGE_NO_COPY_TOKENS))?;
        for (&at, call) in merging
            .iter()
            .zip(&merged)
            .chain(unmerged.iter().zip(&again))
        {
            let text = whole_sentences(call);
            if !text.is_empty() && words(&text) < words(&next[at]) {
                next[at] = text;
            }
        }
        calls.extend(merged);
        calls.extend(again);
        let shortened = next.iter().map(|text| words(text)).sum::<usize>() < total;
        sentences = next;
        if !shortened {
            break;
        }
    }
    Ok(Condensed {
        text: paragraphs(&sentences),
        calls,
    })
}

/// One merge call for each run of `runs` at `at`, copying no run of
/// `no_copy_tokens` tokens when given.
fn merge(
    llm: &mut dyn Llm,
    runs: &[Vec<String>],
    at: &[usize],
    no_copy_tokens: Option<usize>,
) -> Result<Vec<Call>> {
    let prompts: Vec<Prompt> = at
        .iter()
        .map(|&at| {
            let run: Vec<&str> = runs[at].iter().map(String::as_str).collect();
            merge_prompt(&run, no_copy_tokens)
        })
        .collect();
    let max_tokens = tokens_for(WORDS_PER_MERGED_SENTENCE * 2);
    let requests: Vec<Request> = prompts
        .iter()
        .map(|prompt| Request::independent(prompt, max_tokens))
        .collect();
    Call::run_each(llm, &requests)
}

/// Sentences laid out as paragraphs of about a hundred words.
fn paragraphs(sentences: &[String]) -> String {
    const PARAGRAPH_WORDS: usize = 100;
    let mut text = String::new();
    let mut paragraph_words = 0;
    for sentence in sentences {
        if paragraph_words >= PARAGRAPH_WORDS {
            text.push_str("\n\n");
            paragraph_words = 0;
        } else if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(sentence.trim());
        paragraph_words += words(sentence);
    }
    text
}

/// What `call` wrote, without a last sentence its token budget cut off and
/// without markdown's bold marks: asked for one sentence of prose, the
/// 1.5B model sometimes wrote a bolded heading before it, and the
/// Sabotage manual's summary kept "**Switchboard Disruption**: Exchange
/// wires in."
fn whole_sentences(call: &Call) -> String {
    let text = call.summary();
    let kept = match call.filled_budget() {
        true => &text[..last_sentence_end(text).unwrap_or(text.len())],
        false => text,
    };
    kept.replace("**", "")
}

/// `text` without a fragment after its last whole sentence, on the same
/// line, that stops without a closing mark: what is left of a sentence
/// when a final answer's token budget runs out ("… and the author feels a
/// sense"). A list item on a line of its own is kept, stop or no stop.
pub fn without_unfinished_sentence(text: &str) -> &str {
    let text = text.trim_end();
    let Some(end) = last_sentence_end(text) else {
        return text;
    };
    let tail = &text[end..];
    let unfinished = !tail.contains('\n')
        && tail.ends_with(|c: char| c.is_alphanumeric() || matches!(c, ',' | ';' | ':' | '-'));
    match unfinished {
        true => &text[..end],
        false => text,
    }
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
    use crate::llm::fake::{Fake, Reply};

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
        assert_eq!(target_words(None, &[chunk(638)]), 150);
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
        assert_eq!(group_by_words(&long, 1200), std::slice::from_ref(&long));
    }

    /// Answers every merge with its first sentence, cut to the words a
    /// merge is asked for, as a model that merges perfectly would in fewer
    /// words; or, while `copies_unless_masked`,
    /// writes out what it was asked to merge unless copying is masked.
    #[derive(Default)]
    struct FirstSentence {
        prompts: Vec<String>,
        copies_unless_masked: bool,
        masked: Vec<bool>,
    }

    impl Reply for FirstSentence {
        fn reply(&mut self, prompt: &Prompt) -> String {
            let text = prompt.segments.concat();
            self.prompts.push(text.clone());
            let masked = prompt.source.and_then(|source| source.no_copy_tokens);
            self.masked.push(masked == Some(MERGE_NO_COPY_TOKENS));
            let merged = text.split("\n\n").nth(1).unwrap_or_default();
            match self.copies_unless_masked && masked.is_none() {
                true => merged.trim().to_string(),
                false => {
                    let first = split_sentences(merged)[0].clone();
                    match words(&first) > WORDS_PER_MERGED_SENTENCE {
                        true => {
                            let kept: Vec<&str> = first
                                .split_whitespace()
                                .take(WORDS_PER_MERGED_SENTENCE)
                                .collect();
                            format!("{}.", kept.join(" "))
                        }
                        false => first,
                    }
                }
            }
        }
    }

    #[test]
    fn condensing_merges_runs_of_sentences_from_first_to_last() {
        let notes: Vec<String> = (1..=12)
            .map(|i| format!("Note {i} tells of one event in about ten words."))
            .collect();
        let mut llm = Fake(FirstSentence::default());
        // 120 words of notes to 50: two runs of six, each merged into one.
        let condensed = condense(&mut llm, &notes, 50).unwrap();
        assert_eq!(llm.0.prompts.len(), 2);
        assert!(llm.0.prompts[0].starts_with("Summarize in one sentence of at most 25 words"));
        assert!(
            llm.0.prompts[0].contains("Note 1 tells") && llm.0.prompts[0].contains("Note 6 tells")
        );
        assert!(
            llm.0.prompts[1].contains("Note 7 tells") && llm.0.prompts[1].contains("Note 12 tells")
        );
        assert_eq!(
            condensed.text,
            "Note 1 tells of one event in about ten words. Note 7 tells of one event in about ten words."
        );
        assert_eq!(condensed.calls.len(), 2);
    }

    #[test]
    fn a_merge_written_out_unchanged_is_asked_again_without_copying() {
        let notes: Vec<String> = (1..=12)
            .map(|i| format!("Note {i} tells of one event in about ten words."))
            .collect();
        let mut llm = Fake(FirstSentence {
            copies_unless_masked: true,
            ..FirstSentence::default()
        });
        let condensed = condense(&mut llm, &notes, 50).unwrap();
        // Two merges copied out, then the same two with copying masked.
        assert_eq!(llm.0.masked, [false, false, true, true]);
        assert_eq!(llm.0.prompts[0], llm.0.prompts[2]);
        assert_eq!(condensed.calls.len(), 4);
        assert_eq!(words(&condensed.text), 20);
    }

    #[test]
    fn long_notes_are_merged_a_few_sentences_at_a_time() {
        let notes: Vec<String> = (1..=40)
            .map(|i| format!("Note {i} tells of one event in about ten words."))
            .collect();
        let mut llm = Fake(FirstSentence::default());
        // 400 words to 50: not two runs of twenty notes but eight of five,
        // then the eight merged sentences in two runs of four.
        let condensed = condense(&mut llm, &notes, 50).unwrap();
        assert_eq!(llm.0.prompts.len(), 10);
        assert!(llm.0.prompts[0].contains("Note 5 tells") && !llm.0.prompts[0].contains("Note 6 "));
        assert_eq!(words(&condensed.text), 20);
    }

    #[test]
    fn a_long_sentence_standing_alone_is_shortened_too() {
        let long = format!("The long note {}ends here.", "goes on ".repeat(28));
        let notes = vec![
            long.clone(),
            "A short note follows it here.".to_string(),
            "Another short note ends the list.".to_string(),
        ];
        let mut llm = Fake(FirstSentence::default());
        // 70 words to 30: the 58-word note is a run of its own.
        let condensed = condense(&mut llm, &notes, 30).unwrap();
        assert!(llm.0.prompts[0].contains(&long) && !llm.0.prompts[0].contains("short"));
        assert!(
            words(&condensed.text) as f64 <= 30.0 * SLACK,
            "{}",
            condensed.text
        );
    }

    #[test]
    fn a_note_without_a_closing_mark_or_with_a_title_is_merged_as_one_sentence() {
        let notes: Vec<String> = ["Ada: the keeper", "", "Mr. Jory Vass: the inspector"]
            .iter()
            .map(|note| note.to_string())
            .chain((1..=12).map(|i| format!("Note {i} tells of one event in about ten words.")))
            .collect();
        let mut llm = Fake(FirstSentence::default());
        condense(&mut llm, &notes, 50).unwrap();
        assert!(
            llm.0.prompts[0]
                .contains("\n\nAda: the keeper. Mr. Jory Vass: the inspector. Note 1 tells"),
            "{}",
            llm.0.prompts[0]
        );
    }

    #[test]
    fn text_within_its_target_is_left_as_written() {
        let mut llm = Fake(FirstSentence::default());
        let text = "1. Keep tools dull.\n2. Jam the locks.";
        assert_eq!(to_length(&mut llm, text, 120).unwrap().text, text);
        assert!(llm.0.prompts.is_empty());
    }

    #[test]
    fn an_answer_cut_mid_sentence_loses_the_fragment_and_keeps_list_items() {
        let cut = "The creature wakes. He flees the room, and the author feels a sense";
        assert_eq!(without_unfinished_sentence(cut), "The creature wakes.");
        let list = "1. Keep tools dull.\n2. Jam the locks";
        assert_eq!(without_unfinished_sentence(list), list);
        let quoted = "He said so. \u{201c}Go.\u{201d}";
        assert_eq!(without_unfinished_sentence(quoted), quoted);
        assert_eq!(
            without_unfinished_sentence("no stop at all"),
            "no stop at all"
        );
        let mut llm = Fake(FirstSentence::default());
        assert_eq!(
            to_length(&mut llm, cut, 120).unwrap().text,
            "The creature wakes."
        );
    }

    #[test]
    fn a_merge_loses_its_bold_marks() {
        struct Bolded;
        impl Reply for Bolded {
            fn reply(&mut self, _: &Prompt) -> String {
                "**Switchboard Disruption**: Exchange wires.".to_string()
            }
        }
        let mut llm = Fake(Bolded);
        let notes: Vec<String> = (1..=12)
            .map(|i| format!("Note {i} tells of one event in about ten words."))
            .collect();
        let condensed = condense(&mut llm, &notes, 50).unwrap();
        assert!(!condensed.text.contains('*'), "{}", condensed.text);
        assert!(condensed
            .text
            .contains("Switchboard Disruption: Exchange wires."));
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
