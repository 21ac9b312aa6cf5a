//! Chain of Summaries against a scripted model: the calls a script leads to,
//! the candidate chosen on validation questions, the stats, resuming, and
//! the document's KV surviving the answer calls with two cache slots.

use crate::common::{scripted_files, ScriptedLlm};
use prism::chunk::{split, Chunk};
use prism::methods::cos::{split_pairs, Cos, CosConfig, CosFigures, Step};
use prism::run::dir::RunDir;
use prism::run::{drive, NoProgress, Outcome, Stats};
use serde_json::json;

const PAIRS: [(&str, &str); 4] = [
    ("Who sails north?", "Walton"),
    ("What stops the ship?", "ice"),
    ("Who is found on the ice?", "Victor"),
    ("Where does Walton write from?", "Archangel"),
];

const S0: &str = "Walton sails north.";
const S1: &str = "Walton sails north from Archangel and meets ice.";
const S2: &str = "A ship sails.";

fn config(iterations: usize, questions_per_iteration: usize) -> CosConfig {
    CosConfig {
        qa_pairs: 4,
        iterations,
        questions_per_iteration,
        fail_f1: 0.5,
        seed: 0,
        summary_tokens: 200,
        constrained: true,
    }
}

/// The document in `count` chunks of one paragraph each.
fn chunks(count: usize) -> Vec<Chunk> {
    let text: String = (0..count)
        .map(|i| format!("Paragraph {i}: Walton writes from Archangel; the ship meets ice and finds Victor.\n\n"))
        .collect();
    let chunks = split(&text, 90, &|piece: &str| piece.chars().count()).unwrap();
    assert_eq!(chunks.len(), count);
    chunks
}

fn pairs_json(pairs: &[(&str, &str)]) -> String {
    let items: Vec<_> = pairs
        .iter()
        .map(|(question, answer)| json!({"question": question, "answer": answer}))
        .collect();
    serde_json::to_string(&items).unwrap()
}

/// The reference answer of the `position`-th question of a part of the split.
fn reference(part: &[usize], position: usize) -> String {
    PAIRS[part[position]].1.to_string()
}

/// A script for one chunk, two rounds with one question each: s⁰ misses
/// its validation question, s¹ answers it, s² misses it again; s¹ then
/// answers its test question.
fn two_round_script() -> Vec<String> {
    script_with_summaries([S0, S1, S2])
}

/// [`two_round_script`] with other summaries.
fn script_with_summaries([s0, s1, s2]: [&str; 3]) -> Vec<String> {
    let split = split_pairs(4, 0);
    let right = |part: &[usize], position| reference(part, position);
    vec![
        pairs_json(&PAIRS),
        format!("Summary: {s0}"),
        "nobody".into(),
        "I don't know.".into(),
        right(&split.train, 1),
        format!("Updated Summary:\n{s1}"),
        right(&split.validation, 0),
        "no idea".into(),
        "no idea".into(),
        s2.into(),
        "wrong".into(),
        format!("Answer: {}", right(&split.test, 0)),
    ]
}

fn run(
    config: &CosConfig,
    chunks: &[Chunk],
    llm: &mut ScriptedLlm,
    dir: &std::path::Path,
    resume: bool,
    stop_after: Option<usize>,
) -> Outcome<CosFigures> {
    let method = Cos::new(config);
    let run_dir = RunDir::create(dir).unwrap();
    let files = scripted_files(&run_dir, resume, stop_after);
    drive(&method, llm, chunks, &files, &mut NoProgress).unwrap()
}

fn finished(outcome: Outcome<CosFigures>) -> (String, Stats<CosFigures>) {
    match outcome {
        Outcome::Finished { summary, stats } => (summary, stats),
        Outcome::Paused { .. } => panic!("the run should finish"),
    }
}

fn steps(dir: &std::path::Path) -> Vec<Step> {
    RunDir::create(dir)
        .unwrap()
        .read_jsonl("steps.jsonl")
        .unwrap()
}

#[test]
fn the_best_validation_candidate_is_kept_and_scored_on_test() {
    let script = two_round_script();
    let replies: Vec<&str> = script.iter().map(String::as_str).collect();
    let mut llm = ScriptedLlm::new(&replies);
    let dir = tempfile::tempdir().unwrap();
    let (summary, stats) = finished(run(
        &config(2, 1),
        &chunks(1),
        &mut llm,
        dir.path(),
        false,
        None,
    ));

    // 2 reading + 3 validation + 2 × 2 train + 2 refinements + 1 test.
    assert_eq!(stats.run.calls, 12);
    assert_eq!(llm.prompts.len(), 12);
    assert_eq!(summary, S1);
    let figures = &stats.method_figures;
    assert_eq!(figures.validation_f1, [Some(0.0), Some(1.0), Some(0.0)]);
    assert_eq!(figures.chosen, 1);
    assert_eq!(figures.test_f1, Some(1.0));
    assert_eq!(figures.qa_pairs, 4);
    assert_eq!(figures.rounds, 2);
    assert_eq!(figures.refine_calls, 2);
    assert_eq!(figures.train_f1, [Some(0.5), Some(0.0), None]);
    assert_eq!(figures.candidate_tokens.len(), 3);
    // The test question is asked of the chosen summary.
    assert!(llm.prompts[11].segments.concat().contains(S1));
    // Round 2 refines with the question round 1 did not use.
    let split = split_pairs(4, 0);
    let round_two = llm.prompts[9].segments.concat();
    assert!(round_two.contains(PAIRS[split.train[1]].0), "{round_two}");
    assert!(!round_two.contains(PAIRS[split.train[0]].0), "{round_two}");

    let steps = steps(dir.path());
    assert_eq!(steps.len(), 9);
    assert_eq!(steps.iter().map(|step| step.calls).sum::<usize>(), 12);
    let candidates: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("candidates.json")).unwrap())
            .unwrap();
    assert_eq!(candidates[0]["summary"], S0);
    assert_eq!(candidates[2]["summary"], S2);
    let pairs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("qa_pairs.json")).unwrap())
            .unwrap();
    assert_eq!(pairs["train"].as_array().unwrap().len(), 2);
    assert_eq!(pairs["test"][0]["chunk"], 0);
}

#[test]
fn refinement_stops_when_no_train_question_fails() {
    let split = split_pairs(4, 0);
    let replies = [
        pairs_json(&PAIRS),
        S1.to_string(),
        "wrong".into(),
        reference(&split.train, 0),
        reference(&split.train, 1),
        reference(&split.test, 0),
    ];
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let mut llm = ScriptedLlm::new(&replies);
    let dir = tempfile::tempdir().unwrap();
    let (summary, stats) = finished(run(
        &config(3, 2),
        &chunks(1),
        &mut llm,
        dir.path(),
        false,
        None,
    ));
    assert_eq!(stats.run.calls, 6);
    assert_eq!(summary, S1);
    assert_eq!(stats.method_figures.rounds, 0);
    assert_eq!(stats.method_figures.chosen, 0);
    assert_eq!(stats.method_figures.test_f1, Some(1.0));
}

#[test]
fn output_without_pairs_leaves_the_first_summary() {
    let replies = ["I cannot write questions.", S0];
    let mut llm = ScriptedLlm::new(&replies);
    let dir = tempfile::tempdir().unwrap();
    let (summary, stats) = finished(run(
        &config(3, 3),
        &chunks(1),
        &mut llm,
        dir.path(),
        false,
        None,
    ));
    assert_eq!(stats.run.calls, 2);
    assert_eq!(summary, S0);
    assert_eq!(stats.method_figures.qa_pairs, 0);
    assert_eq!(stats.method_figures.test_f1, None);
}

#[test]
fn an_interrupted_run_resumes_to_the_same_result() {
    let script = two_round_script();
    let replies: Vec<&str> = script.iter().map(String::as_str).collect();
    let whole = tempfile::tempdir().unwrap();
    let (expected, expected_stats) = finished(run(
        &config(2, 1),
        &chunks(1),
        &mut ScriptedLlm::new(&replies),
        whole.path(),
        false,
        None,
    ));

    let dir = tempfile::tempdir().unwrap();
    let mut llm = ScriptedLlm::new(&replies);
    // Reading, validation of s⁰, its train questions, round 1: six calls.
    let paused = run(
        &config(2, 1),
        &chunks(1),
        &mut llm,
        dir.path(),
        false,
        Some(4),
    );
    assert!(matches!(paused, Outcome::Paused { completed: 4 }));
    assert_eq!(llm.prompts.len(), 6);
    let mut llm = ScriptedLlm::new(&replies[6..]);
    let (summary, stats) = finished(run(
        &config(2, 1),
        &chunks(1),
        &mut llm,
        dir.path(),
        true,
        None,
    ));
    assert_eq!(summary, expected);
    assert_eq!(stats.run.calls, expected_stats.run.calls);
    assert_eq!(stats.method_figures, expected_stats.method_figures);
    let kinds = |steps: Vec<Step>| {
        steps
            .into_iter()
            .map(|step| serde_json::to_value(step.work).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(steps(dir.path())), kinds(steps(whole.path())));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("candidates.json")).unwrap(),
        std::fs::read_to_string(whole.path().join("candidates.json")).unwrap()
    );
}

/// With two cache slots the answer calls between refinements leave the
/// chunk's KV alone, so each refinement reuses the whole chunk; with one
/// slot they push it out. The summaries outweigh the answer instructions
/// and differ from their first word, as real ones do.
#[test]
fn two_cache_slots_keep_the_document_for_refinement() {
    let long = |opening: &str| {
        format!(
            "{opening} {}",
            "The ship sails north into the ice. ".repeat(20)
        )
    };
    let (s0, s1, s2) = (long("Walton writes."), long("Archangel."), long("Victor."));
    let script = script_with_summaries([&s0, &s1, &s2]);
    let replies: Vec<&str> = script.iter().map(String::as_str).collect();
    // A chunk that outweighs the instructions, as a real one does.
    let text = "Walton writes from Archangel; the ship meets ice and finds Victor. ".repeat(40);
    let chunks = split(&text, 10_000, &|piece: &str| piece.chars().count()).unwrap();
    let chunk_chars = chunks[0].text.chars().count();
    let reused = |slots: usize| {
        let dir = tempfile::tempdir().unwrap();
        let mut llm = ScriptedLlm::with_cache_slots(&replies, slots);
        let (_, stats) = finished(run(
            &config(2, 1),
            &chunks,
            &mut llm,
            dir.path(),
            false,
            None,
        ));
        assert_eq!(stats.method_figures.refine_calls, 2);
        stats.method_figures.refine_reused_tokens
    };
    let one = reused(1);
    let two = reused(2);
    assert!(one < chunk_chars, "one slot reused {one}");
    assert!(
        two >= 2 * chunk_chars,
        "two slots reused {two} of 2 × {chunk_chars}"
    );
}

/// Over two chunks, each pair remembers its chunk, and a round refines
/// against the chunk of each failed question, in document order.
#[test]
fn a_round_refines_against_the_chunks_of_its_questions() {
    let split = split_pairs(4, 0);
    let replies = [
        pairs_json(&PAIRS[..2]),
        S0.to_string(),
        pairs_json(&PAIRS[2..]),
        S0.to_string(),
        "wrong".into(),
        "wrong".into(),
        "wrong".into(),
        "first refinement".into(),
        S1.into(),
        reference(&split.validation, 0),
        reference(&split.test, 0),
    ];
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let mut llm = ScriptedLlm::new(&replies);
    let chunks = chunks(2);
    let dir = tempfile::tempdir().unwrap();
    let (summary, stats) = finished(run(
        &config(1, 2),
        &chunks,
        &mut llm,
        dir.path(),
        false,
        None,
    ));
    assert_eq!(stats.run.calls, 11);
    assert_eq!(summary, S1);
    assert_eq!(stats.method_figures.refine_calls, 2);
    // The train questions come from different chunks (the split is pinned by its seed).
    let chunk_of = |pair: usize| pair / 2;
    assert_ne!(chunk_of(split.train[0]), chunk_of(split.train[1]));
    for (call, chunk) in [(7, 0), (8, 1)] {
        let prompt = llm.prompts[call].segments.concat();
        assert!(
            prompt.contains(chunks[chunk].text.trim_end()),
            "call {call}"
        );
        assert!(
            !prompt.contains(chunks[1 - chunk].text.trim_end()),
            "call {call}"
        );
        let question = split
            .train
            .iter()
            .find(|&&pair| chunk_of(pair) == chunk)
            .unwrap();
        assert!(prompt.contains(PAIRS[*question].0), "call {call}");
    }
    // The second call of the round refines what the first wrote.
    assert!(llm.prompts[8]
        .segments
        .concat()
        .contains("first refinement"));
    let pairs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("qa_pairs.json")).unwrap())
            .unwrap();
    let chunks_of: Vec<_> = ["train", "validation", "test"]
        .iter()
        .flat_map(|part| pairs[part].as_array().unwrap().clone())
        .map(|pair| pair["chunk"].as_u64().unwrap())
        .collect();
    assert_eq!(chunks_of.iter().filter(|&&chunk| chunk == 1).count(), 2);
}
