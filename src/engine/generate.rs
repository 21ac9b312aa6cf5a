//! The decoding loop: pick a token (under the grammar, if any), append it, and stop
//! early at a stop string, a line the caller refuses, or a repeat the loop guard sees.

use super::chooser::TokenChooser;
use super::model::Pass;
use super::sampling::{self, CopySource, Sampler, TokenMarks};
use super::speculative::{DraftPlan, DraftSource, Round};
use super::{Engine, GenerateOptions, Generation, LineCheck, LineVerdict, StopReason, Usage};
use crate::error::{CandleContext, Error, Result};
use candle_core::Tensor;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

impl Engine {
    /// Run `prompt` and generate up to `options.max_tokens` tokens after it.
    pub fn generate(&mut self, prompt: &[u32], options: &GenerateOptions) -> Result<Generation> {
        self.generate_checking_lines(prompt, options, None)
    }

    /// [`generate`](Self::generate), stopping before the first whole line of
    /// output that `refuse_line` refuses. Under a grammar of whole lines the
    /// output stays valid when cut there; a model going round in circles
    /// stops at its first repeat instead of spending the token budget on it.
    pub fn generate_checking_lines(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        refuse_line: Option<&LineCheck>,
    ) -> Result<Generation> {
        self.decode(prompt, options, refuse_line, &mut |_, _| true)
    }

    /// [`generate`](Self::generate), showing `on_tokens` the tokens kept so
    /// far and the usage so far after each step (a server streams them);
    /// generation stops with [`StopReason::Cancelled`] as soon as it returns
    /// false.
    pub fn generate_streaming(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_tokens: &mut dyn FnMut(&[u32], &Usage) -> bool,
    ) -> Result<Generation> {
        self.decode(prompt, options, None, on_tokens)
    }

    fn decode(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        refuse_line: Option<&LineCheck>,
        on_tokens: &mut dyn FnMut(&[u32], &Usage) -> bool,
    ) -> Result<Generation> {
        // The draft model is lent to the loop, which works on its caches and
        // this engine's together; it comes back whatever the loop returns.
        let mut draft = self.draft.take();
        let generation = self.decode_with(
            prompt,
            options,
            refuse_line,
            on_tokens,
            draft.as_deref_mut(),
        );
        self.draft = draft;
        generation
    }

    fn decode_with(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        refuse_line: Option<&LineCheck>,
        on_tokens: &mut dyn FnMut(&[u32], &Usage) -> bool,
        draft: Option<&mut Engine>,
    ) -> Result<Generation> {
        // One function on purpose: every branch of the loop below moves the
        // same state together (logits, the cache, the drafts, the chooser's
        // history, the tokens kept), and the order of those moves is what
        // keeps the cache equal to a token-at-a-time decode. Helpers would
        // pass all of it around and hide that order.
        options.sampling.validate()?;
        let constraint = match &options.grammar {
            Some(grammar) => Some(self.grammars()?.constraint(grammar)?),
            None => None,
        };
        // Cutting grammar-constrained output would leave it invalid, so the
        // loop guard watches free text only.
        let loop_guard = options.sampling.loop_guard && constraint.is_none();
        let marks = if options.sampling.needs_token_marks() || refuse_line.is_some() {
            self.token_marks()
        } else {
            Arc::default()
        };
        let mut watch = TextWatch {
            stops: &options.stop,
            refuse_line,
            loop_guard,
            marks: Arc::clone(&marks),
            line_start: 0,
        };
        let (mut logits, mut usage) = self.prefill(prompt)?;
        // The draft model reads the prompt from its own longest cached
        // prefix; one whose context cannot hold it drafts nothing this call.
        let mut draft =
            match draft.map(|draft| draft.prefill(prompt).map(|(_, used)| (draft, used))) {
                Some(Ok((draft, used))) => {
                    // Reading the prompt is prefill work, whichever model does it.
                    usage.prefill_seconds += used.prefill_seconds;
                    Some(draft)
                }
                Some(Err(Error::PromptTooLong { .. })) | None => None,
                Some(Err(err)) => return Err(err),
            };
        let draft_decoding = draft.as_ref().map(|draft| draft.model.decoding());
        let decode_start = Instant::now();
        let stop_ids = self.format.tokenizer().stop_token_ids().to_vec();
        let copy_source = CopySource::new(&options.copy_source, options.sampling.no_copy_ngram);
        let mut chooser = TokenChooser {
            sampler: Sampler::new(&options.sampling, marks, copy_source),
            constraint,
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
        };
        let draft_limit = if self.model.checks_drafts() {
            self.draft_tokens
        } else {
            0
        };
        let vocab = self.model.config().vocab_size;
        // Drafted tokens already in the cache, each with the logits after
        // it, valid while the sampled tokens follow the draft.
        let mut drafts: VecDeque<Drafted> = VecDeque::new();
        // The round the drafts in the cache belong to, and what the rounds
        // so far say about the next one.
        let mut round: Option<Round> = None;
        let mut plan = DraftPlan::default();
        // Rejection sampling's own draws, seeded apart from the sampler's.
        let mut coin = StdRng::seed_from_u64(options.sampling.seed ^ CHECK_SEED);
        let mut tokens = Vec::new();
        // Lines the line check skipped, whose tokens are banned where a
        // new line retraces them.
        let mut skipped: Vec<SkippedLine> = Vec::new();
        let decoding = self.model.decoding();
        // Set when a stop string, the loop guard or the line check cuts the text.
        let mut cut_text = None;
        let stop_reason = loop {
            // Counted over every token sampled, skipped lines' too, so a
            // model that keeps writing refused lines still runs out.
            if usage.output_tokens >= options.max_tokens {
                break StopReason::MaxTokens;
            }
            let banned = skipped_line_bans(&skipped, &tokens);
            let token = match drafts.front() {
                // A draft model's token drawn from its distribution: kept
                // or replaced by rejection sampling.
                Some(Drafted {
                    token: drafted,
                    drawn_from: Some(q),
                    ..
                }) => chooser.check(&logits, &mut usage, &banned, *drafted, q, &mut coin)?,
                // Otherwise a draft is kept where the sampler picks it.
                _ => chooser.next(&logits, &mut usage, &banned)?,
            };
            usage.output_tokens += 1;
            if stop_ids.contains(&token) {
                break StopReason::EndOfTurn;
            }
            chooser.accept(token)?;
            tokens.push(token);
            let decode = |tokens: &[u32]| self.format.tokenizer().decode(tokens, true);
            match watch.check(&tokens, decode)? {
                None => {}
                Some(Watched::Stop { keep, reason }) => {
                    cut_text = Some(keep);
                    break reason;
                }
                Some(Watched::SkipLine { start, from }) => {
                    let kept = tokens_before(&tokens, start, decode)?;
                    let ban_at = tokens_before(&tokens, start + from, decode)?;
                    skipped.push(SkippedLine {
                        start: kept,
                        tokens: tokens[kept..].to_vec(),
                        ban_from: ban_at.saturating_sub(kept),
                    });
                    // Back to the last kept token: its logits are recomputed
                    // from the cache as it stood when it was sampled.
                    let cache = &mut self.slots.active_mut().cache;
                    cache.truncate(cache.len() - drafts.len());
                    drafts.clear();
                    chooser.rollback(tokens.len() - kept)?;
                    tokens.truncate(kept);
                    let last = chooser.history.len() - 1;
                    cache.truncate(last);
                    logits = self
                        .model
                        .forward(&chooser.history[last..], cache, Pass::Decode)?;
                    usage.decode_steps += 1;
                    continue;
                }
            }
            usage.decode_seconds = decode_start.elapsed().as_secs_f64();
            if !on_tokens(&tokens, &usage) {
                break StopReason::Cancelled;
            }
            if usage.output_tokens >= options.max_tokens {
                break StopReason::MaxTokens;
            }
            let cache = &mut self.slots.active_mut().cache;
            match drafts.pop_front() {
                Some(drafted) if drafted.token == token => {
                    logits = drafted.after;
                    usage.decode_steps += 1;
                    usage.accepted_drafts += 1;
                    let source = round.as_mut().map(|round| {
                        round.accepted += 1;
                        round.source
                    });
                    match source {
                        Some(DraftSource::Model) => usage.accepted_model_drafts += 1,
                        _ => usage.accepted_lookup_drafts += 1,
                    }
                    continue;
                }
                // The sampler went another way: the draft's positions go.
                Some(_) => {
                    cache.truncate(cache.len() - 1 - drafts.len());
                    drafts.clear();
                }
                None => {}
            }
            let context = self.model.config().context_tokens;
            if cache.len() + 1 >= context {
                break StopReason::ContextFull;
            }
            // Every drafted position must fit the context as a step would.
            let room = context - cache.len() - 2;
            if let Some(done) = round.take() {
                plan.record(done);
            }
            let lookup = lookup_draft(&chooser.history, draft_limit.min(room)).to_vec();
            let source = plan.choose(!lookup.is_empty(), draft.is_some());
            let proposal = match source {
                Some(DraftSource::Lookup) => lookup.into_iter().map(|t| (t, None)).collect(),
                Some(DraftSource::Model) => match draft.as_deref_mut() {
                    Some(draft) => {
                        // More drafts than tokens left to sample are wasted.
                        let left = options.max_tokens - usage.output_tokens;
                        let count = plan.model_length.min(room).min(left);
                        let bans = |drafted: &[u32]| {
                            if skipped.is_empty() {
                                Vec::new()
                            } else {
                                skipped_line_bans(&skipped, &[&tokens[..], drafted].concat())
                            }
                        };
                        let wanted = Proposal {
                            count,
                            vocab,
                            stop_ids: &stop_ids,
                        };
                        propose(draft, &mut chooser, &wanted, &bans, &mut coin, &mut usage)?
                    }
                    None => Vec::new(),
                },
                None => Vec::new(),
            };
            round = source.map(|source| Round {
                source,
                drafted: proposal.len(),
                accepted: 0,
            });
            if proposal.is_empty() {
                logits = self.model.forward(&[token], cache, Pass::Decode)?;
            } else {
                let run: Vec<u32> = std::iter::once(token)
                    .chain(proposal.iter().map(|&(drafted, _)| drafted))
                    .collect();
                let rows = self.model.forward_rows(&run, cache)?;
                logits = rows.get(0).context("drafted tokens")?;
                for (i, (drafted, drawn_from)) in proposal.into_iter().enumerate() {
                    drafts.push_back(Drafted {
                        token: drafted,
                        after: rows.get(i + 1).context("drafted tokens")?,
                        drawn_from,
                    });
                }
            }
            usage.decode_steps += 1;
        };
        // The cache keeps what decoding a token a pass would have fed it.
        let cache = &mut self.slots.active_mut().cache;
        cache.truncate(cache.len() - drafts.len());
        drop(decoding);
        drop(draft_decoding);
        usage.decode_seconds = decode_start.elapsed().as_secs_f64();
        self.store_to_disk(options.shared_prefix_tokens);
        let text = match cut_text {
            Some(text) => text,
            None => self.format.tokenizer().decode(&tokens, true)?,
        };
        Ok(Generation {
            text,
            tokens,
            stop_reason,
            usage,
        })
    }

    /// What the repetition controls need to know about each token's text:
    /// every id of the logits decoded once (ids the tokenizer lacks read as
    /// empty), with end-of-turn tokens as DRY breakers.
    fn token_marks(&self) -> Arc<TokenMarks> {
        let marks = self.token_marks.get_or_init(|| {
            let vocab = self.model.config().vocab_size as u32;
            let texts = (0..vocab).map(|id| {
                self.format
                    .tokenizer()
                    .decode(&[id], false)
                    .unwrap_or_default()
            });
            Arc::new(TokenMarks::new(
                texts,
                self.format.tokenizer().stop_token_ids(),
            ))
        });
        Arc::clone(marks)
    }
}

/// Mixed into the sampling seed for rejection sampling's draws, so that they
/// are not the sampler's own.
const CHECK_SEED: u64 = 0x5eed_d4af_7c0d_e5a1;

/// A drafted token whose position is in the cache.
struct Drafted {
    token: u32,
    /// The logits after it.
    after: Tensor,
    /// Under sampling, the draft model's distribution it was drawn from;
    /// `None` for a token drafted from earlier text or under greedy
    /// decoding, which is kept where the sampler picks it.
    drawn_from: Option<Vec<f32>>,
}

/// What a draft model is asked for in a round.
struct Proposal<'a> {
    /// The most tokens to draft.
    count: usize,
    /// The target's vocabulary: the width of the distributions compared.
    vocab: usize,
    /// Drafting ends after one of these.
    stop_ids: &'a [u32],
}

/// Up to `wanted.count` tokens the draft model proposes after
/// `chooser.history`, a pass of it each, chosen as `chooser` would choose
/// them (under its grammar, after its repetition controls, never one of
/// `bans(drafted so far)`): the most likely under greedy decoding, else
/// drawn, with the distribution drawn from. First the draft's cache is cut
/// to the prefix it shares with the history and given the rest in one pass
/// (after a round, the last drafted or the target's own token).
fn propose(
    draft: &mut Engine,
    chooser: &mut TokenChooser,
    wanted: &Proposal,
    bans: &dyn Fn(&[u32]) -> Vec<u32>,
    coin: &mut StdRng,
    usage: &mut Usage,
) -> Result<Vec<(u32, Option<Vec<f32>>)>> {
    let history_len = chooser.history.len();
    // The last drafted token is never run by the draft: room for the others.
    let count = wanted
        .count
        .min(draft.context_tokens().saturating_sub(history_len + 1));
    if count == 0 {
        return Ok(Vec::new());
    }
    let cache = &mut draft.slots.active_mut().cache;
    let kept = cache.common_prefix(&chooser.history).min(history_len - 1);
    cache.truncate(kept);
    let mut logits = draft
        .model
        .forward(&chooser.history[kept..], cache, Pass::Decode)?;
    let mut proposed: Vec<(u32, Option<Vec<f32>>)> = Vec::with_capacity(count);
    // The chooser takes each drafted token in, for the grammar and the
    // repetition controls of the next, and forgets them all at the end.
    let mut taken = 0;
    let mut step = || -> Result<()> {
        for i in 0..count {
            let mut values = logits.to_vec1::<f32>().context("draft logits")?;
            // Compared over the target's ids: a wider draft output has no
            // say past them, a narrower one gives the rest no chance.
            values.resize(wanted.vocab, f32::NEG_INFINITY);
            let drafted: Vec<u32> = proposed.iter().map(|&(token, _)| token).collect();
            let Some((token, drawn_from)) = chooser.draw(values, usage, &bans(&drafted), coin)?
            else {
                break;
            };
            proposed.push((token, drawn_from));
            if wanted.stop_ids.contains(&token) {
                break;
            }
            chooser.accept(token)?;
            taken += 1;
            if i + 1 < count {
                logits = draft.model.forward(&[token], cache, Pass::Decode)?;
            }
        }
        Ok(())
    };
    let drafted = step();
    chooser.rollback(taken)?;
    drafted.map(|()| proposed)
}

/// A line the line check skipped: where it started among the generated
/// tokens, its tokens, and from which of them on a new line that retraces
/// it is turned away.
struct SkippedLine {
    start: usize,
    tokens: Vec<u32>,
    ban_from: usize,
}

/// The tokens banned after `tokens`: for each skipped line that began at
/// the same place and that the tokens since retrace exactly, the token it
/// went on with, once the retrace has reached the line's banned part.
fn skipped_line_bans(skipped: &[SkippedLine], tokens: &[u32]) -> Vec<u32> {
    let mut banned: Vec<u32> = skipped
        .iter()
        .filter_map(|line| {
            let written = tokens.get(line.start..)?;
            let next = *line.tokens.get(written.len())?;
            (written.len() >= line.ban_from && line.tokens.starts_with(written)).then_some(next)
        })
        .collect();
    banned.sort_unstable();
    banned.dedup();
    banned
}

/// How many of `tokens` decode to text that ends at or before byte `offset`
/// of their whole decoded text: the tokens to keep to cut the text there (a
/// token that spans the offset goes too).
fn tokens_before(
    tokens: &[u32],
    offset: usize,
    decode: impl Fn(&[u32]) -> Result<String>,
) -> Result<usize> {
    for kept in (0..=tokens.len()).rev() {
        if decode(&tokens[..kept])?.len() <= offset {
            return Ok(kept);
        }
    }
    Ok(0)
}

/// What the text watch saw.
enum Watched {
    /// Stop, keeping this text.
    Stop { keep: String, reason: StopReason },
    /// The line at byte `start` was refused; decode on in its place (see
    /// [`LineVerdict::Skip`]).
    SkipLine { start: usize, from: usize },
}

/// Watches the text generated so far for a reason to stop before the end.
struct TextWatch<'a> {
    stops: &'a [String],
    refuse_line: Option<&'a LineCheck<'a>>,
    loop_guard: bool,
    marks: Arc<TokenMarks>,
    /// Where the line after the last checked one starts, in the decoded text.
    line_start: usize,
}

impl TextWatch<'_> {
    /// What to do after `tokens`: nothing, stop (with the text to keep and
    /// why), or skip a refused line.
    ///
    /// The text is decoded here only for stop strings, and for the loop guard
    /// and line check when a line or sentence may have ended: at a token
    /// holding `\n . ! ?` or the one after it (a full stop counts once
    /// whitespace follows). Otherwise the caller decodes it once at the end.
    fn check(
        &mut self,
        tokens: &[u32],
        decode: impl FnOnce(&[u32]) -> Result<String>,
    ) -> Result<Option<Watched>> {
        if self.loop_guard {
            if let Some(keep) = sampling::periodic_tail(tokens) {
                return Ok(Some(Watched::Stop {
                    keep: decode(&tokens[..keep])?,
                    reason: StopReason::Repetition,
                }));
            }
        }
        let unit_may_end = (self.loop_guard || self.refuse_line.is_some())
            && tokens
                .iter()
                .rev()
                .take(2)
                .any(|&t| self.marks.may_end_unit(t));
        if self.stops.is_empty() && !unit_may_end {
            return Ok(None);
        }
        let so_far = decode(tokens)?;
        let keep = |cut: usize, reason| {
            Ok(Some(Watched::Stop {
                keep: so_far[..cut].to_string(),
                reason,
            }))
        };
        if let Some(cut) = first_stop(&so_far, self.stops) {
            return keep(cut, StopReason::StopString);
        }
        if let Some(refuse_line) = self.refuse_line {
            match first_refused_line(&so_far, &mut self.line_start, refuse_line) {
                None | Some((_, LineVerdict::Keep)) => {}
                Some((cut, LineVerdict::Stop)) => return keep(cut, StopReason::LineRefused),
                Some((start, LineVerdict::Skip { from })) => {
                    return Ok(Some(Watched::SkipLine { start, from }))
                }
            }
        }
        if unit_may_end && self.loop_guard {
            if let Some(cut) = sampling::repeated_unit(&so_far) {
                return keep(cut, StopReason::Repetition);
            }
        }
        Ok(None)
    }
}

/// Tokens a draft is keyed on: the last ones of the history, found earlier in it.
const DRAFT_KEY: usize = 3;

/// Up to `count` tokens that followed the latest earlier occurrence of the
/// last [`DRAFT_KEY`] tokens of `history`: a guess that the text goes on as
/// it did there.
fn lookup_draft(history: &[u32], count: usize) -> &[u32] {
    if count == 0 || history.len() <= DRAFT_KEY {
        return &[];
    }
    let key = &history[history.len() - DRAFT_KEY..];
    history[..history.len() - 1]
        .windows(DRAFT_KEY)
        .rposition(|window| window == key)
        .map_or(&[], |at| {
            let next = at + DRAFT_KEY;
            &history[next..history.len().min(next + count)]
        })
}

/// Byte offset of the earliest stop string in `text`.
fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|stop| !stop.is_empty())
        .filter_map(|stop| text.find(stop.as_str()))
        .min()
}

/// Check each whole line of `text` from `*line_start` on: the byte offset
/// where the first line not kept starts, with the verdict on it, or `None`
/// with `*line_start` moved past every line that was kept.
pub(crate) fn first_refused_line(
    text: &str,
    line_start: &mut usize,
    check: &LineCheck,
) -> Option<(usize, LineVerdict)> {
    while let Some(length) = text.get(*line_start..).and_then(|rest| rest.find('\n')) {
        let line = &text[*line_start..*line_start + length];
        match check(&text[..*line_start], line) {
            LineVerdict::Keep => *line_start += length + 1,
            verdict => return Some((*line_start, verdict)),
        }
    }
    None
}

/// `text` with the line check applied after the fact, for models that
/// cannot check while they generate: skipped lines are taken out, and the
/// text ends before a line the check stops at.
pub(crate) fn check_lines_after(text: &str, check: &LineCheck) -> String {
    let mut text = text.to_string();
    let mut line_start = 0;
    while let Some((start, verdict)) = first_refused_line(&text, &mut line_start, check) {
        match verdict {
            LineVerdict::Skip { .. } => {
                let end = text[start..]
                    .find('\n')
                    .map_or(text.len(), |at| start + at + 1);
                text.replace_range(start..end, "");
            }
            _ => {
                text.truncate(start);
                break;
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{check_lines_after, first_refused_line, first_stop, lookup_draft, LineVerdict};

    #[test]
    fn a_draft_is_what_followed_the_latest_earlier_key() {
        // The key 1 2 3 occurs at 0 and 5; the later one is followed by 8 9.
        let history = [1, 2, 3, 4, 5, 1, 2, 3, 8, 9, 7, 1, 2, 3];
        assert_eq!(lookup_draft(&history, 2), &[8, 9]);
        assert_eq!(lookup_draft(&history, 4), &[8, 9, 7, 1]);
        assert_eq!(lookup_draft(&history, 0), &[] as &[u32]);
        // The key's own place at the end is not an earlier occurrence.
        assert_eq!(lookup_draft(&[5, 1, 2, 3], 3), &[] as &[u32]);
        assert_eq!(lookup_draft(&[1, 2, 3], 3), &[] as &[u32]);
        // A key just before the end drafts what is left.
        assert_eq!(lookup_draft(&[1, 2, 3, 1, 2, 3], 3), &[1, 2, 3]);
    }

    #[test]
    fn earliest_stop_string_wins() {
        let stops = vec!["\n\n".to_string(), "END".to_string(), String::new()];
        assert_eq!(first_stop("abc END x\n\n", &stops), Some(4));
        assert_eq!(first_stop("abc", &stops), None);
    }

    #[test]
    fn checking_after_the_fact_drops_skipped_lines_and_cuts_at_a_stop() {
        let check = |_kept: &str, line: &str| match line {
            "skip" => LineVerdict::Skip { from: 0 },
            "stop" => LineVerdict::Stop,
            _ => LineVerdict::Keep,
        };
        assert_eq!(check_lines_after("a\nskip\nb\nskip\nc", &check), "a\nb\nc");
        assert_eq!(check_lines_after("a\nstop\nb\n", &check), "a\n");
        assert_eq!(check_lines_after("skip\nskip\n", &check), "");
    }

    #[test]
    fn a_skipped_line_bans_its_next_token_only_where_it_is_retraced() {
        use super::{skipped_line_bans, SkippedLine};
        let skipped = [SkippedLine {
            start: 2,
            tokens: vec![7, 8, 9],
            ban_from: 1,
        }];
        // Before its banned part: nothing banned.
        assert!(skipped_line_bans(&skipped, &[1, 1]).is_empty());
        assert!(skipped_line_bans(&skipped, &[1, 1, 7]).contains(&8));
        assert_eq!(skipped_line_bans(&skipped, &[1, 1, 7, 8]), [9]);
        // Once the new line goes another way, or past its end, nothing.
        assert!(skipped_line_bans(&skipped, &[1, 1, 6]).is_empty());
        assert!(skipped_line_bans(&skipped, &[1, 1, 7, 8, 9]).is_empty());
    }

    #[test]
    fn the_line_check_sees_each_whole_line_once_with_what_was_kept() {
        let seen = std::cell::RefCell::new(Vec::new());
        let refuse_b = |kept: &str, line: &str| {
            seen.borrow_mut().push((kept.to_string(), line.to_string()));
            if line == "b" {
                LineVerdict::Stop
            } else {
                LineVerdict::Keep
            }
        };
        let mut start = 0;
        assert_eq!(
            first_refused_line("a\npartial", &mut start, &refuse_b),
            None
        );
        assert_eq!(start, 2);
        assert_eq!(
            first_refused_line("a\npartial c\nb\nd\n", &mut start, &refuse_b),
            Some((12, LineVerdict::Stop))
        );
        assert_eq!(
            seen.into_inner(),
            [("", "a"), ("a\n", "partial c"), ("a\npartial c\n", "b")]
                .map(|(kept, line)| (kept.to_string(), line.to_string()))
        );
    }
}
