//! How PRISM reads a chunk before it revises the memory: a plain summary of
//! each piece of it, and a list of the people it names.

use super::prompt::PEOPLE_EXAMPLE_WHO;
use super::Prism;
use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::Llm;
use crate::memory::{render_revision, JsonPath, Revision};
use crate::methods::baseline::Call;
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
/// for again with fewer sentences. The people the chunk names are listed in
/// a call of their own.
pub(super) fn summarize(llm: &mut dyn Llm, chunk: &Chunk) -> Result<ChunkSummary> {
    let words = |text: &str| text.split_whitespace().count();
    let mut summary = ChunkSummary {
        text: String::new(),
        people: Vec::new(),
        calls: Vec::new(),
    };
    for piece in crate::chunk::split(&chunk.text, WORDS_PER_SUMMARY, &words)? {
        let text = DocumentWords::new(&piece.text);
        let mut sentences = (words(&piece.text) / WORDS_PER_SENTENCE).clamp(2, 5);
        for attempt in 1..=SUMMARY_ATTEMPTS {
            let prompt = Prism::summary_prompt(&piece, sentences);
            let call = Call::run(llm, &prompt, (sentences + 2) * TOKENS_PER_SENTENCE)?;
            let written = call.summary().to_string();
            let copied = text.copying(&[&written]).copied_8gram_share;
            summary.calls.push(call);
            if copied < COPIED_SUMMARY || attempt == SUMMARY_ATTEMPTS || sentences == 1 {
                if !summary.text.is_empty() {
                    summary.text.push(' ');
                }
                summary.text.push_str(&written);
                break;
            }
            sentences = (sentences / 2).max(1);
        }
    }
    let call = Call::run(llm, &Prism::people_prompt(chunk), PEOPLE_TOKENS)?;
    summary.people = people_listed(call.summary(), &chunk.text);
    summary.calls.push(call);
    Ok(summary)
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
