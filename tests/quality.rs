//! Coherence scoring (BooookScore) against a scripted judge: one call per
//! sentence over a shared cached prefix, verdicts of every form counted, and
//! unreadable ones never counted as clean; then constrained verdicts from a
//! random model, and the command line on a bad summary file.

use crate::common::{assert_one_error_line, run_prism, ScriptedLlm};
use crate::constrained::char_model;
use prism::engine::{GenerateOptions, StopReason};
use prism::quality::coherence::{
    parse_verdict, score_coherence, verdict_grammar, CoherenceConfig, ErrorType, Verdict,
    VerdictKind,
};

const SUMMARY: &str = "Anna inherits the mill from her uncle. The mill burns down in May. \
Mr. Brandt, the banker, refuses her a loan. Anna rebuilds the mill with the villagers' help.";

fn score(replies: &[&str]) -> (prism::quality::coherence::CoherenceReport, ScriptedLlm) {
    let mut llm = ScriptedLlm::new(replies);
    let config = CoherenceConfig { constrained: false };
    let mut seen = Vec::new();
    let report = score_coherence(&mut llm, SUMMARY, &config, &mut |done, total| {
        seen.push((done, total))
    })
    .unwrap();
    assert_eq!(seen, [(1, 4), (2, 4), (3, 4), (4, 4)]);
    (report, llm)
}

#[test]
fn each_sentence_is_judged_once_after_the_same_prefix() {
    let (report, llm) = score(&[
        r#"{"confusing": false}"#,
        "Yes: causal omission",
        r#"{"confusing": true, "types": ["entity omission"]}"#,
        "No confusion.",
    ]);
    assert_eq!(llm.prompts.len(), 4);
    let sentences: Vec<&str> = report
        .verdicts
        .iter()
        .map(|v| v.sentence.as_str())
        .collect();
    assert_eq!(
        sentences,
        [
            "Anna inherits the mill from her uncle.",
            "The mill burns down in May.",
            "Mr. Brandt, the banker, refuses her a loan.",
            "Anna rebuilds the mill with the villagers' help."
        ]
    );
    for (prompt, sentence) in llm.prompts.iter().zip(&sentences) {
        assert_eq!(prompt.system, llm.prompts[0].system);
        assert_eq!(prompt.segments[..2], llm.prompts[0].segments[..2]);
        assert!(prompt.segments[1].contains(SUMMARY));
        let last = prompt.segments.last().unwrap();
        assert!(last.contains(sentence), "{last}");
    }

    let kinds: Vec<VerdictKind> = report.verdicts.iter().map(|v| v.verdict).collect();
    assert_eq!(
        kinds,
        [
            VerdictKind::Clean,
            VerdictKind::Confusing,
            VerdictKind::Confusing,
            VerdictKind::Clean
        ]
    );
    assert_eq!(report.verdicts[1].types, [ErrorType::CausalOmission]);
    assert_eq!(report.verdicts[1].raw, "Yes: causal omission");
    assert_eq!((report.clean, report.confusing, report.unparsed), (2, 2, 0));
    assert!((report.score - 0.5).abs() < 1e-12);
    assert_eq!(report.score_parsed, Some(0.5));

    // The scripted model counts characters: every call after the first
    // reuses at least the system turn, instructions and summary.
    let judge = &report.judge;
    assert_eq!(judge.calls, 4);
    let prefix: usize = llm.prompts[0].system.as_ref().unwrap().chars().count()
        + llm.prompts[0].segments[..2]
            .iter()
            .map(|s| s.chars().count())
            .sum::<usize>();
    assert!(judge.figures.reused_tokens >= 3 * prefix);
    assert!(judge.figures.cache_hit_rate > 0.5, "{judge:?}");
}

#[test]
fn unreadable_verdicts_lower_the_score_and_are_reported() {
    let (report, _) = score(&["No", "Maybe?", "{\"confusing\": tr", ""]);
    assert_eq!((report.clean, report.confusing, report.unparsed), (1, 0, 3));
    assert!((report.score - 0.25).abs() < 1e-12);
    assert_eq!(report.score_parsed, Some(1.0));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["verdicts"][1]["verdict"], "unparsed");
    assert_eq!(json["verdicts"][2]["raw"], "{\"confusing\": tr");
    assert_eq!(json["unparsed"], 3);
    assert!(json["judge"]["cache_hit_rate"].as_f64().unwrap() > 0.0);
}

#[test]
fn all_unreadable_scores_zero_with_no_parsed_score() {
    let (report, _) = score(&["?", "?", "?", "?"]);
    assert_eq!(report.score, 0.0);
    assert_eq!(report.score_parsed, None);
}

#[test]
fn a_summary_without_sentences_is_an_error() {
    let mut llm = ScriptedLlm::new(&[]);
    let config = CoherenceConfig { constrained: true };
    let err = score_coherence(&mut llm, "--- \n ...", &config, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("no sentences"), "{err}");
    assert!(llm.prompts.is_empty());
}

#[test]
fn constrained_verdicts_of_a_random_model_always_parse() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = char_model(dir.path());
    for (seed, prompt) in ["x", "abc", "q0", "zz 9"].iter().enumerate() {
        let ids = engine.text_prompt(prompt).unwrap();
        let mut options = GenerateOptions {
            max_tokens: 120,
            grammar: Some(verdict_grammar()),
            ..GenerateOptions::default()
        };
        options.sampling.temperature = 1.0;
        options.sampling.seed = seed as u64;
        let generation = engine.generate(&ids, &options).unwrap();
        assert_eq!(
            generation.stop_reason,
            StopReason::EndOfTurn,
            "{:?}",
            generation.text
        );
        assert_ne!(
            parse_verdict(&generation.text),
            Verdict::Unparsed,
            "{:?}",
            generation.text
        );
    }
}

#[test]
fn an_empty_or_binary_summary_file_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let result = run_prism(&["score", "coherence", empty.to_str().unwrap()]);
    assert_one_error_line(&result, "is empty");

    let binary = dir.path().join("binary.txt");
    std::fs::write(&binary, [0u8, 159, 146, 150, 1, 2, 3]).unwrap();
    let result = run_prism(&["score", "coherence", binary.to_str().unwrap()]);
    assert_one_error_line(&result, "binary");
}

/// Questions answered side by side, on siblings of the engine whose decode
/// steps batch, get the answers they get in turn, and the same token counts
/// but for reuse: each worker has a cache of its own.
#[test]
fn questions_answered_side_by_side_match_those_answered_in_turn() {
    use prism::engine::source::ModelSource;
    use prism::engine::{Engine, EngineConfig};
    use prism::llm::Backend;
    use prism::qa::{score_summary, QaPair};
    let dir = tempfile::tempdir().unwrap();
    crate::common::tiny_chat_model(dir.path());
    let source = ModelSource::HfDir {
        dir: dir.path().to_path_buf(),
        name: "tiny-chat".into(),
    };
    // Side by side gives alone's bits only where each row is multiplied alone: the CPU.
    let config = EngineConfig {
        device: prism::engine::device::DeviceChoice::Cpu,
        ..EngineConfig::new(source)
    };
    let engine = Engine::open(&config).unwrap();
    let mut backend = Backend::Local(Box::new(engine));
    let summary = "w1 w2 w3 w4. w5 w6 w7.";
    let pairs: Vec<QaPair> = (0..5)
        .map(|i| QaPair {
            question: format!("w{} w{}?", i + 1, 9 - i),
            answer: format!("w{i}"),
            chunk: None,
        })
        .collect();
    let in_turn = {
        let mut llm = backend.llm(GenerateOptions::default());
        score_summary(&mut *llm, summary, &pairs).unwrap()
    };
    let side_by_side = {
        let mut llm = backend
            .llm_side_by_side(GenerateOptions::default(), 3)
            .unwrap();
        score_summary(&mut *llm, summary, &pairs).unwrap()
    };
    let answers = |score: &prism::qa::QaScore| -> Vec<String> {
        score.questions.iter().map(|q| q.answer.clone()).collect()
    };
    assert_eq!(answers(&side_by_side), answers(&in_turn));
    assert_eq!(side_by_side.calls, 5);
    assert_eq!(
        side_by_side.figures.prompt_tokens,
        in_turn.figures.prompt_tokens
    );
    assert_eq!(
        side_by_side.figures.output_tokens,
        in_turn.figures.output_tokens
    );
}

/// Questions written about a document keep only pairs whose answers come
/// from their passage and are not in the question, and that do not ask
/// about "the passage"; each question is asked once across the document,
/// and what one chunk falls short of is asked of the next.
#[test]
fn generated_questions_are_grounded_in_their_passage_and_asked_once() {
    use prism::chunk::Chunk;
    use prism::qa::generate_document_pairs;
    let chunk = |index: usize, text: &str| Chunk {
        index,
        text: text.to_string(),
        tokens: text.chars().count(),
        start_byte: 0,
    };
    let chunks = [
        chunk(0, "The keeper, Ada Penhallow, lit the lamp at dusk."),
        chunk(1, "Tomas Reddick climbed the ladder in the gale."),
    ];
    let mut llm = ScriptedLlm::new(&[
        "Q: Who lit the lamp?\nA: Ada Penhallow\nQ: Who is named in the passage?\nA: Ada Penhallow\nQ: What did the keeper light?\nA: The keeper\nQ: What is the title?\nA: Passage from a document",
        "Q: Who lit the lamp?\nA: Tomas Reddick\nQ: What did Tomas Reddick climb?\nA: the ladder\nQ: What was the weather?\nA: a gale",
    ]);
    let mut heard = Vec::new();
    let written =
        generate_document_pairs(&mut llm, &chunks, 4, false, &mut |chunk, kept, asked| {
            heard.push((chunk.index, kept, asked))
        })
        .unwrap();
    let pairs: Vec<(&str, &str, Option<usize>)> = written
        .pairs
        .iter()
        .map(|pair| (pair.question.as_str(), pair.answer.as_str(), pair.chunk))
        .collect();
    assert_eq!(
        pairs,
        [
            ("Who lit the lamp?", "Ada Penhallow", Some(0)),
            ("What did Tomas Reddick climb?", "the ladder", Some(1)),
            ("What was the weather?", "a gale", Some(1)),
        ]
    );
    assert_eq!(heard, [(0, 1, 2), (1, 2, 3)]);
}
