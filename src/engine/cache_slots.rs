//! Several cached token sequences, and the choice of which one a new prompt
//! continues.
//!
//! With one slot (the default) the engine keeps only its last sequence, so a
//! method that alternates two kinds of prompt (refine against the document,
//! then answer questions from the summary) recomputes the document each time.
//! With more slots the prompt goes to the slot sharing its longest prefix.
//! When continuing that slot would throw away most of what it holds, the
//! shared prefix is copied into another slot (an empty one, else the least
//! recently used) and the prompt continues there, so the long sequence stays
//! for the prompt that comes back to it.

use super::kv_cache::KvCache;
use crate::error::Result;
use candle_core::Tensor;

/// One cached sequence.
pub struct Slot {
    pub cache: KvCache,
    /// The logits after the last prompt prefilled here, and that prompt's
    /// length: valid while the cache still holds that prompt.
    pub prompt_logits: Option<(usize, Tensor)>,
    last_used: u64,
}

/// The engine's cached sequences; one is active (the last one used).
pub struct CacheSlots {
    slots: Vec<Slot>,
    active: usize,
    limit: usize,
    clock: u64,
}

impl CacheSlots {
    /// One empty slot; more are made on demand, up to `limit`.
    pub fn new(first: KvCache, limit: usize) -> Self {
        CacheSlots {
            slots: vec![Slot {
                cache: first,
                prompt_logits: None,
                last_used: 0,
            }],
            active: 0,
            limit: limit.max(1),
            clock: 0,
        }
    }

    /// At most this many sequences are kept; extra ones are dropped.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
        if self.slots.len() > self.limit {
            let active = self.slots.swap_remove(self.active);
            self.slots.truncate(self.limit - 1);
            self.slots.push(active);
            self.active = self.slots.len() - 1;
        }
    }

    pub fn active(&self) -> &Slot {
        &self.slots[self.active]
    }

    pub fn active_mut(&mut self) -> &mut Slot {
        &mut self.slots[self.active]
    }

    /// Forget every cached sequence.
    pub fn clear(&mut self) {
        for slot in &mut self.slots {
            slot.cache.truncate(0);
            slot.prompt_logits = None;
        }
    }

    /// Make the slot that `prompt` should continue active and return how
    /// many of its leading tokens that slot holds. `new_cache` makes the
    /// storage of a new slot.
    pub fn take_for(
        &mut self,
        prompt: &[u32],
        new_cache: impl FnOnce() -> KvCache,
    ) -> Result<usize> {
        self.clock += 1;
        let (best, shared) = self
            .slots
            .iter()
            .enumerate()
            .map(|(index, slot)| (index, slot.cache.common_prefix(prompt), slot.last_used))
            .max_by_key(|&(_, shared, last_used)| (shared, last_used))
            .map(|(index, shared, _)| (index, shared))
            .expect("there is always at least one slot");
        let keeps_most = 2 * shared >= self.slots[best].cache.len();
        let chosen = if keeps_most || self.limit == 1 {
            best
        } else {
            let target = self.spare_slot(best, new_cache);
            let (source, target_slot) = two_slots(&mut self.slots, best, target);
            target_slot.cache.copy_prefix_from(&source.cache, shared)?;
            target_slot.prompt_logits = None;
            target
        };
        self.active = chosen;
        self.slots[chosen].last_used = self.clock;
        Ok(shared)
    }

    /// A slot other than `keep` to work in: a new one while under the limit,
    /// else the least recently used.
    fn spare_slot(&mut self, keep: usize, new_cache: impl FnOnce() -> KvCache) -> usize {
        if self.slots.len() < self.limit {
            self.slots.push(Slot {
                cache: new_cache(),
                prompt_logits: None,
                last_used: 0,
            });
            return self.slots.len() - 1;
        }
        self.slots
            .iter()
            .enumerate()
            .filter(|(index, _)| *index != keep)
            .min_by_key(|(_, slot)| slot.last_used)
            .map(|(index, _)| index)
            .expect("a limit above one leaves a slot besides `keep`")
    }
}

/// `slots[source]` to read and `slots[target]` to write, `source != target`.
fn two_slots(slots: &mut [Slot], source: usize, target: usize) -> (&Slot, &mut Slot) {
    if source < target {
        let (left, right) = slots.split_at_mut(target);
        (&left[source], &mut right[0])
    } else {
        let (left, right) = slots.split_at_mut(source);
        (&right[0], &mut left[target])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn empty() -> KvCache {
        KvCache::new(1, 1, 1, 64, DType::F32, &Device::Cpu)
    }

    fn fill(slots: &mut CacheSlots, prompt: &[u32]) -> usize {
        let shared = slots.take_for(prompt, empty).unwrap();
        let cache = &mut slots.active_mut().cache;
        cache.truncate(shared);
        cache.append_zeros_for_test(&prompt[shared..]);
        shared
    }

    #[test]
    fn one_slot_always_continues_the_last_sequence() {
        let mut slots = CacheSlots::new(empty(), 1);
        fill(&mut slots, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(fill(&mut slots, &[1, 9]), 1);
        assert_eq!(slots.active().cache.tokens(), &[1, 9]);
    }

    #[test]
    fn a_short_match_works_in_another_slot_and_keeps_the_long_one() {
        let mut slots = CacheSlots::new(empty(), 2);
        let document = [1, 2, 3, 4, 5, 6, 7, 8];
        fill(&mut slots, &document);
        // Shares only the first token: continues in a copy, the document stays.
        assert_eq!(fill(&mut slots, &[1, 20, 21]), 1);
        assert_eq!(slots.active().cache.tokens(), &[1, 20, 21]);
        // Back to the document with a new tail: all of it is reused.
        assert_eq!(fill(&mut slots, &[1, 2, 3, 4, 5, 6, 7, 8, 30]), 8);
        // The answer-style prompt again finds its own slot.
        assert_eq!(fill(&mut slots, &[1, 20, 21, 22]), 3);
    }

    #[test]
    fn the_least_recently_used_slot_is_replaced() {
        let mut slots = CacheSlots::new(empty(), 2);
        fill(&mut slots, &[1, 2, 3, 4]);
        fill(&mut slots, &[5, 6, 7, 8]);
        fill(&mut slots, &[1, 2, 3, 4, 9]);
        // [5..8] was used least recently; a new sequence replaces it.
        fill(&mut slots, &[10, 11, 12]);
        assert_eq!(fill(&mut slots, &[1, 2, 3, 4, 9, 1]), 5);
        assert_eq!(fill(&mut slots, &[5, 6]), 0);
    }
}
