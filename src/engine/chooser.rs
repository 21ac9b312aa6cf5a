//! Choosing each next token: the sampler, under the grammar when there is one.

use super::constraint::Constraint;
use super::sampling::{self, Sampler};
use super::speculative;
use super::Usage;
use crate::error::{CandleContext, Result};
use candle_core::Tensor;
use rand::rngs::StdRng;
use std::time::Instant;

/// Picks each next token: the sampler alone, or the sampler over the logits
/// the grammar allows.
pub(super) struct TokenChooser {
    pub(super) sampler: Sampler,
    pub(super) constraint: Option<Constraint>,
    /// The prompt and every token accepted after it, for the repetition controls.
    pub(super) history: Vec<u32>,
    pub(super) prompt_len: usize,
}

impl TokenChooser {
    /// The next token, never one of `banned` (sorted) unless the grammar
    /// allows nothing else.
    pub(super) fn next(
        &mut self,
        logits: &Tensor,
        usage: &mut Usage,
        banned: &[u32],
    ) -> Result<u32> {
        if self.constraint.is_none() && banned.is_empty() {
            return self.sampler.sample(logits, &self.history, self.prompt_len);
        }
        let values = logits.to_vec1::<f32>().context("grammar mask")?;
        let values = self.transform(values, usage, banned)?;
        let len = values.len();
        let masked =
            Tensor::from_vec(values, len, &candle_core::Device::Cpu).context("grammar mask")?;
        self.sampler.pick(&masked)
    }

    /// `values` as the sampler sees them: the grammar's mask, then the
    /// repetition controls, then the bans.
    fn transform(
        &mut self,
        mut values: Vec<f32>,
        usage: &mut Usage,
        banned: &[u32],
    ) -> Result<Vec<f32>> {
        if let Some(constraint) = self.constraint.as_mut() {
            let start = Instant::now();
            constraint.mask(&mut values)?;
            usage.mask_seconds += start.elapsed().as_secs_f64();
        }
        // After the mask, so the bans can see what the grammar allows.
        self.sampler
            .penalize(&mut values, &self.history, self.prompt_len);
        sampling::apply_bans(&mut values, banned);
        Ok(values)
    }

    /// A draft model's next token from its logits `values`, transformed as
    /// the target's are: the most likely under greedy decoding, else drawn
    /// with `coin`, returned with the distribution drawn from. `None` when
    /// no token is left.
    pub(super) fn draw(
        &mut self,
        values: Vec<f32>,
        usage: &mut Usage,
        banned: &[u32],
        coin: &mut StdRng,
    ) -> Result<Option<(u32, Option<Vec<f32>>)>> {
        let values = self.transform(values, usage, banned)?;
        Ok(match self.sampler.distribution(&values) {
            None => values
                .iter()
                .enumerate()
                .filter(|(_, value)| **value > f32::NEG_INFINITY)
                .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
                .map(|(id, _)| (id as u32, None)),
            Some(q) => {
                let weights: Vec<f64> = q.iter().map(|&v| f64::from(v)).collect();
                speculative::draw(&weights, coin).map(|id| (id as u32, Some(q)))
            }
        })
    }

    /// The token at `logits` when the draft model drew `drafted` from
    /// `drawn_from`: kept or replaced by rejection sampling against the
    /// target's distribution, under the same transforms.
    pub(super) fn check(
        &mut self,
        logits: &Tensor,
        usage: &mut Usage,
        banned: &[u32],
        drafted: u32,
        drawn_from: &[f32],
        coin: &mut StdRng,
    ) -> Result<u32> {
        let values = logits.to_vec1::<f32>().context("checking a draft")?;
        let values = self.transform(values, usage, banned)?;
        match self.sampler.distribution(&values) {
            Some(p) => Ok(speculative::accept_or_resample(
                &p, drawn_from, drafted, coin,
            )),
            None => {
                let len = values.len();
                let values = Tensor::from_vec(values, len, &candle_core::Device::Cpu)
                    .context("checking a draft")?;
                self.sampler.pick(&values)
            }
        }
    }

    pub(super) fn accept(&mut self, token: u32) -> Result<()> {
        if let Some(constraint) = self.constraint.as_mut() {
            constraint.accept(token)?;
        }
        self.history.push(token);
        Ok(())
    }

    /// Forget the last `count` accepted tokens.
    pub(super) fn rollback(&mut self, count: usize) -> Result<()> {
        if let Some(constraint) = self.constraint.as_mut() {
            constraint.rollback(count)?;
        }
        self.history.truncate(self.history.len() - count);
        Ok(())
    }
}
