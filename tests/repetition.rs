//! Repetition controls on a tiny random model whose greedy output falls into
//! a cycle: the n-gram ban, DRY and the loop guard each break or end it, and
//! none of them breaks grammar-constrained output.

use crate::common::{tiny_engine_with_words, TINY_VOCAB};
use prism::engine::constraint::Grammar;
use prism::engine::sampling::{repeated_unit, SamplingConfig};
use prism::engine::{Engine, GenerateOptions, StopReason};

/// A tiny random model whose tokens are words: `w{id} `, except that every
/// id divisible by 8 ends a line (`w{id}.\n`) and every other one divisible
/// by 4 a sentence (`w{id}. `), so its output has lines and sentences for the
/// loop guard. Only the line ends are DRY sequence breakers.
fn line_model(dir: &std::path::Path, seed: u64) -> Engine {
    let words = (2..TINY_VOCAB).map(|id| match id % 8 {
        0 => format!("w{id}.\n"),
        4 => format!("w{id}. "),
        _ => format!("w{id} "),
    });
    tiny_engine_with_words(dir, seed, words, "tiny-lines")
}

/// Weights and prompt whose greedy output settles into the 3-token cycle
/// `w12. w47 w41 ` (no line break, so no DRY breaker in it).
const CYCLING_SEED: u64 = 5;
fn cycling_prompt() -> Vec<u32> {
    (10..18).collect()
}

/// Weights and prompt whose greedy output writes the line
/// `w42 w54 w34 w43 w30 w37 w24.` twice in a row.
const LINE_SEED: u64 = 4;
fn line_prompt() -> Vec<u32> {
    (30..38).collect()
}

fn generate(
    engine: &mut Engine,
    prompt: &[u32],
    sampling: SamplingConfig,
) -> prism::engine::Generation {
    let options = GenerateOptions {
        max_tokens: 200,
        sampling,
        ..GenerateOptions::default()
    };
    engine.generate(prompt, &options).unwrap()
}

/// The smallest period (up to 16) the last 60 tokens repeat with.
fn tail_period(tokens: &[u32]) -> Option<usize> {
    let tail = &tokens[tokens.len().saturating_sub(60)..];
    (1..=16).find(|&p| tail.windows(p + 1).all(|w| w[0] == w[p]))
}

/// The line ends of [`line_model`], which stop a DRY match.
fn is_breaker(token: u32) -> bool {
    token.is_multiple_of(8)
}

/// The longest repeat the output extended, counted as DRY counts it: for a
/// token of `context[from..]` that is no breaker, the longest run of tokens
/// before it, none a breaker, that also came before an earlier copy of it.
fn longest_extended_repeat(context: &[u32], from: usize) -> usize {
    let mut longest = 0;
    for i in from..context.len() {
        for j in (0..i).filter(|&j| context[j] == context[i] && !is_breaker(context[i])) {
            let run = (1..=j)
                .take_while(|&back| {
                    context[i - back] == context[j - back] && !is_breaker(context[i - back])
                })
                .count();
            longest = longest.max(run);
        }
    }
    longest
}

fn has_repeated_ngram(tokens: &[u32], n: usize) -> bool {
    let mut seen = std::collections::HashSet::new();
    tokens.windows(n).any(|gram| !seen.insert(gram))
}

#[test]
fn greedy_output_of_the_tiny_model_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = line_model(dir.path(), CYCLING_SEED);
    let free = generate(&mut engine, &cycling_prompt(), SamplingConfig::default());
    assert_eq!(free.stop_reason, StopReason::MaxTokens);
    assert_eq!(tail_period(&free.tokens), Some(3), "{:?}", free.tokens);
    assert!(
        free.text.contains("w12. w47 w41 w12. w47 w41 w12. "),
        "{}",
        free.text
    );
}

#[test]
fn no_repeat_ngram_leaves_no_ngram_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = line_model(dir.path(), CYCLING_SEED);
    let free = generate(&mut engine, &cycling_prompt(), SamplingConfig::default());
    assert!(has_repeated_ngram(&free.tokens, 3));
    for n in [1, 2, 3] {
        let sampling = SamplingConfig {
            no_repeat_ngram: n,
            ..SamplingConfig::default()
        };
        let banned = generate(&mut engine, &cycling_prompt(), sampling);
        // With 1-grams every token is new, and the model ends (with
        // </s>) before it runs out of the 62 words; longer n-grams run to
        // the budget.
        if n == 1 {
            assert!(banned.tokens.len() > 50, "{}", banned.tokens.len());
        } else {
            assert_eq!(banned.tokens.len(), 200, "{n}: {:?}", banned.stop_reason);
        }
        assert!(
            !has_repeated_ngram(&banned.tokens, n),
            "{n}: {:?}",
            banned.tokens
        );
    }
}

/// DRY with the summary defaults lets the output extend a repeat of at most
/// a few tokens (a 6-token repeat would cost 0.8 · 1.75⁴ ≈ 7.5 logits), where
/// greedy output repeats one cycle to the end.
#[test]
fn dry_breaks_the_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = line_model(dir.path(), CYCLING_SEED);
    let prompt = cycling_prompt();
    let context = |g: &prism::engine::Generation| [prompt.clone(), g.tokens.clone()].concat();
    let free = generate(&mut engine, &prompt, SamplingConfig::default());
    assert!(longest_extended_repeat(&context(&free), prompt.len()) > 150);
    let sampling = SamplingConfig {
        loop_guard: false,
        ..SamplingConfig::for_summaries()
    };
    let dry = generate(&mut engine, &prompt, sampling);
    assert_eq!(dry.stop_reason, StopReason::MaxTokens);
    assert_ne!(dry.tokens, free.tokens);
    let longest = longest_extended_repeat(&context(&dry), prompt.len());
    assert!(longest <= 5, "a repeat of {longest}: {:?}", dry.tokens);
}

/// The output is cut where its first repeated line or sentence starts, and
/// generation stops there instead of running to `max_tokens`.
#[test]
fn the_loop_guard_ends_output_that_repeats_a_sentence_or_line() {
    for (seed, prompt, repeated) in [
        (CYCLING_SEED, cycling_prompt(), "w47 w41 w12. "),
        (LINE_SEED, line_prompt(), "w42 w54 w34 w43 w30 w37 w24.\n"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = line_model(dir.path(), seed);
        let free = generate(&mut engine, &prompt, SamplingConfig::default());
        let sampling = SamplingConfig {
            loop_guard: true,
            ..SamplingConfig::default()
        };
        let guarded = generate(&mut engine, &prompt, sampling);
        assert_eq!(
            guarded.stop_reason,
            StopReason::Repetition,
            "{:?}",
            guarded.text
        );
        assert!(guarded.tokens.len() < 20, "{}", guarded.tokens.len());
        assert!(guarded.tokens.len() < free.tokens.len());
        assert!(guarded.text.ends_with(repeated), "{:?}", guarded.text);
        assert!(free.text[guarded.text.len()..].starts_with(repeated));
        assert_eq!(repeated_unit(&free.text), Some(guarded.text.len()));
        assert_eq!(repeated_unit(&guarded.text), None);
        // The same tokens as without the guard, up to where it stopped.
        assert_eq!(guarded.tokens, free.tokens[..guarded.tokens.len()]);
    }
}

/// Whether a text is what a grammar allows.
type Check = fn(&str) -> bool;

/// Under a grammar the controls never leave every allowed token forbidden:
/// `(ab){6}` allows one token per step, which a 1- or 2-gram ban forbids
/// after the first few, so the ban is skipped and the output stays valid.
#[test]
fn grammar_output_stays_valid_under_every_control() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = crate::constrained::char_model(dir.path());
    let prompt = engine.text_prompt("x").unwrap();
    let controls = [
        SamplingConfig {
            no_repeat_ngram: 1,
            ..SamplingConfig::default()
        },
        SamplingConfig {
            no_repeat_ngram: 2,
            ..SamplingConfig::default()
        },
        SamplingConfig {
            dry_multiplier: 5.0,
            dry_base: 3.0,
            dry_allowed_length: 1,
            ..SamplingConfig::default()
        },
        SamplingConfig {
            no_repeat_ngram: 1,
            ..SamplingConfig::for_summaries()
        },
    ];
    let valid: [(&str, Check); 3] = [
        ("(ab){6}", |text| text == "abababababab"),
        ("[abc]{12}", |text| {
            text.len() == 12 && text.chars().all(|c| "abc".contains(c))
        }),
        ("[0-9]{3}-[a-c]{2}", |text| {
            text.len() == 6
                && text[..3].chars().all(|c| c.is_ascii_digit())
                && &text[3..4] == "-"
                && text[4..].chars().all(|c| "abc".contains(c))
        }),
    ];
    for sampling in controls {
        for (regex, is_valid) in valid {
            let options = GenerateOptions {
                max_tokens: 30,
                sampling: sampling.clone(),
                grammar: Some(Grammar::Regex(regex.into())),
                ..GenerateOptions::default()
            };
            let generation = engine.generate(&prompt, &options).unwrap();
            assert_eq!(
                generation.stop_reason,
                StopReason::EndOfTurn,
                "{sampling:?}"
            );
            assert!(
                is_valid(&generation.text),
                "{regex} under {sampling:?}: {:?}",
                generation.text
            );
        }
    }
    // Where the grammar leaves a choice, the 1-gram ban still applies.
    let options = GenerateOptions {
        max_tokens: 30,
        sampling: SamplingConfig {
            no_repeat_ngram: 1,
            ..SamplingConfig::default()
        },
        grammar: Some(Grammar::Regex("[abc]{3}".into())),
        ..GenerateOptions::default()
    };
    let mut letters: Vec<char> = engine
        .generate(&prompt, &options)
        .unwrap()
        .text
        .chars()
        .collect();
    letters.sort_unstable();
    assert_eq!(letters, ['a', 'b', 'c']);
}

/// Told to copy (its greedy output is a cycle; the source is that cycle), the
/// model writes no run of the source as long as the no-copy ban, and shorter
/// runs stay free.
#[test]
fn the_no_copy_ban_keeps_the_output_from_copying_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = line_model(dir.path(), CYCLING_SEED);
    let prompt = cycling_prompt();
    let free = generate(&mut engine, &prompt, SamplingConfig::default());
    let source: Vec<u32> = free.tokens[..30].to_vec();
    let copies = |tokens: &[u32], n: usize| {
        let runs: std::collections::HashSet<&[u32]> = source.windows(n).collect();
        tokens.windows(n).any(|run| runs.contains(run))
    };
    assert!(copies(&free.tokens, 4));
    let options = GenerateOptions {
        max_tokens: 200,
        sampling: SamplingConfig {
            no_copy_ngram: 4,
            ..SamplingConfig::default()
        },
        copy_source: source.clone(),
        ..GenerateOptions::default()
    };
    let banned = engine.generate(&prompt, &options).unwrap();
    assert!(!copies(&banned.tokens, 4), "{:?}", banned.tokens);
    assert!(
        copies(&banned.tokens, 3),
        "runs of 3 stay free: {:?}",
        banned.tokens
    );
    assert!(banned.tokens.len() > 50, "{}", banned.tokens.len());
    // Without a source the setting bans nothing.
    let options = GenerateOptions {
        copy_source: Vec::new(),
        ..options
    };
    assert_eq!(
        engine.generate(&prompt, &options).unwrap().tokens,
        free.tokens
    );
}

/// A line the check skips is taken back and decoding goes on in its place:
/// the model, which would write the same line twice, writes something else
/// after its first, and the skipped tokens still count as output.
#[test]
fn a_skipped_line_is_replaced_and_decoding_goes_on() {
    use prism::engine::LineVerdict;
    let dir = tempfile::tempdir().unwrap();
    let mut engine = line_model(dir.path(), LINE_SEED);
    let prompt = line_prompt();
    let repeated = "w42 w54 w34 w43 w30 w37 w24.";
    let skipped = std::cell::Cell::new(0);
    let skip_repeats = |kept: &str, line: &str| {
        if kept.lines().any(|earlier| earlier == line) {
            skipped.set(skipped.get() + 1);
            LineVerdict::Skip { from: 0 }
        } else {
            LineVerdict::Keep
        }
    };
    let options = GenerateOptions {
        max_tokens: 60,
        ..GenerateOptions::default()
    };
    let free = engine.generate(&prompt, &options).unwrap();
    let twice = format!("{repeated}\n{repeated}\n");
    let first_repeat =
        free.text.find(&twice).expect("the line twice in a row") + repeated.len() + 1;
    let checked = engine
        .generate_checking_lines(&prompt, &options, Some(&skip_repeats))
        .unwrap();
    assert!(skipped.get() >= 1);
    assert!(
        checked.text.starts_with(&free.text[..first_repeat]),
        "{}",
        checked.text
    );
    assert!(!checked.text.contains(&twice), "{}", checked.text);
    let lines: Vec<&str> = checked.text.lines().collect();
    let mut seen = std::collections::HashSet::new();
    let whole_lines = checked.text.matches('\n').count();
    assert!(
        lines[..whole_lines].iter().all(|line| seen.insert(*line)),
        "{}",
        checked.text
    );
    assert_eq!(checked.usage.output_tokens, 60);
    assert!(checked.tokens.len() < 60);
    // Stopping at the line instead ends the output before it.
    let stop_at_repeats = |kept: &str, line: &str| {
        if kept.lines().any(|earlier| earlier == line) {
            LineVerdict::Stop
        } else {
            LineVerdict::Keep
        }
    };
    let stopped = engine
        .generate_checking_lines(&prompt, &options, Some(&stop_at_repeats))
        .unwrap();
    assert_eq!(stopped.text, free.text[..first_repeat]);
    assert_eq!(stopped.stop_reason, StopReason::LineRefused);
}
