//! One revision step of PRISM: the chunk's summary, the revision calls that
//! note it (again for what an early stop left), and the chunk's people.

use super::reading::{people_revisions, summarize};
use super::{notes, AnswerForm, MemoryMode, Prism, PrismState, Reading};
use crate::chunk::Chunk;
use crate::engine::{is_zero, LineVerdict, Usage};
use crate::error::Result;
use crate::llm::{Llm, Prompt};
use crate::memory::grammar::{binds_a_limit, revision_constraint, MAX_LINES};
use crate::memory::revise::{apply_parsed, apply_revisions, Refused};
use crate::memory::{apply, parse_revisions, Amendments, Op, RejectionKind, Revision, Screen};
use crate::methods::baseline::Call;
use crate::metrics::Tokens;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::time::Instant;

/// What one chunk's step did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub chunk: usize,
    pub chunk_tokens: usize,
    /// The revision call's tokens.
    #[serde(flatten)]
    pub tokens: Tokens,
    /// The summary of the chunk that the revision call read, when it read one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The calls that wrote it, in order: a call per piece of the chunk,
    /// again for a piece whose summary copied it out, then the call that
    /// listed the chunk's people.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub summary_calls: Vec<Call>,
    /// The people the chunk names, as the people call listed them and the
    /// memory took them in, after the revision call's notes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub people: Vec<Revision>,
    pub applied: Vec<Revision>,
    pub rejected: Vec<Refused>,
    /// The amendments were folded into one object before this step's prompt,
    /// because appending to them would no longer fit the context.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consolidated: bool,
    /// A safety limit of the step bound: its line count, a string's length, a
    /// list's size, or its token budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capped: bool,
    /// Lines refused while they were decoded, because they repeated or
    /// reworded a note the memory holds or copied the prompt or the chunk
    /// (see `Screen::goes_round`); the step wrote on in their place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The line the step stopped before: the last of
    /// [`SKIPS_BEFORE_STOP`] refused in a row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_before: Option<String>,
    /// Further revision calls for the part of the summary a call that
    /// stopped early left unnoted; their tokens and output are this step's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub continuations: usize,
    /// What the model wrote, verbatim.
    pub output: String,
    pub seconds: f64,
}

impl Prism<'_> {
    /// Run the revision step for `chunk` and fold its revisions into `state`.
    pub fn step(
        &self,
        llm: &mut dyn Llm,
        state: &mut PrismState,
        chunk: &Chunk,
        chunks: usize,
    ) -> Result<Step> {
        // The calls in the order they run: the chunk's summary, the revision
        // call (again for the rest when it stopped early), then the people.
        let start = Instant::now();
        let summary = match self.config.reading {
            Reading::Summary => Some(summarize(llm, chunk)?),
            Reading::Text => None,
        };
        let screen = match self.config.answer_form {
            AnswerForm::Summary => self.screen.with_source(
                &chunk.text,
                summary.as_ref().map(|summary| summary.text.as_str()),
            ),
            AnswerForm::Direct => self.screen.clone(),
        };
        let shown = summary.as_ref().map(|summary| summary.text.as_str());
        let mut revised = self.revise(llm, state, &screen, chunk, chunks, shown)?;
        // A step that stopped at a repeat or at a bound has not always
        // noted its summary to the end: on a play's act, three of five
        // steps stopped before the wrestling match, the banishment and the
        // flight that their summaries told. The rest is shown again, alone,
        // while each call notes something of it.
        if let Some(summary) = &summary {
            let sentences = crate::sentences::split_sentences(&summary.text);
            let mut ended_early = revised.ended_early();
            for _ in 0..MAX_CONTINUATIONS {
                let rest = notes::rest_to_note(&sentences, &revised.applied);
                if !ended_early || rest.is_empty() {
                    break;
                }
                let more =
                    self.revise(llm, state, &screen, chunk, chunks, Some(&rest.join(" ")))?;
                ended_early = more.ended_early();
                let noted = !more.applied.is_empty();
                revised.absorb(more);
                if !noted {
                    break;
                }
            }
        }
        // The people go in after the step's own notes: applied before, their
        // lines came last in the prompt, and the model went on writing
        // people lines instead of noting the chunk. They are screened for
        // repeats and echoes only: who someone is ("the writer") is rightly
        // not in the text's words.
        let people = match &summary {
            Some(summary) => {
                self.fold(&self.screen, state, &people_revisions(&summary.people))
                    .0
            }
            None => Vec::new(),
        };
        state.revisions_applied += people.len() + revised.applied.len();
        state.count_refused(&revised.rejected);
        state.revisions_capped += usize::from(revised.capped);
        state.revision_steps_stopped += usize::from(revised.stopped_before.is_some());
        state.revision_lines_skipped += revised.skipped.len();
        Ok(Step {
            chunk: chunk.index,
            chunk_tokens: chunk.tokens,
            tokens: Tokens::of(&revised.usage),
            summary: summary.as_ref().map(|summary| summary.text.clone()),
            summary_calls: summary.map_or_else(Vec::new, |summary| summary.calls),
            people,
            applied: revised.applied,
            rejected: revised.rejected,
            consolidated: revised.consolidated,
            capped: revised.capped,
            skipped: revised.skipped,
            stopped_before: revised.stopped_before,
            continuations: revised.continuations,
            output: revised.output,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// One revision call: the prompt that shows `shown` (the chunk's
    /// summary or part of it; the chunk itself when None), fitted to the
    /// context, generated under the line check, its revisions folded into
    /// `state`.
    fn revise(
        &self,
        llm: &mut dyn Llm,
        state: &mut PrismState,
        screen: &Screen,
        chunk: &Chunk,
        chunks: usize,
        shown: Option<&str>,
    ) -> Result<Revised> {
        let (prompt, consolidated) =
            self.prompt_that_fits(llm, state, self.config.revision_tokens, |state| {
                self.revision_prompt(state, chunk, chunks, shown)
            })?;
        let grammar = self.config.constrained.then(|| {
            revision_constraint(self.schema, &state.memory, self.config.updates, MAX_LINES)
        });
        let skipped = RefCell::new(Vec::new());
        let refused_in_a_row = Cell::new(0);
        let stopped_before = RefCell::new(None);
        let check_line = |kept: &str, line: &str| {
            if !self.goes_round(screen, &state.memory, kept, line) {
                refused_in_a_row.set(0);
                return LineVerdict::Keep;
            }
            refused_in_a_row.set(refused_in_a_row.get() + 1);
            if refused_in_a_row.get() >= SKIPS_BEFORE_STOP {
                stopped_before.replace(Some(line.to_string()));
                return LineVerdict::Stop;
            }
            skipped.borrow_mut().push(line.to_string());
            LineVerdict::Skip {
                from: note_start(line),
            }
        };
        let completion = llm.complete_checking_lines(
            &prompt,
            self.config.revision_tokens,
            grammar.as_ref(),
            &check_line,
        )?;
        let (applied, rejected) = self.fold(screen, state, &completion.text);
        // From the output as written: applying drops the sentence a string
        // bound cut, and refused revisions were bound all the same.
        let capped = completion.usage.output_tokens >= self.config.revision_tokens
            || applied.len() + rejected.len() >= MAX_LINES
            || parse_revisions(&completion.text)
                .iter()
                .flatten()
                .any(binds_a_limit);
        Ok(Revised {
            usage: completion.usage,
            output: completion.text,
            applied,
            rejected,
            skipped: skipped.into_inner(),
            stopped_before: stopped_before.into_inner(),
            capped,
            consolidated,
            continuations: 0,
        })
    }

    /// The prompt `prompt_of` builds, and whether the amendments were folded
    /// to make it fit. Amendments only grow: when the prompt plus `budget`
    /// tokens to generate would not fit the context, the revisions are folded
    /// into the base (the memory is encoded afresh once, shorter) and amending
    /// goes on from there. An in-place memory has nothing to fold; a prompt that
    /// still does not fit is refused by the model call.
    fn prompt_that_fits(
        &self,
        llm: &dyn Llm,
        state: &mut PrismState,
        budget: usize,
        prompt_of: impl Fn(&PrismState) -> Prompt,
    ) -> Result<(Prompt, bool)> {
        let prompt = prompt_of(state);
        if self.config.memory != MemoryMode::Amendments
            || state.amendments.revisions.is_empty()
            || llm.prompt_tokens(&prompt)? + budget <= llm.context_tokens()
        {
            return Ok((prompt, false));
        }
        state.amendments = Amendments::new(state.memory.clone());
        state.consolidations += 1;
        Ok((prompt_of(state), true))
    }

    /// Whether the revision `line`, written after the lines `kept`, shows the
    /// model going round in circles. A small model under greedy decoding that
    /// repeats or rewords a note does so until its token budget runs out, so
    /// the step stops at the first such line rather than decoding the rest.
    /// Adding again at a key this step already wrote is the same loop in
    /// another form: Qwen2.5-Coder-1.5B under the code schema added
    /// `$.humanize` a dozen times over, each refused, until its budget ran out.
    fn goes_round(&self, screen: &Screen, memory: &Value, kept: &str, line: &str) -> bool {
        let Some(Ok(revision)) = parse_revisions(line).into_iter().next() else {
            return false;
        };
        let mut memory = memory.clone();
        apply_revisions(
            &mut memory,
            kept,
            self.schema,
            self.config.updates,
            Some(screen),
        );
        let adds_again_where_refused = revision.op == Op::Add
            && parse_revisions(kept)
                .iter()
                .flatten()
                .any(|earlier| earlier.path == revision.path)
            && apply(&memory, &revision, self.schema)
                .is_err_and(|refusal| refusal.kind == RejectionKind::PathExists);
        adds_again_where_refused || screen.goes_round(&memory, &revision)
    }

    /// Parse `output`, lay a summary's notes out one sentence each, take out
    /// of each revision what is redundant, and apply what is left when it
    /// checks out, in order.
    fn fold(
        &self,
        screen: &Screen,
        state: &mut PrismState,
        output: &str,
    ) -> (Vec<Revision>, Vec<Refused>) {
        let mut revisions = parse_revisions(output);
        if self.config.answer_form == AnswerForm::Summary {
            revisions = notes::one_sentence_per_note(revisions);
        }
        let (applied, rejected) = apply_parsed(
            &mut state.memory,
            revisions,
            self.schema,
            self.config.updates,
            Some(screen),
        );
        for revision in &applied {
            state.amendments.push(revision.clone());
        }
        (applied, rejected)
    }
}

/// Refused lines in a row after which a step stops: a small model under
/// greedy decoding that has begun to repeat itself rewords the same note
/// again and again, and a step that still does after this many has noted
/// what it will.
pub const SKIPS_BEFORE_STOP: usize = 3;

/// Further revision calls a step makes, at most, for the part of its
/// summary that a call which stopped early left unnoted.
const MAX_CONTINUATIONS: usize = 3;

/// What the revision calls of one step wrote and did, added up over the
/// calls.
struct Revised {
    usage: Usage,
    output: String,
    applied: Vec<Revision>,
    rejected: Vec<Refused>,
    skipped: Vec<String>,
    stopped_before: Option<String>,
    capped: bool,
    consolidated: bool,
    continuations: usize,
}

impl Revised {
    /// Whether the call stopped before its end: at a repeat or at a bound.
    fn ended_early(&self) -> bool {
        self.stopped_before.is_some() || self.capped
    }

    /// Add a further call's `more` to these.
    fn absorb(&mut self, more: Revised) {
        self.usage += &more.usage;
        self.output.push('\n');
        self.output.push_str(&more.output);
        self.applied.extend(more.applied);
        self.rejected.extend(more.rejected);
        self.skipped.extend(more.skipped);
        self.stopped_before = more.stopped_before.or(self.stopped_before.take());
        self.capped |= more.capped;
        self.consolidated |= more.consolidated;
        self.continuations += 1 + more.continuations;
    }
}

/// Where a refused line's own words begin: its value's first letter or
/// digit, so a line written in its place keeps the revision's form and its
/// path but says something else.
fn note_start(line: &str) -> usize {
    let value = line
        .find("\"value\":")
        .map_or(0, |at| at + "\"value\":".len());
    line[value..]
        .find(|c: char| c.is_alphanumeric())
        .map_or(value, |at| value + at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_line_is_banned_from_its_notes_first_word() {
        let line = r#"{"op": "add", "path": "$.events", "value": "Tomas fired a flare."}"#;
        assert_eq!(&line[note_start(line)..], "Tomas fired a flare.\"}");
        let list = r#"{"op": "add", "path": "$.people.'Wenna Cole'", "value": ["Skipper."]}"#;
        assert_eq!(&list[note_start(list)..], "Skipper.\"]}");
        assert_eq!(note_start("no value here"), 0);
    }
}
