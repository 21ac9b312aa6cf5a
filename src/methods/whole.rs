//! The whole document summarized in one call: the reference every chunked method is
//! judged against. A document that does not fit is refused, never cut.

use super::baseline::{Call, SYSTEM};
use super::length::{target_words, to_length, tokens_for, words};
use super::AnswerForm;
use crate::chunk::Chunk;
use crate::error::{Error, Result};
use crate::llm::{Llm, Prompt, Source};
use crate::run::{prompt_texts, Advance, Finish, Method, NoFigures, Position};

/// Settings of one whole-document run; everything here is part of a run's identity.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WholeConfig {
    pub query: String,
    /// The most tokens of a direct answer.
    pub answer_tokens: usize,
    /// The summary's length in words; by default it scales with the document
    /// ([`target_words`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_words: Option<usize>,
    /// A summary, or the query answered directly.
    #[serde(default, skip_serializing_if = "AnswerForm::is_summary")]
    pub answer_form: AnswerForm,
}

/// Everything a run carries; saved in checkpoints.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WholeState {
    /// The summary, once the call is made.
    pub summary: Option<String>,
    /// Whether a summary well short of its target was asked for again at length.
    #[serde(default)]
    pub lengthened: bool,
}

/// The one call, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// The chunks the document was split into, all of them in the prompt.
    pub chunks: usize,
    #[serde(flatten)]
    pub call: Call,
}

/// The system turn of a direct answer: the summaries' turn would ask for prose.
const QUERY_SYSTEM: &str = "You answer questions about a document exactly and briefly.";

/// A summary shorter than this share of its target is asked for again at
/// length. Asked for 150 words of a play's first act, Qwen2.5-Coder-1.5B
/// wrote 79, and for 514 it wrote 102; a method that answers in half its
/// target cannot be compared with one that meets it.
const SHORT_SHARE: f64 = 0.6;

/// One call over the whole document.
pub struct Whole<'a> {
    config: &'a WholeConfig,
}

impl<'a> Whole<'a> {
    pub fn new(config: &'a WholeConfig) -> Self {
        Whole { config }
    }

    /// The most tokens the call may write.
    fn answer_tokens(&self, chunks: &[Chunk]) -> usize {
        match self.config.answer_form {
            AnswerForm::Summary => tokens_for(target_words(self.config.summary_words, chunks)),
            AnswerForm::Direct => self.config.answer_tokens,
        }
    }

    /// The prompt that asks again, at length, for a `summary` well short of
    /// its target: the first prompt, so the document is a cached prefix,
    /// with the short summary and the request to write it out fully.
    pub fn lengthen_prompt(&self, chunks: &[Chunk], summary: &str) -> Prompt {
        let target = target_words(self.config.summary_words, chunks);
        let mut prompt = self.prompt(chunks);
        prompt.segments.push(format!(
            "\n\nA first summary, of {} words:\n{}\n\nIt is too short. Write the summary again in about {target} words: keep what it says, and add the events, the people and the outcomes it leaves out. Output only the summary.",
            words(summary),
            summary.trim()
        ));
        prompt
    }

    /// The prompt that summarizes the document of `chunks`: the document
    /// (the chunks' texts in order, a blank line between two), then the query.
    pub fn prompt(&self, chunks: &[Chunk]) -> Prompt {
        let document: Vec<&str> = chunks.iter().map(|chunk| chunk.text.trim()).collect();
        let (system, request) = match self.config.answer_form {
            AnswerForm::Summary => (
                SYSTEM,
                format!(
                    "\n## Request\n{}\nWrite the summary in plain prose, in your own words, in about {} words. Output only the summary.",
                    self.config.query,
                    target_words(self.config.summary_words, chunks)
                ),
            ),
            AnswerForm::Direct => (
                QUERY_SYSTEM,
                format!("\n## Question\n{}\n", self.config.query),
            ),
        };
        Prompt {
            system: Some(system.to_string()),
            segments: vec![
                "## Document\n".to_string(),
                format!("{}\n", document.join("\n\n")),
                request,
            ],
            source: (self.config.answer_form == AnswerForm::Summary).then_some(Source::segment(1)),
            shared_segments: None,
        }
    }
}

impl Method for Whole<'_> {
    type State = WholeState;
    type Step = Step;
    type Figures = NoFigures;

    fn label(&self) -> String {
        "whole".to_string()
    }

    fn template_texts(&self) -> Vec<String> {
        prompt_texts(&[self.prompt(&[]), self.lengthen_prompt(&[], "")])
    }

    fn start(&self, _chunks: &[Chunk]) -> WholeState {
        WholeState::default()
    }

    fn position(&self, state: &WholeState, _chunks: &[Chunk]) -> Position {
        let done = usize::from(state.summary.is_some());
        Position {
            done,
            total: 1,
            stage: if done == 0 {
                "whole document".to_string()
            } else {
                "final summary".to_string()
            },
        }
    }

    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut WholeState,
        chunks: &[Chunk],
    ) -> Result<Advance<Step>> {
        if let Some(summary) = &state.summary {
            if self.config.answer_form == AnswerForm::Direct {
                return Ok(Advance::Done(Finish {
                    summary: summary.clone(),
                    ..Finish::default()
                }));
            }
            let target = target_words(self.config.summary_words, chunks);
            if !state.lengthened && (words(summary) as f64) < target as f64 * SHORT_SHARE {
                // Built only when needed: the prompt holds a copy of the whole document.
                let lengthen = self.lengthen_prompt(chunks, summary);
                let answer_tokens = self.answer_tokens(chunks);
                if llm.prompt_tokens(&lengthen)? + answer_tokens <= llm.context_tokens() {
                    let call = Call::run(llm, &lengthen, answer_tokens)?;
                    if words(call.summary()) > words(summary) {
                        state.summary = Some(call.summary().to_string());
                    }
                    state.lengthened = true;
                    return Ok(Advance::Step(Step {
                        chunks: chunks.len(),
                        call,
                    }));
                }
            }
            return Ok(Advance::Done(Finish {
                summary: to_length(llm, summary, target)?.text,
                summary_words_target: Some(target),
                ..Finish::default()
            }));
        }
        let prompt = self.prompt(chunks);
        let prompt_tokens = llm.prompt_tokens(&prompt)?;
        let (answer_tokens, context) = (self.answer_tokens(chunks), llm.context_tokens());
        if prompt_tokens + answer_tokens > context {
            return Err(Error::invalid(
                "whole",
                format!(
                    "the whole document is {prompt_tokens} tokens with the prompt; with {answer_tokens} to generate it does not fit the model's context of {context} tokens: use a chunked method"
                ),
            ));
        }
        let call = Call::run(llm, &prompt, answer_tokens)?;
        state.summary = Some(call.summary().to_string());
        Ok(Advance::Step(Step {
            chunks: chunks.len(),
            call,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(index: usize, text: &str) -> Chunk {
        Chunk {
            index,
            text: text.into(),
            tokens: text.len(),
            start_byte: 0,
        }
    }

    fn config() -> WholeConfig {
        WholeConfig {
            query: "Summarize the story.".into(),
            answer_tokens: 100,
            summary_words: Some(65),
            answer_form: AnswerForm::Summary,
        }
    }

    #[test]
    fn the_document_is_every_chunk_in_order_then_the_query() {
        let config = config();
        let whole = Whole::new(&config);
        let prompt = whole.prompt(&[chunk(0, "First part.\n\n"), chunk(1, "Second part.\n")]);
        assert_eq!(prompt.segments[1], "First part.\n\nSecond part.\n");
        assert!(prompt.segments[2].contains("Summarize the story."));
        assert!(prompt.segments[2].contains("about 65 words"));
        assert_eq!(prompt.source, Some(Source::segment(1)));
    }

    #[test]
    fn its_template_has_no_document_text() {
        let config = config();
        let texts = Whole::new(&config).template_texts();
        assert_eq!(texts.len(), 4, "{texts:?}");
        assert_eq!(texts[0], SYSTEM);
        assert_eq!(texts[1], "## Document");
        assert!(texts[2].starts_with("## Request\nSummarize the story."));
        assert!(texts[3].starts_with("A first summary, of 0 words:"));
    }
}
