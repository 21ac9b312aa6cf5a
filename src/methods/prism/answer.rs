//! PRISM's final answer, written from the memory alone.

use super::prompt::EMPTY_MEMORY;
use super::{Prism, PrismState};
use crate::error::Result;
use crate::llm::{Llm, Prompt};
use crate::methods::length::{self, condense, CONDENSE_SYSTEM};
use crate::methods::AnswerForm;
use serde_json::Value;

impl Prism<'_> {
    /// Write the final answer from the memory: the query answered from
    /// the whole memory, or a summary of about the target length condensed
    /// from the notes in order (in parts when they are long).
    pub fn answer(&self, llm: &mut dyn Llm, state: &PrismState, target: usize) -> Result<String> {
        if self.config.answer_form == AnswerForm::Direct {
            let prompt = self.query_prompt(state);
            let completion = llm.complete(&prompt, self.config.answer_tokens, None)?;
            return Ok(completion.text.trim().to_string());
        }
        let notes = notes_named_first(&state.memory);
        if notes.is_empty() {
            let prompt = Prompt {
                system: Some(CONDENSE_SYSTEM.to_string()),
                segments: vec![EMPTY_MEMORY.to_string()],
                source: None,
            };
            let completion = llm.complete(&prompt, length::tokens_for(target), None)?;
            return Ok(completion.text.trim().to_string());
        }
        Ok(condense(llm, &notes, target)?.text)
    }
}

/// The notes of a memory, in memory order: every string, led by the key it
/// sits under when that key is deeper than the top level (a person's name,
/// say), so that a note read alone still says what it is about.
pub(super) fn memory_notes(memory: &Value) -> Vec<String> {
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

/// The notes of a memory as a summary tells them: first those kept under
/// a name (a person's, in the stock schemas), so that a summary says who
/// its people are before what they do, then the rest, each in memory order.
pub(super) fn notes_named_first(memory: &Value) -> Vec<String> {
    let Value::Object(members) = memory else {
        return memory_notes(memory);
    };
    let (named, told): (Vec<_>, Vec<_>) = members.iter().partition(|(_, value)| value.is_object());
    named
        .into_iter()
        .chain(told)
        .flat_map(|(key, value)| memory_notes(&serde_json::json!({ key: value })))
        .collect()
}
