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

use super::llm::{Llm, Prompt};
use super::revision_grammar::revision_grammar;
use super::run::{Advance, Finish, Method, Position};
use crate::chunk::Chunk;
use crate::engine::constraint::Grammar;
use crate::error::Result;
use crate::memory::{
    apply, parse_revisions, render_in_place, render_revision, Amendments, Next, Op, Rejection,
    Revision, Schema,
};
use crate::metrics::Figures;
use crate::rundir::RunDir;
use serde_json::Value;
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
}

/// The most revision lines one constrained step may write.
const MAX_CONSTRAINED_LINES: usize = 3;

/// A revision the program refused, with the reason.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Refused {
    /// The revision as parsed; absent when the text did not parse (the reason quotes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    pub reason: String,
}

/// What one chunk's step did, as a line of `steps.jsonl`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub chunk: usize,
    pub chunk_tokens: usize,
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    pub net_tokens: usize,
    pub output_tokens: usize,
    pub applied: Vec<Revision>,
    pub rejected: Vec<Refused>,
    /// The amendments were folded into one object before this step's prompt,
    /// because appending to them would no longer fit the context.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consolidated: bool,
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
    /// Times the amendments were folded into their base to make room.
    #[serde(default)]
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
            consolidations: 0,
        }
    }
}

/// The PRISM loop over one document.
pub struct Prism<'a> {
    config: &'a PrismConfig,
    schema: &'a Schema,
    /// Instructions, query and schema: the first, never-changing user segment.
    preamble: String,
    /// A revision line with placeholders, shaped like the schema's first new entry.
    example_line: String,
}

const SYSTEM: &str = "You keep a structured memory of a long document that you read one chunk at a time. You change the memory only by writing revisions in the exact format asked for.";

impl<'a> Prism<'a> {
    pub fn new(config: &'a PrismConfig, schema: &'a Schema) -> Self {
        let preamble = preamble(config, schema);
        let example_line = example_line(schema);
        Prism {
            config,
            schema,
            preamble,
            example_line,
        }
    }

    /// The prompt for revising the memory after reading `chunk`.
    pub fn revision_prompt(&self, state: &PrismState, chunk: &Chunk, chunks: usize) -> Prompt {
        let mut segments = vec![self.preamble.clone()];
        segments.extend(self.memory_segments(state));
        segments.push(format!(
            "\n## Chunk {} of {}\n{}\n",
            chunk.index + 1,
            chunks,
            chunk.text.trim_end()
        ));
        segments.push(self.revision_request());
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments,
        }
    }

    /// The prompt for the final answer from the finished memory.
    pub fn answer_prompt(&self, state: &PrismState) -> Prompt {
        let mut segments = vec![self.preamble.clone()];
        segments.extend(self.memory_segments(state));
        segments.push(format!(
            "\nThe document has ended and the memory above is complete. Using only the memory, answer the query in plain prose, not JSON:\n{}\n",
            self.config.query
        ));
        Prompt {
            system: Some(SYSTEM.to_string()),
            segments,
        }
    }

    fn memory_segments(&self, state: &PrismState) -> Vec<String> {
        let mut segments = vec!["\n## Memory\n".to_string()];
        match self.config.memory {
            MemoryMode::InPlace => segments.push(render_in_place(&state.memory)),
            MemoryMode::Amendments => segments.extend(state.amendments.segments()),
        }
        segments
    }

    fn revision_request(&self) -> String {
        let ops = if self.config.updates {
            "\"add\" creates a path that does not exist yet or appends to an existing list; \"update\" replaces what an existing path holds"
        } else {
            "\"add\" only: it creates a path that does not exist yet or appends to an existing list"
        };
        format!(
            "\n## Your revisions\nWrite the revisions this chunk calls for, one JSON object per line, and nothing else. Each line has an op ({ops}), a path in the memory, and a value of the type the schema gives that path, in this form:\n{}\nUse the names, places and events of this chunk; do not copy the placeholders.\n",
            self.example_line
        )
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
                MAX_CONSTRAINED_LINES,
            ))
        });
        let completion = llm.complete(&prompt, self.config.revision_tokens, grammar.as_ref())?;
        let (applied, rejected) = self.fold(state, &completion.text);
        state.revisions_applied += applied.len();
        state.revisions_rejected += rejected.len();
        let figures = Figures::of(&completion.usage);
        Ok(Step {
            chunk: chunk.index,
            chunk_tokens: chunk.tokens,
            prompt_tokens: figures.prompt_tokens,
            reused_tokens: figures.reused_tokens,
            net_tokens: figures.net_tokens,
            output_tokens: figures.output_tokens,
            applied,
            rejected,
            consolidated,
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

    /// Parse `output` and apply each revision that checks out, in order.
    fn fold(&self, state: &mut PrismState, output: &str) -> (Vec<Revision>, Vec<Refused>) {
        let (applied, rejected) =
            apply_revisions(&mut state.memory, output, self.schema, self.config.updates);
        for revision in &applied {
            state.amendments.push(revision.clone());
        }
        (applied, rejected)
    }

    /// Ask for the final answer from the memory.
    pub fn answer(&self, llm: &mut dyn Llm, state: &mut PrismState) -> Result<String> {
        let (prompt, _) =
            self.prompt_that_fits(llm, state, self.config.answer_tokens, |state| {
                self.answer_prompt(state)
            })?;
        let completion = llm.complete(&prompt, self.config.answer_tokens, None)?;
        Ok(completion.text.trim().to_string())
    }
}

/// Parse the revisions in `output` and apply to `memory` each one that checks
/// out against `schema`, in order; `update`s are refused unless `updates`.
/// Returns what was applied and what was refused, with the reasons.
pub(crate) fn apply_revisions(
    memory: &mut Value,
    output: &str,
    schema: &Schema,
    updates: bool,
) -> (Vec<Revision>, Vec<Refused>) {
    let mut applied = Vec::new();
    let mut rejected = Vec::new();
    for parsed in parse_revisions(output) {
        let revision = match parsed {
            Ok(revision) => revision,
            Err(reason) => {
                rejected.push(Refused {
                    revision: None,
                    reason,
                });
                continue;
            }
        };
        let outcome = if !updates && revision.op == Op::Update {
            Err(Rejection::update_disabled(&revision))
        } else {
            apply(memory, &revision, schema)
        };
        match outcome {
            Ok(next) => {
                *memory = next;
                applied.push(revision);
            }
            Err(rejection) => rejected.push(Refused {
                revision: Some(render_revision(&revision).trim_end().to_string()),
                reason: rejection.reason,
            }),
        }
    }
    (applied, rejected)
}

/// An `add` line for the first place an empty memory can grow, with
/// placeholders where the model's own words go.
fn example_line(schema: &Schema) -> String {
    example_add(schema, "<name>")
        .map(|revision| render_revision(&revision).trim_end().to_string())
        .unwrap_or_default()
}

/// An `add` revision at the first place an empty memory can grow, named
/// `new_key` where the model would choose a key, with a placeholder value.
pub(crate) fn example_add(schema: &Schema, new_key: &str) -> Option<Revision> {
    let empty = schema.empty_memory();
    let (pattern, node) = schema.add_targets(&empty).into_iter().next()?;
    let path = match &pattern.next {
        Next::NewKey => pattern.prefix.key(new_key),
        Next::Key(name) => pattern.prefix.key(name.clone()),
        Next::Index(index) => pattern.prefix.index(*index),
    };
    Some(Revision::add(path, placeholder(schema, node, 0)))
}

/// A value of `node`'s type with `<…>` placeholders for its text.
fn placeholder(schema: &Schema, node: &crate::memory::SchemaNode, depth: usize) -> Value {
    use crate::memory::NodeKind;
    match &schema.resolve(node).kind {
        _ if depth > 3 => Value::String("<…>".into()),
        NodeKind::Array { items } => Value::Array(vec![placeholder(schema, items, depth + 1)]),
        NodeKind::Object { properties, .. } => Value::Object(
            properties
                .iter()
                .map(|(key, child)| (key.clone(), placeholder(schema, child, depth + 1)))
                .collect(),
        ),
        NodeKind::Number | NodeKind::Integer => Value::from(0),
        NodeKind::Boolean => Value::Bool(true),
        _ => Value::String("<what this chunk says>".into()),
    }
}

/// The fixed opening of every prompt: the task, the query and the schema.
fn preamble(config: &PrismConfig, schema: &Schema) -> String {
    let memory_form = match config.memory {
        MemoryMode::InPlace => "The memory is one JSON object and shows every change made so far.",
        MemoryMode::Amendments => "The memory is a JSON object followed by revision lines, oldest first. Read it as the object with every line applied in order: a later line about a path replaces what an earlier one said.",
    };
    let about = [schema.title(), schema.description()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(": ");
    format!(
        "## Task\nYou read a document in chunks and keep notes in a structured memory, so that at the end you can answer this query from the memory alone:\n{}\n\n## Memory schema\n{}\n{}\n{}\n",
        config.query,
        about,
        schema.render_types().trim_end(),
        memory_form,
    )
}

impl Method for Prism<'_> {
    type State = PrismState;
    type Step = Step;

    fn label(&self) -> String {
        let memory = match self.config.memory {
            MemoryMode::InPlace => "in-place",
            MemoryMode::Amendments => "amendments",
        };
        let mut label = format!("prism-{memory}");
        if !self.config.updates {
            label.push_str("-no-updates");
        }
        if !self.config.constrained {
            label.push_str("-unconstrained");
        }
        label
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
    ) -> Result<Advance<Step>> {
        if let Some(chunk) = chunks.get(state.chunks_read) {
            let step = self.step(llm, state, chunk, chunks.len())?;
            state.chunks_read += 1;
            return Ok(Advance::Step(step));
        }
        let summary = self.answer(llm, state)?;
        let mut stats = serde_json::Map::new();
        stats.insert("revisions_applied".into(), state.revisions_applied.into());
        stats.insert("revisions_rejected".into(), state.revisions_rejected.into());
        stats.insert("consolidations".into(), state.consolidations.into());
        Ok(Advance::Done(Finish {
            summary,
            files: vec![(RunDir::MEMORY, state.memory.clone())],
            stats,
        }))
    }
}
