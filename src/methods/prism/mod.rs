//! PRISM (structured memory with revisions): after each chunk the model proposes
//! revisions to a schema-shaped memory, the program checks and applies them.

mod answer;
mod notes;
mod prompt;
mod reading;
mod step;

use crate::chunk::Chunk;
use crate::engine::is_zero;
use crate::error::Result;
use crate::llm::{Llm, Prompt, Source};
use crate::memory::revise::{RefusalKind, Refused};
use crate::memory::{render_in_place, Amendments, Schema, Screen};
use crate::methods::length::{self, target_words, CONDENSE_SYSTEM};
use crate::methods::AnswerForm;
use crate::run::dir::RunDir;
use crate::run::{Advance, Finish, Method, Position};
use answer::memory_notes;
use prompt::{
    preamble, query_request, revision_request, summary_request, EMPTY_MEMORY, PEOPLE_REQUEST,
    QUERY_SYSTEM, REVISION_REQUEST, SUMMARY_SYSTEM, SYSTEM,
};
use serde_json::Value;
pub use step::{Step, SKIPS_BEFORE_STOP};

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
    use super::answer::{cast_and_notes, MAX_CAST};
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
    fn a_first_name_beside_one_full_name_is_cast_once() {
        let memory = serde_json::json!({
            "events": [
                "Then Justine Moritz joins the family, and Justine serves it.",
                "At the inn Henry Clerval meets him, and Henry Frankenstein writes.",
            ],
            "people": {
                "Justine": ["the servant"],
                "Justine Moritz": ["a servant of the family"],
                "Henry": ["a friend"],
                "Henry Clerval": ["his friend"],
                "Henry Frankenstein": ["his father"],
            },
        });
        let (cast, _) = cast_and_notes(&memory, 40);
        assert_eq!(
            cast,
            "The people in it include Justine Moritz (a servant of the family), Henry (a friend), \
             Henry Clerval (his friend) and Henry Frankenstein (his father)."
        );
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
                "Donovan heads the Office of Strategic Services, and Strategic Services prints it.",
            ],
            "people": {
                "Simple Sabotage Field Manual": ["the manual"],
                "William Donovan": ["the director"],
                "Office of Strategic Services": ["an agency"],
                "Strategic Services": ["the agency"],
            },
        });
        let (cast, _) = cast_and_notes(&manual, 30);
        assert_eq!(
            cast,
            "The people in it include William Donovan (the director)."
        );
        let crew = [
            "Abel", "Bryn", "Cato", "Dora", "Elin", "Finn", "Gwen", "Hal", "Ines", "Jory", "Kit",
            "Lowen",
        ];
        let crowd: serde_json::Map<String, serde_json::Value> = crew
            .iter()
            .map(|name| (name.to_string(), json!(["a sailor"])))
            .collect();
        let notes: Vec<String> = crew
            .iter()
            .map(|name| format!("Then {name} rows."))
            .collect();
        let (cast, _) = cast_and_notes(&json!({"events": notes, "people": crowd}), 200);
        let named = crew.iter().filter(|name| cast.contains(*name)).count();
        assert_eq!(named, MAX_CAST, "{cast}");
        let misspelt = json!({
            "events": ["The light is kept by Ada Penhallow, who writes the log."],
            "people": {"ida Penhallow": ["the keeper"], "Ada Penhallow": ["the writer"]},
        });
        let (cast, _) = cast_and_notes(&misspelt, 30);
        assert_eq!(cast, "The people in it include Ada Penhallow (the writer).");
    }
}
