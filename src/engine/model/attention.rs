//! Causal grouped-query attention as two batched matmuls per key/value head.
//!
//! candle's fused CPU attention kernel is several times slower than its GEMM
//! once the context reaches a few thousand tokens, which is where PRISM's
//! prompts live. Here the query heads that share a key/value head are stacked
//! into one matrix, so keys and values are read straight from the cache,
//! never copied or repeated per query head.

use candle_core::{Device, Result, Tensor};

/// The additive causal mask for `seq` queries at the last positions of `total`:
/// query `i` (at position `total - seq + i`) sees keys `0..=total - seq + i`.
/// `None` for a single query, which sees everything.
pub fn causal_mask(seq: usize, total: usize, device: &Device) -> Result<Option<Tensor>> {
    if seq <= 1 {
        return Ok(None);
    }
    let start = total - seq;
    let mask: Vec<f32> = (0..seq)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (seq, total), device).map(Some)
}

/// Attend `queries` `(1, heads, seq, d)` to `keys` and `values`
/// `(1, kv_heads, total, d)`; returns `(1, seq, heads * d)`.
pub fn causal_attention(
    queries: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (_, heads, seq, d) = queries.dims4()?;
    let (_, kv_heads, total, _) = keys.dims4()?;
    let groups = heads / kv_heads;
    // Query head h reads key/value head h / groups, so consecutive heads stack
    // into one (groups * seq, d) matrix per key/value head.
    let queries = queries.reshape((kv_heads, groups * seq, d))?;
    let keys = keys.squeeze(0)?;
    let values = values.squeeze(0)?;
    // (kv_heads, groups * seq, total)
    let mut scores = (queries.matmul(&keys.t()?)? * scale)?;
    if let Some(mask) = mask {
        scores = scores
            .reshape((kv_heads, groups, seq, total))?
            .broadcast_add(mask)?
            .reshape((kv_heads, groups * seq, total))?;
    }
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    // (kv_heads, groups * seq, d) → (heads, seq, d) → (1, seq, heads * d)
    probs
        .matmul(&values)?
        .reshape((heads, seq, d))?
        .transpose(0, 1)?
        .reshape((1, seq, heads * d))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention written out one query head at a time with explicit loops.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: usize,
        kv_heads: usize,
        seq: usize,
        total: usize,
        d: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; seq * heads * d];
        for h in 0..heads {
            let kv = h / (heads / kv_heads);
            for i in 0..seq {
                let visible = total - seq + i + 1;
                let scores: Vec<f32> = (0..visible)
                    .map(|j| {
                        (0..d)
                            .map(|x| q[(h * seq + i) * d + x] * k[(kv * total + j) * d + x])
                            .sum::<f32>()
                            / (d as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = weights.iter().sum();
                for x in 0..d {
                    out[(i * heads + h) * d + x] = (0..visible)
                        .map(|j| weights[j] / sum * v[(kv * total + j) * d + x])
                        .sum();
                }
            }
        }
        out
    }

    #[test]
    fn matches_a_naive_loop_with_grouped_heads_and_a_cached_prefix() {
        let (heads, kv_heads, seq, total, d) = (6, 2, 3, 5, 4);
        let values = |n: usize, salt: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + salt).sin()).collect()
        };
        let (q, k, v) = (
            values(heads * seq * d, 0.1),
            values(kv_heads * total * d, 0.7),
            values(kv_heads * total * d, 1.3),
        );
        let dev = Device::Cpu;
        let qt = Tensor::from_vec(q.clone(), (1, heads, seq, d), &dev).unwrap();
        let kt = Tensor::from_vec(k.clone(), (1, kv_heads, total, d), &dev).unwrap();
        let vt = Tensor::from_vec(v.clone(), (1, kv_heads, total, d), &dev).unwrap();
        let mask = causal_mask(seq, total, &dev).unwrap();
        let out = causal_attention(&qt, &kt, &vt, mask.as_ref(), 1.0 / (d as f64).sqrt()).unwrap();
        let out: Vec<f32> = out.flatten_all().unwrap().to_vec1().unwrap();
        let expected = naive(&q, &k, &v, heads, kv_heads, seq, total, d);
        let diff = out
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "max difference {diff}");
    }
}
