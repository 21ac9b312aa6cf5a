//! How a prompt is encoded from what the caches hold: the longest cached
//! prefix in memory, the prompt cache on disk, and with segment reuse the
//! later runs a cached sequence holds at other positions.

use super::kv_cache::KvCache;
use super::model::Pass;
use super::segments::{self, Piece};
use super::{Engine, Usage};
use crate::error::{Error, Result};
use candle_core::Tensor;
use std::time::Instant;

impl Engine {
    /// How much of `prompt` a prefill would take from the caches, and where
    /// the prompt first differs from what they hold, without running the
    /// model or changing a cache.
    pub fn preview(&self, prompt: &[u32]) -> Result<CachePreview> {
        let in_memory = match self.prefix_cache {
            true => self
                .slots
                .caches()
                .map(|cache| cache.common_prefix(prompt))
                .max()
                .unwrap_or(0),
            false => 0,
        };
        let on_disk = match self.prompt_cache.as_ref().filter(|_| self.prefix_cache) {
            Some(disk) => disk.longest_prefix(prompt)?.map_or(0, |hit| hit.matched),
            None => 0,
        };
        // As a prefill does, at least the last token is computed.
        let last = prompt.len().saturating_sub(1);
        let from_memory = in_memory.min(last);
        let from_disk = on_disk.min(last).saturating_sub(from_memory);
        let cached = from_memory + from_disk;
        let (by_segment, recomputed) = self
            .segment_plan(prompt, cached)
            .map_or((0, 0), |plan| (plan.reused(), plan.recomputed));
        let held = in_memory.max(on_disk);
        Ok(CachePreview {
            prompt_tokens: prompt.len(),
            from_memory,
            from_disk,
            by_segment,
            recomputed,
            computed: prompt.len() - cached - by_segment,
            first_difference: (held < prompt.len()).then_some(held),
        })
    }

    /// Encode `prompt`, reusing the cached prefix it shares with the previous
    /// call, and return the logits for the token after it.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<(Tensor, Usage)> {
        // Choosing a cache slot may free one's storage before any pass runs.
        self.model.bind_to_this_thread()?;
        let context = self.context_tokens();
        if prompt.is_empty() {
            return Err(Error::invalid("prompt", "is empty"));
        }
        if prompt.len() >= context {
            return Err(Error::PromptTooLong {
                prompt_tokens: prompt.len(),
                context_tokens: context,
            });
        }
        let vocab = self.model.config().vocab_size as u32;
        if let Some(bad) = prompt.iter().find(|&&id| id >= vocab) {
            return Err(Error::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let shared = if self.prefix_cache {
            let model = &self.model;
            self.slots.take_for(prompt, || model.new_cache())?
        } else {
            0
        };
        let restored = self.restore_from_disk(prompt, shared);
        let slot = self.slots.active_mut();
        // The same prompt again: its logits are kept, nothing needs computing.
        // Re-running its last token instead would give logits that differ in
        // the last float bits (one row is not multiplied as a batch is), which
        // quantized decoding can amplify into a different greedy path.
        if shared == prompt.len() && restored == 0 {
            if let Some((_, logits)) = slot
                .prompt_logits
                .as_ref()
                .filter(|(len, _)| *len == shared)
            {
                let logits = logits.clone();
                slot.cache.truncate(shared);
                let usage = Usage {
                    prompt_tokens: prompt.len(),
                    reused_tokens: prompt.len(),
                    ..Usage::default()
                };
                return Ok((logits, usage));
            }
        }
        // At least the last prompt token must run to produce its logits.
        let reused = shared.min(prompt.len() - 1);
        let cached = reused + restored;
        let start = Instant::now();
        let encoding = self.encoding_after(prompt, cached)?;
        let slot = self.slots.active_mut();
        slot.cache.truncate(cached);
        slot.prompt_logits = None;
        let mut logits = None;
        for step in encoding.steps {
            match step {
                Encode::Compute(range) => {
                    let computed =
                        self.model
                            .forward(&prompt[range], &mut slot.cache, Pass::Prompt)?;
                    logits = Some(computed);
                }
                Encode::Take { range, layers } => {
                    slot.cache.append_stored(&prompt[range], &layers)?;
                }
            }
        }
        let logits = logits.ok_or_else(|| Error::invalid("prompt", "no token was computed"))?;
        slot.prompt_logits = Some((prompt.len(), logits.clone()));
        let usage = Usage {
            prompt_tokens: prompt.len(),
            reused_tokens: reused,
            restored_tokens: restored,
            segment_tokens: encoding.taken,
            recomputed_tokens: encoding.recomputed,
            prefill_seconds: start.elapsed().as_secs_f64(),
            ..Usage::default()
        };
        Ok((logits, usage))
    }

    /// With segment reuse on, the plan of `prompt` after its first `cached`
    /// tokens over every slot's sequence (the sources its pieces index).
    fn segment_plan(&self, prompt: &[u32], cached: usize) -> Option<segments::Plan> {
        let reuse = self.segment_reuse.filter(|_| self.prefix_cache)?;
        let sources: Vec<&[u32]> = self.slots.caches().map(KvCache::tokens).collect();
        Some(segments::plan(prompt, cached, &sources, reuse))
    }

    /// How `prompt` is encoded after its first `cached` tokens: computed
    /// whole, or with segment reuse, in stretches computed and runs taken
    /// from the cached sequences. The taken rows are read out (their keys
    /// moved to their new positions) before anything is written, since the
    /// active slot's own tail may be among them.
    fn encoding_after(&self, prompt: &[u32], cached: usize) -> Result<Encoding> {
        let whole = Encoding {
            steps: vec![Encode::Compute(cached..prompt.len())],
            taken: 0,
            recomputed: 0,
        };
        let Some(plan) = self.segment_plan(prompt, cached) else {
            return Ok(whole);
        };
        let caches: Vec<&KvCache> = self.slots.caches().collect();
        let taken = plan.reused();
        let steps = plan
            .pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Compute(range) => Ok(Encode::Compute(range)),
                Piece::Reuse {
                    at,
                    source,
                    from,
                    len,
                } => {
                    let delta = at as i64 - from as i64;
                    let layers = caches[source]
                        .rows(from, len)?
                        .into_iter()
                        .map(|(keys, values)| match delta {
                            0 => Ok((keys, values)),
                            _ => Ok((self.model.model().shift_keys(&keys, delta)?, values)),
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(Encode::Take {
                        range: at..at + len,
                        layers,
                    })
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoding {
            steps,
            taken,
            recomputed: plan.recomputed,
        })
    }

    /// When the prompt cache on disk holds more of `prompt` than the `shared`
    /// tokens in memory, load its blocks into the active slot, and return how
    /// many tokens that adds. The disk only ever saves work: when it cannot
    /// be read the prompt is computed as if it were not there.
    fn restore_from_disk(&mut self, prompt: &[u32], shared: usize) -> usize {
        // At least the last prompt token must run to produce its logits, so
        // when memory holds all the rest the index is not read at all.
        let wanted = self.prefix_cache && shared + 1 < prompt.len();
        let Some(disk) = self.prompt_cache.as_ref().filter(|_| wanted) else {
            return 0;
        };
        let hit = match disk.longest_prefix(prompt) {
            Ok(Some(hit)) => hit.shortened(prompt.len() - 1),
            Ok(None) => return 0,
            Err(err) => {
                tracing::warn!("prompt cache: not read: {err}");
                return 0;
            }
        };
        if hit.matched <= shared {
            return 0;
        }
        let slot = self.slots.active_mut();
        match disk.restore(&hit, &mut slot.cache) {
            Ok(0) => 0,
            // Only a restore longer than the `shared` tokens loads anything.
            Ok(restored) => {
                slot.prompt_logits = None;
                restored.saturating_sub(shared)
            }
            Err(err) => {
                tracing::warn!("prompt cache: not read: {err}");
                0
            }
        }
    }

    /// Keep the active sequence on disk for later processes, or only its
    /// first `shared_prefix_tokens` (not when prefix reuse is off: nothing
    /// would restore it). Failing to write costs only
    /// that, so it is a warning, not an error.
    pub(super) fn store_to_disk(&self, shared_prefix_tokens: Option<usize>) {
        if let Some(disk) = self.prompt_cache.as_ref().filter(|_| self.prefix_cache) {
            let cache = &self.slots.active().cache;
            // Rows taken from segments are approximate, and a later process
            // would restore them as computed ones: only the exact prefix goes.
            let exact = cache.exact_len();
            let stored = match shared_prefix_tokens {
                Some(shared) => disk.store_prefix(cache, shared.min(exact)),
                None if exact < cache.len() => disk.store_prefix(cache, exact),
                None => disk.store(cache),
            };
            if let Err(err) = stored {
                tracing::warn!("prompt cache: not stored: {err}");
            }
        }
    }
}

/// What the caches hold of a prompt ([`Engine::preview`]): its tokens
/// from each source, in prefill's order, and what is left to compute.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CachePreview {
    pub prompt_tokens: usize,
    /// The longest prefix a cached sequence in memory holds.
    pub from_memory: usize,
    /// The tokens after those that the prompt cache on disk holds.
    pub from_disk: usize,
    /// With segment reuse, the later tokens taken from cached runs...
    pub by_segment: usize,
    /// ...and the tokens of such runs computed anyway.
    pub recomputed: usize,
    /// Tokens to compute, `recomputed` among them.
    pub computed: usize,
    /// Where the prompt first differs from the longest prefix held in
    /// memory or on disk; `None` when that prefix is the whole prompt.
    pub first_difference: Option<usize>,
}

/// A prompt's encoding after its cached prefix ([`Engine::encoding_after`]).
struct Encoding {
    steps: Vec<Encode>,
    /// Prompt tokens taken from cached runs.
    taken: usize,
    /// Tokens of matched runs computed anyway.
    recomputed: usize,
}

/// One stretch of a prompt's encoding, in order.
enum Encode {
    /// Run these prompt positions through the model.
    Compute(std::ops::Range<usize>),
    /// Append the keys and values `layers` for these prompt positions.
    Take {
        range: std::ops::Range<usize>,
        layers: Vec<(Tensor, Tensor)>,
    },
}
