//! Generate-update: after each chunk the model writes the whole memory again; an
//! output that does not read as a memory is refused and counted, the memory kept.

use super::{chunk_segment, memory_segments, settle, Call, Cok, CokState, Kind, Step};
use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::Llm;

/// What the model is asked to write after chunk `index` (from 0).
pub(super) fn request(kind: Kind, index: usize) -> String {
    let form = match kind {
        Kind::GuText => "in plain prose",
        _ => "as one JSON object",
    };
    format!(
        "\n## Your answer\nWrite the whole memory again, {form}, so that it also covers chunk {}. Write nothing else.\n",
        index + 1
    )
}

/// Read `chunk` into the memory by having the model rewrite it.
pub(super) fn step(
    cok: &Cok,
    llm: &mut dyn Llm,
    state: &mut CokState,
    chunk: &Chunk,
    chunks: usize,
) -> Result<Step> {
    let mut tail = memory_segments(&state.memory);
    tail.push(chunk_segment(chunk, chunks));
    tail.push(request(cok.kind, chunk.index));
    let (mut step, read) = cok.rewrite(
        llm,
        Call::Update,
        Some(chunk.index),
        &state.memory,
        tail,
        cok.rewrite_tokens(state),
    )?;
    settle(
        read,
        &mut state.memory,
        &mut state.counts.updates_rejected,
        &mut step,
    );
    Ok(step)
}
