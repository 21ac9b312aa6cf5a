//! The PRISM loop against a scripted model: revisions applied and refused,
//! cache reuse of the two memory renderings, checkpoints and resume; then the
//! token-prefix promise of amendments on the real tokenizer.

use crate::common::{fetched_model, scripted_files, ScriptedLlm};
use prism::chunk::{split, Chunk};
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig};
use prism::llm::Llm;
use prism::memory::revise::RefusalKind;
use prism::memory::{render_revision, shipped, Schema};
use prism::methods::prism::{
    MemoryMode, Prism, PrismConfig, PrismFigures, PrismState, Reading, Step, SKIPS_BEFORE_STOP,
};
use prism::methods::AnswerForm;
use prism::run::dir::RunDir;
use prism::run::{drive, NoProgress, Outcome};

fn book_schema() -> Schema {
    Schema::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/book.json")).unwrap()
}

fn config(memory: MemoryMode, updates: bool) -> PrismConfig {
    PrismConfig {
        memory,
        updates,
        query: "Summarize the story.".into(),
        revision_tokens: 256,
        answer_tokens: 256,
        // Below the notes' length, so that the final answer is a merge call.
        summary_words: Some(3),
        constrained: false,
        reading: Reading::Text,
        answer_form: AnswerForm::Summary,
    }
}

fn chunks(count: usize) -> Vec<Chunk> {
    let text: String = (0..count)
        .map(|i| format!("Paragraph {i} tells of the ship and its crew in some detail.\n\n"))
        .collect();
    split(&text, 60, &|piece: &str| piece.chars().count()).unwrap()
}

const REPLIES: [&str; 5] = [
    r#"{"op": "add", "path": "$.Voyage", "value": ["The ship sails north."]}"#,
    "```json\n{\"op\": \"add\", \"path\": \"$.Crew\", \"value\": [\"The crew is uneasy.\"]}\nnot json at all {\n```",
    r#"{"op": "update", "path": "$.Voyage", "value": ["The ship sails north into ice."]}"#,
    r#"{"op": "add", "path": "$.Voyage", "value": 42}"#,
    "The uneasy crew sails north into ice.",
];

fn run_all(
    memory: MemoryMode,
    updates: bool,
    dir: &std::path::Path,
) -> (Outcome<PrismFigures>, Vec<Step>) {
    let (outcome, steps, _) = run_scripted(memory, updates, ScriptedLlm::new(&REPLIES), dir);
    (outcome, steps)
}

/// Run the four chunks against `llm`; also hands back the model and its prompts.
fn run_scripted(
    memory: MemoryMode,
    updates: bool,
    llm: ScriptedLlm,
    dir: &std::path::Path,
) -> (Outcome<PrismFigures>, Vec<Step>, ScriptedLlm) {
    run_scripted_on(&book_schema(), memory, updates, llm, dir)
}

fn run_scripted_on(
    schema: &Schema,
    memory: MemoryMode,
    updates: bool,
    mut llm: ScriptedLlm,
    dir: &std::path::Path,
) -> (Outcome<PrismFigures>, Vec<Step>, ScriptedLlm) {
    let config = config(memory, updates);
    let method = Prism::new(&config, schema);
    let run_dir = RunDir::create(dir).unwrap();
    let files = scripted_files(&run_dir, false, None);
    let outcome = drive(&method, &mut llm, &chunks(4), &files, &mut NoProgress).unwrap();
    let steps: Vec<Step> = run_dir.read_jsonl("steps.jsonl").unwrap();
    (outcome, steps, llm)
}

#[test]
fn revisions_are_applied_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (outcome, steps) = run_all(MemoryMode::Amendments, true, dir.path());
    let Outcome::Finished { summary, stats } = outcome else {
        panic!("the run should finish")
    };
    assert_eq!(summary, REPLIES[4]);
    // Applied: Voyage, Crew, the update of Voyage. Refused: the prose-with-brace
    // attempt and the number where the schema wants a list of sentences.
    assert_eq!(stats.method_figures.revisions_applied, 3);
    assert_eq!(stats.method_figures.revisions_rejected, 2);
    assert_eq!(stats.run.calls, 5);
    assert_eq!(steps.len(), 4);
    assert!(
        steps[3].rejected[0].reason.contains("$.Voyage"),
        "{:?}",
        steps[3].rejected
    );
    let memory: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("memory.json")).unwrap())
            .unwrap();
    assert_eq!(
        memory,
        serde_json::json!({"Voyage": ["The ship sails north into ice."], "Crew": ["The crew is uneasy."]})
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("stats.json")).unwrap())
            .unwrap();
    for key in [
        "prompt_tokens",
        "reused_tokens",
        "net_tokens",
        "output_tokens",
        "cache_hit_rate",
        "cost_index",
        "calls",
        "revisions_applied",
        "revisions_rejected",
        "wall_seconds",
    ] {
        assert!(saved.get(key).is_some(), "stats.json lacks {key}");
    }
}

#[test]
fn without_updates_an_update_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (outcome, steps) = run_all(MemoryMode::InPlace, false, dir.path());
    let Outcome::Finished { stats, .. } = outcome else {
        panic!()
    };
    assert_eq!(stats.method_figures.revisions_applied, 2);
    assert_eq!(stats.method_figures.revisions_rejected, 3);
    assert!(steps[2].rejected[0]
        .reason
        .contains("updates are turned off"));
    let memory = std::fs::read_to_string(dir.path().join("memory.json")).unwrap();
    assert!(memory.contains("The ship sails north.") && !memory.contains("into ice"));
}

/// A chunk that adds nothing gets an empty reply, and that is a correct step:
/// nothing applied, nothing refused, the memory as it was.
#[test]
fn no_revision_is_a_valid_step() {
    let dir = tempfile::tempdir().unwrap();
    let replies = [
        r#"{"op": "add", "path": "$.Voyage", "value": ["The ship sails north."]}"#,
        "",
        "(nothing: this text adds nothing the query needs)",
        "",
        "The ship sails north.",
    ];
    let (outcome, steps, _) = run_scripted(
        MemoryMode::Amendments,
        true,
        ScriptedLlm::new(&replies),
        dir.path(),
    );
    let Outcome::Finished { stats, .. } = outcome else {
        panic!("the run should finish")
    };
    assert_eq!(stats.method_figures.revisions_applied, 1);
    assert_eq!(stats.method_figures.revisions_rejected, 0);
    for step in &steps[1..] {
        assert!(
            step.applied.is_empty() && step.rejected.is_empty(),
            "{step:?}"
        );
    }
    let memory = std::fs::read_to_string(dir.path().join("memory.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&memory).unwrap(),
        serde_json::json!({"Voyage": ["The ship sails north."]})
    );
}

/// A note the memory already holds, or one lifted from the prompt's own
/// rules, is taken out of a revision that also says something new, with its
/// reason, and counted apart from invalid lines.
#[test]
fn duplicates_and_echoes_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let replies = [
        r#"{"op": "add", "path": "$.Voyage", "value": ["The ship sails north from Archangel."]}"#,
        concat!(
            r#"{"op": "add", "path": "$.Voyage", "value": ["The ship sails north from Archangel!", "Ice closes in around the ship."]}"#,
            "\n",
            r#"{"op": "add", "path": "$.Rules", "value": ["Do not repeat a note the memory already has.", "The crew fears the ice."]}"#
        ),
        r#"{"op": "add", "path": "$.Crew", "value": "not a list"}"#,
        "",
        "The ship sails north and is caught in the ice.",
    ];
    let (outcome, steps, _) = run_scripted(
        MemoryMode::InPlace,
        true,
        ScriptedLlm::new(&replies),
        dir.path(),
    );
    let Outcome::Finished { stats, .. } = outcome else {
        panic!("the run should finish")
    };
    assert_eq!(stats.method_figures.revisions_duplicate, 1);
    assert_eq!(stats.method_figures.revisions_echo, 1);
    assert_eq!(stats.method_figures.revisions_rejected, 1);
    assert_eq!(stats.method_figures.revision_steps_stopped, 0);
    let kinds: Vec<RefusalKind> = steps[1].rejected.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [RefusalKind::Duplicate, RefusalKind::Echo]);
    assert!(steps[1].rejected[0].reason.contains("duplicate"));
    assert!(steps[1].rejected[1].reason.contains("echo"));
    let memory: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("memory.json")).unwrap())
            .unwrap();
    assert_eq!(
        memory,
        serde_json::json!({
            "Voyage": ["The ship sails north from Archangel.", "Ice closes in around the ship."],
            "Rules": ["The crew fears the ice."],
        })
    );
}

/// A line that repeats or rewords a note is skipped and the step goes on:
/// what the model writes after it is applied, and the skip is logged and
/// counted.
#[test]
fn a_line_that_goes_round_in_circles_is_skipped_and_the_step_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    // Each reply is cut at `revision_tokens` characters: the lines are short.
    let reworded = r#"{"op": "add", "path": "$.Voyage", "value": ["The old ship sails north."]}"#;
    let replies = [
        [
            r#"{"op": "add", "path": "$.Voyage", "value": ["The ship sails north."]}"#,
            reworded,
            r#"{"op": "add", "path": "$.Voyage", "value": ["A sledge is sighted."]}"#,
            "",
        ]
        .join("\n"),
        String::new(),
        String::new(),
        String::new(),
        "The ship sails north.".to_string(),
    ];
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let (outcome, steps, _) = run_scripted(
        MemoryMode::Amendments,
        true,
        ScriptedLlm::new(&replies),
        dir.path(),
    );
    let Outcome::Finished { stats, .. } = outcome else {
        panic!("the run should finish")
    };
    assert_eq!(steps[0].skipped, [reworded]);
    assert_eq!(steps[0].stopped_before, None);
    assert_eq!(steps[0].applied.len(), 2);
    assert!(steps[0].rejected.is_empty(), "{:?}", steps[0].rejected);
    assert_eq!(stats.method_figures.revision_lines_skipped, 1);
    assert_eq!(stats.method_figures.revision_steps_stopped, 0);
    assert_eq!(stats.method_figures.revisions_duplicate, 0);
}

/// Lines refused [`SKIPS_BEFORE_STOP`] times in a row end the step: the
/// model is going round in circles and has nothing new to note.
#[test]
fn a_step_stops_after_refused_lines_in_a_row() {
    let dir = tempfile::tempdir().unwrap();
    // Short lines: each reply is cut at `revision_tokens` characters.
    let line = |note: &str| format!(r#"{{"op": "add", "path": "$.V", "value": ["{note}"]}}"#);
    let mut lines = vec![line("Ice.")];
    lines.extend((0..SKIPS_BEFORE_STOP).map(|_| line("Ice.")));
    lines.push(line("Sledge."));
    lines.push(String::new());
    let replies = [
        lines.join("\n"),
        String::new(),
        String::new(),
        String::new(),
        "The ship sails north.".to_string(),
    ];
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let (outcome, steps, _) = run_scripted(
        MemoryMode::Amendments,
        true,
        ScriptedLlm::new(&replies),
        dir.path(),
    );
    let Outcome::Finished { stats, .. } = outcome else {
        panic!("the run should finish")
    };
    assert_eq!(steps[0].skipped.len(), SKIPS_BEFORE_STOP - 1);
    assert_eq!(steps[0].stopped_before, Some(line("Ice.")));
    assert_eq!(
        steps[0].applied.len(),
        1,
        "the line after the stop is never applied"
    );
    assert_eq!(stats.method_figures.revision_steps_stopped, 1);
    assert_eq!(
        stats.method_figures.revision_lines_skipped,
        SKIPS_BEFORE_STOP - 1
    );
}

/// Adding again at a key the step already wrote is going round too, even
/// when the note says something new: without updates every such line is
/// refused, so it is skipped rather than applied.
#[test]
fn a_line_that_adds_again_at_a_key_it_wrote_is_skipped() {
    let code = Schema::from_value(&serde_json::from_str(shipped::CODE).unwrap()).unwrap();
    let note = |key: &str, purpose: &str| {
        format!(
            r#"{{"op": "add", "path": "$.{key}", "value": {{"purpose": "{purpose}", "input": "x", "output": "y", "procedure": "z"}}}}"#
        )
    };
    let again = note("sizes", "formats file sizes");
    let replies = [
        [note("sizes", "the package"), again.clone(), String::new()].join("\n"),
        note("parse", "reads a number"),
        String::new(),
        String::new(),
        "sizes".to_string(),
    ];
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().unwrap();
    let (outcome, steps, _) = run_scripted_on(
        &code,
        MemoryMode::Amendments,
        false,
        ScriptedLlm::new(&replies),
        dir.path(),
    );
    let Outcome::Finished { stats, .. } = outcome else {
        panic!("the run should finish")
    };
    assert_eq!(steps[0].skipped, [again]);
    assert_eq!(steps[0].applied.len(), 1);
    assert!(steps[0].rejected.is_empty(), "{:?}", steps[0].rejected);
    // A new key in a later step is a new note, not a loop.
    assert!(steps[1].skipped.is_empty());
    assert_eq!(steps[1].applied.len(), 1);
    assert_eq!(stats.method_figures.revision_lines_skipped, 1);
}

/// Reading summaries, each chunk is summarized by a call of its own and the
/// revision call is shown that summary, never the chunk; the summary is
/// logged with its step and its call counted.
#[test]
fn a_summary_of_each_chunk_is_what_the_revision_step_reads() {
    let dir = tempfile::tempdir().unwrap();
    let schema = book_schema();
    let config = PrismConfig {
        reading: Reading::Summary,
        ..config(MemoryMode::Amendments, true)
    };
    let method = Prism::new(&config, &schema);
    let mut replies = Vec::new();
    for (i, reply) in REPLIES[..4].iter().enumerate() {
        replies.push(format!(
            "The uneasy crew sails the ship north into ice, part {i}."
        ));
        replies.push("- Ada Quill: the navigator".to_string());
        replies.push(reply.to_string());
    }
    replies.push(REPLIES[4].to_string());
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let mut llm = ScriptedLlm::with_cache_slots(&replies, 2);
    let run_dir = RunDir::create(dir.path()).unwrap();
    let files = scripted_files(&run_dir, false, None);
    let chunks = chunks(4);
    let Outcome::Finished { summary, stats } =
        drive(&method, &mut llm, &chunks, &files, &mut NoProgress).unwrap()
    else {
        panic!("the run should finish")
    };
    assert_eq!(summary, REPLIES[4]);
    assert_eq!(stats.run.calls, 13);
    // The book schema has no `people`: the people listed are refused.
    assert_eq!(stats.method_figures.revisions_applied, 3);
    let steps: Vec<Step> = run_dir.read_jsonl("steps.jsonl").unwrap();
    for (i, (step, chunk)) in steps.iter().zip(&chunks).enumerate() {
        let read = format!("The uneasy crew sails the ship north into ice, part {i}.");
        assert_eq!(step.summary.as_deref(), Some(read.as_str()));
        assert_eq!(step.summary_calls.len(), 2);
        assert!(step.people.is_empty());
        let summarizing = llm.prompts[3 * i].segments.concat();
        assert!(summarizing.contains(chunk.text.trim()), "{summarizing}");
        let listing = llm.prompts[3 * i + 1].segments.concat();
        assert!(listing.starts_with("Who are the people"), "{listing}");
        assert!(listing.contains(chunk.text.trim()), "{listing}");
        let revising = llm.prompts[3 * i + 2].segments.concat();
        assert!(revising.contains(&read), "{revising}");
        assert!(!revising.contains(chunk.text.trim()), "{revising}");
    }
}

/// PRISM with amendments reading chunk summaries, and the `summary` schema.
fn reading_summaries() -> (PrismConfig, Schema) {
    let schema =
        Schema::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/summary.json")).unwrap();
    let config = PrismConfig {
        reading: Reading::Summary,
        ..config(MemoryMode::Amendments, true)
    };
    (config, schema)
}

/// The people a chunk's own call lists become entries under `people`, added
/// after the step's notes, and the summary opens by saying who they are, in
/// the words of their notes, before the events it condenses.
#[test]
fn the_people_listed_go_into_the_memory_and_lead_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let (config, schema) = reading_summaries();
    let method = Prism::new(&config, &schema);
    let replies = [
        "The ship sails north with Ada Quill.",
        "The people:\n- Ada Quill: the navigator\n- Ada Quill: again",
        r#"{"op": "add", "path": "$.events", "value": "The ship sails north with Ada Quill."}"#,
    ];
    let mut llm = ScriptedLlm::new(&replies);
    let run_dir = RunDir::create(dir.path()).unwrap();
    let files = scripted_files(&run_dir, false, None);
    let Outcome::Finished { summary, stats } =
        drive(&method, &mut llm, &chunks(1), &files, &mut NoProgress).unwrap()
    else {
        panic!("the run should finish")
    };
    assert_eq!(
        summary,
        "The people in it include Ada Quill (the navigator). The ship sails north with Ada Quill."
    );
    assert_eq!(stats.method_figures.revisions_applied, 2);
    let memory: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("memory.json")).unwrap())
            .unwrap();
    assert_eq!(
        memory["people"],
        serde_json::json!({"Ada Quill": ["the navigator"]})
    );
    let steps: Vec<Step> = run_dir.read_jsonl("steps.jsonl").unwrap();
    assert_eq!(steps[0].people.len(), 1);
    assert_eq!(steps[0].applied.len(), 1);
    assert_eq!(
        llm.prompts.len(),
        3,
        "notes within the target are not merged"
    );
}

/// A revision call that stops early leaves the rest of the chunk's summary
/// unnoted; the step shows that rest in a further call, which notes it.
#[test]
fn a_step_that_stopped_early_notes_the_rest_of_its_summary_in_another_call() {
    let dir = tempfile::tempdir().unwrap();
    let (config, schema) = reading_summaries();
    let method = Prism::new(&config, &schema);
    let note = |text: &str| format!(r#"{{"op": "add", "path": "$.events", "value": "{text}"}}"#);
    let mut first = vec![note("The ship sails north.")];
    first.extend((0..SKIPS_BEFORE_STOP).map(|_| note("The ship sails north.")));
    let replies = [
        "The ship sails north. Ice closes in around the ship. A sledge is sighted.".to_string(),
        String::new(),
        first.join("\n"),
        [
            note("Ice closes in around the ship."),
            note("A sledge is sighted."),
        ]
        .join("\n"),
    ];
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let mut llm = ScriptedLlm::new(&replies);
    let run_dir = RunDir::create(dir.path()).unwrap();
    let files = scripted_files(&run_dir, false, None);
    let Outcome::Finished { summary, stats } =
        drive(&method, &mut llm, &chunks(1), &files, &mut NoProgress).unwrap()
    else {
        panic!("the run should finish")
    };
    let steps: Vec<Step> = run_dir.read_jsonl("steps.jsonl").unwrap();
    assert_eq!(steps[0].continuations, 1);
    assert_eq!(steps[0].applied.len(), 3);
    let continued = llm
        .prompts
        .iter()
        .map(|prompt| prompt.segments.concat())
        .rfind(|prompt| prompt.contains("Summary of chunk"))
        .unwrap();
    assert!(
        continued.contains("Ice closes in around the ship. A sledge is sighted.")
            && !continued.contains("The ship sails north. Ice"),
        "the further call shows only the rest: {continued}"
    );
    assert!(summary.contains("sledge"), "{summary}");
    assert_eq!(stats.method_figures.revisions_applied, 3);
}

#[test]
fn amendments_reuse_more_of_the_prompt_than_in_place() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hit = |outcome: Outcome<PrismFigures>| match outcome {
        Outcome::Finished { stats, .. } => stats.figures.cache_hit_rate,
        Outcome::Paused { .. } => panic!("the run should finish"),
    };
    let amendments = hit(run_all(MemoryMode::Amendments, true, a.path()).0);
    let in_place = hit(run_all(MemoryMode::InPlace, true, b.path()).0);
    assert!(
        amendments > in_place,
        "amendments {amendments} vs in place {in_place}"
    );
}

/// When the amendments would push a prompt past the context, they are folded
/// into one object: the run goes on, with the same memory and answer.
#[test]
fn amendments_that_outgrow_the_context_are_folded_into_the_memory() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let roomy = ScriptedLlm::new(&REPLIES);
    let (_, roomy_steps, roomy) = run_scripted(MemoryMode::Amendments, true, roomy, a.path());
    assert!(roomy_steps.iter().all(|step| !step.consolidated));
    // Room for every prompt but the last chunk's, which carries three revision lines.
    let sizes: Vec<usize> = roomy
        .prompts
        .iter()
        .map(|prompt| roomy.prompt_tokens(prompt).unwrap())
        .collect();
    assert!(sizes[..3].iter().all(|&size| size < sizes[3]), "{sizes:?}");
    let context = sizes[3] - 1 + config(MemoryMode::Amendments, true).revision_tokens;
    let tight = ScriptedLlm::new(&REPLIES).with_context(context);

    let (outcome, steps, tight) = run_scripted(MemoryMode::Amendments, true, tight, b.path());
    let Outcome::Finished { summary, stats } = outcome else {
        panic!("the run should finish")
    };
    assert_eq!(summary, REPLIES[4]);
    assert_eq!(stats.method_figures.consolidations, 1);
    let consolidated: Vec<bool> = steps.iter().map(|step| step.consolidated).collect();
    assert_eq!(consolidated, [false, false, false, true]);
    let last = tight.prompts[3].segments.concat();
    assert!(tight.prompt_tokens(&tight.prompts[3]).unwrap() < sizes[3]);
    for revision in steps.iter().flat_map(|step| &step.applied) {
        assert!(!last.contains(render_revision(revision).trim()), "{last}");
    }
    assert!(last.contains("The ship sails north into ice."), "{last}");
    let memory = |dir: &std::path::Path| std::fs::read_to_string(dir.join("memory.json")).unwrap();
    assert_eq!(memory(a.path()), memory(b.path()));
}

#[test]
fn an_interrupted_run_resumes_to_the_same_result() {
    let schema = book_schema();
    let config = config(MemoryMode::Amendments, true);
    let method = Prism::new(&config, &schema);
    let whole = tempfile::tempdir().unwrap();
    let (
        Outcome::Finished {
            summary: expected, ..
        },
        expected_steps,
    ) = run_all(MemoryMode::Amendments, true, whole.path())
    else {
        panic!()
    };

    let dir = tempfile::tempdir().unwrap();
    let run_dir = RunDir::create(dir.path()).unwrap();
    let mut files = scripted_files(&run_dir, false, Some(2));
    let mut llm = ScriptedLlm::new(&REPLIES);
    let first = drive(&method, &mut llm, &chunks(4), &files, &mut NoProgress).unwrap();
    assert!(matches!(first, Outcome::Paused { completed: 2 }));
    // Starting over in the same directory without --resume is refused.
    files.stop_after = None;
    assert!(drive(
        &method,
        &mut ScriptedLlm::new(&REPLIES),
        &chunks(4),
        &files,
        &mut NoProgress
    )
    .is_err());
    // A new process picks up at chunk 3 with the model's replies from there on.
    files.resume = true;
    let mut llm = ScriptedLlm::new(&REPLIES[2..]);
    let Outcome::Finished { summary, .. } =
        drive(&method, &mut llm, &chunks(4), &files, &mut NoProgress).unwrap()
    else {
        panic!()
    };
    assert_eq!(summary, expected);
    let steps: Vec<Step> = run_dir.read_jsonl("steps.jsonl").unwrap();
    assert_eq!(steps.len(), expected_steps.len());
    let applied = |steps: &[Step]| steps.iter().map(|s| s.applied.clone()).collect::<Vec<_>>();
    assert_eq!(applied(&steps), applied(&expected_steps));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("memory.json")).unwrap(),
        std::fs::read_to_string(whole.path().join("memory.json")).unwrap()
    );
    // A checkpoint made with other settings is refused.
    files.fingerprint = "other".into();
    let err = drive(
        &method,
        &mut ScriptedLlm::new(&REPLIES),
        &chunks(4),
        &files,
        &mut NoProgress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("different settings"), "{err}");
}

/// With SmolLM2's tokenizer: the prompt of step i, up to the end of its memory,
/// is a token prefix of the prompt of step i + 1 when memory is kept as amendments.
#[test]
fn amendments_keep_earlier_prompt_tokens_as_a_prefix() {
    let source = ModelSource::Gguf {
        path: fetched_model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        name: "smollm2".into(),
    };
    let engine = Engine::open(&EngineConfig::new(source)).unwrap();
    let schema = book_schema();
    let config = config(MemoryMode::Amendments, true);
    let method = Prism::new(&config, &schema);
    let mut state = PrismState::new(&schema);
    let chunk = &chunks(1)[0];
    let lines = [
        r#"{"op": "add", "path": "$.'Walton letters'", "value": ["Robert Walton writes to his sister Margaret."]}"#,
        r#"{"op": "add", "path": "$.Victor", "value": ["Victor is found on the ice, near death."]}"#,
        r#"{"op": "update", "path": "$.'Walton letters'", "value": ["Walton, at sea, writes to Margaret: 1.5 km, naïve hopes."]}"#,
    ];
    let mut previous: Option<Vec<u32>> = None;
    for line in lines {
        let prompt = method.revision_prompt(&state, chunk, 1, None);
        // Everything before the chunk: system turn, preamble, memory.
        let memory_end = prompt.segments.len() - 2;
        let ids = engine
            .segmented_chat_prompt(prompt.system.as_deref(), &prompt.segments[..memory_end])
            .unwrap();
        // Drop the template's closing tokens (end of turn, assistant opener).
        let template = engine
            .segmented_chat_prompt(prompt.system.as_deref(), &[])
            .unwrap();
        let closer = template.len() - common(&template, &ids);
        let head = &ids[..ids.len() - closer];
        if let Some(previous) = &previous {
            assert!(
                head.starts_with(previous),
                "step prompt is not an extension of the last one"
            );
        }
        previous = Some(head.to_vec());
        let revision = prism::memory::parse_revisions(line).remove(0).unwrap();
        state.memory = prism::memory::apply(&state.memory, &revision, &schema).unwrap();
        state.amendments.push(revision.clone());
        assert!(render_revision(&revision).ends_with('\n'));
    }
}

/// Length of the common prefix of two id lists.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
