//! Chain of Summaries' questions: the train, validation and test split, the failed
//! ones a round refines with, and the candidate the validation scores keep.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// The three sets of questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// Guide the refinements.
    Train,
    /// Choose among the candidates.
    Validation,
    /// Score the chosen one.
    Test,
}

/// Which pairs (by index) are train, validation and test questions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    pub train: Vec<usize>,
    pub validation: Vec<usize>,
    pub test: Vec<usize>,
}

impl Split {
    pub fn part(&self, part: Part) -> &[usize] {
        match part {
            Part::Train => &self.train,
            Part::Validation => &self.validation,
            Part::Test => &self.test,
        }
    }
}

/// Split `count` pairs into train, validation and test sets, in an order
/// shuffled by `seed`: a quarter each (at least one) for validation and
/// test, the rest for training. Three or more pairs fill every set; two
/// give one train and one validation question, one gives a train question.
pub fn split_pairs(count: usize, seed: u64) -> Split {
    let mut order: Vec<usize> = (0..count).collect();
    shuffle(&mut order, seed);
    let (validation, test) = match count {
        0 | 1 => (0, 0),
        2 => (1, 0),
        _ => ((count / 4).max(1), (count / 4).max(1)),
    };
    let train = count - validation - test;
    Split {
        train: order[..train].to_vec(),
        validation: order[train..train + validation].to_vec(),
        test: order[train + validation..].to_vec(),
    }
}

/// Fisher–Yates with SplitMix64: the same seed gives the same order on every
/// platform and with every version of the `rand` crate.
fn shuffle(items: &mut [usize], seed: u64) {
    let mut state = seed;
    for i in (1..items.len()).rev() {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        items.swap(i, (z % (i as u64 + 1)) as usize);
    }
}

/// The candidate to keep, given each one's mean validation F1 and length in
/// tokens: the best score (no score ranks below any), ties to the shorter,
/// then to the earlier. `None` only when there are no candidates.
///
/// The first summary s⁰ is a candidate too, where the paper's argmax runs
/// over s¹..sⁱ: keeping it guards against a refinement that hurts, for
/// one more round of validation answers.
pub fn select(candidates: &[(Option<f64>, usize)]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (index, &(f1, tokens)) in candidates.iter().enumerate() {
        let better = match best {
            None => true,
            Some(leader) => {
                let (leader_f1, leader_tokens) = candidates[leader];
                match compare_scores(f1, leader_f1) {
                    Ordering::Greater => true,
                    Ordering::Less => false,
                    Ordering::Equal => tokens < leader_tokens,
                }
            }
        };
        if better {
            best = Some(index);
        }
    }
    best
}

/// Scores within a rounding error of each other are equal.
fn compare_scores(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) if (a - b).abs() <= 1e-9 => Ordering::Equal,
        (Some(a), Some(b)) => a.total_cmp(&b),
        (a, b) => a.is_some().cmp(&b.is_some()),
    }
}

/// Up to `limit` train questions (as pair indices) to refine with: those
/// whose answer scored below `fail_f1` (`f1s` follows `train`), the ones
/// used least in earlier rounds (`used`, by pair index) first, then in
/// split order. This stands in for the paper's sampling without refining
/// against one stubborn question every round.
pub fn pick_failed(
    train: &[usize],
    f1s: &[f64],
    used: &[usize],
    fail_f1: f64,
    limit: usize,
) -> Vec<usize> {
    let mut failed: Vec<(usize, usize, usize)> = train
        .iter()
        .zip(f1s)
        .enumerate()
        .filter(|(_, (_, &f1))| f1 < fail_f1)
        .map(|(position, (&pair, _))| (used.get(pair).copied().unwrap_or(0), position, pair))
        .collect();
    failed.sort_unstable();
    failed
        .into_iter()
        .take(limit)
        .map(|(_, _, pair)| pair)
        .collect()
}
