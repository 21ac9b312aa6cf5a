//! The OpenAI cookbook's summary with controllable detail: the level of detail sets
//! the number of chunks, each summarized alone (or after those before it), joined in order.

use super::baseline::{earlier_segment, part_prompt, summarize_alone, Call, EARLIER_HEADING};
use crate::chunk::Chunk;
use crate::error::{Error, Result};
use crate::llm::Llm;
use crate::run::{blank_chunk, prompt_texts, Advance, Finish, Method, NoFigures, Position};

/// Settings of one detail run; everything here is part of a run's identity.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DetailConfig {
    pub query: String,
    /// From 0 (the fewest chunks that fit) to 1 (chunks of `min_chunk_tokens`).
    pub detail: f64,
    /// The smallest chunk worth summarizing on its own.
    pub min_chunk_tokens: usize,
    /// Show each call the summaries of the chunks before its own.
    pub recursive: bool,
    /// The most tokens of each chunk's summary.
    pub max_summary_tokens: usize,
}

/// The chunk size that cuts `document_tokens` into the number of chunks
/// `detail` asks for: from the fewest that `largest` (the biggest chunk that
/// fits a call) allows to the most that `smallest` allows, interpolated and
/// rounded. Fails when `detail` is not in [0, 1]. The chunk size has to be
/// chosen before the document is split, so the caller applies it when splitting.
pub fn chunk_tokens(
    document_tokens: usize,
    detail: f64,
    largest: usize,
    smallest: usize,
) -> Result<usize> {
    if !(0.0..=1.0).contains(&detail) {
        return Err(Error::invalid(
            "detail",
            format!("must be between 0 and 1, not {detail}"),
        ));
    }
    if largest == 0 || smallest == 0 {
        return Err(Error::invalid("chunk size", "must be at least 1 token"));
    }
    if document_tokens == 0 {
        return Ok(largest);
    }
    let fewest = document_tokens.div_ceil(largest);
    let most = fewest.max(document_tokens / smallest);
    let chunks = (fewest as f64 + detail * (most - fewest) as f64).round() as usize;
    Ok(document_tokens.div_ceil(chunks.max(1)).min(largest))
}

/// Everything a run carries from one chunk to the next; saved in checkpoints.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DetailState {
    /// One summary per chunk read so far.
    pub summaries: Vec<String>,
}

/// What one chunk's call did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub chunk: usize,
    pub chunk_tokens: usize,
    /// How many summaries of earlier chunks the prompt showed (recursive only).
    pub earlier: usize,
    #[serde(flatten)]
    pub call: Call,
}

/// The chunk-by-chunk loop over one document.
pub struct Detail<'a> {
    config: &'a DetailConfig,
}

impl<'a> Detail<'a> {
    pub fn new(config: &'a DetailConfig) -> Self {
        Detail { config }
    }

    /// Summarize the next chunks each on its own, as many at once as `llm`
    /// runs (without `recursive`, no call needs another's summary).
    fn summarize_chunks(
        &self,
        llm: &mut dyn Llm,
        state: &mut DetailState,
        chunks: &[Chunk],
    ) -> Result<Vec<Step>> {
        let calls = summarize_alone(
            llm,
            &self.config.query,
            chunks,
            state.summaries.len(),
            None,
            self.config.max_summary_tokens,
        )?;
        Ok(calls
            .into_iter()
            .map(|(chunk, call)| {
                state.summaries.push(call.summary().to_string());
                Step {
                    chunk: chunk.index,
                    chunk_tokens: chunk.tokens,
                    earlier: 0,
                    call,
                }
            })
            .collect())
    }

    /// The most recent summaries that fit beside `chunk`'s prompt, oldest first.
    fn earlier<'s>(
        &self,
        llm: &dyn Llm,
        summaries: &'s [String],
        chunk: &Chunk,
        chunks: usize,
    ) -> Result<&'s [String]> {
        if !self.config.recursive || summaries.is_empty() {
            return Ok(&[]);
        }
        let alone = part_prompt(&self.config.query, chunk, chunks, &[], None);
        // Segments are tokenized one by one, so each earlier summary adds exactly its own tokens.
        let used = llm.prompt_tokens(&alone)?
            + llm.count_tokens(EARLIER_HEADING)?
            + self.config.max_summary_tokens;
        let mut room = llm.context_tokens().saturating_sub(used);
        let mut first = summaries.len();
        while first > 0 {
            let cost = llm.count_tokens(&earlier_segment(&summaries[first - 1]))?;
            if cost > room {
                break;
            }
            room -= cost;
            first -= 1;
        }
        Ok(&summaries[first..])
    }
}

impl Method for Detail<'_> {
    type State = DetailState;
    type Step = Step;
    type Figures = NoFigures;

    fn label(&self) -> String {
        if self.config.recursive {
            "detail-recursive".to_string()
        } else {
            "detail".to_string()
        }
    }

    fn template_texts(&self) -> Vec<String> {
        let earlier = if self.config.recursive {
            vec![String::new()]
        } else {
            Vec::new()
        };
        prompt_texts(&[part_prompt(
            &self.config.query,
            &blank_chunk(),
            1,
            &earlier,
            None,
        )])
    }

    fn start(&self, _chunks: &[Chunk]) -> DetailState {
        DetailState {
            summaries: Vec::new(),
        }
    }

    fn position(&self, state: &DetailState, chunks: &[Chunk]) -> Position {
        let read = state.summaries.len();
        let stage = if read < chunks.len() {
            format!("chunk {}/{}", read + 1, chunks.len())
        } else {
            "final summary".to_string()
        };
        Position {
            done: read,
            total: chunks.len(),
            stage,
        }
    }

    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut DetailState,
        chunks: &[Chunk],
    ) -> Result<Advance<Step>> {
        let Some(chunk) = chunks.get(state.summaries.len()) else {
            return Ok(Advance::Done(Finish {
                summary: state.summaries.join("\n\n"),
                ..Finish::default()
            }));
        };
        if !self.config.recursive {
            return Ok(Advance::Steps(self.summarize_chunks(llm, state, chunks)?));
        }
        let earlier = self.earlier(llm, &state.summaries, chunk, chunks.len())?;
        let prompt = part_prompt(&self.config.query, chunk, chunks.len(), earlier, None);
        let step = Step {
            chunk: chunk.index,
            chunk_tokens: chunk.tokens,
            earlier: earlier.len(),
            call: Call::run(llm, &prompt, self.config.max_summary_tokens)?,
        };
        state.summaries.push(step.call.summary().to_string());
        Ok(Advance::Step(step))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_interpolates_between_fewest_and_most_chunks() {
        // 3000 tokens: 3 chunks of 1000 at least, 6 of 500 at most.
        assert_eq!(chunk_tokens(3000, 0.0, 1000, 500).unwrap(), 1000);
        assert_eq!(chunk_tokens(3000, 1.0, 1000, 500).unwrap(), 500);
        // 4.5 chunks round to 5.
        assert_eq!(chunk_tokens(3000, 0.5, 1000, 500).unwrap(), 600);
        assert_eq!(chunk_tokens(3001, 0.0, 1000, 500).unwrap(), 751);
    }

    #[test]
    fn detail_out_of_range_is_refused() {
        for detail in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
            let err = chunk_tokens(3000, detail, 1000, 500).unwrap_err();
            assert!(err.to_string().contains("between 0 and 1"), "{err}");
        }
    }

    #[test]
    fn tiny_documents_are_one_chunk() {
        assert_eq!(chunk_tokens(100, 1.0, 1000, 500).unwrap(), 100);
        assert_eq!(chunk_tokens(1, 0.5, 1000, 500).unwrap(), 1);
        assert_eq!(chunk_tokens(0, 1.0, 1000, 500).unwrap(), 1000);
    }

    #[test]
    fn a_minimum_above_the_largest_chunk_means_the_fewest_chunks() {
        assert_eq!(chunk_tokens(3000, 1.0, 400, 500).unwrap(), 375);
    }

    #[test]
    fn a_zero_chunk_size_is_refused() {
        assert!(chunk_tokens(3000, 0.5, 0, 500).is_err());
        assert!(chunk_tokens(3000, 0.5, 1000, 0).is_err());
    }
}
