//! PRISM (structured memory with revisions): read the document chunk by chunk;
//! after each chunk the model proposes revisions to a schema-shaped memory, the
//! program checks and applies them, and the final answer comes from the memory.
//!
//! The prompt puts what never changes first (instructions, query, schema),
//! then the memory, then the chunk, so the engine reuses as much of its KV
//! cache as the memory rendering allows. With amendments the memory is the
//! first-written object followed by every accepted revision, so a new revision
//! only appends text; in place, the object is rewritten where it changed.
//! When the amendments grow so long that the next prompt would not fit the
//! context, they are folded into one object and appending starts again.
//!
//! The revisions are screened before they are applied: what the memory
//! already holds and what copies the prompt are refused and counted. The
//! final answer is written from the memory's notes a few at a time (see
//! [`Prism::answer`]). The words of every prompt are in `prompt.rs`.

mod prompt;

use crate::chunk::Chunk;
use crate::engine::constraint::Grammar;
use crate::error::Result;
use crate::llm::{Llm, Prompt};
use crate::memory::grammar::{binds_a_limit, revision_grammar, MAX_LINES};
use crate::memory::revise::{apply_revisions, RefusalKind, Refused};
use crate::memory::{
    apply, parse_revisions, render_in_place, Amendments, Op, RejectionKind, Revision, Schema,
    Screen,
};
use crate::methods::AnswerForm;
use crate::metrics::Tokens;
use crate::run::dir::RunDir;
use crate::run::{Advance, Finish, Method, Position};
use prompt::{
    answer_request, preamble, query_request, revision_request, ANSWER_SYSTEM, EMPTY_MEMORY,
    QUERY_SYSTEM, REVISION_REQUEST, SUMMARIZE_NOTES, SYSTEM,
};
use serde_json::Value;
use std::cell::RefCell;
use std::time::Instant;

/// How the memory is shown to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryMode {
    /// One JSON object, revised where it stands.
    InPlace,
    /// The object as first written, then the accepted revisions in order.
    Amendments,
}

/// The settings a PRISM run's name fixes: the memory layout and the paper's
/// two ablations, as `prism-{amendments,in-place}[-no-updates][-unconstrained]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub memory: MemoryMode,
    pub updates: bool,
    pub constrained: bool,
}

impl Variant {
    /// Every variant, in the order help texts list them.
    pub fn all() -> impl Iterator<Item = Variant> {
        [MemoryMode::Amendments, MemoryMode::InPlace]
            .into_iter()
            .flat_map(|memory| {
                [(true, true), (false, true), (true, false), (false, false)]
                    .into_iter()
                    .map(move |(updates, constrained)| Variant {
                        memory,
                        updates,
                        constrained,
                    })
            })
    }

    /// The variant `name` names, if any.
    pub fn parse(name: &str) -> Option<Variant> {
        Variant::all().find(|variant| variant.name() == name)
    }

    /// `prism-amendments`, `prism-in-place-no-updates-unconstrained`, …: the
    /// label of its runs in `stats.json` and its name in `bench --methods`.
    pub fn name(&self) -> String {
        let memory = match self.memory {
            MemoryMode::InPlace => "in-place",
            MemoryMode::Amendments => "amendments",
        };
        let mut name = format!("prism-{memory}");
        if !self.updates {
            name.push_str("-no-updates");
        }
        if !self.constrained {
            name.push_str("-unconstrained");
        }
        name
    }
}

/// Settings of one PRISM run; everything here is part of a run's identity.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PrismConfig {
    pub memory: MemoryMode,
    /// When false, `update` revisions are refused (the paper's "without updates" ablation).
    pub updates: bool,
    pub query: String,
    /// The most tokens a revision step may generate.
    pub revision_tokens: usize,
    /// The most tokens the final answer may have.
    pub answer_tokens: usize,
    /// Decode revisions under a grammar derived from the schema, so that every
    /// line parses and type-checks.
    pub constrained: bool,
    /// A summary written from the notes part by part, or the query answered
    /// from the whole memory in one call.
    #[serde(default, skip_serializing_if = "AnswerForm::is_summary")]
    pub answer_form: AnswerForm,
}

/// What one chunk's step did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub chunk: usize,
    pub chunk_tokens: usize,
    #[serde(flatten)]
    pub tokens: Tokens,
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
    /// The line the step stopped before, because it repeated or reworded a
    /// note the memory holds, or copied the prompt (see `Screen::goes_round`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_before: Option<String>,
    /// What the model wrote, verbatim.
    pub output: String,
    pub seconds: f64,
}

/// Everything a run carries from one chunk to the next; saved in checkpoints.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PrismState {
    /// The memory with every accepted revision applied.
    pub memory: Value,
    /// The same memory as amendments (kept in both modes: it is the log of accepted revisions).
    pub amendments: Amendments,
    /// Chunks read so far.
    pub chunks_read: usize,
    pub revisions_applied: usize,
    pub revisions_rejected: usize,
    /// Values refused because the memory already held them.
    #[serde(default)]
    pub revisions_duplicate: usize,
    /// Values refused because they copied the prompt or the schema.
    #[serde(default)]
    pub revisions_echo: usize,
    /// Steps where a safety limit on the revisions bound.
    #[serde(default)]
    pub revisions_capped: usize,
    /// Steps stopped at a line that went round in circles.
    #[serde(default)]
    pub revision_steps_stopped: usize,
    /// Times the amendments were folded into their base to make room.
    #[serde(default)]
    pub consolidations: usize,
}

/// What became of the revisions the model wrote, as `stats.json` reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrismFigures {
    pub revisions_applied: usize,
    pub revisions_rejected: usize,
    pub revisions_duplicate: usize,
    pub revisions_echo: usize,
    pub revisions_capped: usize,
    pub revision_steps_stopped: usize,
    pub consolidations: usize,
}

impl PrismState {
    pub fn new(schema: &Schema) -> Self {
        let memory = schema.empty_memory();
        PrismState {
            amendments: Amendments::new(memory.clone()),
            memory,
            chunks_read: 0,
            revisions_applied: 0,
            revisions_rejected: 0,
            revisions_duplicate: 0,
            revisions_echo: 0,
            revisions_capped: 0,
            revision_steps_stopped: 0,
            consolidations: 0,
        }
    }
}

/// The PRISM loop over one document.
pub struct Prism<'a> {
    config: &'a PrismConfig,
    schema: &'a Schema,
    /// Instructions, worked examples, query and schema: the first,
    /// never-changing user segment, and so a prefix every call reuses.
    preamble: String,
    /// Everything the prompts say that is not the document or the memory,
    /// so that copies of it are kept out of the memory.
    screen: Screen,
}

impl<'a> Prism<'a> {
    pub fn new(config: &'a PrismConfig, schema: &'a Schema) -> Self {
        let preamble = preamble(config, schema);
        let screen = Screen::new([
            SYSTEM,
            preamble.as_str(),
            REVISION_REQUEST,
            ANSWER_SYSTEM,
            SUMMARIZE_NOTES,
            EMPTY_MEMORY,
            QUERY_SYSTEM,
        ]);
        Prism {
            config,
            schema,
            preamble,
            screen,
        }
    }

    /// The prompt for revising the memory after reading `chunk`.
    pub fn revision_prompt(&self, state: &PrismState, chunk: &Chunk, chunks: usize) -> Prompt {
        let mut segments = vec![self.preamble.clone()];
        segments.extend(self.memory_segments(state));
        segments.push(format!(
            "Text (chunk {} of {}):\n{}\n",
            chunk.index + 1,
            chunks,
            chunk.text.trim_end()
        ));
        segments.push(revision_request(&chunk.text));
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments,
        }
    }

    /// The prompt for one part of the final answer: a fixed opening shared
    /// by every part, then the notes this part condenses. Neither the rest of
    /// the memory nor the revision prompt's opening is shown: given the whole
    /// memory the model summarizes all of it again in every part, and given
    /// the worked examples it retells them.
    pub fn answer_prompt(&self, part: &AnswerPart) -> Prompt {
        Prompt {
            system: Some(ANSWER_SYSTEM.to_string()),
            segments: vec![answer_request(part)],
        }
    }

    /// The prompt that answers the query from the memory: the whole memory
    /// as one object, then the query. Unlike a summary, a direct answer
    /// must weigh every note against the others (which candidate fits
    /// best), so it is one call that sees them all.
    pub fn query_prompt(&self, state: &PrismState) -> Prompt {
        Prompt {
            system: Some(QUERY_SYSTEM.to_string()),
            segments: vec![query_request(
                &render_in_place(&state.memory),
                &self.config.query,
            )],
        }
    }

    fn memory_segments(&self, state: &PrismState) -> Vec<String> {
        let mut segments = vec!["\nMemory so far:\n".to_string()];
        match self.config.memory {
            MemoryMode::InPlace => segments.push(render_in_place(&state.memory)),
            MemoryMode::Amendments => segments.extend(state.amendments.segments()),
        }
        segments
    }

    /// Run the revision step for `chunk` and fold its revisions into `state`.
    pub fn step(
        &self,
        llm: &mut dyn Llm,
        state: &mut PrismState,
        chunk: &Chunk,
        chunks: usize,
    ) -> Result<Step> {
        let start = Instant::now();
        let (prompt, consolidated) =
            self.prompt_that_fits(llm, state, self.config.revision_tokens, |state| {
                self.revision_prompt(state, chunk, chunks)
            })?;
        let grammar = self.config.constrained.then(|| {
            Grammar::Lark(revision_grammar(
                self.schema,
                &state.memory,
                self.config.updates,
                MAX_LINES,
            ))
        });
        let stopped_before = RefCell::new(None);
        let refuse_line = |kept: &str, line: &str| {
            let refused = self.goes_round(&state.memory, kept, line);
            if refused {
                stopped_before.replace(Some(line.to_string()));
            }
            refused
        };
        let completion = llm.complete_checking_lines(
            &prompt,
            self.config.revision_tokens,
            grammar.as_ref(),
            &refuse_line,
        )?;
        let stopped_before = stopped_before.into_inner();
        state.revision_steps_stopped += usize::from(stopped_before.is_some());
        let (applied, rejected) = self.fold(state, &completion.text);
        // From the output as written: applying drops the sentence a string
        // bound cut, and refused revisions were bound all the same.
        let capped = completion.usage.output_tokens >= self.config.revision_tokens
            || applied.len() + rejected.len() >= MAX_LINES
            || parse_revisions(&completion.text)
                .iter()
                .flatten()
                .any(binds_a_limit);
        state.revisions_applied += applied.len();
        for refusal in &rejected {
            match refusal.kind {
                RefusalKind::Invalid => state.revisions_rejected += 1,
                RefusalKind::Duplicate => state.revisions_duplicate += 1,
                RefusalKind::Echo => state.revisions_echo += 1,
            }
        }
        state.revisions_capped += usize::from(capped);
        Ok(Step {
            chunk: chunk.index,
            chunk_tokens: chunk.tokens,
            tokens: Tokens::of(&completion.usage),
            applied,
            rejected,
            consolidated,
            capped,
            stopped_before,
            output: completion.text,
            seconds: start.elapsed().as_secs_f64(),
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
    fn goes_round(&self, memory: &Value, kept: &str, line: &str) -> bool {
        let Some(Ok(revision)) = parse_revisions(line).into_iter().next() else {
            return false;
        };
        let mut memory = memory.clone();
        apply_revisions(
            &mut memory,
            kept,
            self.schema,
            self.config.updates,
            Some(&self.screen),
        );
        let adds_again_where_refused = revision.op == Op::Add
            && parse_revisions(kept)
                .iter()
                .flatten()
                .any(|earlier| earlier.path == revision.path)
            && apply(&memory, &revision, self.schema)
                .is_err_and(|refusal| refusal.kind == RejectionKind::PathExists);
        adds_again_where_refused || self.screen.goes_round(&memory, &revision)
    }

    /// Parse `output`, take out of each revision what is redundant, and apply
    /// what is left when it checks out, in order.
    fn fold(&self, state: &mut PrismState, output: &str) -> (Vec<Revision>, Vec<Refused>) {
        let (applied, rejected) = apply_revisions(
            &mut state.memory,
            output,
            self.schema,
            self.config.updates,
            Some(&self.screen),
        );
        for revision in &applied {
            state.amendments.push(revision.clone());
        }
        (applied, rejected)
    }

    /// Write the final answer from the memory, part by part: each call
    /// condenses a run of its notes into a few sentences, and the parts are
    /// joined in memory order. A small model asked to summarize a long memory
    /// in one call copies it out; asked to condense a hundred words of notes
    /// it writes two or three good sentences.
    pub fn answer(&self, llm: &mut dyn Llm, state: &PrismState) -> Result<String> {
        if self.config.answer_form == AnswerForm::Direct {
            let prompt = self.query_prompt(state);
            let completion = llm.complete(&prompt, self.config.answer_tokens, None)?;
            return Ok(completion.text.trim().to_string());
        }
        let parts = answer_parts(&memory_notes(&state.memory), self.config.answer_tokens);
        let part_tokens = self.config.answer_tokens / parts.len().max(1);
        let mut answer = Vec::with_capacity(parts.len());
        for part in &parts {
            let completion = llm.complete(&self.answer_prompt(part), part_tokens, None)?;
            let text = completion.text.trim();
            let text = if completion.usage.output_tokens < part_tokens {
                text
            } else {
                &text[..last_sentence_end(text).unwrap_or(text.len())]
            };
            if !text.is_empty() {
                answer.push(text.to_string());
            }
        }
        Ok(answer.join("\n\n"))
    }
}

/// Where the last whole sentence of `text` ends: after a `.`, `!` or `?`
/// that closes the text or comes before whitespace, and is not the dot of a
/// list number ("3."), which a part cut at its token budget often ends on.
fn last_sentence_end(text: &str) -> Option<usize> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    chars
        .iter()
        .enumerate()
        .rev()
        .find_map(|(at, &(offset, c))| {
            let closes = matches!(c, '.' | '!' | '?')
                && chars
                    .get(at + 1)
                    .is_none_or(|(_, next)| next.is_whitespace());
            let list_number = c == '.'
                && at > 0
                && chars[at - 1].1.is_ascii_digit()
                && chars[..at]
                    .iter()
                    .rev()
                    .find(|(_, earlier)| !earlier.is_ascii_digit())
                    .is_none_or(|(_, earlier)| earlier.is_whitespace());
            (closes && !list_number).then_some(offset + c.len_utf8())
        })
}

/// The notes of a memory, in memory order: every string, led by the key it
/// sits under when that key is deeper than the top level (a person's name,
/// say), so that a note read alone still says what it is about.
fn memory_notes(memory: &Value) -> Vec<String> {
    fn walk(value: &Value, key: Option<&str>, depth: usize, notes: &mut Vec<String>) {
        match value {
            Value::String(text) if !text.trim().is_empty() => notes.push(match key {
                Some(key) if depth > 1 => format!("{key}: {}", text.trim()),
                _ => text.trim().to_string(),
            }),
            Value::Array(items) => {
                for item in items {
                    walk(item, key, depth, notes);
                }
            }
            Value::Object(members) => {
                for (name, member) in members {
                    walk(member, Some(name), depth + 1, notes);
                }
            }
            Value::Number(_) | Value::Bool(_) => {
                if let Some(key) = key {
                    notes.push(format!("{key}: {value}"));
                }
            }
            _ => {}
        }
    }
    let mut notes = Vec::new();
    walk(memory, None, 0, &mut notes);
    notes
}

/// Words of notes one part of the final answer condenses: about five notes
/// of one sentence. Parts are cut by words, not notes: Qwen2.5-Coder-1.5B
/// condenses little, and five notes of three sentences each ran past the
/// part's tokens, so the sentence the part was cut at lost the log's ending.
const WORDS_PER_PART: usize = 100;
/// The fewest tokens one part of the answer is given.
const MIN_PART_TOKENS: usize = 80;

/// The notes split into consecutive runs of about [`WORDS_PER_PART`] words,
/// in as many parts as `answer_tokens` can give [`MIN_PART_TOKENS`] each. An
/// empty memory still gets one part, which says so.
fn answer_parts(notes: &[String], answer_tokens: usize) -> Vec<AnswerPart> {
    let words: Vec<usize> = notes
        .iter()
        .map(|note| note.split_whitespace().count().max(1))
        .collect();
    let total: usize = words.iter().sum();
    let max_parts = (answer_tokens / MIN_PART_TOKENS).max(1);
    let parts = total.div_ceil(WORDS_PER_PART).clamp(1, max_parts);
    let words_per_part = total.div_ceil(parts);
    let mut runs = Vec::with_capacity(parts);
    let mut run: Vec<String> = Vec::new();
    let mut run_words = 0;
    for (note, &note_words) in notes.iter().zip(&words) {
        let full = run_words + note_words > words_per_part && runs.len() + 1 < parts;
        if full && !run.is_empty() {
            runs.push(AnswerPart {
                notes: std::mem::take(&mut run),
            });
            run_words = 0;
        }
        run.push(note.clone());
        run_words += note_words;
    }
    runs.push(AnswerPart { notes: run });
    runs
}

/// A run of notes that one call of the final answer condenses.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerPart {
    pub notes: Vec<String>,
}

impl Method for Prism<'_> {
    type State = PrismState;
    type Step = Step;
    type Figures = PrismFigures;

    fn label(&self) -> String {
        Variant {
            memory: self.config.memory,
            updates: self.config.updates,
            constrained: self.config.constrained,
        }
        .name()
    }

    fn template_texts(&self) -> Vec<String> {
        vec![
            SYSTEM.to_string(),
            self.preamble.clone(),
            REVISION_REQUEST.to_string(),
            ANSWER_SYSTEM.to_string(),
            SUMMARIZE_NOTES.to_string(),
            EMPTY_MEMORY.to_string(),
            QUERY_SYSTEM.to_string(),
        ]
    }

    fn start(&self, _chunks: &[Chunk]) -> PrismState {
        PrismState::new(self.schema)
    }

    fn position(&self, state: &PrismState, chunks: &[Chunk]) -> Position {
        let stage = if state.chunks_read < chunks.len() {
            format!("chunk {}/{}", state.chunks_read + 1, chunks.len())
        } else {
            "final answer".to_string()
        };
        Position {
            done: state.chunks_read,
            total: chunks.len() + 1,
            stage,
        }
    }

    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut PrismState,
        chunks: &[Chunk],
    ) -> Result<Advance<Step, PrismFigures>> {
        if let Some(chunk) = chunks.get(state.chunks_read) {
            let step = self.step(llm, state, chunk, chunks.len())?;
            state.chunks_read += 1;
            return Ok(Advance::Step(step));
        }
        let summary = self.answer(llm, state)?;
        let figures = PrismFigures {
            revisions_applied: state.revisions_applied,
            revisions_rejected: state.revisions_rejected,
            revisions_duplicate: state.revisions_duplicate,
            revisions_echo: state.revisions_echo,
            revisions_capped: state.revisions_capped,
            revision_steps_stopped: state.revision_steps_stopped,
            consolidations: state.consolidations,
        };
        Ok(Advance::Done(Finish {
            summary,
            files: vec![(RunDir::MEMORY, state.memory.clone())],
            figures,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn notes_come_in_memory_order_with_their_key_below_the_top() {
        let memory = json!({
            "events": ["The fog came down.", "Tomas fired a flare."],
            "people": {"Wenna Cole": ["Skipper of the Marigold."]},
            "setting": [],
        });
        assert_eq!(
            memory_notes(&memory),
            [
                "The fog came down.",
                "Tomas fired a flare.",
                "Wenna Cole: Skipper of the Marigold."
            ]
        );
    }

    #[test]
    fn the_answer_takes_about_a_hundred_words_a_part_within_the_budget() {
        // Twelve notes of eleven words, then two of fifty.
        let mut notes: Vec<String> = (0..12)
            .map(|i| format!("note {i} says what one short part of the text said"))
            .collect();
        let sizes =
            |parts: Vec<AnswerPart>| parts.iter().map(|p| p.notes.len()).collect::<Vec<_>>();
        assert_eq!(sizes(answer_parts(&notes, 900)), [6, 6]);
        notes.extend((0..2).map(|i| format!("long note {i} {}", "word ".repeat(47))));
        assert_eq!(sizes(answer_parts(&notes, 900)), [7, 5, 2]);
        // 160 tokens give two parts of at least 80 tokens.
        assert_eq!(sizes(answer_parts(&notes, 160)), [10, 4]);
        assert_eq!(sizes(answer_parts(&notes, 10)), [14]);
        assert_eq!(sizes(answer_parts(&[], 900)), [0]);
    }

    #[test]
    fn a_cut_answer_ends_at_a_sentence_not_a_list_number() {
        let text = "1. Keep tools dull. It slows work.\n2. Jam the locks.\n3.";
        assert_eq!(
            last_sentence_end(text).map(|end| &text[..end]),
            Some("1. Keep tools dull. It slows work.\n2. Jam the locks.")
        );
        let prices = "It cost 3.50 in all. Then it";
        assert_eq!(
            last_sentence_end(prices).map(|end| &prices[..end]),
            Some("It cost 3.50 in all.")
        );
        assert_eq!(last_sentence_end("no end here"), None);
    }
}
