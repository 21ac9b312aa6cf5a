//! Chain of Summaries (CoS; Brach, Košťál and Galke Poech): a first summary refined
//! round by round against questions it fails, keeping the best on held-out questions.

mod questions;

use crate::chunk::Chunk;
use crate::error::{Error, Result};
use crate::llm::{Llm, Prompt};
use crate::metrics::{Ledger, Tokens};
use crate::qa::f1::mean_f1;
use crate::qa::{self, Answered, QaPair};
use crate::run::{blank_chunk, prompt_texts, Advance, Finish, Method, Position};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

/// Settings of one CoS run; everything here is part of a run's identity.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CosConfig {
    /// Question–answer pairs to generate over the whole document.
    pub qa_pairs: usize,
    /// Refinement rounds (the paper's i).
    pub iterations: usize,
    /// Failed train questions one round refines with (the paper's iq).
    pub questions_per_iteration: usize,
    /// A train question counts as failed when its answer scores below this Correct-F1.
    pub fail_f1: f64,
    /// Seed of the train/validation/test split.
    pub seed: u64,
    /// The most tokens of one summary.
    pub summary_tokens: usize,
    /// Generate pairs under a JSON Schema, so that every pair parses.
    pub constrained: bool,
}

pub use questions::{pick_failed, select, split_pairs, Part, Split};

/// Questions answered per unit of work.
const ANSWERS_PER_STEP: usize = 4;

/// A summary the run may end with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub summary: String,
    pub tokens: usize,
    /// Mean Correct-F1 on the validation questions, once answered.
    pub validation_f1: Option<f64>,
    /// Correct-F1 of each train question (in split order), once answered.
    /// Only candidates that a round refines from are asked them.
    pub train_f1s: Option<Vec<f64>>,
}

/// What refinement calls cost, to show the document's KV being reused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RefineTotals {
    pub calls: usize,
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    /// Tokens of the chunks the refinement prompts held.
    pub document_tokens: usize,
}

/// The questions, the candidates' scores and what refinement cost, as
/// `stats.json` reports them. Candidates are listed in order, s⁰ first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CosFigures {
    pub qa_pairs: usize,
    pub train_questions: usize,
    pub validation_questions: usize,
    pub test_questions: usize,
    pub validation_f1: Vec<Option<f64>>,
    pub train_f1: Vec<Option<f64>>,
    pub candidate_tokens: Vec<usize>,
    /// The candidate the run ended with.
    pub chosen: usize,
    /// The chosen candidate's mean Correct-F1 on the test questions.
    pub test_f1: Option<f64>,
    pub rounds: usize,
    pub refine_calls: usize,
    pub refine_prompt_tokens: usize,
    pub refine_reused_tokens: usize,
    pub refine_document_tokens: usize,
}

/// Everything a run carries from one unit to the next; saved in checkpoints.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CosState {
    pub units_done: usize,
    pub chunks_read: usize,
    pub pairs: Vec<QaPair>,
    /// The first summary as far as the chunks read so far.
    pub draft: String,
    /// Made once every chunk is read.
    pub split: Split,
    /// s⁰, s¹, …; empty until every chunk is read.
    pub candidates: Vec<Candidate>,
    /// Answers so far of the question set being answered.
    pub answers: Vec<Answered>,
    /// How many rounds each pair (by index) was refined with.
    pub refined_with: Vec<usize>,
    /// Mean Correct-F1 of the chosen candidate on the test questions.
    pub test_f1: Option<f64>,
    pub refine: RefineTotals,
}

/// What one unit did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub stage: String,
    #[serde(flatten)]
    pub work: Work,
    pub calls: usize,
    #[serde(flatten)]
    pub tokens: Tokens,
    pub seconds: f64,
}

/// The kind of unit and what it produced.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Work {
    /// Pairs written about one chunk, and the first summary extended by it.
    Read {
        chunk: usize,
        pairs: Vec<QaPair>,
        /// What the model wrote when asked for pairs, verbatim.
        pairs_output: String,
        summary: String,
    },
    /// Questions answered from one candidate.
    Answers {
        candidate: usize,
        part: Part,
        answers: Vec<Answered>,
    },
    /// One refinement round, writing a new candidate.
    Refine {
        candidate: usize,
        chunks: Vec<usize>,
        questions: Vec<String>,
        /// What the model wrote in each call, verbatim.
        outputs: Vec<String>,
    },
}

/// The next unit of work, as the state implies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Read(usize),
    Answer { candidate: usize, part: Part },
    Refine,
    Finish,
}

/// The Chain of Summaries loop over one document.
///
/// The paper's loop, for a document that fits the context:
///
/// 1. the model writes question–answer pairs about the document, split into
///    train, validation and test questions ([`split_pairs`]);
/// 2. it writes a first summary s⁰ (the thesis);
/// 3. for rounds k = 1..=i: it answers the train questions from s^(k-1)
///    alone; up to `iq` of those it fails (Correct-F1 below `fail_f1`, the
///    antithesis) go with the document and s^(k-1) into a refinement that
///    writes s^k;
/// 4. each candidate is scored on the validation questions, the best is
///    kept ([`select`], the synthesis) and its test-question score reported.
///
/// Our documents are longer than the context, so each step sees one chunk at
/// a time:
///
/// - the pairs are written chunk by chunk (the requested number spread over
///   the chunks), and each pair remembers its chunk;
/// - the first summary is built incrementally: each chunk's call rewrites
///   the summary so far to take in that chunk;
/// - a refinement round refines against the chunk holding each selected
///   failed question: one call per such chunk, in document order, each
///   given that chunk's questions and the summary as the previous call left
///   it. With one chunk this is exactly the paper's round.
///
/// A round with no failed train question ends the refinement early.
pub struct Cos<'a> {
    config: &'a CosConfig,
}

impl<'a> Cos<'a> {
    pub fn new(config: &'a CosConfig) -> Self {
        Cos { config }
    }

    fn next_action(&self, state: &CosState, chunks: &[Chunk]) -> Action {
        if state.chunks_read < chunks.len() {
            return Action::Read(state.chunks_read);
        }
        let Some(last) = state.candidates.len().checked_sub(1) else {
            return Action::Finish;
        };
        let candidate = &state.candidates[last];
        if !state.split.validation.is_empty() && candidate.validation_f1.is_none() {
            return Action::Answer {
                candidate: last,
                part: Part::Validation,
            };
        }
        if last < self.config.iterations && !state.split.train.is_empty() {
            match &candidate.train_f1s {
                None => {
                    return Action::Answer {
                        candidate: last,
                        part: Part::Train,
                    }
                }
                Some(f1s) if !self.failed(state, f1s).is_empty() => return Action::Refine,
                Some(_) => {}
            }
        }
        if !state.split.test.is_empty() && state.test_f1.is_none() {
            return Action::Answer {
                candidate: chosen(state),
                part: Part::Test,
            };
        }
        Action::Finish
    }

    fn failed(&self, state: &CosState, train_f1s: &[f64]) -> Vec<usize> {
        pick_failed(
            &state.split.train,
            train_f1s,
            &state.refined_with,
            self.config.fail_f1,
            self.config.questions_per_iteration,
        )
    }

    fn words(&self) -> usize {
        (self.config.summary_tokens / 2).max(10)
    }

    /// The prompt that extends the first summary, `draft` so far, with `chunk`.
    pub fn thesis_prompt(&self, chunk: &Chunk, draft: &str) -> Prompt {
        let words = self.words();
        let request = if draft.is_empty() {
            vec![format!(
                "\nSummarize this passage in at most {words} words. Write only the summary.\n"
            )]
        } else {
            vec![
                format!(
                    "\nSummary of the document before this passage:\n{}\n",
                    draft.trim()
                ),
                format!(
                    "\nRewrite the summary above so that it also covers this passage, in at most {words} words. Write only the summary.\n"
                ),
            ]
        };
        qa::passage_prompt(&chunk.text, request)
    }

    /// The prompt that refines `summary` against `chunk` to answer `questions`.
    pub fn refine_prompt(&self, chunk: &Chunk, summary: &str, questions: &[&str]) -> Prompt {
        let listed: String = questions
            .iter()
            .map(|question| format!("- {}\n", question.trim()))
            .collect();
        qa::passage_prompt(
            &chunk.text,
            vec![
                format!("\nSummary of the whole document:\n{}\n", summary.trim()),
                format!("\nQuestions the summary cannot answer yet:\n{listed}"),
                format!(
                    "\nRewrite the summary so that it also answers these questions, using facts from the passage. Keep the important points it already has. Do not write the questions. At most {} words. Write only the summary.\n",
                    self.words()
                ),
            ],
        )
    }

    fn read(
        &self,
        llm: &mut dyn Llm,
        state: &mut CosState,
        chunks: &[Chunk],
        index: usize,
        calls: &mut Ledger,
    ) -> Result<Work> {
        let chunk = &chunks[index];
        let count = qa::spread(self.config.qa_pairs, chunks.len())[index];
        let (pairs, pairs_output) = if count > 0 {
            let generated = qa::generate_pairs(
                llm,
                &chunk.text,
                Some(index),
                count,
                self.config.constrained,
            )?;
            calls.record(&generated.usage);
            (generated.pairs, generated.output)
        } else {
            (Vec::new(), String::new())
        };
        let prompt = self.thesis_prompt(chunk, &state.draft);
        let completion = llm.complete(&prompt, self.config.summary_tokens, None)?;
        calls.record(&completion.usage);
        let summary = clean_summary(&completion.text);
        if !summary.is_empty() {
            state.draft = summary;
        }
        state.pairs.extend(pairs.iter().cloned());
        state.chunks_read += 1;
        if state.chunks_read == chunks.len() {
            state.split = split_pairs(state.pairs.len(), self.config.seed);
            state.refined_with = vec![0; state.pairs.len()];
            state.candidates.push(Candidate {
                tokens: llm.count_tokens(&state.draft)?,
                summary: state.draft.clone(),
                validation_f1: None,
                train_f1s: None,
            });
        }
        Ok(Work::Read {
            chunk: index,
            pairs,
            pairs_output,
            summary: state.draft.clone(),
        })
    }

    fn answer(
        &self,
        llm: &mut dyn Llm,
        state: &mut CosState,
        candidate: usize,
        part: Part,
        calls: &mut Ledger,
    ) -> Result<Work> {
        let questions = state.split.part(part).to_vec();
        let start = state.answers.len();
        let end = (start + ANSWERS_PER_STEP).min(questions.len());
        let summary = state.candidates[candidate].summary.clone();
        let mut answers = Vec::new();
        for &index in &questions[start..end] {
            let pair = &state.pairs[index];
            let prompt = qa::answer_prompt(&summary, &pair.question);
            let (answered, usage) = qa::ask(llm, &prompt, pair)?;
            calls.record(&usage);
            answers.push(answered);
        }
        state.answers.extend(answers.iter().cloned());
        if state.answers.len() == questions.len() {
            let f1s: Vec<f64> = state.answers.drain(..).map(|answer| answer.f1).collect();
            match part {
                Part::Validation => state.candidates[candidate].validation_f1 = mean_f1(&f1s),
                Part::Train => state.candidates[candidate].train_f1s = Some(f1s),
                Part::Test => state.test_f1 = mean_f1(&f1s),
            }
        }
        Ok(Work::Answers {
            candidate,
            part,
            answers,
        })
    }

    fn refine(
        &self,
        llm: &mut dyn Llm,
        state: &mut CosState,
        chunks: &[Chunk],
        calls: &mut Ledger,
    ) -> Result<Work> {
        let from = state.candidates.len() - 1;
        let train_f1s = state.candidates[from].train_f1s.clone().unwrap_or_default();
        let picked = self.failed(state, &train_f1s);
        let mut by_chunk: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for &index in &picked {
            let pair = &state.pairs[index];
            by_chunk
                .entry(pair.chunk.unwrap_or(0))
                .or_default()
                .push(&pair.question);
        }
        let mut summary = state.candidates[from].summary.clone();
        let mut outputs = Vec::new();
        for (&index, questions) in &by_chunk {
            let chunk = chunks.get(index).ok_or_else(|| {
                Error::invalid(
                    format!("question pair of chunk {index}"),
                    format!("the document has {} chunks", chunks.len()),
                )
            })?;
            let prompt = self.refine_prompt(chunk, &summary, questions);
            let completion = llm.complete(&prompt, self.config.summary_tokens, None)?;
            calls.record(&completion.usage);
            state.refine.calls += 1;
            state.refine.prompt_tokens += completion.usage.prompt_tokens;
            state.refine.reused_tokens += completion.usage.reused_tokens;
            state.refine.document_tokens += chunk.tokens;
            let refined = clean_summary(&completion.text);
            if !refined.is_empty() {
                summary = refined;
            }
            outputs.push(completion.text);
        }
        let questions = picked
            .iter()
            .map(|&index| state.pairs[index].question.clone())
            .collect();
        for &index in &picked {
            state.refined_with[index] += 1;
        }
        state.candidates.push(Candidate {
            tokens: llm.count_tokens(&summary)?,
            summary,
            validation_f1: None,
            train_f1s: None,
        });
        Ok(Work::Refine {
            candidate: state.candidates.len() - 1,
            chunks: by_chunk.keys().copied().collect(),
            questions,
            outputs,
        })
    }

    fn finish(&self, state: &CosState) -> Finish<CosFigures> {
        let chosen = chosen(state);
        let summary = state.candidates.get(chosen).map_or_else(
            || state.draft.clone(),
            |candidate| candidate.summary.clone(),
        );
        let train_f1: Vec<Option<f64>> = state
            .candidates
            .iter()
            .map(|candidate| candidate.train_f1s.as_deref().and_then(mean_f1))
            .collect();
        let figures = CosFigures {
            qa_pairs: state.pairs.len(),
            train_questions: state.split.train.len(),
            validation_questions: state.split.validation.len(),
            test_questions: state.split.test.len(),
            validation_f1: state.candidates.iter().map(|c| c.validation_f1).collect(),
            train_f1: train_f1.clone(),
            candidate_tokens: state.candidates.iter().map(|c| c.tokens).collect(),
            chosen,
            test_f1: state.test_f1,
            rounds: state.candidates.len().saturating_sub(1),
            refine_calls: state.refine.calls,
            refine_prompt_tokens: state.refine.prompt_tokens,
            refine_reused_tokens: state.refine.reused_tokens,
            refine_document_tokens: state.refine.document_tokens,
        };

        let pairs_of = |part: Part| {
            state
                .split
                .part(part)
                .iter()
                .map(|&index| state.pairs[index].clone())
                .collect::<Vec<_>>()
        };
        let pairs = json!({
            "train": pairs_of(Part::Train),
            "validation": pairs_of(Part::Validation),
            "test": pairs_of(Part::Test),
        });
        let candidates = state
            .candidates
            .iter()
            .zip(&train_f1)
            .map(|(candidate, train_f1)| {
                json!({
                    "summary": candidate.summary,
                    "tokens": candidate.tokens,
                    "validation_f1": candidate.validation_f1,
                    "train_f1": train_f1,
                })
            })
            .collect();
        Finish {
            summary,
            files: vec![
                ("qa_pairs.json", pairs),
                ("candidates.json", Value::Array(candidates)),
            ],
            notes: Vec::new(),
            summary_words_target: None,
            figures,
        }
    }
}

/// The candidate [`select`] keeps (0 before there are any).
fn chosen(state: &CosState) -> usize {
    let scores: Vec<(Option<f64>, usize)> = state
        .candidates
        .iter()
        .map(|candidate| (candidate.validation_f1, candidate.tokens))
        .collect();
    select(&scores).unwrap_or(0)
}

/// The summary in a reply, without a heading ("Updated summary:", "# Summary")
/// that a model may open with.
fn clean_summary(reply: &str) -> String {
    let text = reply.trim();
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let first = first.trim();
    let heading =
        first.starts_with('#') || (first.ends_with(':') && first.split_whitespace().count() <= 4);
    let text = if heading { rest.trim() } else { text };
    let text = text.trim_start_matches('*').trim_start();
    match text.split_once(':') {
        Some((label, body))
            if label.to_lowercase().contains("summary")
                && label.split_whitespace().count() <= 3 =>
        {
            body.trim_start_matches('*').trim().to_string()
        }
        _ => text.to_string(),
    }
}

impl Method for Cos<'_> {
    type State = CosState;
    type Step = Step;
    type Figures = CosFigures;

    fn label(&self) -> String {
        "cos".to_string()
    }

    fn template_texts(&self) -> Vec<String> {
        let blank = blank_chunk();
        prompt_texts(&[
            qa::generation_prompt("", 1, self.config.constrained),
            self.thesis_prompt(&blank, ""),
            // A draft that is blank but not empty asks for the rewrite.
            self.thesis_prompt(&blank, " "),
            self.refine_prompt(&blank, "", &[]),
            qa::answer_prompt("", ""),
        ])
    }

    fn start(&self, _chunks: &[Chunk]) -> CosState {
        CosState::default()
    }

    fn position(&self, state: &CosState, chunks: &[Chunk]) -> Position {
        let stage = match self.next_action(state, chunks) {
            Action::Read(index) => format!("chunk {}/{}", index + 1, chunks.len()),
            Action::Answer { candidate, part } => {
                let part = match part {
                    Part::Train => "train",
                    Part::Validation => "validation",
                    Part::Test => "test",
                };
                format!("{part} questions, summary {candidate}")
            }
            Action::Refine => format!(
                "refine round {}/{}",
                state.candidates.len(),
                self.config.iterations
            ),
            Action::Finish => "finish".to_string(),
        };
        // Rounds may end early, so the total is an upper estimate.
        let sizes = if state.chunks_read == chunks.len() {
            state.split.clone()
        } else {
            split_pairs(self.config.qa_pairs, self.config.seed)
        };
        let batches = |part: Part| sizes.part(part).len().div_ceil(ANSWERS_PER_STEP);
        let rounds = self.config.iterations;
        let total = chunks.len()
            + (rounds + 1) * batches(Part::Validation)
            + rounds * (batches(Part::Train) + 1)
            + batches(Part::Test);
        Position {
            done: state.units_done,
            total: total.max(state.units_done + 1),
            stage,
        }
    }

    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut CosState,
        chunks: &[Chunk],
    ) -> Result<Advance<Step, CosFigures>> {
        let start = Instant::now();
        let stage = self.position(state, chunks).stage;
        let mut calls = Ledger::default();
        let work = match self.next_action(state, chunks) {
            Action::Read(index) => self.read(llm, state, chunks, index, &mut calls)?,
            Action::Answer { candidate, part } => {
                self.answer(llm, state, candidate, part, &mut calls)?
            }
            Action::Refine => self.refine(llm, state, chunks, &mut calls)?,
            Action::Finish => return Ok(Advance::Done(self.finish(state))),
        };
        state.units_done += 1;
        Ok(Advance::Step(Step {
            stage,
            work,
            calls: calls.calls,
            tokens: Tokens::of(&calls.usage),
            seconds: start.elapsed().as_secs_f64(),
        }))
    }
}

#[cfg(test)]
mod tests;
