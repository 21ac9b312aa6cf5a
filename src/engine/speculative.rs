//! Draft-model speculative decoding as policy: whether a draft model may draft
//! for a model, the rule that keeps or replaces a drafted token, how many
//! tokens to draft, and which source of drafts to use.
//!
//! A small model sharing the target's tokenizer proposes a few tokens, one
//! pass each; the target checks them all in one pass. Under greedy decoding
//! a drafted token is kept when it is the target's argmax, so the output is
//! the target's. Under sampling the rule is rejection sampling (Leviathan et
//! al. 2023, Chen et al. 2023): a token `x` drawn from the draft's
//! distribution `q` is kept with probability `min(1, p(x)/q(x))`, where `p`
//! is the target's; otherwise the token is drawn from `norm(max(0, p − q))`.
//! Either way each token follows `p`. Both `p` and `q` are taken after the
//! same sampling transforms (grammar mask, repetition controls, temperature,
//! top-k, top-p), so a token the grammar forbids is never drafted.

use super::tokenizer::Tokenizer;
use rand::Rng;

/// Text the two tokenizers must split into the same ids: code, prose,
/// accents, CJK, an emoji, runs of spaces and newlines, digits, and the chat
/// markers of the templates prism meets.
const PROBES: &[&str] = &[
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "fn main() {\n    println!(\"{}\", 12345 + 678);\n}\n",
    "  naïve café — 日本語のテキスト 🦀\n\n\tdone",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] w2 w3 w17 [/INST]</s>",
];

/// Token ids whose strings are compared, spread over the vocabulary.
const SAMPLED_IDS: usize = 512;

/// Why `draft` does not tokenize as `target` does, if it does not: the
/// vocabulary sizes, the begin, end and end-of-turn tokens, the ids of a
/// few probe texts, and the strings of ids spread over the vocabulary are
/// compared. A draft that passes proposes ids that mean to the target what
/// they mean to the draft.
pub fn tokenizer_difference(target: &Tokenizer, draft: &Tokenizer) -> Option<String> {
    let (size, draft_size) = (target.vocab_size(), draft.vocab_size());
    if size != draft_size {
        return Some(format!("vocabularies of {size} and {draft_size} tokens"));
    }
    if target.bos_token_id() != draft.bos_token_id() {
        return Some(format!(
            "begin tokens {:?} and {:?}",
            target.bos_token_id(),
            draft.bos_token_id()
        ));
    }
    if target.eos_token_id() != draft.eos_token_id() {
        return Some(format!(
            "end tokens {:?} and {:?}",
            target.eos_token_id(),
            draft.eos_token_id()
        ));
    }
    if target.stop_token_ids() != draft.stop_token_ids() {
        return Some(format!(
            "end-of-turn tokens {:?} and {:?}",
            target.stop_token_ids(),
            draft.stop_token_ids()
        ));
    }
    for probe in PROBES {
        let ids = target.encode(probe).map_err(|e| e.to_string());
        let draft_ids = draft.encode(probe).map_err(|e| e.to_string());
        if ids != draft_ids {
            return Some(format!("{probe:?} encodes as {ids:?} and {draft_ids:?}"));
        }
    }
    let stride = (size / SAMPLED_IDS).max(1);
    (0..size as u32).step_by(stride).find_map(|id| {
        let text = target.inner().id_to_token(id);
        let draft_text = draft.inner().id_to_token(id);
        (text != draft_text).then(|| format!("token {id} is {text:?} and {draft_text:?}"))
    })
}

/// The tokens a draft model drafts in its first round of a call.
pub const FIRST_DRAFT_LENGTH: usize = 4;

/// The most tokens a draft model drafts in a round.
pub const MAX_DRAFT_LENGTH: usize = 8;

/// How many tokens to draft next, after a round that drafted `drafted`
/// tokens at `length` and had `accepted` of them kept.
///
/// Every drafted token costs a pass of the draft model, and a rejected one
/// also a row of the target's pass, while each kept one saves a pass of the
/// target. So after a round kept whole the next drafts one more (up to
/// [`MAX_DRAFT_LENGTH`]): the draft is tracking the target and a longer run
/// is likely. After a round that kept fewer than half, it drafts one fewer
/// (never below 1): the tail of long drafts is being thrown away. In
/// between, the length stays.
pub fn next_draft_length(length: usize, drafted: usize, accepted: usize) -> usize {
    if drafted > 0 && accepted >= drafted {
        (length + 1).min(MAX_DRAFT_LENGTH)
    } else if 2 * accepted < drafted {
        length.saturating_sub(1).max(1)
    } else {
        length.clamp(1, MAX_DRAFT_LENGTH)
    }
}

/// Where a round's drafts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftSource {
    /// What followed the last few tokens earlier in the prompt or output.
    Lookup,
    /// The draft model's proposal.
    Model,
}

/// One round of drafts: how many were drafted and how many were kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    pub source: DraftSource,
    pub drafted: usize,
    pub accepted: usize,
}

/// How much the latest round weighs in a source's acceptance rate: recent
/// rounds say more about the text being written now than old ones.
const RATE_WEIGHT: f64 = 0.3;

/// How much more a lookup draft's acceptance counts than a model draft's
/// in choosing between them. A model draft costs a pass of the draft
/// model per token: on two cores of an Intel Xeon, the 0.5B Qwen drafting
/// for the 1.5B took half a pass of the 1.5B per token, so a round of
/// four model drafts costs about two passes more, while a lookup draft
/// costs only its row in the checking pass. Chosen by acceptance
/// alone, the model took the rounds lookup would have served on the
/// README's sample and the run was no faster than without drafting
/// (docs/RESULTS.md, "Drafted decoding").
const LOOKUP_ADVANTAGE: f64 = 2.0;

/// Which source to draft from, and how long a model draft is, from the
/// rounds seen so far in a call.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftPlan {
    /// Recent share of drafted tokens kept, per source, in 0..=1; both
    /// start at 1, so each source is tried.
    lookup_rate: f64,
    model_rate: f64,
    /// Tokens the draft model drafts next.
    pub model_length: usize,
}

impl Default for DraftPlan {
    fn default() -> Self {
        DraftPlan {
            lookup_rate: 1.0,
            model_rate: 1.0,
            model_length: FIRST_DRAFT_LENGTH,
        }
    }
}

impl DraftPlan {
    /// Take a finished round into account.
    pub fn record(&mut self, round: Round) {
        if round.drafted == 0 {
            return;
        }
        let kept = round.accepted as f64 / round.drafted as f64;
        let rate = match round.source {
            DraftSource::Lookup => &mut self.lookup_rate,
            DraftSource::Model => {
                self.model_length =
                    next_draft_length(self.model_length, round.drafted, round.accepted);
                &mut self.model_rate
            }
        };
        *rate = (1.0 - RATE_WEIGHT) * *rate + RATE_WEIGHT * kept;
    }

    /// The source of the next round, given whether earlier text offers a
    /// draft and whether there is a draft model: the one expected to keep
    /// more tokens for what it costs. Lookup drafts cost no pass to make, so
    /// they are used when they exist and their recent acceptance, times
    /// [`LOOKUP_ADVANTAGE`], is at least the model's.
    pub fn choose(&self, lookup_found: bool, model: bool) -> Option<DraftSource> {
        match (lookup_found, model) {
            (true, true) if self.lookup_rate * LOOKUP_ADVANTAGE >= self.model_rate => {
                Some(DraftSource::Lookup)
            }
            (_, true) => Some(DraftSource::Model),
            (true, false) => Some(DraftSource::Lookup),
            (false, false) => None,
        }
    }
}

/// Rejection sampling's step for one drafted token: `drafted`, drawn from
/// `q`, is kept with probability `min(1, p(x)/q(x))`; otherwise the token
/// is drawn from `max(0, p − q)`, normalized. `p` and `q` are probability
/// vectors over the same ids (a shorter one reads as zero past its end).
/// The token returned follows `p` whatever `q` is.
pub fn accept_or_resample(p: &[f32], q: &[f32], drafted: u32, rng: &mut impl Rng) -> u32 {
    let at = |dist: &[f32], id: usize| f64::from(dist.get(id).copied().unwrap_or(0.0));
    let (p_x, q_x) = (at(p, drafted as usize), at(q, drafted as usize));
    // With q(x) = 0 the token was not drawn from q; keep it only where p
    // would have it at all (the ratio is then infinite).
    let keep_probability = if q_x > 0.0 {
        p_x / q_x
    } else {
        f64::from(p_x > 0.0)
    };
    if rng.random::<f64>() < keep_probability {
        return drafted;
    }
    let residual: Vec<f64> = (0..p.len())
        .map(|id| (at(p, id) - at(q, id)).max(0.0))
        .collect();
    // The residual is empty only when p ≤ q everywhere, that is p = q up to
    // rounding, where the draft is kept with probability 1 but for the
    // rounding: then p itself is the distribution to draw from.
    draw(&residual, rng)
        .or_else(|| draw(&p.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), rng))
        .map_or(drafted, |id| id as u32)
}

/// An index drawn with probability proportional to `weights`, or `None`
/// when they sum to zero.
pub fn draw(weights: &[f64], rng: &mut impl Rng) -> Option<usize> {
    let total: f64 = weights.iter().filter(|w| w.is_finite()).sum();
    if total <= 0.0 {
        return None;
    }
    let mut target = rng.random::<f64>() * total;
    let mut last = None;
    for (id, &weight) in weights.iter().enumerate() {
        if !(weight > 0.0 && weight.is_finite()) {
            continue;
        }
        if target < weight {
            return Some(id);
        }
        target -= weight;
        last = Some(id);
    }
    // Rounding can leave the target just past the last weight.
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(seed)
    }

    #[test]
    fn a_draft_drawn_from_the_targets_own_distribution_is_always_kept() {
        let p = [0.1, 0.6, 0.3, 0.0];
        let mut rng = rng(1);
        for _ in 0..1000 {
            let drafted = draw(&p.map(f64::from), &mut rng).unwrap() as u32;
            assert_eq!(accept_or_resample(&p, &p, drafted, &mut rng), drafted);
        }
    }

    #[test]
    fn a_draft_the_target_gives_no_mass_is_always_replaced() {
        // q puts mass on 3, where p has none: 3 is never kept, and the
        // replacement comes from where p exceeds q.
        let p = [0.5, 0.5, 0.0, 0.0];
        let q = [0.25, 0.0, 0.25, 0.5];
        let mut rng = rng(2);
        for _ in 0..1000 {
            let token = accept_or_resample(&p, &q, 3, &mut rng);
            assert!(token == 0 || token == 1, "{token}");
            let token = accept_or_resample(&p, &q, 2, &mut rng);
            assert!(token == 0 || token == 1, "{token}");
        }
    }

    /// Draw from q, keep or replace: over many seeded draws the tokens come
    /// out as p has them, within 0.01 of each probability.
    #[test]
    fn the_tokens_kept_or_drawn_follow_the_targets_distribution() {
        let cases: [([f32; 5], [f32; 5]); 3] = [
            ([0.5, 0.3, 0.2, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0]),
            ([0.05, 0.05, 0.1, 0.2, 0.6], [0.6, 0.2, 0.1, 0.05, 0.05]),
            ([0.0, 0.0, 1.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]),
        ];
        let draws = 200_000;
        for (case, (p, q)) in cases.iter().enumerate() {
            let mut rng = rng(3 + case as u64);
            let mut counts = [0usize; 5];
            for _ in 0..draws {
                let drafted = draw(&q.map(f64::from), &mut rng).unwrap() as u32;
                counts[accept_or_resample(p, q, drafted, &mut rng) as usize] += 1;
            }
            for (id, &count) in counts.iter().enumerate() {
                let seen = count as f64 / draws as f64;
                assert!(
                    (seen - f64::from(p[id])).abs() < 0.01,
                    "case {case}: token {id} came {seen}, p is {}",
                    p[id]
                );
            }
        }
    }

    #[test]
    fn draft_length_grows_after_a_full_round_and_shrinks_after_a_poor_one() {
        assert_eq!(next_draft_length(4, 4, 4), 5);
        assert_eq!(next_draft_length(8, 8, 8), 8, "capped at the most");
        assert_eq!(next_draft_length(4, 4, 1), 3, "fewer than half kept");
        assert_eq!(next_draft_length(1, 1, 0), 1, "never below one");
        assert_eq!(next_draft_length(4, 4, 2), 4, "half kept: unchanged");
        assert_eq!(next_draft_length(4, 4, 3), 4);
        // A round cut short (by the context or an end token) and kept whole.
        assert_eq!(next_draft_length(6, 2, 2), 7);
        assert_eq!(next_draft_length(3, 0, 0), 3, "nothing drafted: unchanged");
    }

    #[test]
    fn the_plan_prefers_lookup_drafts_until_they_are_kept_far_less_often() {
        let mut plan = DraftPlan::default();
        assert_eq!(plan.choose(true, true), Some(DraftSource::Lookup));
        assert_eq!(plan.choose(false, true), Some(DraftSource::Model));
        assert_eq!(plan.choose(true, false), Some(DraftSource::Lookup));
        assert_eq!(plan.choose(false, false), None);
        // Kept at 0.7 of the model's rate: still worth more than its drafts.
        plan.record(Round {
            source: DraftSource::Lookup,
            drafted: 4,
            accepted: 0,
        });
        assert_eq!(plan.choose(true, true), Some(DraftSource::Lookup));
        // At 0.49 of it, no longer.
        plan.record(Round {
            source: DraftSource::Lookup,
            drafted: 4,
            accepted: 0,
        });
        assert_eq!(plan.choose(true, true), Some(DraftSource::Model));
        plan.record(Round {
            source: DraftSource::Model,
            drafted: 4,
            accepted: 0,
        });
        assert_eq!(plan.choose(true, true), Some(DraftSource::Lookup));
        assert_eq!(plan.model_length, 3);
    }
}
