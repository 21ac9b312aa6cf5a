//! Segment reuse (`--reuse-segments`): a prompt that leaves a cached
//! sequence part way still takes the keys and values of the later runs it
//! shares with it, at their new positions, computing only the first tokens
//! of each run again.

use std::collections::HashMap;
use std::ops::Range;

/// How segments are reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SegmentReuse {
    /// The shortest run of cached tokens taken at a new position. Shorter
    /// matches are common words and punctuation, whose keys and values
    /// depend more on what preceded them than on themselves.
    pub min_tokens: usize,
    /// Leading tokens of each run that are computed again rather than
    /// taken. A run's first tokens were computed after other text than
    /// they now follow, and later tokens attend to them most (EPIC,
    /// position-independent caching): computing them again with their new
    /// context repairs most of what the move breaks.
    pub recompute_tokens: usize,
}

impl Default for SegmentReuse {
    fn default() -> Self {
        SegmentReuse {
            min_tokens: DEFAULT_MIN_TOKENS,
            recompute_tokens: DEFAULT_RECOMPUTE_TOKENS,
        }
    }
}

/// See [`SegmentReuse::min_tokens`].
pub const DEFAULT_MIN_TOKENS: usize = 32;
/// See [`SegmentReuse::recompute_tokens`].
pub const DEFAULT_RECOMPUTE_TOKENS: usize = 16;

/// One stretch of a prompt, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Run these prompt positions through the model.
    Compute(Range<usize>),
    /// Take positions `from..from + len` of cached sequence `source` for
    /// prompt positions `at..at + len`.
    Reuse {
        at: usize,
        source: usize,
        from: usize,
        len: usize,
    },
}

/// How a prompt is encoded after its cached prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub pieces: Vec<Piece>,
    /// Tokens of matched runs that are computed anyway.
    pub recomputed: usize,
}

impl Plan {
    /// Prompt tokens taken from cached runs.
    pub fn reused(&self) -> usize {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Reuse { len, .. } => *len,
                Piece::Compute(_) => 0,
            })
            .sum()
    }
}

/// The most earlier occurrences of a run's first tokens that are followed
/// up: repetitive text (rows of dashes, a refrain) would otherwise make
/// planning quadratic.
const MOST_CANDIDATES: usize = 8;

/// Plan the encoding of `prompt` from position `start` (its cached
/// prefix ends there) given the token sequences `sources` whose keys and
/// values are cached. Left to right, each position starts the longest run
/// of at least `reuse.min_tokens` tokens found in a source, nearest its own
/// position on a tie; the first `reuse.recompute_tokens` of the run are
/// computed and the rest taken. The last prompt token is always computed:
/// its logits are what a prompt pass returns.
pub fn plan(prompt: &[u32], start: usize, sources: &[&[u32]], reuse: SegmentReuse) -> Plan {
    let whole = Plan {
        pieces: vec![Piece::Compute(start..prompt.len())],
        recomputed: 0,
    };
    let width = reuse.min_tokens.max(1);
    let Some(last) = prompt.len().checked_sub(1) else {
        return whole;
    };
    if start + width > last {
        return whole;
    }
    let mut starts: HashMap<&[u32], Vec<(usize, usize)>> = HashMap::new();
    for (source, tokens) in sources.iter().enumerate() {
        for from in 0..(tokens.len() + 1).saturating_sub(width) {
            starts
                .entry(&tokens[from..from + width])
                .or_default()
                .push((source, from));
        }
    }
    let mut pieces = Vec::new();
    let mut recomputed = 0;
    let mut computing = start;
    let mut at = start;
    while at + width <= last {
        let matched = starts.get(&prompt[at..at + width]).and_then(|found| {
            found
                .iter()
                .rev()
                .take(MOST_CANDIDATES)
                .map(|&(source, from)| {
                    let tokens = sources[source];
                    let len = (0..)
                        .take_while(|&k| at + k < last && from + k < tokens.len())
                        .take_while(|&k| prompt[at + k] == tokens[from + k])
                        .count();
                    (source, from, len)
                })
                .max_by_key(|&(_, from, len)| (len, std::cmp::Reverse(from.abs_diff(at))))
        });
        let Some((source, from, len)) = matched.filter(|&(_, _, len)| len >= width) else {
            at += 1;
            continue;
        };
        let recompute = reuse.recompute_tokens.min(len);
        recomputed += recompute;
        if recompute < len {
            if computing < at + recompute {
                pieces.push(Piece::Compute(computing..at + recompute));
            }
            pieces.push(Piece::Reuse {
                at: at + recompute,
                source,
                from: from + recompute,
                len: len - recompute,
            });
            computing = at + len;
        }
        at += len;
    }
    pieces.push(Piece::Compute(computing..prompt.len()));
    Plan { pieces, recomputed }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reuse(min_tokens: usize, recompute_tokens: usize) -> SegmentReuse {
        SegmentReuse {
            min_tokens,
            recompute_tokens,
        }
    }

    #[test]
    fn a_run_moved_by_an_edit_is_taken_after_its_first_tokens() {
        // Cached: 0..10 then 100..120. The prompt changes 0..10 to 10
        // other tokens plus 3 more, so the run 100..120 moves 3 later.
        let cached: Vec<u32> = (0..10).chain(100..120).collect();
        let prompt: Vec<u32> = (0..5).chain(50..58).chain(100..120).chain([7]).collect();
        let plan = plan(&prompt, 5, &[&cached], reuse(8, 2));
        assert_eq!(
            plan.pieces,
            vec![
                Piece::Compute(5..15),
                Piece::Reuse {
                    at: 15,
                    source: 0,
                    from: 12,
                    len: 18
                },
                Piece::Compute(33..34),
            ]
        );
        assert_eq!((plan.recomputed, plan.reused()), (2, 18));
    }

    #[test]
    fn the_last_prompt_token_is_always_computed() {
        let cached: Vec<u32> = (100..140).collect();
        let prompt: Vec<u32> = [1, 2].into_iter().chain(100..140).collect();
        let plan = plan(&prompt, 0, &[&cached], reuse(8, 0));
        assert_eq!(plan.pieces.last(), Some(&Piece::Compute(41..42)));
        assert_eq!(plan.reused(), 39);
    }

    #[test]
    fn short_matches_and_whole_recomputation_reuse_nothing() {
        let cached: Vec<u32> = (100..140).collect();
        let prompt: Vec<u32> = [1, 2].into_iter().chain(100..140).chain([9]).collect();
        let short = plan(&prompt, 0, &[&cached], reuse(64, 0));
        assert_eq!(short.pieces, vec![Piece::Compute(0..43)]);
        let all = plan(&prompt, 0, &[&cached], reuse(8, usize::MAX));
        assert_eq!(all.pieces, vec![Piece::Compute(0..43)]);
        assert_eq!((all.recomputed, all.reused()), (40, 0));
    }

    #[test]
    fn the_longest_run_wins_and_ties_go_to_the_nearest_position() {
        let short: Vec<u32> = (100..112).collect();
        let long: Vec<u32> = (100..130).collect();
        let prompt: Vec<u32> = (100..130).chain([1]).collect();
        let plan_of = |sources: &[&[u32]]| plan(&prompt, 0, sources, reuse(8, 0));
        assert_eq!(
            plan_of(&[&short, &long]).pieces[0],
            Piece::Reuse {
                at: 0,
                source: 1,
                from: 0,
                len: 30
            }
        );
        let twice: Vec<u32> = (100..130).chain(100..130).collect();
        assert_eq!(
            plan_of(&[&twice]).pieces[0],
            Piece::Reuse {
                at: 0,
                source: 0,
                from: 0,
                len: 30
            }
        );
    }

    #[test]
    fn prompts_too_short_to_hold_a_run_are_computed_whole() {
        assert_eq!(
            plan(&[1, 2, 3], 1, &[&[1, 2, 3]], reuse(8, 0)).pieces,
            vec![Piece::Compute(1..3)]
        );
        assert_eq!(
            plan(&[], 0, &[], reuse(8, 0)).pieces,
            vec![Piece::Compute(0..0)]
        );
    }
}
