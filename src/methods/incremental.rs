//! BooookScore's incremental updating: summarize the first chunk, then fold each
//! next chunk into the running summary, compressing it when it outgrows its budget.

use super::baseline::{ends_mid_sentence, part_prompt, words_for, Call, SYSTEM};
use super::length::{target_words, to_length};
use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::{Llm, Prompt, Source};
use crate::run::{blank_chunk, prompt_texts, Advance, Finish, Method, Position};

/// Settings of one incremental run; everything here is part of a run's identity.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IncrementalConfig {
    pub query: String,
    /// The most tokens of the running summary.
    pub max_summary_tokens: usize,
    /// The final summary's length in words; by default it scales with the
    /// document ([`target_words`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_words: Option<usize>,
}

/// Compression calls one chunk may make before the best attempt is kept.
const MAX_COMPRESSIONS: usize = 3;

/// How often the summary had to be compressed, as `stats.json` reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncrementalFigures {
    pub compressions: usize,
    pub compression_failures: usize,
}

/// Everything a run carries from one chunk to the next; saved in checkpoints.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IncrementalState {
    /// The summary of every chunk read so far.
    pub summary: String,
    pub chunks_read: usize,
    /// Compression calls made.
    pub compressions: usize,
    /// Chunks after which no attempt was both within budget and whole.
    pub compression_failures: usize,
}

/// Which text became the running summary after a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kept {
    /// What the update call wrote.
    Update,
    /// What the compression call at this index (from 0) wrote.
    Compression(usize),
    /// The summary before this chunk, because the update came back empty.
    Previous,
}

/// What one chunk's unit did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub chunk: usize,
    pub chunk_tokens: usize,
    /// The call that summarized the first chunk or folded this one into the summary.
    pub update: Call,
    /// The calls that compressed or repaired the update's summary, in order.
    pub compressions: Vec<Call>,
    pub kept: Kept,
    /// Every compression attempt was too long or cut off; the best one was kept.
    pub failed: bool,
    /// Tokens of the running summary after this chunk.
    pub summary_tokens: usize,
}

/// The incremental-updating loop over one document.
pub struct Incremental<'a> {
    config: &'a IncrementalConfig,
}

impl<'a> Incremental<'a> {
    pub fn new(config: &'a IncrementalConfig) -> Self {
        Incremental { config }
    }

    /// The prompt that folds `chunk` into `summary`.
    pub fn update_prompt(&self, summary: &str, chunk: &Chunk, chunks: usize) -> Prompt {
        let words = words_for(self.config.max_summary_tokens);
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments: vec![
                format!(
                    "You summarize a long document one part at a time. Below are the summary of the document so far and its next part. Rewrite the summary so that it also covers the next part: keep what matters from the summary so far, add the new events, people and ideas in the order they happen, and keep it one coherent text.\nThe summary is for this request: {}\n",
                    self.config.query
                ),
                format!("\n## Summary so far\n{summary}\n"),
                format!(
                    "\n## Part {} of {chunks}\n{}\n",
                    chunk.index + 1,
                    chunk.text.trim_end()
                ),
                format!("\nWrite the updated summary of everything so far, in at most {words} words. Output only the summary."),
            ],
            source: Some(Source::segment(2)),
            shared_segments: None,
        }
    }

    /// The prompt that shortens `summary`, on try `attempt` (from 0): each
    /// try asks for fewer words, so a repeated greedy call does not repeat itself.
    pub fn compression_prompt(&self, summary: &str, attempt: usize) -> Prompt {
        let words = compression_words(words_for(self.config.max_summary_tokens), attempt);
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments: vec![
                "Rewrite the summary below so that it is shorter and ends with a complete sentence. Keep the main events, people and ideas in the order they happen, and drop minor details.\n".to_string(),
                format!("\n## Summary\n{summary}\n"),
                format!("\nWrite the shorter summary in at most {words} words, ending with a full sentence. Output only the summary."),
            ],
            source: None,
            shared_segments: None,
        }
    }

    /// Summarize or fold in `chunk`, then compress until the summary fits.
    fn read(
        &self,
        llm: &mut dyn Llm,
        state: &mut IncrementalState,
        chunk: &Chunk,
        chunks: usize,
    ) -> Result<Step> {
        let budget = self.config.max_summary_tokens;
        let prompt = if state.chunks_read == 0 {
            part_prompt(
                &self.config.query,
                chunk,
                chunks,
                &[],
                Some(words_for(budget)),
            )
        } else {
            self.update_prompt(&state.summary, chunk, chunks)
        };
        let update = Call::run(llm, &prompt, budget)?;
        let mut best = Judged::of_call(llm, &update, budget)?;
        let mut kept = Kept::Update;
        let mut compressions = Vec::new();
        if best.blank && state.chunks_read > 0 {
            kept = Kept::Previous;
            best = Judged::of(llm, &state.summary, budget)?;
        } else {
            let source = update.summary().to_string();
            while !best.fits() && !best.blank && compressions.len() < MAX_COMPRESSIONS {
                let attempt = compressions.len();
                let call = Call::run(llm, &self.compression_prompt(&source, attempt), budget)?;
                let judged = Judged::of_call(llm, &call, budget)?;
                if judged.rank() < best.rank() {
                    best = judged;
                    kept = Kept::Compression(attempt);
                }
                compressions.push(call);
            }
        }
        let failed = !compressions.is_empty() && !best.fits();
        state.compressions += compressions.len();
        state.compression_failures += usize::from(failed);
        state.summary = best.text;
        Ok(Step {
            chunk: chunk.index,
            chunk_tokens: chunk.tokens,
            update,
            compressions,
            kept,
            failed,
            summary_tokens: best.tokens,
        })
    }
}

/// The word target of compression try `attempt` (from 0) under a summary
/// limit of `words`: 80%, 60%, 40% … of it, never below a tenth.
fn compression_words(words: usize, attempt: usize) -> usize {
    let tenths = 8usize.saturating_sub(2 * attempt).max(1);
    words * tenths / 10
}

/// A candidate running summary and what is wrong with it.
struct Judged {
    text: String,
    tokens: usize,
    blank: bool,
    /// It is as long as its budget, or its call decoded the whole budget: it
    /// was likely cut short.
    too_long: bool,
    mid_sentence: bool,
}

impl Judged {
    fn of(llm: &dyn Llm, text: &str, budget: usize) -> Result<Self> {
        let tokens = llm.count_tokens(text)?;
        Ok(Judged {
            text: text.to_string(),
            tokens,
            blank: text.trim().is_empty(),
            too_long: tokens >= budget,
            mid_sentence: ends_mid_sentence(text),
        })
    }

    /// Judge what `call` wrote. Its summary is trimmed, so a reply cut off by
    /// the budget can count a few tokens under it once its trailing
    /// whitespace is gone; the call itself says whether it was stopped.
    fn of_call(llm: &dyn Llm, call: &Call, budget: usize) -> Result<Self> {
        let mut judged = Judged::of(llm, call.summary(), budget)?;
        judged.too_long |= call.filled_budget();
        Ok(judged)
    }

    fn fits(&self) -> bool {
        !self.blank && !self.too_long && !self.mid_sentence
    }

    /// Lower is better: an empty summary is worst, then one too long, then
    /// one cut off; of two with the same faults, the shorter.
    fn rank(&self) -> (bool, bool, bool, usize) {
        (self.blank, self.too_long, self.mid_sentence, self.tokens)
    }
}

impl Method for Incremental<'_> {
    type State = IncrementalState;
    type Step = Step;
    type Figures = IncrementalFigures;

    fn label(&self) -> String {
        "incremental".to_string()
    }

    fn template_texts(&self) -> Vec<String> {
        let blank = blank_chunk();
        let words = words_for(self.config.max_summary_tokens);
        let mut prompts = vec![
            part_prompt(&self.config.query, &blank, 1, &[], Some(words)),
            self.update_prompt("", &blank, 1),
        ];
        prompts.extend((0..MAX_COMPRESSIONS).map(|attempt| self.compression_prompt("", attempt)));
        prompt_texts(&prompts)
    }

    fn start(&self, _chunks: &[Chunk]) -> IncrementalState {
        IncrementalState {
            summary: String::new(),
            chunks_read: 0,
            compressions: 0,
            compression_failures: 0,
        }
    }

    fn position(&self, state: &IncrementalState, chunks: &[Chunk]) -> Position {
        let stage = if state.chunks_read < chunks.len() {
            format!("chunk {}/{}", state.chunks_read + 1, chunks.len())
        } else {
            "final summary".to_string()
        };
        Position {
            done: state.chunks_read,
            total: chunks.len(),
            stage,
        }
    }

    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut IncrementalState,
        chunks: &[Chunk],
    ) -> Result<Advance<Step, IncrementalFigures>> {
        if let Some(chunk) = chunks.get(state.chunks_read) {
            let step = self.read(llm, state, chunk, chunks.len())?;
            state.chunks_read += 1;
            return Ok(Advance::Step(step));
        }
        // The running summary is held to BooookScore's budget; the answer
        // is brought to the length every method aims at.
        let target = target_words(self.config.summary_words, chunks);
        Ok(Advance::Done(Finish {
            summary: to_length(llm, &state.summary, target)?.text,
            summary_words_target: Some(target),
            files: Vec::new(),
            notes: Vec::new(),
            figures: IncrementalFigures {
                compressions: state.compressions,
                compression_failures: state.compression_failures,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_asks_for_fewer_words_each_try() {
        assert_eq!(compression_words(585, 0), 468);
        assert_eq!(compression_words(585, 1), 351);
        assert_eq!(compression_words(585, 2), 234);
        assert_eq!(compression_words(585, 9), 58);
    }
}
