//! Several cached token sequences, and the choice of which one a new prompt
//! continues.

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
    /// The most bytes of KV storage the slots other than the active one may
    /// hold together with it; `None` is no bound beyond `limit`.
    byte_budget: Option<usize>,
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
            byte_budget: None,
            clock: 0,
        }
    }

    /// Every slot's cache, the active one among them.
    pub fn caches(&self) -> impl Iterator<Item = &KvCache> {
        self.slots.iter().map(|slot| &slot.cache)
    }

    /// The most sequences kept.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bound the KV storage of all slots together: past `bytes`, the least
    /// recently used slots are dropped (and their memory freed) until the
    /// rest fit. The slot in use is never dropped, so it alone may exceed
    /// the budget. `None` lifts the bound.
    pub fn set_byte_budget(&mut self, bytes: Option<usize>) {
        self.byte_budget = bytes;
        self.evict_over_budget();
    }

    /// The byte budget, if any.
    pub fn byte_budget(&self) -> Option<usize> {
        self.byte_budget
    }

    /// Bytes of KV storage the slots hold, allocated or not yet written.
    pub fn allocated_bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|slot| slot.cache.allocated_bytes())
            .sum()
    }

    fn evict_over_budget(&mut self) {
        let Some(budget) = self.byte_budget else {
            return;
        };
        while self.allocated_bytes() > budget && self.slots.len() > 1 {
            let oldest = (0..self.slots.len())
                .filter(|&index| index != self.active)
                .min_by_key(|&index| self.slots[index].last_used)
                .expect("more than one slot");
            self.slots.remove(oldest);
            if oldest < self.active {
                self.active -= 1;
            }
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
        let views: Vec<SlotView> = self
            .slots
            .iter()
            .map(|slot| SlotView {
                shared: slot.cache.common_prefix(prompt),
                len: slot.cache.len(),
                last_used: slot.last_used,
            })
            .collect();
        let (chosen, shared) = match place(&views, self.limit) {
            Placement::Continue(index) => (index, views[index].shared),
            Placement::Copy { from, into } => {
                let target = into.unwrap_or_else(|| {
                    self.slots.push(Slot {
                        cache: new_cache(),
                        prompt_logits: None,
                        last_used: 0,
                    });
                    self.slots.len() - 1
                });
                let (source, target_slot) = two_slots(&mut self.slots, from, target);
                target_slot
                    .cache
                    .copy_prefix_from(&source.cache, views[from].shared)?;
                target_slot.prompt_logits = None;
                (target, views[from].shared)
            }
        };
        self.active = chosen;
        self.slots[chosen].last_used = self.clock;
        self.evict_over_budget();
        Ok(shared)
    }
}

/// What [`place`] needs to know of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotView {
    /// Tokens the prompt shares with the slot's sequence.
    pub shared: usize,
    /// Tokens the slot holds.
    pub len: usize,
    /// When the slot was last used; higher is later.
    pub last_used: u64,
}

/// Where a prompt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Continue this slot, dropping what follows the shared prefix.
    Continue(usize),
    /// Copy the shared prefix of slot `from` into `into` (a new slot when
    /// `None`) and continue there.
    Copy { from: usize, into: Option<usize> },
}

/// Choose the slot for a prompt: the one sharing the longest prefix (the most
/// recently used on a tie). Only the sequence used last is protected: if
/// continuing it would discard most of it, the prompt is likely a side trip
/// (answer a question, then come back to the document), so the shared prefix
/// goes to a new slot while under `limit`, else to the least recently used
/// one. An older slot that would lose most of its tokens holds a stale
/// sequence and is simply continued.
pub fn place(slots: &[SlotView], limit: usize) -> Placement {
    let (best, view) = slots
        .iter()
        .enumerate()
        .max_by_key(|(_, view)| (view.shared, view.last_used))
        .expect("there is always at least one slot");
    let keeps_most = 2 * view.shared >= view.len;
    let used_last = slots.iter().all(|other| other.last_used <= view.last_used);
    if keeps_most || !used_last || limit <= 1 {
        return Placement::Continue(best);
    }
    if slots.len() < limit {
        return Placement::Copy {
            from: best,
            into: None,
        };
    }
    let into = slots
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != best)
        .min_by_key(|(_, view)| view.last_used)
        .map(|(index, _)| index);
    match into {
        Some(index) => Placement::Copy {
            from: best,
            into: Some(index),
        },
        None => Placement::Continue(best),
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
    use crate::engine::kv_cache::KvDtype;
    use candle_core::Device;

    fn empty() -> KvCache {
        KvCache::new(1, 1, 1, 64, KvDtype::F32, &Device::Cpu)
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
    fn a_stale_slot_is_continued_and_the_live_one_kept() {
        let view = |shared, len, last_used| SlotView {
            shared,
            len,
            last_used,
        };
        // The document (used last) and an old answer prompt: a new answer
        // prompt shares more with the old one, which is stale, so it goes there.
        let slots = [view(3, 100, 3), view(5, 30, 2)];
        assert_eq!(place(&slots, 2), Placement::Continue(1));
        // Sharing most with the live sequence only a little: keep it, copy.
        let slots = [view(3, 100, 3), view(1, 30, 2)];
        assert_eq!(
            place(&slots, 2),
            Placement::Copy {
                from: 0,
                into: Some(1)
            }
        );
        assert_eq!(
            place(&slots[..1], 2),
            Placement::Copy {
                from: 0,
                into: None
            }
        );
        assert_eq!(place(&slots[..1], 1), Placement::Continue(0));
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

    #[test]
    fn over_the_byte_budget_the_least_recently_used_slots_go() {
        let mut slots = CacheSlots::new(empty(), 3);
        fill(&mut slots, &[1, 2, 3, 4, 5, 6, 7, 8]);
        fill(&mut slots, &[1, 20, 21]);
        fill(&mut slots, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let three_slots = slots.allocated_bytes();
        assert_eq!(slots.slots.len(), 2);
        // Room for one slot only: the other goes, the one in use stays.
        slots.set_byte_budget(Some(three_slots / 2));
        assert_eq!(slots.slots.len(), 1);
        assert_eq!(slots.active().cache.tokens(), &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        // A budget below the slot in use keeps it all the same.
        slots.set_byte_budget(Some(0));
        assert_eq!(fill(&mut slots, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 9);
    }
}
