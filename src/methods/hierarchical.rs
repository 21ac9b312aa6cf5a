//! BooookScore's hierarchical merging: summarize every chunk, then merge as many
//! consecutive summaries as one call holds, level by level, until one is left.

use super::baseline::{part_prompt, summarize_alone, words_for, Call, SYSTEM};
use super::length::{target_words, to_length};
use crate::chunk::Chunk;
use crate::error::{Error, Result, Setting};
use crate::llm::{Llm, Prompt};
use crate::run::{blank_chunk, prompt_texts, Advance, Finish, Method, Position};
use std::ops::Range;

/// Settings of one hierarchical run; everything here is part of a run's identity.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HierarchicalConfig {
    pub query: String,
    /// The most tokens of the top summary; lower levels get less.
    pub max_summary_tokens: usize,
    /// The final summary's length in words; by default it scales with the
    /// document ([`target_words`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_words: Option<usize>,
}

/// Each level's summary budget as a share of the level above it.
const LEVEL_RATIO: f64 = 0.65;

/// Tokens set aside for a merge prompt's own words when estimating, before
/// any prompt is built, how many summaries one merge holds.
const PROMPT_ALLOWANCE: usize = 256;

/// The summary budget of `level` (from 0) when `levels` levels are expected
/// and the top one may have `top_tokens`: 0.65× per level below the top, at
/// least 1, so summaries may grow toward the top. Levels at or above the
/// expected top get the top budget. The levels are estimated once, at the
/// start ([`estimated_level_sizes`]).
pub fn level_budget(level: usize, levels: usize, top_tokens: usize) -> usize {
    let below_top = levels.saturating_sub(1).saturating_sub(level);
    let budget = top_tokens as f64 * LEVEL_RATIO.powf(below_top as f64);
    (budget.round() as usize).max(1)
}

/// The expected number of summaries at each level, from `items` chunk
/// summaries when each merge takes `per_call` of them (at least 2), down to one.
pub fn estimated_level_sizes(items: usize, per_call: usize) -> Vec<usize> {
    let per_call = per_call.max(2);
    let mut sizes = vec![items];
    let mut size = items;
    while size > 1 {
        size = size.div_ceil(per_call);
        sizes.push(size);
    }
    sizes
}

/// Split items costing `tokens` into runs of consecutive items, each run
/// within `budget` tokens: as few runs as possible, and among those as few
/// runs of one item as possible. An item over the budget alone makes a run
/// of one, so every item lands in exactly one non-empty run.
pub fn group_consecutive(tokens: &[usize], budget: usize) -> Vec<Range<usize>> {
    // best[end] = (runs, runs of one, start of the last run) over the first `end` items.
    let mut best: Vec<(usize, usize, usize)> = vec![(0, 0, 0); tokens.len() + 1];
    for end in 1..=tokens.len() {
        let mut choice: Option<(usize, usize, usize)> = None;
        let mut sum = 0usize;
        for start in (0..end).rev() {
            sum = sum.saturating_add(tokens[start]);
            let alone = end - start == 1;
            if !alone && sum > budget {
                break;
            }
            let (runs, singles, _) = best[start];
            let candidate = (runs + 1, singles + usize::from(alone), start);
            if choice.is_none_or(|chosen| (candidate.0, candidate.1) <= (chosen.0, chosen.1)) {
                choice = Some(candidate);
            }
        }
        best[end] = choice.expect("a run of one item is always allowed");
    }
    let mut runs = Vec::new();
    let mut end = tokens.len();
    while end > 0 {
        let start = best[end].2;
        runs.push(start..end);
        end = start;
    }
    runs.reverse();
    runs
}

/// The shape of the merge tree, as `stats.json` reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HierarchicalFigures {
    /// Levels of summaries, the chunk summaries included.
    pub levels: usize,
}

/// Everything a run carries from one call to the next; saved in checkpoints.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HierarchicalState {
    /// The summaries written, level by level; level 0 has one per chunk.
    pub levels: Vec<Vec<String>>,
    /// How many summaries of the level below the last one it has merged so far.
    pub merged: usize,
    /// Levels expected at the start; they set each level's budget.
    pub estimated_levels: usize,
    /// Calls expected at the start, for progress.
    pub estimated_calls: usize,
}

impl HierarchicalState {
    /// The last level has taken in all of the level below it.
    fn level_complete(&self, chunks: usize) -> bool {
        match self.levels.len() {
            1 => self.levels[0].len() == chunks,
            depth => self.merged == self.levels[depth - 2].len(),
        }
    }

    /// The one summary left at the top, once merging is over.
    fn finished(&self, chunks: usize) -> Option<&str> {
        let top = self.levels.last()?;
        match top.as_slice() {
            [summary] if self.level_complete(chunks) => Some(summary),
            _ => None,
        }
    }
}

/// What one call did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub level: usize,
    /// The chunk (level 0) or the summaries of the level below that this call summarized.
    pub sources: Range<usize>,
    /// The previous summary of this level was in the prompt as context.
    pub with_context: bool,
    #[serde(flatten)]
    pub call: Call,
}

/// The hierarchical-merging loop over one document.
pub struct Hierarchical<'a> {
    config: &'a HierarchicalConfig,
    /// The model's context, for estimating how many summaries one merge holds.
    context_tokens: usize,
}

impl<'a> Hierarchical<'a> {
    pub fn new(config: &'a HierarchicalConfig, context_tokens: usize) -> Self {
        Hierarchical {
            config,
            context_tokens,
        }
    }

    /// The prompt that merges `summaries` (already rendered by `merged_segment`),
    /// after `context` (the previous merge of this level) when given.
    pub fn merge_prompt(
        &self,
        context: Option<&str>,
        summaries: &[String],
        words: usize,
    ) -> Prompt {
        let mut segments = vec![format!(
            "Below are summaries of consecutive parts of a longer document, in order. Merge them into one summary that covers all of them in order, as one coherent text.\nThe summary is for this request: {}\n",
            self.config.query
        )];
        segments.extend(context.map(context_segment));
        segments.extend(summaries.iter().cloned());
        segments.push(format!(
            "\nWrite the merged summary of these parts in at most {words} words. Output only the summary."
        ));
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments,
            source: None,
            shared_segments: None,
        }
    }

    /// Summarize the next chunks at level 0, as many at once as `llm` runs.
    fn summarize_chunks(
        &self,
        llm: &mut dyn Llm,
        state: &mut HierarchicalState,
        chunks: &[Chunk],
    ) -> Result<Vec<Step>> {
        let budget = level_budget(0, state.estimated_levels, self.config.max_summary_tokens);
        let calls = summarize_alone(
            llm,
            &self.config.query,
            chunks,
            state.levels[0].len(),
            Some(words_for(budget)),
            budget,
        )?;
        Ok(calls
            .into_iter()
            .map(|(chunk, call)| {
                state.levels[0].push(call.summary().to_string());
                Step {
                    level: 0,
                    sources: chunk.index..chunk.index + 1,
                    with_context: false,
                    call,
                }
            })
            .collect())
    }

    /// Merge the next run of summaries of the level below into the last level.
    fn merge(&self, llm: &mut dyn Llm, state: &mut HierarchicalState) -> Result<Step> {
        let level = state.levels.len() - 1;
        let top = self.config.max_summary_tokens;
        let context_tokens = llm.context_tokens();
        let summaries: Vec<String> = state.levels[level - 1]
            .iter()
            .enumerate()
            .map(|(index, summary)| merged_segment(index, summary))
            .collect();
        let costs = summaries
            .iter()
            .map(|summary| llm.count_tokens(summary))
            .collect::<Result<Vec<_>>>()?;
        let total: usize = costs.iter().sum();

        // Segments are tokenized one by one, so a prompt's tokens are its
        // frame's plus each segment's: the runs below fit exactly.
        let frame_top = llm.prompt_tokens(&self.merge_prompt(None, &[], words_for(top)))?;
        let (sources, budget, context) = if state.merged == 0
            && frame_top + top + total <= context_tokens
        {
            // The whole level fits one call, which writes the top summary.
            (0..summaries.len(), top, None)
        } else {
            let budget = level_budget(level, state.estimated_levels, top);
            let frame = llm.prompt_tokens(&self.merge_prompt(None, &[], words_for(budget)))?;
            // Room is kept for the previous merge of this level, written under
            // the same budget, so the runs do not depend on what it says.
            let context_room = llm.count_tokens(&context_segment(""))? + budget;
            let room = context_tokens.saturating_sub(frame + budget + context_room);
            let runs = group_consecutive(&costs, room);
            if runs.len() == summaries.len() {
                return Err(Error::invalid(
                    format!("merge level {level}"),
                    format!("no two summaries of {} fit one call in the model's context of {context_tokens} tokens; use a smaller {}", summaries.len(), Setting::MaxSummaryTokens),
                ));
            }
            let run = runs
                .into_iter()
                .find(|run| run.contains(&state.merged))
                .expect("the runs cover every summary");
            let previous = state.levels[level].last().map(String::as_str);
            // A previous merge that counts more than it was allowed to write is left out.
            let context = match previous {
                Some(text) if llm.count_tokens(&context_segment(text))? <= context_room => {
                    Some(text)
                }
                _ => None,
            };
            (state.merged..run.end, budget, context)
        };
        let with_context = context.is_some();
        let prompt = self.merge_prompt(context, &summaries[sources.clone()], words_for(budget));
        let call = Call::run(llm, &prompt, budget)?;
        state.levels[level].push(call.summary().to_string());
        state.merged = sources.end;
        Ok(Step {
            level,
            sources,
            with_context,
            call,
        })
    }
}

/// The previous merge of a level, as context for the next one, so that the
/// pieces of a level read as one story.
fn context_segment(summary: &str) -> String {
    format!("\n## Summary of the parts before these (context only; do not repeat it)\n{summary}\n")
}

/// Summary `index` of the level below, as a merge prompt shows it. Numbered
/// by its place in the level, so its tokens do not depend on its run.
fn merged_segment(index: usize, summary: &str) -> String {
    format!("\n## Part {}\n{summary}\n", index + 1)
}

impl Method for Hierarchical<'_> {
    type State = HierarchicalState;
    type Step = Step;
    type Figures = HierarchicalFigures;

    fn label(&self) -> String {
        "hierarchical".to_string()
    }

    /// The prompts as the top level writes them; lower levels differ only
    /// in the number of words asked for.
    fn template_texts(&self) -> Vec<String> {
        let words = words_for(self.config.max_summary_tokens);
        prompt_texts(&[
            part_prompt(&self.config.query, &blank_chunk(), 1, &[], Some(words)),
            self.merge_prompt(Some(""), &[merged_segment(0, "")], words),
        ])
    }

    fn start(&self, chunks: &[Chunk]) -> HierarchicalState {
        let top = self.config.max_summary_tokens.max(1);
        // Assume every summary fills the top budget: more levels rather than fewer.
        let per_call = self
            .context_tokens
            .saturating_sub(2 * top + PROMPT_ALLOWANCE)
            / top;
        let sizes = estimated_level_sizes(chunks.len(), per_call);
        HierarchicalState {
            levels: vec![Vec::new()],
            merged: 0,
            estimated_levels: sizes.len(),
            estimated_calls: sizes.iter().sum(),
        }
    }

    fn position(&self, state: &HierarchicalState, chunks: &[Chunk]) -> Position {
        let done = state.levels.iter().map(Vec::len).sum();
        if state.finished(chunks.len()).is_some() {
            return Position {
                done,
                total: done,
                stage: "final summary".to_string(),
            };
        }
        let stage = if state.levels[0].len() < chunks.len() {
            format!("chunk {}/{}", state.levels[0].len() + 1, chunks.len())
        } else if state.level_complete(chunks.len()) {
            format!("merge level {}", state.levels.len())
        } else {
            format!("merge level {}", state.levels.len() - 1)
        };
        Position {
            done,
            total: state.estimated_calls.max(done + 1),
            stage,
        }
    }

    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut HierarchicalState,
        chunks: &[Chunk],
    ) -> Result<Advance<Step, HierarchicalFigures>> {
        if state.levels[0].len() < chunks.len() {
            return Ok(Advance::Steps(self.summarize_chunks(llm, state, chunks)?));
        }
        if let Some(summary) = state.finished(chunks.len()) {
            // The top summary is held to BooookScore's budget; the answer is
            // brought to the length every method aims at.
            let target = target_words(self.config.summary_words, chunks);
            return Ok(Advance::Done(Finish {
                summary: to_length(llm, summary, target)?.text,
                summary_words_target: Some(target),
                files: Vec::new(),
                notes: Vec::new(),
                figures: HierarchicalFigures {
                    levels: state.levels.len(),
                },
            }));
        }
        if state.level_complete(chunks.len()) {
            if state.levels.last().is_none_or(Vec::is_empty) {
                return Err(Error::invalid("document", "has no text to summarize"));
            }
            state.levels.push(Vec::new());
            state.merged = 0;
        }
        Ok(Advance::Step(self.merge(llm, state)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_grow_toward_the_top() {
        assert_eq!(level_budget(0, 1, 900), 900);
        assert_eq!(level_budget(0, 2, 900), 585);
        assert_eq!(level_budget(1, 2, 900), 900);
        assert_eq!(level_budget(0, 3, 900), 380);
        assert_eq!(level_budget(1, 3, 900), 585);
        // Levels past the estimate keep the top budget.
        assert_eq!(level_budget(5, 3, 900), 900);
        assert_eq!(level_budget(0, 40, 900), 1);
    }

    #[test]
    fn level_sizes_shrink_to_one() {
        assert_eq!(estimated_level_sizes(10, 4), vec![10, 3, 1]);
        assert_eq!(estimated_level_sizes(4, 4), vec![4, 1]);
        assert_eq!(estimated_level_sizes(1, 4), vec![1]);
        assert_eq!(estimated_level_sizes(0, 4), vec![0]);
        // A merge takes two at least, so the estimate always ends.
        assert_eq!(estimated_level_sizes(5, 0), vec![5, 3, 2, 1]);
    }

    #[test]
    fn runs_take_as_many_as_fit() {
        assert_eq!(group_consecutive(&[3, 3, 3], 10), vec![0..3]);
        assert_eq!(group_consecutive(&[5, 5, 5, 5], 10), vec![0..2, 2..4]);
        assert_eq!(group_consecutive(&[], 10), Vec::<Range<usize>>::new());
        assert_eq!(group_consecutive(&[7], 10), vec![0..1]);
    }

    #[test]
    fn a_run_of_one_only_when_unavoidable() {
        // Greedy packing would leave [4, 3, 3] and [4].
        assert_eq!(group_consecutive(&[4, 3, 3, 4], 10), vec![0..2, 2..4]);
        // Five items of 5 under 10: three runs, one of them alone.
        let runs = group_consecutive(&[5, 5, 5, 5, 5], 10);
        assert_eq!(runs.len(), 3);
        assert_eq!(runs.iter().filter(|run| run.len() == 1).count(), 1);
    }

    #[test]
    fn an_item_over_the_budget_goes_alone_and_the_rest_still_merge() {
        assert_eq!(group_consecutive(&[20, 3, 3], 10), vec![0..1, 1..3]);
        assert_eq!(group_consecutive(&[3, 20, 3], 10), vec![0..1, 1..2, 2..3]);
        assert_eq!(group_consecutive(&[1, 1], 0), vec![0..1, 1..2]);
    }

    #[test]
    fn runs_cover_every_item_once_in_order() {
        let tokens: Vec<usize> = (0..40).map(|i| (i * 37) % 23 + 1).collect();
        for budget in [0, 1, 10, 25, 60, 1000] {
            let runs = group_consecutive(&tokens, budget);
            let mut next = 0;
            for run in &runs {
                assert_eq!(run.start, next);
                assert!(!run.is_empty());
                let sum: usize = tokens[run.clone()].iter().sum();
                assert!(run.len() == 1 || sum <= budget, "{run:?} over {budget}");
                next = run.end;
            }
            assert_eq!(next, tokens.len());
        }
    }
}
