//! Tests of the samplers: greedy, top-k/p, repeat penalties, DRY, no-repeat n-grams and the loop guard.

use super::*;

fn logits() -> Tensor {
    Tensor::new(&[0.1f32, 2.0, 1.9, -1.0, 0.5], &Device::Cpu).unwrap()
}

fn sampler(config: &SamplingConfig) -> Sampler {
    Sampler::new(config, Arc::default(), CopySource::default())
}

const DRY: Dry = Dry {
    multiplier: 0.8,
    base: 1.75,
    allowed_length: 2,
    last_n: 0,
};

fn no_breakers(_: u32) -> bool {
    false
}

fn assert_close(actual: &[(u32, f32)], expected: &[(u32, f32)]) {
    let close = actual.len() == expected.len()
        && actual
            .iter()
            .zip(expected)
            .all(|(a, e)| a.0 == e.0 && (a.1 - e.1).abs() <= 1e-4 * e.1.abs().max(1.0));
    assert!(close, "{actual:?} != {expected:?}");
}

#[test]
fn greedy_picks_the_largest_logit() {
    let mut sampler = sampler(&SamplingConfig::default());
    assert_eq!(sampler.sample(&logits(), &[], 0).unwrap(), 1);
}

#[test]
fn repeat_penalty_moves_greedy_off_a_seen_token() {
    let config = SamplingConfig {
        repeat_penalty: 1.5,
        ..SamplingConfig::default()
    };
    let mut sampler = sampler(&config);
    assert_eq!(sampler.sample(&logits(), &[1], 0).unwrap(), 2);
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
        let mut sampler = sampler(&config);
        (0..32)
            .map(|_| sampler.sample(&logits(), &[], 0).unwrap())
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
    let low_base = SamplingConfig {
        dry_multiplier: 0.8,
        dry_base: 1.0,
        ..SamplingConfig::default()
    };
    let err = low_base.validate().unwrap_err().to_string();
    assert!(err.contains("dry_base") && err.contains("> 1"), "{err}");
    let negative = SamplingConfig {
        dry_multiplier: -0.5,
        ..SamplingConfig::default()
    };
    assert!(negative.validate().is_err());
    let endless = SamplingConfig {
        dry_multiplier: 0.8,
        dry_allowed_length: DRY_MAX_MATCH,
        ..SamplingConfig::default()
    };
    assert!(endless.validate().is_err());
    // With DRY off its base does not matter.
    let off = SamplingConfig {
        dry_base: 0.5,
        ..SamplingConfig::default()
    };
    off.validate().unwrap();
    SamplingConfig::for_summaries().validate().unwrap();
}

#[test]
fn default_is_greedy_with_every_control_off() {
    let config = SamplingConfig::default();
    assert_eq!(config.temperature, 0.0);
    assert_eq!(config.dry_multiplier, 0.0);
    assert_eq!(config.no_repeat_ngram, 0);
    assert!(!config.loop_guard);
    assert!(!sampler(&config).penalizes());
    let summaries = SamplingConfig::for_summaries();
    assert_eq!(summaries.temperature, 0.0);
    assert_eq!(
        (
            summaries.dry_multiplier,
            summaries.dry_base,
            summaries.dry_allowed_length
        ),
        (0.8, 1.75, 2)
    );
    assert_eq!(summaries.dry_penalty_last_n, 0);
    assert!(summaries.loop_guard);
}

/// A config written before the repetition controls existed reads with
/// them off, and one with them off writes the same JSON as before.
#[test]
fn older_configs_read_with_the_controls_off() {
    let old = r#"{"temperature":0.0,"top_k":null,"top_p":null,"repeat_penalty":1.0,"repeat_last_n":64,"seed":299792458}"#;
    let config: SamplingConfig = serde_json::from_str(old).unwrap();
    assert_eq!(config, SamplingConfig::default());
    assert_eq!(serde_json::to_string(&config).unwrap(), old);
    let summaries = SamplingConfig::for_summaries();
    let json = serde_json::to_string(&summaries).unwrap();
    assert!(json.contains("\"dry_multiplier\":0.8") && json.contains("\"loop_guard\":true"));
    assert_eq!(
        serde_json::from_str::<SamplingConfig>(&json).unwrap(),
        summaries
    );
}

/// Context 1 2 3 9 1 2: the tail "1 2" occurred before, followed by 3, so
/// 3 extends a repeat of length 2: 0.8 · 1.75^(2−2) = 0.8. The tail "2"
/// alone also occurred (followed by 3), which changes nothing.
#[test]
fn dry_penalizes_the_token_that_extends_a_repeat() {
    let penalties = dry_penalties(&[1, 2, 3, 9, 1, 2], &DRY, no_breakers);
    assert_close(&penalties, &[(3, 0.8)]);
}

/// 1 2 3 4 9 1 2 3 4 9 1 2 3: read backwards from the second 3, the
/// text matches the tail for 8 tokens (back to the start), and that 3 was
/// followed by 4: 0.8 · 1.75^(8−2). The match ending at the first 3 (3
/// long) also points at 4; the longest counts.
#[test]
fn dry_penalty_grows_with_the_repeat_length() {
    let context = [1, 2, 3, 4, 9, 1, 2, 3, 4, 9, 1, 2, 3];
    let penalties = dry_penalties(&context, &DRY, no_breakers);
    assert_close(&penalties, &[(4, 0.8 * 1.75f32.powi(6))]);
}

#[test]
fn dry_ignores_repeats_shorter_than_the_allowed_length() {
    // The tail "2" repeats once (followed by 3), "1 2" does not.
    assert!(dry_penalties(&[2, 3, 9, 1, 2], &DRY, no_breakers).is_empty());
    let lenient = Dry {
        allowed_length: 1,
        ..DRY
    };
    assert_close(
        &dry_penalties(&[2, 3, 9, 1, 2], &lenient, no_breakers),
        &[(3, 0.8)],
    );
}

/// 1 7 2 3 9 1 7 2: without breakers the tail "1 7 2" repeats and 3
/// gets 0.8 · 1.75; with 7 a breaker the match stops at it, leaving "2"
/// alone, too short. A breaker as the next token, or at the end of the
/// context, means no penalty.
#[test]
fn breakers_stop_a_match() {
    let seven = |t: u32| t == 7;
    assert!(dry_penalties(&[1, 7, 2, 3, 9, 1, 7, 2], &DRY, seven).is_empty());
    assert_close(
        &dry_penalties(&[1, 7, 2, 3, 9, 1, 7, 2], &DRY, no_breakers),
        &[(3, 0.8 * 1.75)],
    );
    assert!(dry_penalties(&[1, 2, 7, 9, 1, 2], &DRY, seven).is_empty());
    assert!(dry_penalties(&[1, 2, 3, 9, 1, 2, 7], &DRY, seven).is_empty());
}

#[test]
fn dry_searches_only_the_last_n_tokens() {
    let near = Dry { last_n: 4, ..DRY };
    // The last 4 tokens, 3 9 1 2, hold no earlier "1 2".
    assert!(dry_penalties(&[1, 2, 3, 9, 1, 2], &near, no_breakers).is_empty());
    let far = Dry { last_n: 6, ..DRY };
    assert_close(
        &dry_penalties(&[1, 2, 3, 9, 1, 2], &far, no_breakers),
        &[(3, 0.8)],
    );
}

/// 5 5 5 5 ends with "5 5 5", which occurred before (overlapping it)
/// followed by 5: length 3. A thousand 5s count as [`DRY_MAX_MATCH`], and
/// the penalty stays finite.
#[test]
fn dry_caps_long_repeats() {
    assert_close(
        &dry_penalties(&[5, 5, 5, 5], &DRY, no_breakers),
        &[(5, 0.8 * 1.75)],
    );
    let penalties = dry_penalties(&[5; 1000], &DRY, no_breakers);
    let uncapped = 0.8f64 * 1.75f64.powi((DRY_MAX_MATCH - 2) as i32);
    assert_close(&penalties, &[(5, uncapped.min(DRY_MAX_PENALTY) as f32)]);
    assert!(penalties[0].1.is_finite());
}

#[test]
fn common_prefix_lengths_match_a_naive_count() {
    let s = [1u32, 2, 1, 2, 1, 3, 1, 2, 1, 2, 1, 2];
    for limit in [1, 2, 3, 5, 50] {
        let naive: Vec<usize> = (0..s.len())
            .map(|k| match k {
                0 => 0,
                _ => s
                    .iter()
                    .zip(&s[k..])
                    .take_while(|(a, b)| a == b)
                    .count()
                    .min(limit),
            })
            .collect();
        assert_eq!(common_prefix_lengths(&s, limit), naive, "limit {limit}");
    }
}

/// Generated 4 5 6 7 4 5: the 3-gram "4 5 6" exists, so after "4 5" only
/// 6 is banned; 2-grams after "5": 6; 1-grams: everything generated.
#[test]
fn ngram_bans_the_completing_token() {
    let generated = [4, 5, 6, 7, 4, 5];
    assert_eq!(ngram_bans(&generated, 3), vec![6]);
    assert_eq!(ngram_bans(&generated, 2), vec![6]);
    assert_eq!(ngram_bans(&generated, 1), vec![4, 5, 6, 7]);
    assert!(ngram_bans(&generated, 4).is_empty());
    assert!(ngram_bans(&generated, 0).is_empty());
    assert!(ngram_bans(&[4, 5], 3).is_empty());
    // Two continuations of "4 5" seen: both banned.
    assert_eq!(ngram_bans(&[4, 5, 6, 4, 5, 8, 4, 5], 3), vec![6, 8]);
}

#[test]
fn the_ban_is_skipped_when_it_would_forbid_every_allowed_token() {
    let inf = f32::NEG_INFINITY;
    // A grammar allows only 1 and 3; banning both would leave nothing.
    let mut masked = vec![inf, 0.5, inf, 0.2];
    assert!(!apply_bans(&mut masked, &[1, 3]));
    assert_eq!(masked, vec![inf, 0.5, inf, 0.2]);
    // Banning one of them leaves the other.
    assert!(apply_bans(&mut masked, &[1]));
    assert_eq!(masked, vec![inf, inf, inf, 0.2]);
}

#[test]
fn the_sampler_skips_a_ban_that_would_leave_nothing() {
    let config = SamplingConfig {
        no_repeat_ngram: 1,
        ..SamplingConfig::default()
    };
    let sampler = sampler(&config);
    let inf = f32::NEG_INFINITY;
    // Prompt 9, generated 1 2 3: all three banned by 1-grams.
    let mut free = vec![0.0, 3.0, 2.0, 1.0, -1.0];
    sampler.penalize(&mut free, &[9, 1, 2, 3], 1);
    assert_eq!(free, vec![0.0, inf, inf, inf, -1.0]);
    let mut masked = vec![inf, 3.0, 2.0, inf, inf];
    sampler.penalize(&mut masked, &[9, 1, 2, 3], 1);
    assert_eq!(masked, vec![inf, 3.0, 2.0, inf, inf]);
}

#[test]
fn the_sampler_applies_dry_before_picking() {
    let config = SamplingConfig {
        dry_multiplier: 1.0,
        ..SamplingConfig::default()
    };
    let mut sampler = sampler(&config);
    // 1 2 9 1: 1 once followed 2, a repeat of one token: free.
    assert_eq!(sampler.sample(&logits(), &[1, 2, 9, 1], 0).unwrap(), 1);
    // 9 2 1 3 9 2: the tail "9 2" once was followed by 1: 2.0 − 1.0 < 1.9.
    assert_eq!(
        sampler.sample(&logits(), &[9, 2, 1, 3, 9, 2], 0).unwrap(),
        2
    );
}

#[test]
fn token_marks_read_breakers_and_line_ends() {
    let marks = TokenMarks::new(["a", "b\n", "key:", "\"", "end.", "why?", "x"], &[6]);
    let breakers: Vec<bool> = (0..8).map(|t| marks.is_breaker(t)).collect();
    assert_eq!(
        breakers,
        [false, true, true, true, false, false, true, false]
    );
    let ends: Vec<bool> = (0..8).map(|t| marks.may_end_unit(t)).collect();
    assert_eq!(ends, [false, true, false, false, true, true, false, false]);
}

#[test]
fn the_loop_check_finds_a_repeated_line() {
    let text = "The cat sat on the mat\nA dog barked\nthe cat  sat on the MAT\nmore";
    let cut = repeated_unit(text).expect("the third line repeats the first");
    assert_eq!(&text[..cut], "The cat sat on the mat\nA dog barked\n");
}

#[test]
fn the_loop_check_finds_a_repeated_sentence() {
    let text = "He left the town. She stayed home! He left the town. Then";
    let cut = repeated_unit(text).unwrap();
    assert_eq!(&text[..cut], "He left the town. She stayed home! ");
}

#[test]
fn the_loop_check_passes_different_short_and_unfinished_units() {
    assert_eq!(repeated_unit("He left the town. She left the town. "), None);
    // Short lines may repeat: headings, list markers.
    assert_eq!(repeated_unit("## Plot\n- a\n## Plot\n- a\n"), None);
    // A sentence counts once whitespace follows its full stop.
    assert_eq!(
        repeated_unit("Prices rose by 3. Prices rose by 3.5 percent. "),
        None
    );
    assert_eq!(repeated_unit("He left the town. He left the town."), None);
    assert_eq!(
        repeated_unit("He left the town. He left the town.\n"),
        Some(18)
    );
    assert_eq!(repeated_unit(""), None);
}

#[test]
fn a_phrase_written_three_times_over_is_cut_after_its_first_time() {
    let intro = [9, 8];
    let phrase = [1, 2, 3, 4, 5];
    let mut tokens = intro.to_vec();
    for _ in 0..2 {
        tokens.extend(phrase);
        assert_eq!(periodic_tail(&tokens), None);
    }
    tokens.extend(&phrase[..4]);
    assert_eq!(
        periodic_tail(&tokens),
        None,
        "the third time is not complete"
    );
    tokens.push(5);
    assert_eq!(periodic_tail(&tokens), Some(intro.len() + phrase.len()));
}

#[test]
fn short_repeats_count_only_once_they_fill_three_runs_of_four() {
    // "ha ha ha", list markers: runs under four tokens repeat freely…
    assert_eq!(periodic_tail(&[1, 2, 3, 1, 2, 3, 1, 2, 3]), None);
    assert_eq!(periodic_tail(&[7; 11]), None);
    // …until they make a run of four three times over.
    assert_eq!(periodic_tail(&[7; 12]), Some(4));
    assert_eq!(periodic_tail(&[]), None);
}

#[test]
fn the_copy_ban_forbids_what_would_complete_a_run_of_the_source() {
    let source = CopySource::new(&[1, 2, 3, 4, 2, 3, 9], 3);
    // 2 3 was followed by 4 and by 9 in the source.
    assert_eq!(source.bans(&[7, 2, 3]), [4, 9]);
    assert_eq!(source.bans(&[1, 2]), [3]);
    assert!(source.bans(&[3, 2]).is_empty());
    // Too few tokens to end a run yet, or no ban at all.
    assert!(source.bans(&[2]).is_empty());
    assert!(CopySource::new(&[1, 2, 3], 0).bans(&[1, 2]).is_empty());
}

/// Source " the keeper, V|ass, said": after " keeper" "," " V", "ass" would
/// copy a fourth token, but it finishes the word " V" began, so it stays
/// allowed; " said" after "ass" starts a word and is banned.
#[test]
fn the_copy_ban_never_cuts_a_word_in_two() {
    let texts = [" the", " keeper", ",", " V", "ass", " said", " wrote"];
    let marks = Arc::new(TokenMarks::new(texts, &[]));
    assert!(marks.continues_word(3, 4));
    assert!(!marks.continues_word(4, 5));
    assert!(
        !marks.continues_word(2, 4),
        "a word after a comma starts afresh"
    );
    let source = [0, 1, 2, 3, 4, 5];
    let sampler = Sampler::new(
        &SamplingConfig::default(),
        marks,
        CopySource::new(&source, 4),
    );
    let allowed_after = |generated: &[u32], token: u32| {
        let mut logits = vec![0.0f32; texts.len()];
        sampler.penalize(&mut logits, generated, 0);
        logits[token as usize] > f32::NEG_INFINITY
    };
    assert!(allowed_after(&[1, 2, 3], 4));
    assert!(!allowed_after(&[2, 3, 4], 5));
    assert!(allowed_after(&[2, 3, 4], 6));
}

/// The distribution draft-model decoding checks drafts against is the one
/// candle's sampler draws from, with temperature, top-k and top-p.
#[test]
fn probabilities_are_what_the_sampler_draws_from() {
    let values = [0.1f32, 2.0, 1.9, -1.0, 0.5];
    let settings = [
        (0.7, None, None),
        (1.3, Some(3), None),
        (1.0, None, Some(0.8)),
        (0.9, Some(4), Some(0.9)),
    ];
    for (temperature, top_k, top_p) in settings {
        let config = SamplingConfig {
            temperature,
            top_k,
            top_p,
            ..SamplingConfig::default()
        };
        let mut sampler = sampler(&config);
        let expected = sampler.distribution(&values).unwrap();
        assert_eq!(expected, probabilities(&values, temperature, top_k, top_p));
        assert!((expected.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        let draws = 40_000;
        let mut counts = [0usize; 5];
        for _ in 0..draws {
            counts[sampler.pick(&logits()).unwrap() as usize] += 1;
        }
        for (id, &count) in counts.iter().enumerate() {
            let seen = count as f32 / draws as f32;
            assert!(
                (seen - expected[id]).abs() < 0.015,
                "{temperature} {top_k:?} {top_p:?}: token {id} drawn {seen}, expected {}",
                expected[id]
            );
        }
    }
    let greedy = sampler(&SamplingConfig::default());
    assert!(greedy.is_greedy() && greedy.distribution(&values).is_none());
}
