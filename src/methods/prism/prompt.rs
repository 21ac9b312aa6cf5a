//! The words of PRISM's prompts: the task, the revision format, the rules a
//! good memory follows, and worked examples from unrelated documents.

use super::{MemoryMode, PrismConfig};
use crate::memory::render::to_line;
use crate::memory::schema::WorkedExample;
use crate::memory::Schema;

pub(super) const SYSTEM: &str = "You keep notes on a long document that you read one chunk at a time. You change your notes only by writing revision lines in the format you are shown.";

/// The fixed words of the last segment of every revision prompt.
pub(super) const REVISION_REQUEST: &str = "The memory above already holds everything before this chunk: do not write it again. Note only this chunk, in its order, from its opening words to its end, in the third person.\nRevisions:\n";

/// The last segment of a revision prompt, after the chunk (or its summary):
/// the request, anchored at the opening words of what was shown. Without the anchor, once the
/// amendments showed revision lines, Qwen2.5-Coder-1.5B wrote them out again
/// from the first one instead of noting the new chunk. The ellipsis stays
/// although the same model copies it into notes of a few words ("The
/// text…"), which are dropped (`notes::one_sentence_per_note`): with the
/// opening quoted as "the words" and no ellipsis, it noted the sample's
/// first sentence and then listed places as people, and the summary was 31
/// words.
pub(super) fn revision_request(chunk_text: &str) -> String {
    let opening: Vec<&str> = chunk_text.split_whitespace().take(8).collect();
    format!(
        "\nIt opens with \"{}…\". {REVISION_REQUEST}",
        opening.join(" ")
    )
}

/// The fixed opening of every prompt: how the task works, the rules, the
/// examples, then this run's query, schema and memory layout.
///
/// All of it comes before the memory and the chunk and never changes during a
/// run, so after the first call it is a cached prefix: the examples cost their
/// tokens once. The examples are about a town council and a software release,
/// so that nothing in them could pass for the document. A schema made for
/// another task can carry its own example, which replaces the council's (see
/// [`WorkedExample`]).
///
/// The model writes one note per line rather than lists of notes: under
/// greedy decoding Qwen2.5-Coder-1.5B, asked for a list of strings, writes
/// the document's first line over and over, while one string per line it
/// notes the text in order. The rules and examples are kept short for the
/// same reason: with three long examples of differently shaped schemas the
/// same model wrote facts about the world instead of the text.
pub(super) fn preamble(config: &PrismConfig, schema: &Schema) -> String {
    let update = if config.updates {
        "{\"op\": \"update\", \"path\": \"$.people.'Name'\", \"value\": [...]} replaces what a path holds with the whole new value you write.\n"
    } else {
        ""
    };
    let memory_form = match config.memory {
        MemoryMode::InPlace => "The memory is shown as the JSON object it is now.",
        MemoryMode::Amendments => "The memory is shown as the JSON object it was at first, then the revisions made since, one per line, oldest first: read it as the object with each line applied in turn.",
    };
    format!(
        "You read a long document one chunk at a time and keep notes on it in a memory, a JSON object. \
         After each chunk, write revisions that add to the memory what the chunk says; at the end, the memory alone must answer the query.\n\
         \n\
         Write each revision on its own line as JSON, one note per line:\n\
         {{\"op\": \"add\", \"path\": \"$.events\", \"value\": \"...\"}} appends a note to a list, or creates a path that does not exist yet.\n\
         {update}\
         \n\
         Rules:\n\
         {what_to_note}\
         3. Do not repeat a note the memory already has, and do not copy these instructions or the examples.\n\
         4. If the text adds nothing the query needs, write nothing.\n\
         \n\
         Examples from unrelated documents:\n\
         {example}\n\
         {RELEASE}\n\
         Your document.\n\
         Query: {query}\n\
         Schema:\n\
         {types}\n\
         {memory_form}\n",
        what_to_note = match schema.worked_example() {
            None => SUMMARY_NOTES,
            Some(_) => QUERY_NOTES,
        },
        example = schema
            .worked_example()
            .map_or_else(|| COUNCIL.to_string(), render_example),
        query = config.query,
        types = schema.render_types().trim_end(),
    )
}

/// The system turn of the call that summarizes a chunk on its own.
pub(super) const SUMMARY_SYSTEM: &str = "You write clear, faithful summaries in your own words.";

/// The request that opens the call summarizing one piece of a chunk, before
/// the piece, for a summary of `fewest` to `fewest + 2` sentences.
///
/// A summary reads each chunk in two calls: the first summarizes the chunk
/// alone (this request), the second notes that summary in the memory.
/// Shown the chunk itself, Qwen2.5-Coder-1.5B noted it sentence by sentence
/// in the text's own words; asked in one prompt for a gist and then notes,
/// it described the text ("the log mentions the fog") instead of telling
/// it. Asked first and plainly, it tells what happens and names who does it.
///
/// The instruction comes first: after the text, the same model described the
/// text and named no one. Its words were tried on the sample: asked also for
/// "the third person", for "what it says" or for who wrote it, the model
/// copied the text out; shown the summary of the piece before, it summarized
/// that again. Asked after the whole chunk on the revision prompt's opening
/// (instructions and memory first, so that the summary, the people list and
/// the revision call share a cached prefix), for at most 160 words, it
/// copied the sample out; with copying masked it wrote the sample out again
/// in the first person, with words run together, and the revision step that
/// read it wrote people's names from the masked text ("eau de mer Reddick").
pub(super) fn summary_request(fewest: usize) -> String {
    format!(
        "Summarize the following part of a document in {fewest} to {} sentences. \
         Tell what happens, in order, and name the people who do it. \
         Use your own words, and tell the events themselves rather than what the text mentions.\n\n",
        fewest + 2
    )
}

/// The request that opens the call listing the people of a chunk, before
/// the chunk. A summary in a few sentences leaves people out, the writer of
/// a text told as "I" first of all: asked for the summary and the people in
/// one call, Qwen2.5-Coder-1.5B copied the text out, and asked in the
/// summary's request to name the writer, it named no one. Asked on its own
/// who the people are, it lists them with who they are.
/// Who the example in [`PEOPLE_REQUEST`] is; a person described so by a
/// text that does not say it is that example copied.
pub(super) const PEOPLE_EXAMPLE_WHO: &str = "the ship's cook";

pub(super) const PEOPLE_REQUEST: &str = "Who are the people in the following text? List each one on its own line, like \"- Jane Doe: the ship's cook\", and the writer too if the text says \"I\". List only people, not places or boats.\n\n";

/// The request that opens the call rewriting one sentence of a piece's
/// summary that speaks as the text's writer ("Tomas and I took turns"),
/// before the sentence. A summary of a text told as "I" keeps its "I", and
/// the notes, which must be in the third person, cannot say who that was.
/// Asked to summarize in the third person, Qwen2.5-Coder-1.5B copied the
/// text out (see [`summary_request`]); asked to rewrite one sentence with
/// the writer named, it changes the pronouns and keeps the rest.
pub(super) fn third_person_request(writer: &str) -> String {
    format!(
        "Write the following sentence again in the third person. \
         In it, \"I\", \"me\" and \"my\" mean {writer}, and \"we\", \"us\" and \"our\" mean {writer} and the people with them. \
         Answer with the new sentence alone.\n\n"
    )
}

/// The request that opens the call rewriting one sentence of a piece's
/// summary that copies a run of the text, before the sentence. The
/// revision step notes the summary sentence by sentence, and a note that
/// copies the text is refused; Qwen2.5-Coder-1.5B, refused, wrote the same
/// note again until the step stopped, and the chunk's later events were
/// never noted. Asked to say one sentence again in fewer words, it keeps
/// the names and the facts and drops the text's turns of phrase.
pub(super) const SHORTER_REQUEST: &str = "Say the following sentence again in fewer words of your own, keeping who did what. Answer with the new sentence alone.\n\n";

/// Who "I" is in [`third_person_request`] when the people list names no writer.
pub(super) const UNNAMED_WRITER: &str = "the writer of the text";

/// The system turn of a final answer to a query (`AnswerForm::Direct`).
pub(super) const QUERY_SYSTEM: &str =
    "You answer a question about a long document from the notes you kept while reading it.";

/// The whole prompt of a direct answer: the memory, then the query.
pub(super) fn query_request(memory: &str, query: &str) -> String {
    format!("Notes kept while reading the document:\n{memory}\n\nQuestion: {query}\nAnswer from the notes alone.\n")
}

/// The whole final request when the memory holds nothing.
pub(super) const EMPTY_MEMORY: &str = "No notes were kept while reading the document: say in one sentence that it gave nothing to note.\n";

/// The first two rules, for the stock examples, which keep notes for a
/// summary.
const SUMMARY_NOTES: &str = "1. A note is one short sentence in your own words and in the third person that makes sense on its own: name who did what.\n\
     2. Note only what the text says, in its order: its main points, not every line.\n";

/// The first two rules where the schema brings an example of its own task,
/// which is about its query rather than a summary's main points. They did
/// not stop Qwen2.5-Coder-1.5B from noting module docstrings first on the
/// code-retrieval tasks (see the README's code-retrieval section).
const QUERY_NOTES: &str = "1. A note is in your own words and makes sense on its own.\n\
     2. Note only what the query needs from the text, in its order, and leave the rest out.\n";

/// A schema's own example, laid out as the stock ones are.
fn render_example(example: &WorkedExample) -> String {
    let mut text = String::new();
    if let Some(query) = &example.query {
        text.push_str(&format!("Query: {query}\n"));
    }
    text.push_str(&format!(
        "Memory so far: {}\nText:\n{}\nRevisions:\n",
        to_line(&example.memory),
        example.text.trim_end()
    ));
    for revision in &example.revisions {
        text.push_str(&to_line(revision));
        text.push('\n');
    }
    text
}

const COUNCIL: &str = r#"Schema: events: list[str]; people: dict[str, list[str]]
Memory so far: {"events": ["The council of Marrow Bay set aside 40,000 to repair the harbour wall."], "people": {}}
Text: Councillor Idris Fenn reported that the repairs would now cost 65,000, because March storms had widened the breach. The council voted five to two to borrow the difference.
Revisions:
{"op": "add", "path": "$.events", "value": "Councillor Idris Fenn reported that March storms had raised the cost of the harbour repairs to 65,000."}
{"op": "add", "path": "$.events", "value": "The council voted five to two to borrow the difference."}
{"op": "add", "path": "$.people.'Idris Fenn'", "value": ["A Marrow Bay councillor who reported on the harbour repairs."]}
"#;

const RELEASE: &str = r#"Schema: problems: list[str]
Memory so far: {"problems": ["The version 4.2 release waited on a database migration that failed on large tables."]}
Text: Appendix B lists the members of the release team with their phone numbers.
Revisions:
(nothing: this text adds nothing the query needs)
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{parse_revisions, Schema};

    fn config(updates: bool) -> PrismConfig {
        PrismConfig {
            memory: MemoryMode::Amendments,
            updates,
            query: "Summarize.".into(),
            revision_tokens: 512,
            answer_tokens: 600,
            summary_words: None,
            constrained: true,
            reading: super::super::Reading::Text,
            answer_form: crate::methods::AnswerForm::Summary,
        }
    }

    /// The lines after an example's "Revisions:".
    fn revisions_of(example: &str) -> &str {
        example.rsplit("Revisions:\n").next().unwrap()
    }

    #[test]
    fn every_example_revision_parses() {
        for (example, count) in [(COUNCIL, 3), (RELEASE, 0)] {
            let parsed = parse_revisions(revisions_of(example));
            assert_eq!(parsed.len(), count, "{example}");
            assert!(parsed.iter().all(Result::is_ok), "{parsed:?}");
        }
    }

    #[test]
    fn without_updates_no_example_shows_one() {
        let schema = Schema::from_value(&serde_json::json!({"type": "object"})).unwrap();
        let without = preamble(&config(false), &schema);
        assert!(!without.contains(r#""op": "update""#), "{without}");
        let with = preamble(&config(true), &schema);
        assert!(with.contains(r#""op": "update""#));
        assert!(with.contains(r#""op": "add""#));
    }

    #[test]
    fn a_schema_with_its_own_example_shows_it_instead_of_the_council() {
        let code = Schema::from_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/keyed-code-schema.json"
        ))
        .unwrap();
        let opening = preamble(&config(false), &code);
        assert!(!opening.contains("Marrow Bay"), "{opening}");
        assert!(opening.contains("def tokens(sentence):"), "{opening}");
        let shown = render_example(code.worked_example().unwrap());
        assert!(opening.contains(&shown));
        let parsed = parse_revisions(revisions_of(&shown));
        assert_eq!(parsed.len(), 2);
        assert!(parsed.iter().all(Result::is_ok), "{parsed:?}");
        let book = Schema::from_value(&serde_json::from_str(crate::memory::shipped::BOOK).unwrap())
            .unwrap();
        let stock = preamble(&config(false), &book);
        assert!(stock.contains(COUNCIL) && stock.contains(SUMMARY_NOTES));
        assert!(opening.contains(QUERY_NOTES) && !opening.contains(SUMMARY_NOTES));
        assert!(
            stock.contains("not every line.\n3. Do not repeat"),
            "{stock}"
        );
    }

    #[test]
    fn the_revision_request_quotes_the_chunks_opening() {
        let request =
            revision_request("On the Wednesday a fog came down so thick that the beam stopped.");
        assert!(
            request.starts_with("\nIt opens with \"On the Wednesday a fog came down so…\"."),
            "{request}"
        );
        assert!(request.ends_with("Revisions:\n"));
    }

    #[test]
    fn the_summary_request_comes_before_the_chunk_and_asks_for_sentences() {
        let request = summary_request(4);
        assert!(request.starts_with("Summarize the following part"));
        assert!(request.contains("in 4 to 6 sentences"));
        assert!(request.ends_with("\n\n"));
    }
}
