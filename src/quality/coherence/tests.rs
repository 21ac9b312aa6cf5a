//! Tests of the coherence judge: its prompts, verdict parsing and report.

use super::*;
use ErrorType::*;

fn confusing(types: &[ErrorType]) -> Verdict {
    Verdict::Confusing(types.to_vec())
}

#[test]
fn plain_no_forms_are_clean() {
    for raw in [
        "No",
        "no",
        "No confusion",
        "No confusion.",
        "  no confusion\n",
        "Not confusing.",
        "None",
        "Answer: No",
        "**No**",
        "\"No\"",
        "Clear.",
        "false",
    ] {
        assert_eq!(parse_verdict(raw), Verdict::Clean, "{raw:?}");
    }
}

#[test]
fn yes_with_types_names_them() {
    assert_eq!(
        parse_verdict("Yes: causal omission, duplication"),
        confusing(&[CausalOmission, Duplication])
    );
    assert_eq!(
        parse_verdict("YES - Entity Omission; Event-Omission"),
        confusing(&[EntityOmission, EventOmission])
    );
    assert_eq!(
        parse_verdict("Confusing: discontinuity"),
        confusing(&[Discontinuity])
    );
}

#[test]
fn yes_without_types_is_confusing_with_none_named() {
    assert_eq!(parse_verdict("Yes"), confusing(&[]));
    assert_eq!(parse_verdict("yes."), confusing(&[]));
    assert_eq!(parse_verdict("Yes, it would."), confusing(&[]));
}

#[test]
fn type_names_tolerate_case_typos_and_run_together_forms() {
    assert_eq!(
        parse_verdict("yes: CAUSAL OMISION, duplicaton, inconsistancy"),
        confusing(&[CausalOmission, Inconsistency, Duplication])
    );
    assert_eq!(
        parse_verdict("yes: entity_omission, EntityOmission, salience"),
        confusing(&[EntityOmission, Salience])
    );
    assert_eq!(
        parse_verdict("yes: inconsistencies, discontinuities, event omissions"),
        confusing(&[EventOmission, Discontinuity, Inconsistency])
    );
    assert_eq!(
        parse_verdict("yes: repetition and a contradiction"),
        confusing(&[Inconsistency, Duplication])
    );
}

#[test]
fn a_near_word_is_not_a_type() {
    assert_eq!(parse_verdict("yes: even so, it is odd"), confusing(&[]));
    assert_eq!(parse_verdict("yes: causal"), confusing(&[]));
}

#[test]
fn json_verdicts_parse() {
    assert_eq!(parse_verdict(r#"{"confusing": false}"#), Verdict::Clean);
    assert_eq!(
        parse_verdict(r#"{"confusing": true, "types": ["causal omission", "Duplication"]}"#),
        confusing(&[CausalOmission, Duplication])
    );
    assert_eq!(
        parse_verdict(r#"{"confusing": true, "types": []}"#),
        confusing(&[])
    );
    assert_eq!(
        parse_verdict("```json\n{\"Confusing\": \"yes\", \"errors\": \"salience\"}\n```"),
        confusing(&[Salience])
    );
    assert_eq!(
        parse_verdict(r#"Verdict: {"is_confusing": "no"} (the sentence is fine)"#),
        Verdict::Clean
    );
    assert_eq!(
        parse_verdict(r#"{"types": ["languge"]}"#),
        confusing(&[Language])
    );
    assert_eq!(
        parse_verdict(r#"{"confusing": true, "types": ["duplication", "duplication"]}"#),
        confusing(&[Duplication])
    );
}

#[test]
fn a_false_flag_wins_over_listed_types() {
    assert_eq!(
        parse_verdict(r#"{"confusing": false, "types": ["salience"]}"#),
        Verdict::Clean
    );
}

#[test]
fn sentences_that_say_it_plainly_parse() {
    assert_eq!(
        parse_verdict("I think this sentence is not confusing at all."),
        Verdict::Clean
    );
    assert_eq!(
        parse_verdict("The sentence wouldn't confuse anyone."),
        Verdict::Clean
    );
    assert_eq!(
        parse_verdict("The sentence would confuse a reader: the reason she leaves is missing (causal omission)."),
        confusing(&[CausalOmission])
    );
}

#[test]
fn a_reply_opening_with_a_type_is_confusing() {
    assert_eq!(
        parse_verdict("Causal omission: why does Anna leave?"),
        confusing(&[CausalOmission])
    );
}

#[test]
fn malformed_replies_are_unparsed_never_clean() {
    for raw in [
        "",
        "   ",
        "Maybe.",
        "The summary describes a council meeting.",
        r#"{"confusing": fal"#,
        r#"{"confusing": true, "types": ["causal"#,
        r#"{"verdict_text": 3}"#,
        "{",
        "[\"no\"]{",
        r#"{"confusing": null}"#,
    ] {
        assert_eq!(parse_verdict(raw), Verdict::Unparsed, "{raw:?}");
    }
}

#[test]
fn edit_distance_matches_hand_worked_cases() {
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("omission", "omision"), 1);
    assert_eq!(edit_distance("same", "same"), 0);
}

#[test]
fn the_score_counts_unparsed_verdicts_against_the_summary() {
    let verdict = |kind: VerdictKind, types: Vec<ErrorType>| SentenceVerdict {
        sentence: "s".into(),
        verdict: kind,
        types,
        raw: String::new(),
    };
    let judge = JudgeStats {
        calls: 4,
        figures: Figures::of(&Default::default()),
        seconds: 0.0,
    };
    let report = report(
        vec![
            verdict(VerdictKind::Clean, vec![]),
            verdict(VerdictKind::Clean, vec![]),
            verdict(VerdictKind::Confusing, vec![Salience, Duplication]),
            verdict(VerdictKind::Unparsed, vec![]),
        ],
        true,
        judge,
    );
    assert_eq!((report.clean, report.confusing, report.unparsed), (2, 1, 1));
    assert!((report.score - 0.5).abs() < 1e-12);
    assert!((report.score_parsed.unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(report.error_counts["salience"], 1);
    assert!(!report.error_counts.contains_key("language"));
}

#[test]
fn the_prompts_share_everything_before_the_sentence() {
    let summary = "Anna left. Tom stayed.";
    let first = verdict_prompt(summary, "Anna left.");
    let second = verdict_prompt(summary, "Tom stayed.");
    assert_eq!(first.system, second.system);
    assert_eq!(first.segments[..2], second.segments[..2]);
    assert!(first.segments[2].contains("Anna left."));
    for kind in ErrorType::ALL {
        assert!(first.segments[0].contains(kind.name()));
    }
}
