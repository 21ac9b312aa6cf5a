//! PRISM (structured memory with revisions): after each chunk the model proposes
//! revisions to a schema-shaped memory, the program checks and applies them.

mod answer;
mod notes;
mod prompt;
mod reading;

use crate::chunk::Chunk;
use crate::engine::{is_zero, LineVerdict, Usage};
use crate::error::Result;
use crate::llm::{Llm, Prompt, Source};
use crate::memory::grammar::{binds_a_limit, revision_constraint, MAX_LINES};
use crate::memory::revise::{apply_parsed, apply_revisions, RefusalKind, Refused};
use crate::memory::{
    apply, parse_revisions, render_in_place, Amendments, Op, RejectionKind, Revision, Schema,
    Screen,
};
use crate::methods::baseline::Call;
use crate::methods::length::{self, target_words, CONDENSE_SYSTEM};
use crate::methods::AnswerForm;
use crate::metrics::Tokens;
use crate::run::dir::RunDir;
use crate::run::{Advance, Finish, Method, Position};
use answer::memory_notes;
use prompt::{
    preamble, query_request, revision_request, summary_request, EMPTY_MEMORY, PEOPLE_REQUEST,
    QUERY_SYSTEM, REVISION_REQUEST, SUMMARY_SYSTEM, SYSTEM,
};
use reading::{people_revisions, summarize};
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::time::Instant;

/// How the memory is shown to the model.
///
/// With amendments the memory is the first-written object followed by every
/// accepted revision, so a new revision only appends text and the memory
/// already encoded stays a cached prefix; in place, the object is rewritten
/// where it changed. When the amendments grow so long that the next prompt
/// would not fit the context, they are folded into one object and appending
/// starts again.
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

/// What the revision step is shown of each chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reading {
    /// A summary of the chunk that a call of its own writes first, so that
    /// the notes are in the model's words.
    #[default]
    Summary,
    /// The chunk's text, as the paper has it.
    Text,
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
    /// The most tokens a direct answer may have.
    pub answer_tokens: usize,
    /// The summary's length in words; by default it scales with the document
    /// ([`target_words`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_words: Option<usize>,
    /// Decode revisions under a grammar derived from the schema, so that every
    /// line parses and type-checks.
    pub constrained: bool,
    /// What the revision step is shown of each chunk.
    #[serde(default)]
    pub reading: Reading,
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
    /// Values refused because they copied a long run of the chunk.
    #[serde(default)]
    pub revisions_copy: usize,
    /// Values refused because their words were mostly not in what was read.
    #[serde(default)]
    pub revisions_ungrounded: usize,
    /// Values refused because they spoke in the first person.
    #[serde(default)]
    pub revisions_first_person: usize,
    /// Lines refused while decoding, with the step going on in their place.
    #[serde(default)]
    pub revision_lines_skipped: usize,
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
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revisions_copy: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revisions_ungrounded: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revisions_first_person: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revision_lines_skipped: usize,
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
            revisions_copy: 0,
            revisions_ungrounded: 0,
            revisions_first_person: 0,
            revision_lines_skipped: 0,
            revisions_capped: 0,
            revision_steps_stopped: 0,
            consolidations: 0,
        }
    }

    /// Count each refused revision under its kind.
    fn count_refused(&mut self, refused: &[Refused]) {
        for refusal in refused {
            match refusal.kind {
                RefusalKind::Invalid => self.revisions_rejected += 1,
                RefusalKind::Duplicate => self.revisions_duplicate += 1,
                RefusalKind::Echo => self.revisions_echo += 1,
                RefusalKind::Copy => self.revisions_copy += 1,
                RefusalKind::Ungrounded => self.revisions_ungrounded += 1,
                RefusalKind::FirstPerson => self.revisions_first_person += 1,
            }
        }
    }
}

/// The PRISM loop over one document: read it chunk by chunk, revise the
/// memory after each, and answer from the memory at the end.
///
/// The prompt puts what never changes first (instructions, query, schema),
/// then the memory, then the chunk, so the engine reuses as much of its KV
/// cache as the memory rendering allows ([`MemoryMode`]).
///
/// For a summary, each chunk is first summarized on its own and its people
/// listed; the revision step notes that summary rather than the chunk, so
/// the notes are in the model's own words, and the people are added after.
/// Revisions are screened before they are applied (repeats, copies of the
/// prompt or the chunk, the first person) and what is refused is counted.
/// The final answer is condensed from the memory's notes, people first, to
/// the run's target length ([`length::condense`]). The words of every
/// prompt are in `prompt.rs`.
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
            CONDENSE_SYSTEM,
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

    /// The prompt for revising the memory after reading `chunk`, shown as
    /// its `summary` when there is one, else as its text.
    pub fn revision_prompt(
        &self,
        state: &PrismState,
        chunk: &Chunk,
        chunks: usize,
        summary: Option<&str>,
    ) -> Prompt {
        let mut segments = vec![self.preamble.clone()];
        segments.extend(self.memory_segments(state));
        // The next step's prompt starts with the same preamble and memory,
        // and with amendments with all of it; the chunk is read once.
        let shared_segments = Some(segments.len());
        let (heading, shown) = match summary {
            Some(summary) => ("Summary of chunk", summary),
            None => ("Text (chunk", chunk.text.as_str()),
        };
        let close = if summary.is_some() { "" } else { ")" };
        segments.push(format!(
            "{heading} {} of {chunks}{close}:\n{}\n",
            chunk.index + 1,
            shown.trim_end()
        ));
        segments.push(revision_request(shown));
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments,
            source: None,
            shared_segments,
        }
    }

    /// The prompt that summarizes `piece` of a chunk on its own in at
    /// least `sentences` sentences.
    pub fn summary_prompt(piece: &Chunk, sentences: usize) -> Prompt {
        Prompt {
            system: Some(SUMMARY_SYSTEM.to_string()),
            segments: vec![
                summary_request(sentences),
                format!("{}\n", piece.text.trim_end()),
            ],
            source: Some(Source::segment(1)),
            shared_segments: Some(1),
        }
    }

    /// The prompt that lists the people of `chunk` and who they are.
    pub fn people_prompt(chunk: &Chunk) -> Prompt {
        Prompt {
            system: Some(SUMMARY_SYSTEM.to_string()),
            segments: vec![
                PEOPLE_REQUEST.to_string(),
                format!("{}\n", chunk.text.trim_end()),
            ],
            source: None,
            shared_segments: Some(1),
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
            source: None,
            shared_segments: Some(0),
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
        let merging = length::merge_prompt(&[], None);
        vec![
            SYSTEM.to_string(),
            self.preamble.clone(),
            REVISION_REQUEST.to_string(),
            CONDENSE_SYSTEM.to_string(),
            merging.segments.concat(),
            PEOPLE_REQUEST.to_string(),
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
        let target = target_words(self.config.summary_words, chunks);
        let summary = self.answer(llm, state, target)?;
        let figures = PrismFigures {
            revisions_applied: state.revisions_applied,
            revisions_rejected: state.revisions_rejected,
            revisions_duplicate: state.revisions_duplicate,
            revisions_echo: state.revisions_echo,
            revisions_copy: state.revisions_copy,
            revisions_ungrounded: state.revisions_ungrounded,
            revisions_first_person: state.revisions_first_person,
            revision_lines_skipped: state.revision_lines_skipped,
            revisions_capped: state.revisions_capped,
            revision_steps_stopped: state.revision_steps_stopped,
            consolidations: state.consolidations,
        };
        let direct = self.config.answer_form == AnswerForm::Direct;
        Ok(Advance::Done(Finish {
            summary,
            files: vec![(RunDir::MEMORY, state.memory.clone())],
            notes: memory_notes(&state.memory),
            summary_words_target: (!direct).then_some(target),
            figures,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::answer::cast_and_notes;
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
    fn a_summary_opens_with_the_people_the_notes_name_most() {
        let memory = serde_json::json!({
            "events": ["At dusk Wenna Cole waited in the lee.", "Then Tomas fired a flare.", "Later Tomas rang the bell.", "A gale came, and Ada Penhallow logged it."],
            "people": {
                "Ada Penhallow": ["the writer."],
                "Tomas Reddick": ["the assistant keeper", "He rang the bell."],
                "Wenna Cole": ["A skipper who waited out the fog in the lee of the rock until the next noon."],
            },
            "themes": ["Duty."]
        });
        let (cast, notes) = cast_and_notes(&memory, 30);
        assert_eq!(
            cast,
            "The people in it include Tomas Reddick (the assistant keeper), Ada Penhallow (the writer) and Wenna Cole."
        );
        assert_eq!(notes.last().map(String::as_str), Some("Duty."));
        assert_eq!(
            notes.len(),
            5,
            "named notes are told by the cast: {notes:?}"
        );
        let (short, _) = cast_and_notes(&memory, 8);
        assert_eq!(
            short,
            "The people in it include Tomas Reddick (the assistant keeper)."
        );
        let (none, _) = cast_and_notes(&serde_json::json!({"events": ["A gale came."]}), 30);
        assert!(none.is_empty());
    }

    #[test]
    fn the_cast_names_only_those_the_notes_use_as_names() {
        let memory = serde_json::json!({
            "events": [
                "Turbines fail when water gets in.",
                "The orders of Duke Frederick banish Rosalind, and Duke Senior lives in the forest.",
                "Frederick rules the court and Frederick fears Rosalind.",
                "Fuel lines clog with sawdust."
            ],
            "people": {
                "Turbines": ["the turbine"],
                "Fuel lines": ["in engines"],
                "Duke Senior": ["the banished duke"],
                "Duke Frederick": ["the usurper"],
                "Rosalind": ["his daughter"],
                "Project Gutenberg Literary Archive Foundation": ["the publisher"],
            },
        });
        // "Duke" names two people, so it counts for neither: Frederick is
        // named most. A role that would not fit leaves the name alone.
        let (cast, _) = cast_and_notes(&memory, 16);
        assert_eq!(
            cast,
            "The people in it include Duke Frederick (the usurper), Rosalind (his daughter) and Duke Senior."
        );
        let (none, _) = cast_and_notes(
            &serde_json::json!({"events": ["Turbines fail."], "people": {"Turbines": ["the turbine"]}}),
            30,
        );
        assert!(none.is_empty(), "{none}");
        let manual = serde_json::json!({
            "events": [
                "The Simple Sabotage Field Manual was issued by William Donovan.",
                "The manual tells how simple sabotage slows the enemy, and Donovan signs it.",
            ],
            "people": {
                "Simple Sabotage Field Manual": ["the manual"],
                "William Donovan": ["the director"],
            },
        });
        let (cast, _) = cast_and_notes(&manual, 30);
        assert_eq!(
            cast,
            "The people in it include William Donovan (the director)."
        );
    }

    #[test]
    fn a_refused_line_is_banned_from_its_notes_first_word() {
        let line = r#"{"op": "add", "path": "$.events", "value": "Tomas fired a flare."}"#;
        assert_eq!(&line[note_start(line)..], "Tomas fired a flare.\"}");
        let list = r#"{"op": "add", "path": "$.people.'Wenna Cole'", "value": ["Skipper."]}"#;
        assert_eq!(&list[note_start(list)..], "Skipper.\"]}");
        assert_eq!(note_start("no value here"), 0);
    }
}
