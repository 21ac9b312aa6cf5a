//! Token accounting: per-call usage summed into a ledger, and the figures
//! (net tokens, cache hit rate, cost index, speeds) derived from it.

pub mod copying;
pub mod degeneration;

use crate::engine::{is_zero, Usage};

/// The figures every report shows, derived from a [`Usage`] in one place.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    /// Read from the prompt cache on disk.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restored_tokens: usize,
    /// Taken from cached runs at other positions (`--reuse-segments`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub segment_tokens: usize,
    /// Of the computed tokens, those of such runs computed anyway.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recomputed_tokens: usize,
    /// Prompt tokens actually computed: prompt − reused − restored − segment.
    pub net_tokens: usize,
    pub output_tokens: usize,
    /// reused / prompt, in 0..=1: the exact prefix cache in memory only.
    pub cache_hit_rate: f64,
    /// (reused + segment) / prompt, in 0..=1: the hit rate counting reused
    /// segments; left out when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_hit_rate: Option<f64>,
    /// (net + 3 × output) / 10⁶, as PRISM defines it.
    pub cost_index: f64,
    /// Net prompt tokens per second of prefill.
    pub prefill_tokens_per_second: f64,
    /// Generated tokens per second of decoding.
    pub decode_tokens_per_second: f64,
    /// Generated tokens that had been drafted, from earlier text
    /// (`--draft-tokens`) or by the draft model (`--draft-model`), and were
    /// checked in the pass of the token before them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_drafts: usize,
    /// Of `accepted_drafts`, those drafted from earlier text (prompt lookup).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_lookup_drafts: usize,
    /// Of `accepted_drafts`, those proposed by the draft model (`--draft-model`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_model_drafts: usize,
    /// Share of decoding time spent computing grammar masks, in 0..=1.
    pub mask_share: f64,
}

impl Figures {
    pub fn of(usage: &Usage) -> Self {
        let Tokens {
            prompt_tokens,
            reused_tokens,
            restored_tokens,
            segment_tokens,
            recomputed_tokens,
            net_tokens,
            output_tokens,
        } = Tokens::of(usage);
        let segment_hit_rate = (segment_tokens + recomputed_tokens > 0).then(|| {
            ratio(
                (reused_tokens + segment_tokens) as f64,
                prompt_tokens as f64,
            )
        });
        Figures {
            prompt_tokens,
            reused_tokens,
            restored_tokens,
            segment_tokens,
            recomputed_tokens,
            net_tokens,
            output_tokens,
            cache_hit_rate: ratio(usage.reused_tokens as f64, usage.prompt_tokens as f64),
            segment_hit_rate,
            cost_index: (net_tokens as f64 + 3.0 * usage.output_tokens as f64) / 1e6,
            prefill_tokens_per_second: ratio(net_tokens as f64, usage.prefill_seconds),
            decode_tokens_per_second: ratio(usage.decode_steps as f64, usage.decode_seconds),
            accepted_drafts: usage.accepted_drafts,
            accepted_lookup_drafts: usage.accepted_lookup_drafts,
            accepted_model_drafts: usage.accepted_model_drafts,
            mask_share: ratio(usage.mask_seconds, usage.decode_seconds),
        }
    }
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

/// The token counts of one step or call, as `steps.jsonl` records them
/// (flattened into each step's line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tokens {
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
    /// Read from the prompt cache on disk.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restored_tokens: usize,
    /// Taken from cached runs at other positions (`--reuse-segments`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub segment_tokens: usize,
    /// Of the computed tokens, those of such runs computed anyway.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recomputed_tokens: usize,
    /// Prompt tokens actually computed: prompt − reused − restored − segment.
    pub net_tokens: usize,
    pub output_tokens: usize,
}

impl Tokens {
    pub fn of(usage: &Usage) -> Self {
        Tokens {
            prompt_tokens: usage.prompt_tokens,
            reused_tokens: usage.reused_tokens,
            restored_tokens: usage.restored_tokens,
            segment_tokens: usage.segment_tokens,
            recomputed_tokens: usage.recomputed_tokens,
            net_tokens: usage.prompt_tokens
                - usage.reused_tokens
                - usage.restored_tokens
                - usage.segment_tokens,
            output_tokens: usage.output_tokens,
        }
    }
}

/// The running total of every engine call of a run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ledger {
    pub calls: usize,
    pub usage: Usage,
}

impl Ledger {
    pub fn record(&mut self, usage: &Usage) {
        self.calls += 1;
        self.usage += usage;
    }

    pub fn figures(&self) -> Figures {
        Figures::of(&self.usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_read_back_from_a_flat_step_line() {
        #[derive(serde::Deserialize)]
        struct Step {
            chunk: usize,
            #[serde(flatten)]
            tokens: Tokens,
        }
        let line = r#"{"chunk":3,"prompt_tokens":100,"reused_tokens":60,"net_tokens":40,"output_tokens":7}"#;
        let step: Step = serde_json::from_str(line).unwrap();
        assert_eq!(step.chunk, 3);
        let usage = Usage {
            prompt_tokens: 100,
            reused_tokens: 60,
            output_tokens: 7,
            ..Usage::default()
        };
        assert_eq!(step.tokens, Tokens::of(&usage));
    }

    #[test]
    fn figures_match_hand_worked_numbers() {
        // 1000 prompt tokens of which 690 reused, 200 generated:
        // net = 310, hit = 0.69, cost = (310 + 600) / 1e6.
        let usage = Usage {
            prompt_tokens: 1000,
            reused_tokens: 690,
            restored_tokens: 0,
            segment_tokens: 0,
            recomputed_tokens: 0,
            output_tokens: 200,
            prefill_seconds: 2.0,
            decode_steps: 199,
            accepted_drafts: 0,
            accepted_lookup_drafts: 0,
            accepted_model_drafts: 0,
            decode_seconds: 10.0,
            mask_seconds: 0.5,
        };
        let figures = Figures::of(&usage);
        assert_eq!(figures.net_tokens, 310);
        assert!((figures.cache_hit_rate - 0.69).abs() < 1e-12);
        assert!((figures.cost_index - 0.000910).abs() < 1e-12);
        assert!((figures.prefill_tokens_per_second - 155.0).abs() < 1e-9);
        assert!((figures.decode_tokens_per_second - 19.9).abs() < 1e-9);
        assert!((figures.mask_share - 0.05).abs() < 1e-12);
    }

    #[test]
    fn accepted_drafts_are_reported_by_source() {
        let call = Usage {
            output_tokens: 20,
            decode_steps: 19,
            accepted_drafts: 9,
            accepted_lookup_drafts: 4,
            accepted_model_drafts: 5,
            ..Usage::default()
        };
        let mut ledger = Ledger::default();
        ledger.record(&call);
        ledger.record(&call);
        let figures = ledger.figures();
        assert_eq!(
            (
                figures.accepted_drafts,
                figures.accepted_lookup_drafts,
                figures.accepted_model_drafts
            ),
            (18, 8, 10)
        );
        let line = serde_json::to_value(&figures).unwrap();
        assert_eq!(line["accepted_model_drafts"], 10);
        // Lines written before the counts by source existed still read.
        let old: Usage = serde_json::from_str(
            r#"{"prompt_tokens":3,"reused_tokens":0,"output_tokens":2,"prefill_seconds":0.1,
                "decode_steps":2,"accepted_drafts":1,"decode_seconds":0.2,"mask_seconds":0.0}"#,
        )
        .unwrap();
        assert_eq!(
            (old.accepted_lookup_drafts, old.accepted_model_drafts),
            (0, 0)
        );
        // Without drafts the fields stay out, so files keep their shape.
        let plain = serde_json::to_string(&Figures::of(&Usage::default())).unwrap();
        assert!(!plain.contains("drafts"), "{plain}");
    }

    #[test]
    fn ledger_sums_calls() {
        let call = Usage {
            prompt_tokens: 10,
            reused_tokens: 4,
            output_tokens: 2,
            ..Usage::default()
        };
        let mut ledger = Ledger::default();
        ledger.record(&call);
        ledger.record(&call);
        let figures = ledger.figures();
        assert_eq!(ledger.calls, 2);
        assert_eq!((figures.prompt_tokens, figures.net_tokens), (20, 12));
        assert_eq!(Figures::of(&Usage::default()).cache_hit_rate, 0.0);
    }

    #[test]
    fn tokens_restored_from_disk_are_neither_reused_nor_computed() {
        let usage = Usage {
            prompt_tokens: 1000,
            reused_tokens: 100,
            restored_tokens: 800,
            ..Usage::default()
        };
        let figures = Figures::of(&usage);
        assert_eq!((figures.restored_tokens, figures.net_tokens), (800, 100));
        assert!((figures.cache_hit_rate - 0.1).abs() < 1e-12);
        let line = serde_json::to_string(&Tokens::of(&usage)).unwrap();
        assert!(line.contains(r#""restored_tokens":800"#), "{line}");
        // Without the disk cache the field stays out, so older files keep their shape.
        let line = serde_json::to_string(&Tokens::of(&Usage::default())).unwrap();
        assert!(!line.contains("restored"), "{line}");
    }
}
