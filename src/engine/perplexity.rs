//! Perplexity of a text under the model, measured as llama.cpp's
//! `llama-perplexity` measures it, to check that prism computes what a GGUF file means.

use super::Engine;
use crate::error::{Error, Result, Setting};

/// How the text is cut into windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// Tokens per window (llama.cpp's `-c`).
    pub context: usize,
    /// Tokens from one window's start to the next; `context` gives
    /// llama.cpp's non-overlapping chunks.
    pub stride: usize,
}

/// The result: perplexity over every scored token, with its standard error.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Perplexity {
    pub perplexity: f64,
    /// `perplexity × sqrt(var(nll) / (n − 1))`, as llama.cpp reports it.
    pub standard_error: f64,
    pub windows: usize,
    pub scored_tokens: usize,
    /// Tokens of the whole text.
    pub text_tokens: usize,
}

/// Running sums of negative log-likelihoods.
#[derive(Debug, Default)]
struct Nll {
    sum: f64,
    sum_of_squares: f64,
    count: usize,
}

impl Nll {
    fn add(&mut self, log_prob: f32) {
        let nll = -f64::from(log_prob);
        self.sum += nll;
        self.sum_of_squares += nll * nll;
        self.count += 1;
    }

    fn perplexity(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    fn standard_error(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        let mean = self.sum / n;
        let variance = (self.sum_of_squares / n - mean * mean).max(0.0);
        self.perplexity() * (variance / (n - 1.0)).sqrt()
    }
}

impl Windows {
    /// Refuse windows too small to score anything, or a stride of 0.
    pub fn validate(&self, context_tokens: usize) -> Result<()> {
        if self.context < 4 {
            return Err(Error::invalid_setting(
                Setting::Context,
                "must be at least 4 tokens",
            ));
        }
        if self.context >= context_tokens {
            return Err(Error::invalid_setting(
                Setting::Context,
                format!("must be below the model's context of {context_tokens} tokens"),
            ));
        }
        if self.stride == 0 {
            return Err(Error::invalid_setting(
                Setting::Stride,
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Where each window of a text of `tokens` tokens starts.
    fn starts(&self, tokens: usize) -> impl Iterator<Item = usize> + '_ {
        (0..)
            .map(move |window| window * self.stride)
            .take_while(move |start| start + self.context <= tokens)
    }
}

impl Engine {
    /// The perplexity of `text` over `windows`; `progress` hears the window
    /// number and the running perplexity after each window.
    ///
    /// As `llama-perplexity` does it: the text is tokenized whole (BOS first
    /// when the model expects one) and cut into windows of `context` tokens,
    /// one every `stride`. Each window is evaluated from an empty cache, its
    /// first token replaced by BOS when the model uses one, and only the
    /// tokens after position `context / 2` are scored, so each is predicted
    /// from at least half a window of context.
    pub fn perplexity(
        &mut self,
        text: &str,
        windows: Windows,
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<Perplexity> {
        windows.validate(self.context_tokens())?;
        let tokens = self.text_prompt(text)?;
        let tokenizer = self.tokenizer();
        let bos = tokenizer.bos_token_id().filter(|_| tokenizer.add_bos());
        let starts: Vec<usize> = windows.starts(tokens.len()).collect();
        if starts.is_empty() {
            return Err(Error::invalid(
                "perplexity",
                format!(
                    "the text has {} tokens; a window of {} {} needs at least that many",
                    tokens.len(),
                    Setting::Context,
                    windows.context
                ),
            ));
        }
        let mut nll = Nll::default();
        let mut cache = self.model.new_cache();
        for (number, &start) in starts.iter().enumerate() {
            let mut window = tokens[start..start + windows.context].to_vec();
            if let Some(bos) = bos {
                window[0] = bos;
            }
            cache.truncate(0);
            let first = windows.context / 2;
            for log_prob in self
                .model
                .model()
                .next_token_log_probs(&window, &mut cache, first)?
            {
                nll.add(log_prob);
            }
            progress(number + 1, nll.perplexity());
        }
        Ok(Perplexity {
            perplexity: nll.perplexity(),
            standard_error: nll.standard_error(),
            windows: starts.len(),
            scored_tokens: nll.count,
            text_tokens: tokens.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_every_stride_and_stay_whole() {
        let windows = Windows {
            context: 4,
            stride: 4,
        };
        assert_eq!(windows.starts(11).collect::<Vec<_>>(), [0, 4]);
        let overlapping = Windows {
            context: 4,
            stride: 2,
        };
        assert_eq!(overlapping.starts(8).collect::<Vec<_>>(), [0, 2, 4]);
        assert_eq!(windows.starts(3).count(), 0);
    }

    #[test]
    fn perplexity_and_its_error_follow_the_log_likelihoods() {
        let mut nll = Nll::default();
        for p in [0.5f32, 0.25] {
            nll.add(p.ln());
        }
        // exp(mean(ln 2, ln 4)) = exp(ln sqrt 8) = sqrt 8.
        assert!((nll.perplexity() - 8f64.sqrt()).abs() < 1e-6);
        // nll values ln 2 and ln 4: variance (ln 2 / 2)^2, over n - 1 = 1.
        let expected = 8f64.sqrt() * (2f64.ln() / 2.0);
        assert!((nll.standard_error() - expected).abs() < 1e-6);
        assert!(Windows {
            context: 2,
            stride: 1
        }
        .validate(100)
        .is_err());
        assert!(Windows {
            context: 8,
            stride: 0
        }
        .validate(100)
        .is_err());
        assert!(Windows {
            context: 100,
            stride: 8
        }
        .validate(100)
        .is_err());
    }
}
