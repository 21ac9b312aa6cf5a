//! How PRISM reads a chunk before it revises the memory: a plain summary of
//! each piece of it, and a list of the people it names.

use super::prompt::{
    third_person_request, PEOPLE_EXAMPLE_WHO, SHORTER_REQUEST, SUMMARY_SYSTEM, UNNAMED_WRITER,
};
use super::Prism;
use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::{Llm, Prompt, Source};
use crate::memory::screen::speaks_in_first_person;
use crate::memory::Screen;
use crate::memory::{render_revision, JsonPath, Revision};
use crate::methods::baseline::Call;
use crate::methods::length::{words, MERGE_NO_COPY_TOKENS};
use crate::metrics::copying::DocumentWords;

/// The most words of a chunk one summary call reads. Qwen2.5-Coder-1.5B
/// summarizes a few hundred words in a few sentences; asked for more
/// sentences of a longer text, it copied the text out (see
/// [`COPIED_SUMMARY`]).
const WORDS_PER_SUMMARY: usize = 300;
/// Words of text per sentence of its summary.
const WORDS_PER_SENTENCE: usize = 100;
/// Tokens a summary may spend per sentence asked for.
const TOKENS_PER_SENTENCE: usize = 50;
/// A summary with this share of its word 8-grams found in the text it
/// summarizes is that text copied out, and is asked for again, shorter:
/// asked for four to six sentences of the 640-word sample,
/// Qwen2.5-Coder-1.5B summarized it; asked for six to eight, it copied the
/// sample out whole.
const COPIED_SUMMARY: f64 = 0.3;
/// Summaries of one piece asked for before the last one is kept.
const SUMMARY_ATTEMPTS: usize = 3;

/// The summary of a chunk and the calls that wrote it.
pub(super) struct ChunkSummary {
    pub(super) text: String,
    /// Who the chunk names, and who they are.
    pub(super) people: Vec<(String, String)>,
    pub(super) calls: Vec<Call>,
}

/// Summarize `chunk` piece by piece, pieces of at most [`WORDS_PER_SUMMARY`]
/// words ending at paragraph or sentence ends, each in a few sentences. A
/// piece's summary that copies the piece out ([`COPIED_SUMMARY`]) is asked
/// for again with fewer sentences, and the least copied of its summaries is
/// kept: asked for fewer, Qwen2.5-Coder-1.5B copied more. The people the
/// chunk names are listed in a call of their own, and then each sentence
/// of the summary is brought into the form a note must take
/// ([`in_own_words`]).
pub(super) fn summarize(llm: &mut dyn Llm, chunk: &Chunk) -> Result<ChunkSummary> {
    let mut summary = ChunkSummary {
        text: String::new(),
        people: Vec::new(),
        calls: Vec::new(),
    };
    for piece in crate::chunk::split(&chunk.text, WORDS_PER_SUMMARY, &words)? {
        let text = DocumentWords::new(&piece.text);
        let mut sentences = (words(&piece.text) / WORDS_PER_SENTENCE).clamp(2, 5);
        let mut least_copied: Option<(f64, String)> = None;
        for attempt in 1..=SUMMARY_ATTEMPTS {
            let prompt = Prism::summary_prompt(&piece, sentences);
            let call = Call::run(llm, &prompt, (sentences + 2) * TOKENS_PER_SENTENCE)?;
            let written = call.summary().to_string();
            let copied = text.copying(&[&written]).copied_8gram_share;
            summary.calls.push(call);
            if least_copied
                .as_ref()
                .is_none_or(|(least, _)| copied < *least)
            {
                least_copied = Some((copied, written));
            }
            if copied < COPIED_SUMMARY || attempt == SUMMARY_ATTEMPTS || sentences == 1 {
                break;
            }
            sentences = (sentences / 2).max(1);
        }
        if let Some((_, written)) = least_copied {
            if !summary.text.is_empty() {
                summary.text.push(' ');
            }
            summary.text.push_str(&written);
        }
    }
    let call = Call::run(llm, &Prism::people_prompt(chunk), PEOPLE_TOKENS)?;
    summary.people = people_listed(call.summary(), &chunk.text);
    summary.calls.push(call);
    let writer = writer(&summary.people).unwrap_or(UNNAMED_WRITER);
    let copies = Screen::new([]).with_source(&chunk.text, None);
    let mut told = Vec::new();
    for sentence in crate::sentences::split_sentences(&summary.text) {
        if let Some(sentence) = in_own_words(llm, sentence, writer, &copies, &mut summary.calls)? {
            told.push(sentence);
        }
    }
    summary.text = told.join(" ");
    Ok(summary)
}

/// `sentence` of a piece's summary as a note can take it: in the third
/// person, with "I" as `writer`, and copying no run of the chunk that
/// `copies` refuses. A sentence that is neither is kept as it is; one that
/// is rewritten and still speaks as "I" or copies the chunk is left out,
/// since the revision step would refuse its note and, refused, write it
/// again until it stopped.
fn in_own_words(
    llm: &mut dyn Llm,
    mut sentence: String,
    writer: &str,
    copies: &Screen,
    calls: &mut Vec<Call>,
) -> Result<Option<String>> {
    if speaks_in_first_person(&sentence) {
        let request = third_person_request(writer);
        match rewrite(llm, &request, &sentence, None, calls)? {
            Some(rewritten) => sentence = rewritten,
            None => return Ok(None),
        }
    }
    for no_copy_tokens in [None, Some(MERGE_NO_COPY_TOKENS)] {
        if !copies.copies_source(&sentence) {
            return Ok(Some(sentence));
        }
        if let Some(shorter) = rewrite(llm, SHORTER_REQUEST, &sentence, no_copy_tokens, calls)?
            .filter(|shorter| words(shorter) <= words(&sentence))
        {
            sentence = shorter;
        }
    }
    Ok((!copies.copies_source(&sentence)).then_some(sentence))
}

/// `sentence` rewritten as `request` asks, copying no run of
/// `no_copy_tokens` tokens of it when given; `None` when the answer is
/// empty, speaks in the first person, or runs on past one sentence.
fn rewrite(
    llm: &mut dyn Llm,
    request: &str,
    sentence: &str,
    no_copy_tokens: Option<usize>,
    calls: &mut Vec<Call>,
) -> Result<Option<String>> {
    let prompt = Prompt {
        system: Some(SUMMARY_SYSTEM.to_string()),
        segments: vec![request.to_string(), format!("{sentence}\n")],
        source: Some(Source {
            segment: 1,
            no_copy_tokens,
        }),
        shared_segments: Some(1),
    };
    let budget = words(sentence) * TOKENS_PER_REWRITTEN_WORD + REWRITE_SPARE_TOKENS;
    let call = Call::run(llm, &prompt, budget)?;
    let rewritten = call
        .summary()
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    calls.push(call);
    let kept = !rewritten.is_empty()
        && !speaks_in_first_person(&rewritten)
        && words(&rewritten) <= 2 * words(sentence) + REWRITE_SPARE_WORDS;
    Ok(kept.then_some(rewritten))
}

/// Tokens a rewritten sentence may spend per word of the sentence, and a
/// few more for the names that replace "I" and "we".
const TOKENS_PER_REWRITTEN_WORD: usize = 3;
const REWRITE_SPARE_TOKENS: usize = 20;
/// Words a rewritten sentence may add beyond twice its own: more is the
/// model going on past the sentence, and the answer is not used.
const REWRITE_SPARE_WORDS: usize = 10;

/// The person a people list gives as the text's writer ("- Ada Penhallow:
/// the writer"), as the people request asks for one who says "I". An
/// "author" is not taken: on the opening letter of Frankenstein the
/// 1.5B model listed the novel's author from its title page as "the
/// author", while the "I" of the letter is Walton, who writes it.
fn writer(people: &[(String, String)]) -> Option<&str> {
    people
        .iter()
        .find(|(_, who)| {
            let who = who.to_lowercase();
            who.contains("writer") || who.contains("narrator")
        })
        .map(|(name, _)| name.as_str())
}

/// Tokens the list of a chunk's people may spend.
const PEOPLE_TOKENS: usize = 200;

/// The people a list names and who each is, from its lines of the form
/// "- Name: who", each name once. Asked for the people of a manual, the
/// 1.5B model also listed its date ("17 January 1944") and its status
/// ("(Provisional)"): a name starts with a capital letter, holds no digit
/// and is a few words long. Asked for the people of a play's cast list, it
/// gave one of them the request's own example ("the ship's cook"), which is
/// refused where `text` does not say it. Names in
/// capitals, as plays print their speakers, are written as names.
pub(super) fn people_listed(list: &str, text: &str) -> Vec<(String, String)> {
    const MAX_NAME_WORDS: usize = 6;
    let mut names = std::collections::HashSet::new();
    list.lines()
        .filter_map(|line| {
            let (name, who) = line.trim().strip_prefix("- ")?.split_once(':')?;
            let (name, who) = (name.trim(), who.trim());
            let named = name.starts_with(char::is_uppercase)
                && !name.contains(|c: char| c.is_ascii_digit())
                && name.split_whitespace().count() <= MAX_NAME_WORDS
                && !who.is_empty()
                && !is_the_requests_example(who, text);
            (named && names.insert(name.to_lowercase())).then(|| (as_name(name), who.to_string()))
        })
        .collect()
}

/// Whether `who` is the people request's example, which `text` does not hold.
fn is_the_requests_example(who: &str, text: &str) -> bool {
    who.trim_end_matches('.')
        .eq_ignore_ascii_case(PEOPLE_EXAMPLE_WHO)
        && !text.to_lowercase().contains(PEOPLE_EXAMPLE_WHO)
}

/// `name` as a name is written: "TOUCHSTONE" as "Touchstone", anything
/// with a small letter as it is.
fn as_name(name: &str) -> String {
    if name.chars().any(char::is_lowercase) {
        return name.to_string();
    }
    name.split(' ')
        .map(|word| {
            let mut letters = word.chars();
            letters.next().map_or_else(String::new, |first| {
                first.to_string() + &letters.as_str().to_lowercase()
            })
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Revision lines that add each of `people` to the memory's `people`, as
/// the examples show a person noted. The model, shown the list and asked
/// for revisions, filed every name under one key called `name`; written
/// here, each person gets an entry of their own, screened and checked
/// against the schema like any revision (a schema without `people` refuses
/// them).
pub(super) fn people_revisions(people: &[(String, String)]) -> String {
    people
        .iter()
        .map(|(name, who)| {
            let path = JsonPath::root().key("people").key(name.as_str());
            render_revision(&Revision::add(path, serde_json::json!([who])))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::prompt::PEOPLE_REQUEST;
    use super::*;
    use crate::llm::fake::{Fake, Reply};

    /// A model that rewrites as asked: in the third person it puts the
    /// writer named in the request for "I" (or, while `stays_in_first_person`,
    /// writes the sentence back unchanged); in fewer words it keeps the
    /// sentence's first five words.
    #[derive(Default)]
    struct Rewriter {
        requests: Vec<String>,
        stays_in_first_person: bool,
    }

    impl Reply for Rewriter {
        fn reply(&mut self, prompt: &Prompt) -> String {
            let (request, sentence) = (&prompt.segments[0], prompt.segments[1].trim());
            self.requests.push(request.clone());
            if !request.starts_with("Write the following sentence again") {
                let first: Vec<&str> = sentence.split_whitespace().take(5).collect();
                return format!("{}.", first.join(" "));
            }
            let named = request.split(" mean ").nth(1).unwrap_or_default();
            let writer = named.split(',').next().unwrap_or_default();
            match self.stays_in_first_person {
                true => sentence.to_string(),
                false => sentence.replace(" I ", &format!(" {writer} ")),
            }
        }
    }

    const CHUNK: &str = "A gale from the south-west drove the swell over the landing stage and tore away the lower rungs of the ladder.";

    fn told(llm: &mut Fake<Rewriter>, sentence: &str) -> Option<String> {
        let copies = Screen::new([]).with_source(CHUNK, None);
        let mut calls = Vec::new();
        let told = in_own_words(
            llm,
            sentence.to_string(),
            "Ada Penhallow",
            &copies,
            &mut calls,
        );
        assert_eq!(calls.len(), llm.0.requests.len());
        told.unwrap()
    }

    #[test]
    fn a_sentence_in_the_third_person_in_its_own_words_is_kept_without_a_call() {
        let mut llm = Fake(Rewriter::default());
        let sentence = "A storm broke the ladder.";
        assert_eq!(told(&mut llm, sentence).as_deref(), Some(sentence));
        assert!(llm.0.requests.is_empty());
    }

    #[test]
    fn a_sentence_told_as_i_is_told_again_with_the_writer_named() {
        let mut llm = Fake(Rewriter::default());
        let told = told(&mut llm, "Tomas and I mended the pane.");
        assert_eq!(
            told.as_deref(),
            Some("Tomas and Ada Penhallow mended the pane.")
        );
        assert_eq!(llm.0.requests.len(), 1);
    }

    #[test]
    fn a_sentence_still_told_as_i_after_its_rewrite_is_left_out() {
        let mut llm = Fake(Rewriter {
            stays_in_first_person: true,
            ..Rewriter::default()
        });
        assert_eq!(told(&mut llm, "Tomas and I mended the pane."), None);
    }

    #[test]
    fn a_sentence_that_copies_the_chunk_is_said_again_in_fewer_words() {
        let mut llm = Fake(Rewriter::default());
        let copied = format!("On Friday {}", CHUNK.to_lowercase());
        assert_eq!(
            told(&mut llm, &copied).as_deref(),
            Some("On Friday a gale from.")
        );
        assert_eq!(llm.0.requests, [SHORTER_REQUEST]);
    }

    #[test]
    fn the_writer_is_the_person_the_people_list_calls_so() {
        let people = [
            ("Tomas Reddick".to_string(), "the assistant".to_string()),
            (
                "Ada Penhallow".to_string(),
                "the writer of the log".to_string(),
            ),
        ];
        assert_eq!(writer(&people), Some("Ada Penhallow"));
        assert_eq!(writer(&people[..1]), None);
        let novel = [(
            "Mary Wollstonecraft Shelley".to_string(),
            "the author".to_string(),
        )];
        assert_eq!(writer(&novel), None);
    }

    #[test]
    fn a_people_list_becomes_one_revision_per_person() {
        let list = "Here they are:\n- Ada Penhallow: the writer\n- Tomas: \n- Wenna Cole: a skipper\n- Ada Penhallow: the keeper\n- Liam O'Neill: a pilot\nnot a line: at all\n- 17 January 1944: the date\n- (Provisional): the status\n- lowercase name: someone";
        let people = people_listed(list, "");
        assert_eq!(people.len(), 3, "{people:?}");
        let revisions = crate::memory::parse_revisions(&people_revisions(&people));
        let paths: Vec<String> = revisions
            .into_iter()
            .map(|revision| revision.unwrap().path.to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "$.people.'Ada Penhallow'",
                "$.people.'Wenna Cole'",
                "$.people.'Liam O\\'Neill'"
            ]
        );
    }

    #[test]
    fn a_cast_list_gives_names_not_capitals_and_not_the_requests_example() {
        let text = "TOUCHSTONE\ta clown.\nJAQUES\tlords attending on the banished duke.";
        let list = "- TOUCHSTONE: a clown.\n- JAQUES: the ship's cook.\n- Le Beau: a courtier";
        assert_eq!(
            people_listed(list, text),
            [
                ("Touchstone".to_string(), "a clown.".to_string()),
                ("Le Beau".to_string(), "a courtier".to_string()),
            ]
        );
        assert!(PEOPLE_REQUEST.contains(PEOPLE_EXAMPLE_WHO));
        // The same words are a description where the text holds them.
        let aboard = "The ship's cook, Jaques, served the soup.";
        assert_eq!(people_listed("- Jaques: the ship's cook", aboard).len(), 1);
    }
}
