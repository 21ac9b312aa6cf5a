//! Generate-merge: the model writes a JSON memory of each chunk on its own, the
//! program merges it into the memory by key, and the model rewrites it without repeats.

use super::{
    chunk_segment, holds_nothing, memory_segments, settle, Call, Cok, CokState, Phase, Step,
};
use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::Llm;
use crate::memory::Schema;
use serde_json::Value;

/// What the model is asked to write after a chunk.
pub(super) const GENERATE_REQUEST: &str = "\n## Your answer\nWrite the memory of this chunk alone, as one JSON object. Write nothing else.\n";

/// What the model is asked to write to rid the merged memory of repeats.
pub(super) const DEDUP_REQUEST: &str = "\n## Your answer\nThe memory above was put together from memories of separate chunks, so it repeats itself. Write it again without repeats: keys that name the same thing become one key, notes that say the same thing become one note, and every distinct fact stays. Write one JSON object and nothing else.\n";

/// Have the model write a memory of `chunk` alone and merge it into the
/// memory; returns the step, and [`Phase::Dedup`] when the merge met a memory
/// that already held something.
pub(super) fn generate(
    cok: &Cok,
    schema: &Schema,
    llm: &mut dyn Llm,
    state: &mut CokState,
    chunk: &Chunk,
    chunks: usize,
) -> Result<(Step, Option<Phase>)> {
    let tail = vec![chunk_segment(chunk, chunks), GENERATE_REQUEST.to_string()];
    let (mut step, read) = cok.rewrite(
        llm,
        Call::Generate,
        Some(chunk.index),
        &schema.empty_memory(),
        tail,
        cok.config.step_tokens,
    )?;
    let chunk_memory = match read {
        Ok(memory) => memory,
        Err(reason) => {
            state.counts.updates_rejected += 1;
            step.refused = Some(reason);
            return Ok((step, None));
        }
    };
    let dedup = !holds_nothing(&state.memory) && !holds_nothing(&chunk_memory);
    // Both sides validate, so the merge does: every value in it comes from
    // one side or merges two values of the same schema node.
    state.memory = merge_by_key(&state.memory, &chunk_memory);
    Ok((step, dedup.then_some(Phase::Dedup)))
}

/// Have the model rewrite the memory without repeats.
///
/// The paper merges by key in code ("JSON's key-matching capability") and
/// leaves to the model only what code cannot see: keys and notes that say the
/// same thing in different words. So here [`merge_by_key`] is exact and loses
/// nothing, and this pass is the only lossy part. It runs after each merge that
/// met an already filled memory, as the paper removes duplicates turn by turn;
/// a refused pass keeps the merged memory.
pub(super) fn dedup(cok: &Cok, llm: &mut dyn Llm, state: &mut CokState) -> Result<Step> {
    let mut tail = memory_segments(&state.memory);
    tail.push(DEDUP_REQUEST.to_string());
    let (mut step, read) = cok.rewrite(
        llm,
        Call::Dedup,
        None,
        &state.memory,
        tail,
        cok.rewrite_tokens(state),
    )?;
    settle(
        read,
        &mut state.memory,
        &mut state.counts.dedups_rejected,
        &mut step,
    );
    Ok(step)
}

/// `addition` merged into `memory` by key: objects are joined member by
/// member (a member both have is merged in turn, keeping its place), a list
/// gains the items it lacks, and any other value gives way to the newer one.
pub fn merge_by_key(memory: &Value, addition: &Value) -> Value {
    match (memory, addition) {
        (Value::Object(old), Value::Object(new)) => {
            let mut merged = old.clone();
            for (key, value) in new {
                let joined = match old.get(key) {
                    Some(existing) => merge_by_key(existing, value),
                    None => value.clone(),
                };
                merged.insert(key.clone(), joined);
            }
            Value::Object(merged)
        }
        (Value::Array(old), Value::Array(new)) => {
            let mut merged = old.clone();
            for item in new {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            Value::Array(merged)
        }
        (_, newer) => newer.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_meet_and_lists_gain_only_new_items() {
        let memory = json!({"Voyage": ["The ship sails.", "Ice ahead."], "Crew": ["Uneasy."]});
        let addition = json!({"Crew": ["Uneasy.", "They plan a mutiny."], "Storm": ["A gale."]});
        assert_eq!(
            merge_by_key(&memory, &addition),
            json!({
                "Voyage": ["The ship sails.", "Ice ahead."],
                "Crew": ["Uneasy.", "They plan a mutiny."],
                "Storm": ["A gale."]
            })
        );
    }

    #[test]
    fn nested_sections_merge_and_scalars_take_the_newer_value() {
        let memory = json!({"characters": {"Ann": ["Captain."]}, "year": 1800, "mood": ["calm"]});
        let addition = json!({"characters": {"Ann": ["Brave."], "Bo": ["Cook."]}, "year": 1801, "mood": "tense"});
        let merged = merge_by_key(&memory, &addition);
        assert_eq!(
            merged,
            json!({
                "characters": {"Ann": ["Captain.", "Brave."], "Bo": ["Cook."]},
                "year": 1801,
                "mood": "tense"
            })
        );
        // Keys keep their first place, so the rendering changes as late as it can.
        let keys: Vec<&String> = merged.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["characters", "year", "mood"]);
    }
}
