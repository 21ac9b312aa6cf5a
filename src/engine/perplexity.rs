//! Perplexity of a text under the model, measured as llama.cpp's
//! `llama-perplexity` measures it, to check that prism computes what a GGUF file means.

use super::segments::SegmentReuse;
use super::Engine;
use crate::error::{CandleContext, Error, Result, Setting};
use candle_core::{Tensor, D};

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

/// What segment reuse does to a model's predictions
/// ([`Engine::segment_fidelity`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SegmentFidelity {
    pub windows: usize,
    pub scored_tokens: usize,
    /// Of the last third of each window, every layer computed.
    pub exact_perplexity: f64,
    /// Of the same tokens, after the middle third was taken from a cached
    /// sequence where other text preceded it.
    pub reused_perplexity: f64,
    /// `reused / exact − 1`.
    pub perplexity_change: f64,
    /// Mean over the scored positions of KL(exact ‖ reused), in nats.
    pub mean_kl: f64,
    /// The largest of them.
    pub max_kl: f64,
    /// Tokens of the middle thirds taken from the cache, and computed anyway.
    pub taken_tokens: usize,
    pub recomputed_tokens: usize,
}

impl Engine {
    /// How far segment reuse (`reuse`) moves the model's predictions on
    /// `text`, cut into `windows`. Each window is three thirds A, B and C
    /// (from its start at least a third and `shift` tokens into the text).
    /// The cache first holds the text before A — a third and `shift` tokens
    /// — followed by B, as an edited memory leaves its unchanged tail. Then
    /// A, B is encoded with B's rows taken from there (moved back by
    /// `shift`), and C is predicted after it. Both C's perplexity and the
    /// divergence of each prediction are set against the window computed
    /// whole.
    pub fn segment_fidelity(
        &mut self,
        text: &str,
        windows: Windows,
        shift: usize,
        reuse: SegmentReuse,
    ) -> Result<SegmentFidelity> {
        windows.validate(self.context_tokens())?;
        let tokens = self.text_prompt(text)?;
        let third = windows.context / 3;
        let starts: Vec<usize> = windows
            .starts(tokens.len())
            .filter(|&start| start >= third + shift)
            .collect();
        if third < reuse.min_tokens.max(1) || starts.is_empty() {
            return Err(Error::invalid(
                "segment fidelity",
                format!(
                    "needs a third of {} {} of at least {} tokens and a window after the first {} tokens of a text of {}",
                    Setting::Context,
                    windows.context,
                    reuse.min_tokens,
                    third + shift,
                    tokens.len()
                ),
            ));
        }
        let saved = (self.segment_reuse, self.prefix_cache);
        self.prefix_cache = true;
        let measured = self.measure_windows(&tokens, &starts, windows.context, shift, reuse);
        (self.segment_reuse, self.prefix_cache) = saved;
        self.clear_cache();
        measured
    }

    fn measure_windows(
        &mut self,
        tokens: &[u32],
        starts: &[usize],
        context: usize,
        shift: usize,
        reuse: SegmentReuse,
    ) -> Result<SegmentFidelity> {
        let third = context / 3;
        let (mut exact_nll, mut reused_nll) = (Nll::default(), Nll::default());
        let (mut kl_sum, mut max_kl, mut taken, mut recomputed) = (0.0, 0.0f64, 0, 0);
        for &start in starts {
            let window = &tokens[start..start + context];
            let (a_and_b, c) = window.split_at(2 * third);
            // Every prediction of a C token, from the last token of B on.
            let mut cache = self.model.new_cache();
            let exact = self
                .model
                .model()
                .log_prob_rows(window, &mut cache, 2 * third - 1)?
                .narrow(0, 0, c.len())
                .context("segment fidelity")?;
            let stale = [
                &tokens[start - third - shift..start],
                &window[third..2 * third],
            ]
            .concat();
            self.clear_cache();
            self.segment_reuse = None;
            self.prefill(&stale)?;
            self.segment_reuse = Some(reuse);
            let (after_b, usage) = self.prefill(a_and_b)?;
            taken += usage.segment_tokens;
            recomputed += usage.recomputed_tokens;
            let cache = &mut self.slots.active_mut().cache;
            let after_c = self.model.model().log_prob_rows(c, cache, 0)?;
            // Row i of both predicts C[i]: after B's last token, then after C's.
            let compare = || -> candle_core::Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
                let first = candle_nn::ops::log_softmax(&after_b.unsqueeze(0)?, D::Minus1)?;
                let reused = Tensor::cat(&[first, after_c.narrow(0, 0, c.len() - 1)?], 0)?;
                let kl = (exact.exp()? * (&exact - &reused)?)?
                    .sum(D::Minus1)?
                    .to_vec1::<f32>()?;
                let targets = Tensor::new(c, exact.device())?.unsqueeze(1)?;
                let scored = |rows: &Tensor| rows.gather(&targets, 1)?.squeeze(1)?.to_vec1::<f32>();
                Ok((kl, scored(&exact)?, scored(&reused)?))
            };
            let (kl, exact_scores, reused_scores) = compare().context("segment fidelity")?;
            for value in kl {
                kl_sum += f64::from(value);
                max_kl = max_kl.max(f64::from(value));
            }
            for (exact_lp, reused_lp) in exact_scores.into_iter().zip(reused_scores) {
                exact_nll.add(exact_lp);
                reused_nll.add(reused_lp);
            }
        }
        let (exact_perplexity, reused_perplexity) =
            (exact_nll.perplexity(), reused_nll.perplexity());
        Ok(SegmentFidelity {
            windows: starts.len(),
            scored_tokens: exact_nll.count,
            exact_perplexity,
            reused_perplexity,
            perplexity_change: reused_perplexity / exact_perplexity - 1.0,
            mean_kl: kl_sum / exact_nll.count.max(1) as f64,
            max_kl,
            taken_tokens: taken,
            recomputed_tokens: recomputed,
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
