//! Choosing the next token from logits: greedy, or seeded sampling with
//! temperature, top-k and top-p, after the repetition controls.

use crate::error::{CandleContext, Result, Setting};
use candle_core::{Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How to pick tokens. `temperature == 0` is greedy decoding.
///
/// Fields added after the first release carry serde defaults (everything
/// off), so older configs and checkpoints still read; they are left out of
/// the JSON while they hold that default, so a run with them off keeps the
/// fingerprint it had before they existed.
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
    /// DRY: the penalty for a token that extends a repeat of exactly
    /// `dry_allowed_length` tokens; 0 turns DRY off.
    #[serde(default, skip_serializing_if = "is_zero_f32")]
    pub dry_multiplier: f32,
    /// DRY: the penalty grows by this factor for each repeated token beyond
    /// `dry_allowed_length`.
    #[serde(
        default = "default_dry_base",
        skip_serializing_if = "is_default_dry_base"
    )]
    pub dry_base: f32,
    /// DRY: repeats shorter than this are free.
    #[serde(
        default = "default_dry_allowed_length",
        skip_serializing_if = "is_default_dry_allowed_length"
    )]
    pub dry_allowed_length: usize,
    /// DRY: how many of the latest tokens (prompt and output) are searched
    /// for repeats; 0 searches the whole context.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub dry_penalty_last_n: usize,
    /// DRY: count repeats of the prompt too, as llama.cpp does. Off, only
    /// repeats within the output are penalized, so text quoted from the
    /// prompt (a name, a line of the document) is free the first time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_prompt: bool,
    /// Forbid any token that would complete an n-gram of this many token ids
    /// already in the generated text (the prompt does not count); 0 is off.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub no_repeat_ngram: usize,
    /// Forbid any token that would make the output copy a run of this many
    /// token ids from the call's source text (the chunk a prompt asks to
    /// summarize; see [`CopySource`]); 0 is off.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub no_copy_ngram: usize,
    /// End a generation once it completes a line or sentence it already
    /// wrote, cutting the text before the repeat (see [`repeated_unit`]), or
    /// once it writes a run of tokens three times over ([`periodic_tail`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loop_guard: bool,
}

fn default_dry_base() -> f32 {
    1.75
}

fn default_dry_allowed_length() -> usize {
    2
}

fn is_zero_f32(value: &f32) -> bool {
    *value == 0.0
}

fn is_zero_usize(value: &usize) -> bool {
    *value == 0
}

fn is_default_dry_base(value: &f32) -> bool {
    *value == default_dry_base()
}

fn is_default_dry_allowed_length(value: &usize) -> bool {
    *value == default_dry_allowed_length()
}

impl Default for SamplingConfig {
    /// Greedy decoding with every repetition control off: the exact argmax path.
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 299_792_458,
            dry_multiplier: 0.0,
            dry_base: default_dry_base(),
            dry_allowed_length: default_dry_allowed_length(),
            dry_penalty_last_n: 0,
            dry_prompt: false,
            no_repeat_ngram: 0,
            no_copy_ngram: 0,
            loop_guard: false,
        }
    }
}

impl SamplingConfig {
    /// The defaults `summarize` and `bench` use for every method alike: greedy,
    /// DRY over the output (multiplier 0.8, base 1.75, allowed length 2), the
    /// loop guard on, and no n-gram or copy ban. DRY leaves the prompt out
    /// because notes and summaries rightly quote names: over the prompt it
    /// pushes a small model to misspell them. The copy ban does the same:
    /// Qwen2.5-Coder-1.5B, kept from copying runs of 10 tokens, went on
    /// copying with words run together ("theMarigold", "whit wash").
    pub fn for_summaries() -> Self {
        SamplingConfig {
            dry_multiplier: 0.8,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 0,
            dry_prompt: false,
            no_repeat_ngram: 0,
            no_copy_ngram: 0,
            loop_guard: true,
            ..SamplingConfig::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        let invalid =
            |setting: Setting, reason: &str| Err(crate::Error::invalid_setting(setting, reason));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return invalid(Setting::Temperature, "must be a finite number ≥ 0");
        }
        if self.top_k == Some(0) {
            return invalid(Setting::TopK, "must be at least 1");
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return invalid(Setting::TopP, "must be in (0, 1]");
            }
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return invalid(Setting::RepeatPenalty, "must be a finite number > 0");
        }
        if !(self.dry_multiplier >= 0.0 && self.dry_multiplier.is_finite()) {
            return invalid(
                Setting::DryMultiplier,
                "must be a finite number ≥ 0 (0 is off)",
            );
        }
        if !self.dry_base.is_finite() || (self.dry_multiplier > 0.0 && self.dry_base <= 1.0) {
            return invalid(
                Setting::DryBase,
                "must be a finite number > 1: the DRY penalty grows by this factor per repeated token",
            );
        }
        if self.no_copy_ngram == 1 {
            return invalid(
                Setting::NoCopyNgram,
                "must be 0 (off) or at least 2: at 1 every token of the source would be banned",
            );
        }
        if self.dry_multiplier > 0.0 && self.dry_allowed_length >= DRY_MAX_MATCH {
            return invalid(
                Setting::DryAllowedLength,
                &format!("must be below {DRY_MAX_MATCH}, the longest repeat DRY measures"),
            );
        }
        Ok(())
    }

    fn dry_on(&self) -> bool {
        self.dry_multiplier > 0.0
    }

    /// Whether generation needs [`TokenMarks`]: DRY's sequence breakers, or
    /// the tokens that can end a line or sentence for the loop guard.
    pub fn needs_token_marks(&self) -> bool {
        self.dry_on() || self.loop_guard
    }
}

/// The characters that stop a DRY match (llama.cpp's default sequence
/// breakers): a repeat across a line break, a `key:` or a quote is structure
/// (lists, JSON, dialogue), not a loop.
const DRY_BREAKERS: [char; 4] = ['\n', ':', '"', '*'];

/// The longest repeat DRY measures. Longer ones get the same penalty, and the
/// cap keeps both the work per step and `base^length` bounded.
pub const DRY_MAX_MATCH: usize = 50;

/// The largest DRY penalty. It is finite, so a grammar's last allowed tokens
/// are never pushed to −∞, and large enough to outweigh any logit.
const DRY_MAX_PENALTY: f64 = 1e6;

/// What the repetition controls need to know about each token's text,
/// computed once per vocabulary.
#[derive(Debug, Clone, Default)]
pub struct TokenMarks {
    /// Its text holds a DRY sequence breaker, or it ends a turn.
    breaker: Vec<bool>,
    /// Its text holds a character that can end a line or sentence.
    ends_unit: Vec<bool>,
    /// Its text begins with a letter or digit: after a token that ends in
    /// one, it goes on with the same word.
    starts_in_word: Vec<bool>,
    /// Its text ends with a letter or digit.
    ends_in_word: Vec<bool>,
}

impl TokenMarks {
    /// Marks for the tokens whose texts are `texts`, in id order. End-of-turn
    /// tokens (`stop_ids`) are breakers too: a turn that ends as an earlier
    /// one did is no repeat to punish.
    pub fn new<S: AsRef<str>>(texts: impl IntoIterator<Item = S>, stop_ids: &[u32]) -> Self {
        let mut marks = TokenMarks::default();
        for text in texts {
            let text = text.as_ref();
            marks.breaker.push(text.contains(DRY_BREAKERS));
            marks.ends_unit.push(text.contains(['\n', '.', '!', '?']));
            marks
                .starts_in_word
                .push(text.starts_with(char::is_alphanumeric));
            marks
                .ends_in_word
                .push(text.ends_with(char::is_alphanumeric));
        }
        for &id in stop_ids {
            if let Some(mark) = marks.breaker.get_mut(id as usize) {
                *mark = true;
            }
        }
        marks
    }

    /// Whether `token` stops a DRY match (unknown ids do not).
    pub fn is_breaker(&self, token: u32) -> bool {
        self.breaker.get(token as usize).copied().unwrap_or(false)
    }

    /// Whether `token` can end a line or sentence (unknown ids cannot).
    pub fn may_end_unit(&self, token: u32) -> bool {
        self.ends_unit.get(token as usize).copied().unwrap_or(false)
    }

    /// Whether `token`, written after `previous`, goes on with the word
    /// `previous` ends in (unknown ids do not).
    pub fn continues_word(&self, previous: u32, token: u32) -> bool {
        let mark = |marks: &[bool], id: u32| marks.get(id as usize).copied().unwrap_or(false);
        mark(&self.ends_in_word, previous) && mark(&self.starts_in_word, token)
    }
}

/// The DRY settings of a [`SamplingConfig`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dry {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    /// 0 searches the whole context.
    pub last_n: usize,
}

impl Dry {
    fn of(config: &SamplingConfig) -> Self {
        Dry {
            multiplier: config.dry_multiplier,
            base: config.dry_base,
            allowed_length: config.dry_allowed_length,
            last_n: config.dry_penalty_last_n,
        }
    }

    /// The penalty for extending a repeat of `length` tokens.
    fn penalty(&self, length: usize) -> f32 {
        let excess = (length - self.allowed_length) as i32;
        let penalty = f64::from(self.multiplier) * f64::from(self.base).powi(excess);
        penalty.min(DRY_MAX_PENALTY) as f32
    }
}

/// DRY: the tokens that would extend a sequence which already occurred in
/// `context`, each with the amount to subtract from its logit, in id order.
///
/// A candidate token `t` extends a repeat of length `L` when `context` ends
/// with `L` tokens that also occur earlier, followed there by `t`. With `L` at
/// least `allowed_length` (and at least 1) the penalty is
/// `multiplier · base^(L − allowed_length)`, for the longest such `L` (at most
/// [`DRY_MAX_MATCH`]). A match never spans a breaker token, and a breaker is
/// never penalized. Only the last `last_n` tokens of `context` are searched
/// (all when 0). Linear in the searched length.
pub fn dry_penalties(
    context: &[u32],
    dry: &Dry,
    is_breaker: impl Fn(u32) -> bool,
) -> Vec<(u32, f32)> {
    if dry.multiplier == 0.0 {
        return Vec::new();
    }
    let window = match dry.last_n {
        0 => context,
        n => &context[context.len().saturating_sub(n)..],
    };
    // Newest first: a repeat of the tail becomes a common prefix.
    let reversed: Vec<u32> = window.iter().rev().copied().collect();
    let tail = reversed
        .iter()
        .take_while(|&&t| !is_breaker(t))
        .count()
        .min(DRY_MAX_MATCH);
    if tail == 0 {
        return Vec::new();
    }
    let matches = common_prefix_lengths(&reversed, tail);
    let shortest = dry.allowed_length.max(1);
    let mut longest: Vec<(u32, usize)> = Vec::new();
    // reversed[k..k + len] repeats the tail, and reversed[k - 1] followed it.
    for (k, &len) in matches.iter().enumerate().skip(1) {
        let next = reversed[k - 1];
        if len >= shortest && !is_breaker(next) {
            longest.push((next, len));
        }
    }
    longest.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    longest.dedup_by_key(|(token, _)| *token);
    longest
        .into_iter()
        .map(|(token, len)| (token, dry.penalty(len)))
        .collect()
}

/// For each `k`, the length of the longest common prefix of `s` and `s[k..]`,
/// counting at most `limit` tokens (the Z-algorithm, linear in `s.len()`);
/// entry 0 is 0.
fn common_prefix_lengths(s: &[u32], limit: usize) -> Vec<usize> {
    let mut lengths = vec![0; s.len()];
    // s[left..right] equals s[..right - left]: the match reaching furthest right so far.
    let (mut left, mut right) = (0, 0);
    for k in 1..s.len() {
        // Inside that match, s[k..] starts as s[k - left..] does.
        let mut len = if k < right {
            lengths[k - left].min(right - k)
        } else {
            0
        };
        while len < limit && k + len < s.len() && s[len] == s[k + len] {
            len += 1;
        }
        lengths[k] = len;
        if k + len > right {
            (left, right) = (k, k + len);
        }
    }
    lengths
}

/// The tokens that would complete an `n`-gram already present in `generated`,
/// sorted: every token that followed an earlier occurrence of the last
/// `n − 1` tokens (for `n == 1`, every token generated). Empty when `n` is 0.
pub fn ngram_bans(generated: &[u32], n: usize) -> Vec<u32> {
    if n == 0 || generated.len() < n {
        return Vec::new();
    }
    let prefix = &generated[generated.len() + 1 - n..];
    let mut banned: Vec<u32> = generated
        .windows(n)
        .filter(|gram| &gram[..n - 1] == prefix)
        .map(|gram| gram[n - 1])
        .collect();
    banned.sort_unstable();
    banned.dedup();
    banned
}

/// The runs of a source text's tokens that an output may not copy whole:
/// every token that follows an `n − 1`-token run of the source is banned
/// after the output ends with that run.
#[derive(Debug, Clone, Default)]
pub struct CopySource {
    n: usize,
    /// The tokens that followed each run of `n − 1` source tokens.
    next: HashMap<Vec<u32>, Vec<u32>>,
}

impl CopySource {
    /// The runs of `n` tokens in `source`; `n == 0` bans nothing.
    pub fn new(source: &[u32], n: usize) -> Self {
        let mut next: HashMap<Vec<u32>, Vec<u32>> = HashMap::new();
        if n > 0 {
            for gram in source.windows(n) {
                let followers = next.entry(gram[..n - 1].to_vec()).or_default();
                if !followers.contains(&gram[n - 1]) {
                    followers.push(gram[n - 1]);
                }
            }
        }
        CopySource { n, next }
    }

    /// The tokens that would make `generated` end with a run of `n` source
    /// tokens, sorted.
    pub fn bans(&self, generated: &[u32]) -> Vec<u32> {
        if self.n == 0 || generated.len() + 1 < self.n {
            return Vec::new();
        }
        let mut banned = self
            .next
            .get(&generated[generated.len() + 1 - self.n..])
            .cloned()
            .unwrap_or_default();
        banned.sort_unstable();
        banned
    }
}

/// Set the logits of the `banned` tokens (sorted) to −∞, unless that would
/// leave no token with a logit above −∞ (all allowed ones banned by a
/// grammar's mask and the ban together); then change nothing. Returns whether
/// the ban was applied.
pub fn apply_bans(logits: &mut [f32], banned: &[u32]) -> bool {
    let is_banned = |id: usize| banned.binary_search(&(id as u32)).is_ok();
    let any_left = logits
        .iter()
        .enumerate()
        .any(|(id, &logit)| logit > f32::NEG_INFINITY && !is_banned(id));
    if !any_left {
        return false;
    }
    for &token in banned {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit = f32::NEG_INFINITY;
        }
    }
    true
}

/// Divide positive logits (multiply negative ones) of the tokens in `recent`
/// by `penalty`, once per distinct token.
fn apply_repeat_penalty(logits: &mut [f32], penalty: f32, recent: &[u32]) {
    let mut seen = HashSet::new();
    for &token in recent {
        if !seen.insert(token) {
            continue;
        }
        if let Some(logit) = logits.get_mut(token as usize) {
            if *logit >= 0.0 {
                *logit /= penalty;
            } else {
                *logit *= penalty;
            }
        }
    }
}

/// A line or sentence shorter than this many words and characters may repeat
/// (a heading, a list marker, "Yes.").
const LOOP_MIN_WORDS: usize = 3;
const LOOP_MIN_CHARS: usize = 16;

/// The loop guard's test: the byte offset in `text` where the first line or
/// sentence that repeats an earlier one starts, if any.
///
/// A line ends at `\n`; a sentence ends at `.`, `!` or `?` followed by
/// whitespace (so `3.5` and a sentence still being written are not cut). Two
/// are equal when they are equal in lowercase with whitespace collapsed; one
/// of fewer than 3 words and 16 characters never counts.
pub fn repeated_unit(text: &str) -> Option<usize> {
    let mut seen = HashSet::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let end = match c {
            '\n' => at,
            '.' | '!' | '?' if chars.peek().is_some_and(|(_, next)| next.is_whitespace()) => {
                at + c.len_utf8()
            }
            _ => continue,
        };
        let unit = &text[start..end];
        let words: Vec<&str> = unit.split_whitespace().collect();
        let normalized = words.join(" ").to_lowercase();
        let counts = words.len() >= LOOP_MIN_WORDS || normalized.chars().count() >= LOOP_MIN_CHARS;
        if counts && !seen.insert(normalized) {
            return Some(start + (unit.len() - unit.trim_start().len()));
        }
        start = end;
    }
    None
}

/// The shortest run of tokens the loop guard counts as a phrase loop, and
/// the longest it looks for.
const LOOP_MIN_PERIOD: usize = 4;
const LOOP_MAX_PERIOD: usize = 64;

/// The loop guard's test for loops no line or sentence end marks
/// (`'The Log: 'The Log: 'The Log: …`): when `tokens` end with the same run of
/// at least 4 tokens three times over, how many tokens to keep, which is up to
/// the end of the run's first occurrence.
pub fn periodic_tail(tokens: &[u32]) -> Option<usize> {
    let n = tokens.len();
    (LOOP_MIN_PERIOD..=LOOP_MAX_PERIOD.min(n / 3)).find_map(|period| {
        let last = &tokens[n - period..];
        let repeated = last == &tokens[n - 2 * period..n - period]
            && last == &tokens[n - 3 * period..n - 2 * period];
        repeated.then_some(n - 2 * period)
    })
}

/// The distribution [`Sampler::pick`] draws from at `temperature` (above
/// 0) with `top_k` and `top_p`, as candle's `LogitsProcessor` computes it:
/// the softmax of `logits / temperature`, then all but the `top_k` most
/// likely tokens set to zero, then the tokens past the smallest set whose
/// probability reaches `top_p`, then normalized.
pub fn probabilities(
    logits: &[f32],
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![0.0; logits.len()];
    }
    let scaled = |logit: f32| ((f64::from(logit) - f64::from(max)) / temperature).exp();
    let mut probs: Vec<f32> = logits.iter().map(|&l| scaled(l) as f32).collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    let mut by_probability: Vec<usize> = (0..probs.len()).collect();
    by_probability.sort_by(|&i, &j| probs[j].total_cmp(&probs[i]));
    if let Some(k) = top_k.filter(|&k| k < probs.len()) {
        for &id in &by_probability[k..] {
            probs[id] = 0.0;
        }
    }
    if let Some(p) = top_p.filter(|&p| p < 1.0) {
        let mut cumulative = 0.0;
        for &id in &by_probability {
            if cumulative >= p as f32 {
                probs[id] = 0.0;
            } else {
                cumulative += probs[id];
            }
        }
    }
    let kept: f32 = probs.iter().sum();
    if kept > 0.0 {
        probs.iter_mut().for_each(|p| *p /= kept);
    }
    probs
}

/// A seeded token picker: the same seed and logits give the same tokens.
pub struct Sampler {
    processor: LogitsProcessor,
    /// 0 is greedy.
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    repeat_penalty: f32,
    repeat_last_n: usize,
    dry: Dry,
    dry_prompt: bool,
    no_repeat_ngram: usize,
    copy_source: CopySource,
    marks: Arc<TokenMarks>,
}

impl Sampler {
    /// `marks` tell DRY which tokens break a match; without them none does.
    /// `copy_source` holds the token runs the output may not copy.
    pub fn new(config: &SamplingConfig, marks: Arc<TokenMarks>, copy_source: CopySource) -> Self {
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
            temperature: temperature.max(0.0),
            top_k: config.top_k,
            top_p: config.top_p,
            repeat_penalty: config.repeat_penalty,
            repeat_last_n: config.repeat_last_n,
            dry: Dry::of(config),
            dry_prompt: config.dry_prompt,
            no_repeat_ngram: config.no_repeat_ngram,
            copy_source,
            marks,
        }
    }

    /// Whether [`Sampler::penalize`] can change logits.
    pub fn penalizes(&self) -> bool {
        self.repeat_penalty != 1.0
            || self.dry.multiplier > 0.0
            || self.no_repeat_ngram > 0
            || !self.copy_source.next.is_empty()
    }

    /// Apply the repetition controls to `logits`, a vector over the
    /// vocabulary after any grammar mask: the repeat penalty, DRY, then the
    /// n-gram and copy bans unless they would forbid every token still allowed.
    /// `context` is the prompt followed by the tokens generated so far; its
    /// first `prompt_tokens` are the prompt.
    pub fn penalize(&self, logits: &mut [f32], context: &[u32], prompt_tokens: usize) {
        if self.repeat_penalty != 1.0 {
            let recent = &context[context.len().saturating_sub(self.repeat_last_n)..];
            apply_repeat_penalty(logits, self.repeat_penalty, recent);
        }
        let generated = &context[prompt_tokens.min(context.len())..];
        let searched = if self.dry_prompt { context } else { generated };
        for (token, penalty) in dry_penalties(searched, &self.dry, |t| self.marks.is_breaker(t)) {
            if let Some(logit) = logits.get_mut(token as usize) {
                *logit -= penalty;
            }
        }
        apply_bans(logits, &ngram_bans(generated, self.no_repeat_ngram));
        apply_bans(logits, &self.copy_bans(generated));
    }

    /// The copy ban ([`CopySource::bans`]) but for tokens that would finish
    /// a word already begun: cut off inside a copied word, the model wrote
    /// "whitewash" as "whit wash". The ban falls on the next word instead.
    fn copy_bans(&self, generated: &[u32]) -> Vec<u32> {
        let mut banned = self.copy_source.bans(generated);
        if let Some(&last) = generated.last() {
            banned.retain(|&token| !self.marks.continues_word(last, token));
        }
        banned
    }

    /// Whether [`Sampler::pick`] takes the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// The distribution [`Sampler::pick`] draws from given `logits` as
    /// they are (see [`probabilities`]); `None` when it is greedy.
    pub fn distribution(&self, logits: &[f32]) -> Option<Vec<f32>> {
        (!self.is_greedy()).then(|| probabilities(logits, self.temperature, self.top_k, self.top_p))
    }

    /// Pick the next token from `logits` as they are.
    pub fn pick(&mut self, logits: &Tensor) -> Result<u32> {
        self.processor.sample(logits).context("sampling")
    }

    /// [`Sampler::penalize`], then [`Sampler::pick`].
    pub fn sample(
        &mut self,
        logits: &Tensor,
        context: &[u32],
        prompt_tokens: usize,
    ) -> Result<u32> {
        if !self.penalizes() {
            return self.pick(logits);
        }
        let mut values = logits.to_vec1::<f32>().context("repetition controls")?;
        self.penalize(&mut values, context, prompt_tokens);
        let len = values.len();
        let penalized =
            Tensor::from_vec(values, len, &Device::Cpu).context("repetition controls")?;
        self.pick(&penalized)
    }
}

#[cfg(test)]
mod tests;
