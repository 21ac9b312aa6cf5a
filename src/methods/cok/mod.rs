//! The Chain-of-Key paper's methods, as baselines: generate-update, generate-merge
//! and chain-of-key, each keeping one memory that it compresses past a token limit.

pub mod chain;
pub mod merge;
mod update;

use super::length::{target_words, to_length, tokens_for};
use crate::chunk::Chunk;
use crate::engine::constraint::Grammar;
use crate::error::{Error, Result};
use crate::llm::{Completion, Llm, Prompt};
use crate::memory::grammar::memory_json_schema;
use crate::memory::revise::Refused;
use crate::memory::{parse_memory, render_in_place, Revision, Schema};
use crate::metrics::Tokens;
use crate::run::dir::RunDir;
use crate::run::{prompt_texts, Advance, Finish, Method, Position};
use chain::KeyChain;
use serde_json::Value;
use std::time::Instant;

/// Which of the paper's methods runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Generate-update with a prose memory.
    GuText,
    /// Generate-update with a JSON memory.
    GuJson,
    /// Generate-merge: a JSON memory per chunk, merged by key, then rid of repeats.
    GmJson,
    /// Chain-of-key revisions of a JSON memory.
    Cok,
}

impl Variant {
    /// The name `--method` and `stats.json` use.
    pub fn name(self) -> &'static str {
        match self {
            Variant::GuText => "gu-text",
            Variant::GuJson => "gu-json",
            Variant::GmJson => "gm-json",
            Variant::Cok => "cok",
        }
    }
}

/// Settings of one run of these methods; everything here is part of a run's identity.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CokConfig {
    pub query: String,
    /// The most tokens one step may add: all of a chain-of-key step's
    /// revisions, all of a chunk's own memory in generate-merge, and how far a
    /// rewrite of the memory may outgrow the memory it rewrites.
    pub step_tokens: usize,
    /// The most tokens the final answer may have.
    pub answer_tokens: usize,
    /// The final answer's length in words; by default it scales with the
    /// document ([`target_words`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_words: Option<usize>,
    /// Compress the memory when it renders to more tokens than this; `None`: never.
    pub memory_token_limit: Option<usize>,
    /// JSON memories: decode under a grammar derived from the schema, so that
    /// every output parses and validates unless it is cut off.
    pub constrained: bool,
}

/// How many times one compression is tried before the memory is left over its limit.
const COMPRESSION_ATTEMPTS: usize = 2;

/// What the next unit of work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Read the next chunk, or answer when none is left.
    Read,
    /// Rewrite the freshly merged memory without repeats (generate-merge).
    Dedup,
    /// Shrink the memory under its limit; `attempt` counts from 0.
    Compress { attempt: usize },
}

/// Running totals of what the model's outputs came to.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Whole memories (generate-update) or chunk memories (generate-merge)
    /// refused because they did not parse or validate.
    pub updates_rejected: usize,
    /// Rewrites without repeats refused the same way (generate-merge).
    pub dedups_rejected: usize,
    pub revisions_applied: usize,
    pub revisions_rejected: usize,
    /// Chain-of-key outputs that held all three key lists.
    pub chains_complete: usize,
    pub compressions: usize,
    /// Compressions refused: unreadable, or no shorter than the memory.
    pub compressions_failed: usize,
}

/// The [`Counts`] of one variant and the final memory's size, as
/// `stats.json` reports them; a count the variant cannot change is left out.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CokFigures {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updates_rejected: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedups_rejected: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions_applied: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions_rejected: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chains_complete: Option<usize>,
    pub compressions: usize,
    pub compressions_failed: usize,
    /// Tokens of the final memory.
    pub memory_tokens: usize,
}

/// Everything a run carries from one unit to the next; saved in checkpoints.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CokState {
    /// The memory: a JSON object shaped by the schema, or for `gu-text` a
    /// JSON string of prose.
    pub memory: Value,
    /// Tokens of the rendered memory after the last unit (0 before the first).
    pub memory_tokens: usize,
    pub chunks_read: usize,
    pub next: Phase,
    /// Units of work done so far.
    pub steps_done: usize,
    pub counts: Counts,
}

/// Which model call a step made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// Generate-update: the whole memory, rewritten after a chunk.
    Update,
    /// Generate-merge: a memory of one chunk alone.
    Generate,
    /// Generate-merge: the merged memory, rewritten without repeats.
    Dedup,
    /// Chain-of-key: key lists and revisions for a chunk.
    Revise,
    /// The memory, rewritten shorter.
    Compress,
}

/// What one model call did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub call: Call,
    /// The chunk the call read, if it read one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<usize>,
    #[serde(flatten)]
    pub tokens: Tokens,
    /// Tokens of the rendered memory after the call.
    pub memory_tokens: usize,
    /// Why the output was refused whole, leaving the memory as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Chain-of-key: the key lists the output held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<KeyChain>,
    /// Chain-of-key: the revisions applied, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied: Vec<Revision>,
    /// Chain-of-key: the revisions refused, with the reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<Refused>,
    /// What the model wrote, verbatim.
    pub output: String,
    pub seconds: f64,
}

impl Step {
    fn of(call: Call, chunk: Option<usize>, completion: &Completion) -> Self {
        Step {
            call,
            chunk,
            tokens: Tokens::of(&completion.usage),
            memory_tokens: 0,
            refused: None,
            chain: None,
            applied: Vec::new(),
            rejected: Vec::new(),
            output: completion.text.clone(),
            seconds: 0.0,
        }
    }
}

/// The method with the schema its memory needs, if any.
#[derive(Clone, Copy)]
enum Kind<'a> {
    GuText,
    GuJson(&'a Schema),
    GmJson(&'a Schema),
    Cok(&'a Schema),
}

impl<'a> Kind<'a> {
    /// The schema of a JSON memory; `None` for prose.
    fn schema(self) -> Option<&'a Schema> {
        match self {
            Kind::GuText => None,
            Kind::GuJson(schema) | Kind::GmJson(schema) | Kind::Cok(schema) => Some(schema),
        }
    }
}

/// One of the paper's methods over one document. Each model call is one unit
/// of work for [`drive`](crate::run::drive), so a run can stop and resume
/// between any two calls.
pub struct Cok<'a> {
    variant: Variant,
    kind: Kind<'a>,
    config: &'a CokConfig,
    /// Task, query, the memory's form and what a step writes: the first,
    /// never-changing user segment of every prompt.
    preamble: String,
    /// The grammar of a whole JSON memory, when decoding is constrained.
    memory_grammar: Option<Grammar>,
    /// `memory_token_limit`, or `usize::MAX` when there is none (nothing is over it).
    limit: usize,
}

const SYSTEM: &str = "You keep a memory of a long document that you read one chunk at a time. You write exactly what you are asked for and nothing else.";

impl<'a> Cok<'a> {
    /// `schema` shapes the memory of every variant but `gu-text`, which ignores it.
    pub fn new(
        variant: Variant,
        config: &'a CokConfig,
        schema: Option<&'a Schema>,
    ) -> Result<Self> {
        let kind = match (variant, schema) {
            (Variant::GuText, _) => Kind::GuText,
            (Variant::GuJson, Some(schema)) => Kind::GuJson(schema),
            (Variant::GmJson, Some(schema)) => Kind::GmJson(schema),
            (Variant::Cok, Some(schema)) => Kind::Cok(schema),
            (_, None) => {
                return Err(Error::invalid(
                    variant.name(),
                    "a JSON memory needs a schema",
                ))
            }
        };
        let memory_grammar = kind
            .schema()
            .filter(|_| config.constrained)
            .map(|schema| Grammar::JsonSchema(memory_json_schema(schema)));
        Ok(Cok {
            variant,
            kind,
            config,
            preamble: preamble(kind, &config.query),
            memory_grammar,
            limit: config.memory_token_limit.unwrap_or(usize::MAX),
        })
    }

    /// A prompt of the preamble followed by `tail`.
    fn prompt(&self, tail: Vec<String>) -> Prompt {
        let mut segments = vec![self.preamble.clone()];
        segments.extend(tail);
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments,
            source: None,
            shared_segments: None,
        }
    }

    /// Ask, after the preamble and `tail`, for a whole memory in the memory's
    /// form; returns the call as a step and the memory read from it, or why
    /// it is refused. `current` is the memory it would replace.
    fn rewrite(
        &self,
        llm: &mut dyn Llm,
        call: Call,
        chunk: Option<usize>,
        current: &Value,
        tail: Vec<String>,
        max_tokens: usize,
    ) -> Result<(Step, std::result::Result<Value, String>)> {
        let prompt = self.prompt(tail);
        let max_tokens = fit(llm, &prompt, max_tokens)?;
        let completion = llm.complete(&prompt, max_tokens, self.memory_grammar.as_ref())?;
        let read = read_memory(&completion.text, self.kind.schema(), current);
        Ok((Step::of(call, chunk, &completion), read))
    }

    /// The most tokens a rewrite of the current memory may take.
    fn rewrite_tokens(&self, state: &CokState) -> usize {
        state.memory_tokens + self.config.step_tokens
    }

    /// Have the model write the memory shorter. A result that is unreadable
    /// or no shorter is refused and the memory stays as it was.
    fn compress(&self, llm: &mut dyn Llm, state: &mut CokState) -> Result<Step> {
        let before = state.memory_tokens;
        let mut tail = memory_segments(&state.memory);
        tail.push(self.compress_request(before));
        let (mut step, read) =
            self.rewrite(llm, Call::Compress, None, &state.memory, tail, self.limit)?;
        let shorter = match read {
            Ok(memory) => {
                let after = llm.count_tokens(&render_memory(&memory))?;
                if after < before {
                    Ok(memory)
                } else {
                    Err(format!(
                        "not shorter: {after} tokens, the memory had {before}"
                    ))
                }
            }
            Err(reason) => Err(reason),
        };
        match shorter {
            Ok(memory) => {
                state.memory = memory;
                state.counts.compressions += 1;
            }
            Err(reason) => {
                state.counts.compressions_failed += 1;
                step.refused = Some(reason);
            }
        }
        Ok(step)
    }

    /// What the model is asked to write to shrink a memory of `before` tokens.
    fn compress_request(&self, before: usize) -> String {
        let form = match self.kind {
            Kind::GuText => "Write plain prose",
            _ => "Write one JSON object of the same shape",
        };
        format!(
            "\n## Your answer\nThe memory above has grown to {before} tokens; it must stay under {limit}. Write it again in about {words} words: merge notes that repeat each other, keep what comes up often and what matters most for the query, and leave out minor details. {form}, and nothing else.\n",
            limit = self.limit,
            // Half the limit, in words of about 1.3 tokens: room for a few
            // chunks before the next compression.
            words = self.limit * 3 / 8,
        )
    }

    /// What the model is asked to write once the document has ended.
    fn answer_request(&self, words: usize) -> String {
        format!(
            "\n## Your answer\nThe document has ended and the memory above is complete. Using only the memory, answer the query in plain prose, not JSON, in about {words} words:\n{}\n",
            self.config.query
        )
    }

    /// Read the next chunk the way this method does; returns the step and the
    /// phase it calls for next, if it calls for one.
    fn read(
        &self,
        llm: &mut dyn Llm,
        state: &mut CokState,
        chunk: &Chunk,
        chunks: usize,
    ) -> Result<(Step, Option<Phase>)> {
        match self.kind {
            Kind::GuText | Kind::GuJson(_) => {
                Ok((update::step(self, llm, state, chunk, chunks)?, None))
            }
            Kind::GmJson(schema) => merge::generate(self, schema, llm, state, chunk, chunks),
            Kind::Cok(schema) => Ok((chain::step(self, schema, llm, state, chunk, chunks)?, None)),
        }
    }

    /// Answer the query from the final memory, at the length every method aims at.
    fn finish(
        &self,
        llm: &mut dyn Llm,
        state: &CokState,
        chunks: &[Chunk],
    ) -> Result<Finish<CokFigures>> {
        let target = target_words(self.config.summary_words, chunks);
        let mut tail = memory_segments(&state.memory);
        tail.push(self.answer_request(target));
        let budget = self.config.answer_tokens.min(tokens_for(target));
        let completion = llm.complete(&self.prompt(tail), budget, None)?;
        Ok(Finish {
            summary: to_length(llm, completion.text.trim(), target)?.text,
            summary_words_target: Some(target),
            files: vec![(RunDir::MEMORY, state.memory.clone())],
            notes: Vec::new(),
            figures: self.figures(state),
        })
    }

    /// The counts `stats.json` reports for this variant: only those its
    /// kind of step can change.
    fn figures(&self, state: &CokState) -> CokFigures {
        let counts = &state.counts;
        let (updating, merging, chaining) = match self.kind {
            Kind::GuText | Kind::GuJson(_) => (true, false, false),
            Kind::GmJson(_) => (true, true, false),
            Kind::Cok(_) => (false, false, true),
        };
        CokFigures {
            updates_rejected: updating.then_some(counts.updates_rejected),
            dedups_rejected: merging.then_some(counts.dedups_rejected),
            revisions_applied: chaining.then_some(counts.revisions_applied),
            revisions_rejected: chaining.then_some(counts.revisions_rejected),
            chains_complete: chaining.then_some(counts.chains_complete),
            compressions: counts.compressions,
            compressions_failed: counts.compressions_failed,
            memory_tokens: state.memory_tokens,
        }
    }
}

impl Method for Cok<'_> {
    type State = CokState;
    type Step = Step;
    type Figures = CokFigures;

    fn label(&self) -> String {
        let mut label = self.variant.name().to_string();
        if self.kind.schema().is_some() && !self.config.constrained {
            label.push_str("-unconstrained");
        }
        label
    }

    /// The preamble holds the schema's title, description and types, and
    /// chain-of-key's worked example.
    fn template_texts(&self) -> Vec<String> {
        let mut requests = match self.kind {
            Kind::GuText | Kind::GuJson(_) => vec![update::request(self.kind, 0)],
            Kind::GmJson(_) => vec![
                merge::GENERATE_REQUEST.to_string(),
                merge::DEDUP_REQUEST.to_string(),
            ],
            Kind::Cok(_) => vec![chain::request(0)],
        };
        if self.config.memory_token_limit.is_some() {
            requests.push(self.compress_request(self.limit));
        }
        requests.push(self.answer_request(target_words(self.config.summary_words, &[])));
        let prompts: Vec<Prompt> = requests
            .into_iter()
            .map(|request| self.prompt(vec![request]))
            .collect();
        prompt_texts(&prompts)
    }

    fn start(&self, _chunks: &[Chunk]) -> CokState {
        CokState {
            memory: match self.kind.schema() {
                Some(schema) => schema.empty_memory(),
                None => Value::String(String::new()),
            },
            memory_tokens: 0,
            chunks_read: 0,
            next: Phase::Read,
            steps_done: 0,
            counts: Counts::default(),
        }
    }

    fn position(&self, state: &CokState, chunks: &[Chunk]) -> Position {
        let read = state.chunks_read;
        let stage = match state.next {
            Phase::Read if read < chunks.len() => format!("chunk {}/{}", read + 1, chunks.len()),
            Phase::Read => "final answer".to_string(),
            Phase::Dedup => format!("removing repeats after chunk {read}"),
            Phase::Compress { attempt } => {
                format!("compressing after chunk {read} (try {})", attempt + 1)
            }
        };
        let calls_per_chunk = if matches!(self.kind, Kind::GmJson(_)) {
            2
        } else {
            1
        };
        let pending = usize::from(state.next != Phase::Read);
        Position {
            done: state.steps_done,
            total: state.steps_done
                + pending
                + chunks.len().saturating_sub(read) * calls_per_chunk
                + 1,
            stage,
        }
    }

    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut CokState,
        chunks: &[Chunk],
    ) -> Result<Advance<Step, CokFigures>> {
        let start = Instant::now();
        let (mut step, then) = match state.next {
            Phase::Read => {
                let Some(chunk) = chunks.get(state.chunks_read) else {
                    return Ok(Advance::Done(self.finish(llm, state, chunks)?));
                };
                let read = self.read(llm, state, chunk, chunks.len())?;
                state.chunks_read += 1;
                read
            }
            Phase::Dedup => (merge::dedup(self, llm, state)?, None),
            Phase::Compress { .. } => (self.compress(llm, state)?, None),
        };
        state.memory_tokens = llm.count_tokens(&render_memory(&state.memory))?;
        state.next = match (then, state.next) {
            (Some(next), _) => next,
            _ if state.memory_tokens <= self.limit => Phase::Read,
            (None, Phase::Compress { attempt }) if attempt + 1 < COMPRESSION_ATTEMPTS => {
                Phase::Compress {
                    attempt: attempt + 1,
                }
            }
            (None, Phase::Compress { .. }) => Phase::Read,
            (None, _) => Phase::Compress { attempt: 0 },
        };
        state.steps_done += 1;
        step.memory_tokens = state.memory_tokens;
        step.seconds = start.elapsed().as_secs_f64();
        Ok(Advance::Step(step))
    }
}

/// The memory as prompts show it; the same memory always gives the same text.
pub fn render_memory(memory: &Value) -> String {
    match memory {
        Value::String(text) if text.trim().is_empty() => "(nothing yet)\n".to_string(),
        Value::String(text) => format!("{}\n", text.trim_end()),
        other => render_in_place(other),
    }
}

/// The memory's heading and its rendering, as two prompt segments so the
/// heading's tokens never depend on what follows.
fn memory_segments(memory: &Value) -> Vec<String> {
    vec!["\n## Memory so far\n".to_string(), render_memory(memory)]
}

fn chunk_segment(chunk: &Chunk, chunks: usize) -> String {
    format!(
        "\n## Chunk {} of {}\n{}\n",
        chunk.index + 1,
        chunks,
        chunk.text.trim_end()
    )
}

/// `wanted` tokens, or what the context leaves after `prompt` when that is
/// less (at least one, so that a prompt that fills the context is refused by
/// the metered model with a clear message).
fn fit(llm: &dyn Llm, prompt: &Prompt, wanted: usize) -> Result<usize> {
    let room = llm
        .context_tokens()
        .saturating_sub(llm.prompt_tokens(prompt)?);
    Ok(wanted.min(room).max(1))
}

/// A whole memory read out of model output: prose when there is no schema,
/// else the first JSON object, which must validate. A result that holds
/// nothing is refused when `current` holds something: no rewrite may empty
/// the memory.
pub fn read_memory(
    output: &str,
    schema: Option<&Schema>,
    current: &Value,
) -> std::result::Result<Value, String> {
    let memory = match schema {
        None => {
            let text: Vec<&str> = output
                .lines()
                .filter(|line| !line.trim_start().starts_with("```"))
                .collect();
            Value::String(text.join("\n").trim().to_string())
        }
        Some(schema) => {
            let memory = parse_memory(output)?.memory;
            if !memory.is_object() {
                return Err("not a JSON object".into());
            }
            schema.validate(&memory)?;
            memory
        }
    };
    if holds_nothing(&memory) && !holds_nothing(current) {
        return Err("it holds nothing, and would empty the memory".into());
    }
    Ok(memory)
}

/// Whether `value` holds no information: only empty text and containers.
pub fn holds_nothing(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(text) => text.trim().is_empty(),
        Value::Array(items) => items.iter().all(holds_nothing),
        Value::Object(members) => members.values().all(holds_nothing),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// The fixed opening of every prompt.
fn preamble(kind: Kind, query: &str) -> String {
    let memory = match kind.schema() {
        None => "The memory is plain prose: a short running summary of everything read so far."
            .to_string(),
        Some(schema) => {
            let about = [schema.title(), schema.description()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            format!(
                "{about}\n{}\nThe memory is one JSON object of this shape.",
                schema.render_types().trim_end()
            )
        }
    };
    let step = match kind {
        Kind::GuText => "You write the whole memory again: everything it held, said more briefly where you can, and what the chunk adds.".to_string(),
        Kind::GuJson(_) => "You write the whole memory again as one JSON object: every key it had, with what the chunk adds put under the key it belongs to or under a new key.".to_string(),
        Kind::GmJson(_) => "You write a memory of that chunk alone, as one JSON object of this shape.".to_string(),
        Kind::Cok(schema) => chain::instructions(schema),
    };
    format!(
        "## Task\nYou read a document in chunks and keep a memory of it, so that at the end you can answer this query from the memory alone:\n{query}\n\n## Memory\n{memory}\n\n## After each chunk\n{step}\n"
    )
}

/// Take a rewrite that read back as a memory, or leave `memory` as it was,
/// count the refusal in `refusals` and record its reason in `step`.
fn settle(
    read: std::result::Result<Value, String>,
    memory: &mut Value,
    refusals: &mut usize,
    step: &mut Step,
) {
    match read {
        Ok(rewritten) => *memory = rewritten,
        Err(reason) => {
            *refusals += 1;
            step.refused = Some(reason);
        }
    }
}

#[cfg(test)]
mod tests;
