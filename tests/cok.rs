//! The CoK paper's four methods against a scripted model: how the memory
//! evolves under each, refused outputs counted, compression above the token
//! limit, the prompt layout that lets the cache work, and resuming a stopped
//! run; then their grammars on the real model.

use crate::common::{fetched_model, scripted_files, ScriptedLlm};
use prism::chunk::{split, Chunk};
use prism::engine::constraint::Grammar;
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, GenerateOptions};
use prism::memory::grammar::memory_json_schema;
use prism::memory::Schema;
use prism::methods::cok::chain::{chain_constraint, memory_keys, parse_chain};
use prism::methods::cok::{Call, Cok, CokConfig, CokFigures, Step, Variant};
use prism::run::dir::RunDir;
use prism::run::{drive, NoProgress, Outcome, Stats};
use serde_json::{json, Value};
use std::path::Path;

fn book_schema() -> Schema {
    Schema::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/book.json")).unwrap()
}

fn config(memory_token_limit: Option<usize>) -> CokConfig {
    CokConfig {
        query: "Summarize the story.".into(),
        step_tokens: 512,
        answer_tokens: 256,
        summary_words: None,
        memory_token_limit,
        constrained: false,
    }
}

fn chunks() -> Vec<Chunk> {
    let text: String = (0..3)
        .map(|i| format!("Paragraph {i} tells of the ship and its crew in some detail.\n\n"))
        .collect();
    split(&text, 60, &|piece: &str| piece.chars().count()).unwrap()
}

/// What one session of a run left behind.
struct Run {
    outcome: Outcome<CokFigures>,
    steps: Vec<Step>,
    llm: ScriptedLlm,
}

fn session(
    variant: Variant,
    config: &CokConfig,
    replies: &[&str],
    dir: &Path,
    resume: bool,
    stop_after: Option<usize>,
) -> Run {
    let schema = book_schema();
    let schema = (variant != Variant::GuText).then_some(&schema);
    let method = Cok::new(variant, config, schema).unwrap();
    let mut llm = ScriptedLlm::new(replies);
    let run_dir = RunDir::create(dir).unwrap();
    let files = scripted_files(&run_dir, resume, stop_after);
    let outcome = drive(&method, &mut llm, &chunks(), &files, &mut NoProgress).unwrap();
    let steps = run_dir.read_jsonl("steps.jsonl").unwrap();
    Run {
        outcome,
        steps,
        llm,
    }
}

fn run_all(variant: Variant, config: &CokConfig, replies: &[&str], dir: &Path) -> Run {
    session(variant, config, replies, dir, false, None)
}

fn finished(outcome: &Outcome<CokFigures>) -> (&str, &Stats<CokFigures>) {
    match outcome {
        Outcome::Finished { summary, stats } => (summary, stats),
        Outcome::Paused { .. } => panic!("the run should finish"),
    }
}

fn memory_file(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("memory.json")).unwrap()).unwrap()
}

fn calls(steps: &[Step]) -> Vec<Call> {
    steps.iter().map(|step| step.call).collect()
}

const GU_TEXT: [&str; 4] = [
    "The ship sails north.",
    "  \n",
    "The ship sails north. A storm breaks the mast.",
    "A ship sails north and loses its mast in a storm.",
];

#[test]
fn gu_text_rewrites_prose_and_refuses_an_empty_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_all(Variant::GuText, &config(None), &GU_TEXT, dir.path());
    let (summary, stats) = finished(&run.outcome);
    assert_eq!(summary, GU_TEXT[3]);
    assert_eq!(stats.method, "gu-text");
    assert_eq!(stats.method_figures.updates_rejected, Some(1));
    assert_eq!(stats.method_figures.compressions, 0);
    assert_eq!(stats.run.calls, 4);
    assert_eq!(calls(&run.steps), [Call::Update; 3]);
    assert!(run.steps[1].refused.as_ref().unwrap().contains("empty"));
    assert_eq!(memory_file(dir.path()), json!(GU_TEXT[2]));

    // Instructions first, then the memory, then the chunk and the request.
    let prompts = &run.llm.prompts;
    assert!(prompts
        .iter()
        .all(|p| p.segments[0] == prompts[0].segments[0]));
    assert_eq!(prompts[0].segments[1], "\n## Memory so far\n");
    assert_eq!(prompts[0].segments[2], "(nothing yet)\n");
    assert_eq!(prompts[1].segments[2], "The ship sails north.\n");
    assert!(prompts[1].segments[3].starts_with("\n## Chunk 2 of 3\n"));
    // The refused rewrite left the memory as it was, so the next call
    // reuses the cached prompt up to the chunk.
    assert_eq!(prompts[2].segments[2], prompts[1].segments[2]);
    let head: usize = prompts[2].system.as_ref().unwrap().chars().count()
        + prompts[2].segments[..3]
            .iter()
            .map(|s| s.chars().count())
            .sum::<usize>();
    assert!(
        run.steps[2].tokens.reused_tokens >= head,
        "{}",
        run.steps[2].tokens.reused_tokens
    );
}

const GU_JSON: [&str; 4] = [
    r#"{"Voyage": ["The ship sails north."]}"#,
    "```json\n{\"Voyage\": \"not a list\"}\n```",
    r#"Here it is: {"Voyage": ["The ship sails north."], "Storm": ["A gale breaks the mast.", "The crew bails wat"#,
    "The ship sails north; a gale breaks its mast.",
];

#[test]
fn gu_json_keeps_valid_rewrites_and_closes_a_cut_off_one() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_all(Variant::GuJson, &config(None), &GU_JSON, dir.path());
    let (_, stats) = finished(&run.outcome);
    assert_eq!(stats.method, "gu-json-unconstrained");
    assert_eq!(stats.method_figures.updates_rejected, Some(1));
    assert!(run.steps[1].refused.as_ref().unwrap().contains("expected"));
    // The last rewrite ran out of tokens mid-note: what was whole is kept.
    assert_eq!(
        memory_file(dir.path()),
        json!({"Voyage": ["The ship sails north."], "Storm": ["A gale breaks the mast."]})
    );
    let prompts = &run.llm.prompts;
    assert!(prompts[0].segments[0].contains("The memory is one JSON object"));
    assert_eq!(
        prompts[2].segments[2],
        "{\n  \"Voyage\": [\"The ship sails north.\"]\n}\n"
    );
    assert_eq!(
        run.steps[2].memory_tokens,
        stats.method_figures.memory_tokens
    );
}

const GM_JSON: [&str; 6] = [
    r#"{"Voyage": ["The ship sails north."]}"#,
    r#"{"Voyage": ["The ship sails north.", "Ice closes in."], "Crew": ["Uneasy."]}"#,
    r#"{"Voyage": []}"#,
    r#"{"Crew": ["They plan a mutiny."]}"#,
    r#"{"Voyage": ["The ship sails north into closing ice."], "Crew": ["Uneasy; they plan a mutiny."]}"#,
    "The ship sails into ice and the crew plans a mutiny.",
];

#[test]
fn gm_json_merges_by_key_then_has_the_model_remove_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_all(Variant::GmJson, &config(None), &GM_JSON, dir.path());
    let (_, stats) = finished(&run.outcome);
    // The first chunk's memory lands in an empty one: nothing to repeat.
    assert_eq!(
        calls(&run.steps),
        [
            Call::Generate,
            Call::Generate,
            Call::Dedup,
            Call::Generate,
            Call::Dedup
        ]
    );
    assert_eq!(stats.method_figures.updates_rejected, Some(0));
    assert_eq!(stats.method_figures.dedups_rejected, Some(1));
    assert_eq!(stats.run.calls, 6);
    let prompts = &run.llm.prompts;
    // The refused pass (it would have emptied the memory) kept the merge,
    // which the model saw next: the exact repeat dropped, the new key added.
    assert!(run.steps[2].refused.is_some());
    assert!(prompts[4].segments[2].contains(
        "\"Voyage\": [\"The ship sails north.\", \"Ice closes in.\"],\n  \"Crew\": [\"Uneasy.\", \"They plan a mutiny.\"]"
    ));
    // A chunk's memory is written without seeing the memory.
    assert!(!prompts[3].segments.concat().contains("Ice closes in."));
    assert_eq!(
        memory_file(dir.path()),
        serde_json::from_str::<Value>(GM_JSON[4]).unwrap()
    );
}

#[test]
fn gm_json_counts_an_unreadable_chunk_memory() {
    let dir = tempfile::tempdir().unwrap();
    let merged = r#"{"Voyage": ["The ship sails north."], "Crew": ["They plan a mutiny."]}"#;
    let replies = [
        GM_JSON[0],
        "Nothing here is JSON.",
        GM_JSON[3],
        merged,
        "Answer.",
    ];
    let run = run_all(Variant::GmJson, &config(None), &replies, dir.path());
    let (_, stats) = finished(&run.outcome);
    assert_eq!(stats.method_figures.updates_rejected, Some(1));
    assert!(run.steps[1]
        .refused
        .as_ref()
        .unwrap()
        .contains("no JSON object"));
    // The refused chunk merged nothing, so no pass followed it.
    assert_eq!(
        calls(&run.steps),
        [Call::Generate, Call::Generate, Call::Generate, Call::Dedup]
    );
    assert_eq!(stats.method_figures.dedups_rejected, Some(0));
    assert_eq!(
        memory_file(dir.path()),
        json!({"Voyage": ["The ship sails north."], "Crew": ["They plan a mutiny."]})
    );
}

const COK: [&str; 4] = [
    "Keys in memory: []\nKeys this chunk matches: []\nNew keys: [\"$.Voyage\"]\n{\"op\": \"add\", \"path\": \"$.Voyage\", \"value\": [\"The ship sails north.\"]}\n",
    "Keys in memory: [\"$.Voyage\"]\nKeys this chunk matches: [\"$.Voyage\"]\n{\"op\": \"update\", \"path\": \"$.Voyage\", \"value\": [\"The ship sails north into ice.\"]}\nNew keys: [\"$.Crew\"]\n{\"op\": \"add\", \"path\": \"$.Crew\", \"value\": \"The crew is uneasy.\"}\n{\"op\": \"add\", \"path\": \"$.Crew\", \"value\": [\"The crew is uneasy.\"]}\n",
    "{\"op\": \"update\", \"path\": \"$.Storm\", \"value\": [\"A gale.\"]}\n{\"op\": \"add\", \"path\": \"$.Voyage\", \"value\": [\"Ice closes in.\"]}\n",
    "The ship sails north into ice; the crew is uneasy.",
];

#[test]
fn cok_applies_checked_revisions_and_records_the_key_chain() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_all(Variant::Cok, &config(None), &COK, dir.path());
    let (_, stats) = finished(&run.outcome);
    assert_eq!(stats.method, "cok-unconstrained");
    // Applied: add Voyage, update Voyage, add Crew, the append to Voyage.
    // Refused: Crew as a bare string, an update of a key that does not exist.
    assert_eq!(stats.method_figures.revisions_applied, Some(4));
    assert_eq!(stats.method_figures.revisions_rejected, Some(2));
    assert_eq!(stats.method_figures.chains_complete, Some(2));
    assert_eq!(calls(&run.steps), [Call::Revise; 3]);
    let chain = run.steps[1].chain.as_ref().unwrap();
    assert_eq!(chain.matched, Some(vec!["$.Voyage".to_string()]));
    assert!(!run.steps[2].chain.as_ref().unwrap().is_complete());
    assert!(run.steps[2].rejected[0].reason.contains("$.Storm"));
    assert_eq!(
        memory_file(dir.path()),
        json!({"Voyage": ["The ship sails north into ice.", "Ice closes in."], "Crew": ["The crew is uneasy."]})
    );
    // The memory is shown in place, as it stands after each step.
    let prompts = &run.llm.prompts;
    assert_eq!(
        prompts[2].segments[2],
        "{\n  \"Voyage\": [\"The ship sails north into ice.\"],\n  \"Crew\": [\"The crew is uneasy.\"]\n}\n"
    );
    assert!(prompts[0].segments[0].contains("Keys this chunk matches: [\"$.'Harbour wall'\"]"));
}

#[test]
fn a_memory_over_the_limit_is_compressed_and_a_bad_compression_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // 40 characters, 41 tokens rendered: one over the limit.
    let long = "The ship sails north past the cape today";
    let replies = [
        "Short note.",
        long,
        // Cut off at the 40-token limit, it renders as long as the memory it
        // was to shorten.
        "The ship sails north past the cape while the whole crew grows very uneasy.",
        "Ship north; crew uneasy.",
        "Ship north; crew uneasy; mast lost.",
        "Answer.",
    ];
    let run = run_all(Variant::GuText, &config(Some(40)), &replies, dir.path());
    let (_, stats) = finished(&run.outcome);
    assert_eq!(
        calls(&run.steps),
        [
            Call::Update,
            Call::Update,
            Call::Compress,
            Call::Compress,
            Call::Update
        ]
    );
    assert_eq!(stats.method_figures.compressions, 1);
    assert_eq!(stats.method_figures.compressions_failed, 1);
    assert!(run.steps[2]
        .refused
        .as_ref()
        .unwrap()
        .contains("not shorter"));
    // Rendered prose ends in a newline.
    assert_eq!(run.steps[3].memory_tokens, replies[3].len() + 1);
    let request = run.llm.prompts[2].segments.last().unwrap();
    assert!(request.contains(&format!("grown to {} tokens", long.len() + 1)));
    assert!(request.contains("under 40"));
    assert_eq!(memory_file(dir.path()), json!(replies[4]));
}

#[test]
fn compression_gives_up_after_its_tries_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let big = r#"{"Voyage": ["The ship sails north past the cape."]}"#;
    let replies = [
        big,
        "I cannot do that.",
        big,
        r#"{"Voyage": ["North."]}"#,
        "",
        "Answer.",
    ];
    let run = run_all(Variant::GuJson, &config(Some(40)), &replies, dir.path());
    let (_, stats) = finished(&run.outcome);
    assert_eq!(
        calls(&run.steps),
        [
            Call::Update,
            Call::Compress,
            Call::Compress,
            Call::Update,
            Call::Update
        ]
    );
    assert_eq!(stats.method_figures.compressions, 0);
    assert_eq!(stats.method_figures.compressions_failed, 2);
    assert_eq!(stats.method_figures.updates_rejected, Some(1));
    assert!(run.steps[2].memory_tokens > 40);
    assert_eq!(memory_file(dir.path()), json!({"Voyage": ["North."]}));
}

/// Stopping after two calls and resuming in a new process ends where an
/// uninterrupted run does; for generate-merge the stop falls between a merge
/// and its pass without repeats.
#[test]
fn every_variant_resumes_to_the_same_result() {
    let cases: [(Variant, &[&str]); 4] = [
        (Variant::GuText, &GU_TEXT),
        (Variant::GuJson, &GU_JSON),
        (Variant::GmJson, &GM_JSON),
        (Variant::Cok, &COK),
    ];
    let config = config(None);
    for (variant, replies) in cases {
        let whole = tempfile::tempdir().unwrap();
        let expected = run_all(variant, &config, replies, whole.path());
        let dir = tempfile::tempdir().unwrap();
        let first = session(variant, &config, replies, dir.path(), false, Some(2));
        assert!(matches!(first.outcome, Outcome::Paused { completed: 2 }));
        let rest = session(variant, &config, &replies[2..], dir.path(), true, None);
        let (summary, stats) = finished(&rest.outcome);
        let (expected_summary, expected_stats) = finished(&expected.outcome);
        assert_eq!(summary, expected_summary, "{variant:?}");
        assert_eq!(
            stats.method_figures, expected_stats.method_figures,
            "{variant:?}"
        );
        assert_eq!(stats.run.calls, expected_stats.run.calls, "{variant:?}");
        assert_eq!(memory_file(dir.path()), memory_file(whole.path()));
        let record = |steps: &[Step]| {
            steps
                .iter()
                .map(|s| (s.call, s.output.clone(), s.refused.clone(), s.memory_tokens))
                .collect::<Vec<_>>()
        };
        assert_eq!(record(&rest.steps), record(&expected.steps), "{variant:?}");
    }
}

/// With SmolLM2: llguidance accepts the grammars these methods decode under,
/// and what it lets the model write reads back as intended.
#[test]
fn the_grammars_hold_on_the_real_model() {
    let source = ModelSource::Gguf {
        path: fetched_model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        name: "smollm2".into(),
    };
    let mut engine = Engine::open(&EngineConfig::new(source)).unwrap();
    let schema = book_schema();
    let prompt = engine
        .segmented_chat_prompt(None, &["The ship sails north into the ice.".to_string()])
        .unwrap();
    let generate = |engine: &mut Engine, grammar: Grammar, max_tokens: usize| {
        let options = GenerateOptions {
            max_tokens,
            grammar: Some(grammar),
            ..GenerateOptions::default()
        };
        engine.generate(&prompt, &options).unwrap().text
    };
    let memory = generate(
        &mut engine,
        Grammar::JsonSchema(memory_json_schema(&schema)),
        8,
    );
    assert!(memory.starts_with('{'), "{memory:?}");
    for memory in [json!({}), json!({"Voyage": ["The ship sails north."]})] {
        let keys = memory_keys(&schema, &memory);
        let output = generate(
            &mut engine,
            chain_constraint(&schema, &memory, &keys, 2),
            40,
        );
        let (chain, _) = parse_chain(&output);
        let listed: Vec<String> = keys.iter().map(|key| key.to_string()).collect();
        assert_eq!(chain.listed, Some(listed), "{output:?}");
        assert!(chain.matched.is_some(), "{output:?}");
    }
}
