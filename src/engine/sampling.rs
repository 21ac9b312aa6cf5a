//! Choosing the next token from logits: greedy, or seeded sampling with
//! temperature, top-k and top-p, after an optional repeat penalty.

use crate::error::{CandleContext, Result};
use candle_core::Tensor;
use candle_transformers::generation::{LogitsProcessor, Sampling};

/// How to pick tokens. `temperature == 0` is greedy decoding.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingConfig {
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    /// Divides positive logits (multiplies negative ones) of tokens seen in the
    /// last `repeat_last_n` tokens; 1.0 turns it off.
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 299_792_458,
        }
    }
}

impl SamplingConfig {
    pub fn validate(&self) -> Result<()> {
        let invalid = |what: &str, reason: &str| Err(crate::Error::invalid(what, reason));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return invalid("--temperature", "must be a finite number ≥ 0");
        }
        if self.top_k == Some(0) {
            return invalid("--top-k", "must be at least 1");
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return invalid("--top-p", "must be in (0, 1]");
            }
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return invalid("--repeat-penalty", "must be a finite number > 0");
        }
        Ok(())
    }
}

/// A seeded token picker: the same seed and logits give the same tokens.
pub struct Sampler {
    processor: LogitsProcessor,
    repeat_penalty: f32,
    repeat_last_n: usize,
}

impl Sampler {
    pub fn new(config: &SamplingConfig) -> Self {
        let temperature = config.temperature;
        let sampling = if temperature <= 0.0 {
            Sampling::ArgMax
        } else {
            match (config.top_k, config.top_p) {
                (None, None) => Sampling::All { temperature },
                (Some(k), None) => Sampling::TopK { k, temperature },
                (None, Some(p)) => Sampling::TopP { p, temperature },
                (Some(k), Some(p)) => Sampling::TopKThenTopP { k, p, temperature },
            }
        };
        Sampler {
            processor: LogitsProcessor::from_sampling(config.seed, sampling),
            repeat_penalty: config.repeat_penalty,
            repeat_last_n: config.repeat_last_n,
        }
    }

    /// Pick the next token from `logits` (a vector over the vocabulary), given
    /// the tokens so far for the repeat penalty.
    pub fn sample(&mut self, logits: &Tensor, history: &[u32]) -> Result<u32> {
        let logits = if self.repeat_penalty == 1.0 {
            logits.clone()
        } else {
            let recent = &history[history.len().saturating_sub(self.repeat_last_n)..];
            candle_transformers::utils::apply_repeat_penalty(logits, self.repeat_penalty, recent)
                .context("repeat penalty")?
        };
        self.processor.sample(&logits).context("sampling")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn logits() -> Tensor {
        Tensor::new(&[0.1f32, 2.0, 1.9, -1.0, 0.5], &Device::Cpu).unwrap()
    }

    #[test]
    fn greedy_picks_the_largest_logit() {
        let mut sampler = Sampler::new(&SamplingConfig::default());
        assert_eq!(sampler.sample(&logits(), &[]).unwrap(), 1);
    }

    #[test]
    fn repeat_penalty_moves_greedy_off_a_seen_token() {
        let config = SamplingConfig {
            repeat_penalty: 1.5,
            ..SamplingConfig::default()
        };
        let mut sampler = Sampler::new(&config);
        assert_eq!(sampler.sample(&logits(), &[1]).unwrap(), 2);
    }

    #[test]
    fn same_seed_same_tokens() {
        let config = SamplingConfig {
            temperature: 1.0,
            top_p: Some(0.95),
            seed: 7,
            ..SamplingConfig::default()
        };
        let draw = || {
            let mut sampler = Sampler::new(&config);
            (0..32)
                .map(|_| sampler.sample(&logits(), &[]).unwrap())
                .collect::<Vec<_>>()
        };
        let first = draw();
        assert_eq!(first, draw());
        assert!(
            first.iter().any(|&t| t != first[0]),
            "temperature 1 should vary: {first:?}"
        );
    }

    #[test]
    fn invalid_settings_are_refused() {
        let bad = SamplingConfig {
            top_p: Some(1.5),
            ..SamplingConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
