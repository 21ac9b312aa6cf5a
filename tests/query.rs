//! `prism query`'s machinery on a source tree: the tree read as one
//! document with a header per file, PRISM asked a query instead of a
//! summary, and the answer scored as the code-retrieval benchmark scores it.
//! The model is a stand-in that notes a function only when the chunk in
//! front of it defines the one the query describes, and answers with the
//! first name in the memory it is shown, so the test checks that what a
//! chunk held reaches the final answer through the memory alone.

use crate::common::scripted_files;
use prism::bench::code_retrieval::{defined_functions, query, score};
use prism::chunk::split;
use prism::document::{read_sources, MAX_DOCUMENT_BYTES};
use prism::engine::Usage;
use prism::llm::remote::CacheFigures;
use prism::llm::{
    complete_in_turn_checking_after, Completion, Llm, ModelInfo, Prompt, Request, TokenCounter,
};
use prism::memory::shipped;
use prism::methods::prism::{MemoryMode, PrismConfig};
use prism::methods::{AnswerForm, MethodSpec};
use prism::run::dir::RunDir;
use prism::run::{NoProgress, Outcome};
use std::path::PathBuf;

const PLANTED: &str = "parse_duration";

/// Notes the planted function when a revision prompt's chunk defines it;
/// answers a query prompt with the first key of the memory it shows.
#[derive(Default)]
struct ReadingLlm {
    prompts: Vec<Prompt>,
}

impl ReadingLlm {
    fn reply(&mut self, prompt: &Prompt) -> prism::Result<Completion> {
        let text: String = prompt.segments.concat();
        let reply = if text.contains("Revisions:\n") {
            let chunk = text.rsplit("Text (chunk").next().unwrap_or_default();
            match chunk.contains(&format!("def {PLANTED}(")) {
                true => format!(
                    r#"{{"op": "add", "path": "$.'{PLANTED}'", "value": {{"purpose": "reads how long something lasts from what a person typed", "input": "one string argument", "output": "a float total", "procedure": "sums every amount times what its unit letter is worth"}}}}"#
                ),
                false => String::new(),
            }
        } else {
            let notes = text.split("Question:").next().unwrap_or_default();
            let first_key = notes.split('"').nth(1).unwrap_or("nothing");
            format!("The function is `{first_key}`.")
        };
        self.prompts.push(prompt.clone());
        let prompt_tokens = Words.prompt_tokens(prompt)?;
        Ok(Completion {
            usage: Usage {
                prompt_tokens,
                output_tokens: reply.chars().count(),
                ..Usage::default()
            },
            text: reply,
        })
    }
}

impl Llm for ReadingLlm {
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> prism::Result<Vec<Completion>> {
        complete_in_turn_checking_after(requests, done, |request| self.reply(request.prompt))
    }

    fn info(&self) -> ModelInfo<'_> {
        ModelInfo {
            context_tokens: 100_000,
            concurrency: 1,
            cache_figures: CacheFigures::Measured,
            counter: &Words,
        }
    }
}

/// Tokens counted as words, system turn included.
struct Words;

impl TokenCounter for Words {
    fn count_tokens(&self, text: &str) -> prism::Result<usize> {
        Ok(text.split_whitespace().count())
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> prism::Result<usize> {
        let system = prompt.system.iter();
        let words = system
            .chain(&prompt.segments)
            .map(|s| s.split_whitespace().count());
        Ok(words.sum())
    }
}

#[test]
fn a_query_over_a_source_tree_finds_the_function_a_later_chunk_defines() {
    let tree = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/code-package"
    ));
    let text = read_sources(&[tree], MAX_DOCUMENT_BYTES).unwrap();
    assert!(
        text.starts_with("=== File: durations/__init__.py ===\n"),
        "{text}"
    );
    let words = |piece: &str| piece.split_whitespace().count();
    // parse.py, which defines the function, is 264 words with its header,
    // and the two files before it 165 together.
    let chunks = split(&text, 300, &words).unwrap();
    assert_eq!(chunks.len(), 2);
    let defining = chunks
        .iter()
        .position(|chunk| chunk.text.contains(&format!("def {PLANTED}(")))
        .unwrap();
    assert!(
        defining > 0,
        "the planted function is not in the first chunk"
    );
    // Chunks cut before a file header where they can: the one that defines
    // the function holds its whole file.
    assert!(chunks[defining]
        .text
        .starts_with("=== File: durations/parse.py ===\n"));

    let config = PrismConfig {
        memory: MemoryMode::Amendments,
        updates: false,
        query: "Summarize.".into(),
        revision_tokens: 200,
        answer_tokens: 20,
        summary_words: None,
        constrained: false,
        reading: prism::methods::prism::Reading::Summary,
        answer_form: AnswerForm::Summary,
    };
    let summarizing = MethodSpec::Prism {
        config,
        schema: serde_json::from_str(shipped::text("code").unwrap()).unwrap(),
    };
    let description = "Turn a text such as 3h 20m into a number of seconds.";
    let spec = summarizing.answering(&query(description)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let run_dir = RunDir::create(dir.path()).unwrap();
    let mut llm = ReadingLlm::default();
    let files = scripted_files(&run_dir, false, None);
    let outcome = spec
        .run(&mut llm, &chunks, &files, &mut NoProgress)
        .unwrap();
    let Outcome::Finished { summary, .. } = outcome else {
        panic!("the run should finish");
    };

    // The query, not a summary request, guided every revision step.
    let revision = llm.prompts[0].segments.concat();
    assert!(revision.contains(description), "{revision}");
    assert!(!revision.contains("Summarize."), "{revision}");
    // The final answer saw the memory, and only the memory, of the document.
    let last = llm.prompts.last().unwrap().segments.concat();
    assert!(last.contains(&format!("\"{PLANTED}\"")), "{last}");
    assert!(
        !last.contains("def "),
        "no code in the answer prompt: {last}"
    );
    let verdict = score(&summary, PLANTED, &defined_functions(&text));
    assert_eq!(verdict.retrieved.as_deref(), Some(PLANTED), "{summary}");
    assert!(verdict.correct);
    let memory: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(RunDir::MEMORY)).unwrap())
            .unwrap();
    assert!(memory.get(PLANTED).is_some(), "{memory}");
}

#[test]
fn only_prism_and_whole_answer_a_query() {
    let whole = MethodSpec::Whole {
        config: prism::methods::whole::WholeConfig {
            query: "Summarize.".into(),
            answer_tokens: 10,
            summary_words: None,
            answer_form: AnswerForm::Summary,
        },
    };
    assert!(whole.answering("Which function?").is_some());
    let hierarchical = MethodSpec::Hierarchical {
        config: prism::methods::hierarchical::HierarchicalConfig {
            query: "Summarize.".into(),
            max_summary_tokens: 100,
            summary_words: None,
        },
    };
    assert!(hierarchical.answering("Which function?").is_none());
}
