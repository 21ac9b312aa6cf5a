//! The summarizing baselines (incremental, hierarchical, detail, whole)
//! against a scripted model: calls and steps counted, compression when the
//! running summary is too long or cut off, merges level by level within the
//! context, earlier summaries as context, the whole document in one call or a
//! clear refusal, the degeneration figures of stats.json, and resume after a stop.

use crate::common::{assert_one_error_line, run_prism, scripted_files, ScriptedLlm};
use prism::chunk::{split, Chunk};
use prism::llm::Llm;
use prism::methods::detail::{self, Detail, DetailConfig};
use prism::methods::hierarchical::{self, Hierarchical, HierarchicalConfig};
use prism::methods::incremental::{self, Incremental, IncrementalConfig, Kept};
use prism::methods::whole::{Whole, WholeConfig};
use prism::methods::MethodSpec;
use prism::run::dir::RunDir;
use prism::run::{drive, Method, NoProgress, Outcome, Stats};

const QUERY: &str = "Summarize the story.";

fn chunks(count: usize) -> Vec<Chunk> {
    let text: String = (0..count)
        .map(|i| format!("Paragraph {i} tells of the ship and its crew in some detail.\n\n"))
        .collect();
    let chunks = split(&text, 70, &|piece: &str| piece.chars().count()).unwrap();
    assert_eq!(chunks.len(), count);
    chunks
}

/// Run `method` to the end in `dir`, returning the summary, the stats and the steps.
fn finish<M: Method>(
    method: &M,
    llm: &mut dyn Llm,
    chunks: &[Chunk],
    dir: &std::path::Path,
) -> (String, Stats<M::Figures>, Vec<M::Step>) {
    let run_dir = RunDir::create(dir).unwrap();
    let files = scripted_files(&run_dir, false, None);
    let Outcome::Finished { summary, stats } =
        drive(method, llm, chunks, &files, &mut NoProgress).unwrap()
    else {
        panic!("the run should finish")
    };
    assert_eq!(
        std::fs::read_to_string(dir.join("summary.txt")).unwrap(),
        format!("{summary}\n")
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("stats.json")).unwrap()).unwrap();
    assert_eq!(saved["calls"], stats.run.calls);
    assert_eq!(saved["method"], stats.method);
    let steps = run_dir.read_jsonl(RunDir::STEPS).unwrap();
    assert_eq!(steps.len(), stats.run.steps);
    (summary, stats, steps)
}

fn incremental_config(max_summary_tokens: usize) -> IncrementalConfig {
    IncrementalConfig {
        query: QUERY.into(),
        max_summary_tokens,
        summary_words: None,
    }
}

#[test]
fn incremental_updates_the_summary_with_each_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let config = incremental_config(900);
    let method = Incremental::new(&config);
    let mut llm = ScriptedLlm::new(&[
        "The ship sails.",
        "The ship sails north.",
        "The ship sails north into ice.",
    ]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(3), dir.path());
    let steps: Vec<incremental::Step> = steps;
    assert_eq!(summary, "The ship sails north into ice.");
    assert_eq!(
        (stats.run.calls, stats.run.steps, stats.run.chunks),
        (3, 3, 3)
    );
    assert_eq!(stats.method, "incremental");
    assert_eq!(stats.method_figures.compressions, 0);
    assert_eq!(stats.method_figures.compression_failures, 0);
    assert!(steps.iter().all(|step| step.kept == Kept::Update));
    // Instructions, then the summary so far, then the chunk.
    let segments = &llm.prompts[2].segments;
    assert!(segments[1].contains("The ship sails north."));
    assert!(segments[2].contains("Paragraph 2"));
    assert_eq!(llm.prompts[1].segments[0], segments[0]);
}

#[test]
fn incremental_compresses_a_summary_too_long_or_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    // Tokens are characters here: a summary of 60 or more is too long.
    let config = incremental_config(60);
    let method = Incremental::new(&config);
    let long = "The ship sails north into the ice while the whole crew grows uneasy.";
    let mut llm = ScriptedLlm::new(&[
        "The ship sails.",
        long,
        // The first compression is still too long; the second fits.
        "The ship sails north into the ice; the crew grows uneasy, and worse.",
        "The ship sails north; the crew is uneasy.",
        "The ship is trapped in the ice and the",
        "The ship is trapped in the ice.",
    ]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(3), dir.path());
    let steps: Vec<incremental::Step> = steps;
    assert_eq!(summary, "The ship is trapped in the ice.");
    assert_eq!((stats.run.calls, stats.run.steps), (6, 3));
    assert_eq!(stats.method_figures.compressions, 3);
    assert_eq!(stats.method_figures.compression_failures, 0);
    assert_eq!(steps[1].compressions.len(), 2);
    assert_eq!(steps[1].kept, Kept::Compression(1));
    assert_eq!(steps[2].kept, Kept::Compression(0));
    // Compression sees the update's summary as the budget left it, and the
    // next update the compressed one.
    let cut_off: String = long.chars().take(60).collect();
    assert!(llm.prompts[2].segments[1].contains(&format!("{cut_off}\n")));
    assert!(llm.prompts[4].segments[1].contains("the crew is uneasy."));
    // Each try asks for fewer words, so a greedy model does not answer the same.
    assert_ne!(llm.prompts[2].segments[2], llm.prompts[3].segments[2]);
}

#[test]
fn incremental_compresses_a_reply_stopped_by_the_budget_even_on_a_full_stop() {
    let dir = tempfile::tempdir().unwrap();
    let config = incremental_config(60);
    let method = Incremental::new(&config);
    // The budget stops this reply after its first sentence and three newlines:
    // trimmed, it counts 57 tokens and ends a sentence, yet it was cut off.
    let rambling = "The ship sails north into the ice and the crew is uneasy.\n\n\nThe ship";
    let mut llm = ScriptedLlm::new(&[rambling, "The ship is in the ice."]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(1), dir.path());
    let steps: Vec<incremental::Step> = steps;
    assert_eq!(steps[0].update.tokens.output_tokens, 60);
    assert_eq!(stats.method_figures.compressions, 1);
    assert_eq!(steps[0].kept, Kept::Compression(0));
    assert_eq!(summary, "The ship is in the ice.");
}

#[test]
fn incremental_keeps_the_best_attempt_when_every_compression_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = incremental_config(60);
    let method = Incremental::new(&config);
    let mut llm = ScriptedLlm::new(&[
        "The ship sails north into the ice while the whole crew grows uneasy and",
        "The ship sails north into the ice while the crew grows uneasy at last.",
        "The ship sails north into the ice, the crew",
        "",
    ]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(1), dir.path());
    let steps: Vec<incremental::Step> = steps;
    assert_eq!(stats.run.calls, 4);
    assert_eq!(stats.method_figures.compressions, 3);
    assert_eq!(stats.method_figures.compression_failures, 1);
    assert!(steps[0].failed);
    // Within budget but cut off beats too long; an empty answer is worst.
    assert_eq!(steps[0].kept, Kept::Compression(1));
    assert_eq!(summary, "The ship sails north into the ice, the crew");
}

#[test]
fn incremental_keeps_the_previous_summary_when_an_update_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let config = incremental_config(900);
    let method = Incremental::new(&config);
    let mut llm = ScriptedLlm::new(&["The ship sails.", "  "]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(2), dir.path());
    let steps: Vec<incremental::Step> = steps;
    assert_eq!(summary, "The ship sails.");
    assert_eq!(stats.run.calls, 2);
    assert_eq!(steps[1].kept, Kept::Previous);
}

fn hierarchical_config(max_summary_tokens: usize) -> HierarchicalConfig {
    HierarchicalConfig {
        query: QUERY.into(),
        max_summary_tokens,
        summary_words: None,
    }
}

#[test]
fn hierarchical_merges_what_fits_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let config = hierarchical_config(900);
    let method = Hierarchical::new(&config, ScriptedLlm::new(&[]).context_tokens());
    let mut llm = ScriptedLlm::new(&["A sails.", "B freezes.", "C returns.", "All of it."]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(3), dir.path());
    let steps: Vec<hierarchical::Step> = steps;
    assert_eq!(summary, "All of it.");
    assert_eq!((stats.run.calls, stats.run.steps), (4, 4));
    assert_eq!(stats.method_figures.levels, 2);
    // Two levels expected: the chunks get 0.65 of the top budget, the merge all of it.
    assert!(steps[..3]
        .iter()
        .all(|step| step.level == 0 && step.call.max_tokens == 585));
    assert_eq!((steps[3].level, steps[3].sources.clone()), (1, 0..3));
    assert_eq!(steps[3].call.max_tokens, 900);
    let merge = llm.prompts[3].segments.join("");
    assert!(merge.contains("A sails.") && merge.contains("C returns."));
}

#[test]
fn hierarchical_of_one_chunk_is_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let config = hierarchical_config(900);
    let method = Hierarchical::new(&config, 1_000_000);
    let mut llm = ScriptedLlm::new(&["Only this."]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(1), dir.path());
    let steps: Vec<hierarchical::Step> = steps;
    assert_eq!(summary, "Only this.");
    assert_eq!(stats.run.calls, 1);
    assert_eq!(steps[0].call.max_tokens, 900);
}

/// Replies `Summary 1.`, `Summary 2.` … in call order.
fn numbered_replies(count: usize) -> Vec<String> {
    (1..=count).map(|i| format!("Summary {i}.")).collect()
}

#[test]
fn hierarchical_merges_level_by_level_within_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let config = hierarchical_config(40);
    let context_tokens = 640;
    let method = Hierarchical::new(&config, context_tokens);
    let replies = numbered_replies(40);
    let replies: Vec<&str> = replies.iter().map(String::as_str).collect();
    let mut llm = ScriptedLlm::new(&replies).with_context(context_tokens);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(12), dir.path());
    let steps: Vec<hierarchical::Step> = steps;
    assert_eq!(summary, format!("Summary {}.", stats.run.calls));
    assert_eq!(stats.run.calls, stats.run.steps);
    let levels = stats.method_figures.levels;
    assert!(levels >= 3, "{levels} levels");
    // Each level's merges cover the level below in order, one run after another;
    // a merge after the first of its level sees the one before it.
    for level in 1..levels {
        let merges: Vec<&hierarchical::Step> =
            steps.iter().filter(|step| step.level == level).collect();
        let below = steps.iter().filter(|step| step.level == level - 1).count();
        let mut next = 0;
        for (i, merge) in merges.iter().enumerate() {
            assert_eq!(merge.sources.start, next);
            assert!(
                merge.sources.len() >= 2 || below == 1,
                "{:?}",
                merge.sources
            );
            assert_eq!(merge.with_context, i > 0);
            next = merge.sources.end;
        }
        assert_eq!(next, below);
    }
    for (prompt, step) in llm.prompts.iter().zip(&steps) {
        let tokens = llm.prompt_tokens(prompt).unwrap();
        assert!(tokens + step.call.max_tokens <= context_tokens);
    }
}

#[test]
fn hierarchical_refuses_a_level_that_cannot_shrink() {
    let dir = tempfile::tempdir().unwrap();
    let config = hierarchical_config(40);
    // Room for a chunk's summary, never for a merge of two.
    let context_tokens = 520;
    let method = Hierarchical::new(&config, context_tokens);
    let long = "A summary long enough that no two of them fit one merge call at all.";
    let mut llm = ScriptedLlm::new(&[long; 8]).with_context(context_tokens);
    let run_dir = RunDir::create(dir.path()).unwrap();
    let files = scripted_files(&run_dir, false, None);
    let err = drive(&method, &mut llm, &chunks(3), &files, &mut NoProgress).unwrap_err();
    assert!(err.to_string().contains("no two summaries"), "{err}");
}

fn detail_config(detail: f64, recursive: bool) -> DetailConfig {
    DetailConfig {
        query: QUERY.into(),
        detail,
        min_chunk_tokens: 500,
        recursive,
        max_summary_tokens: 200,
    }
}

#[test]
fn detail_joins_the_chunk_summaries() {
    let dir = tempfile::tempdir().unwrap();
    let config = detail_config(0.0, false);
    let method = Detail::new(&config);
    let mut llm = ScriptedLlm::new(&["One.", "Two.", "Three."]);
    let (summary, stats, steps) = finish(&method, &mut llm, &chunks(3), dir.path());
    let steps: Vec<detail::Step> = steps;
    assert_eq!(summary, "One.\n\nTwo.\n\nThree.");
    assert_eq!((stats.run.calls, stats.run.steps), (3, 3));
    assert_eq!(stats.method, "detail");
    assert!(steps.iter().all(|step| step.earlier == 0));
    assert!(!llm.prompts[2].segments.join("").contains("One."));
}

#[test]
fn recursive_detail_shows_the_earlier_summaries_as_a_growing_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let config = detail_config(0.0, true);
    let method = Detail::new(&config);
    let mut llm = ScriptedLlm::new(&["One.", "Two.", "Three."]);
    let (_, stats, steps) = finish(&method, &mut llm, &chunks(3), dir.path());
    let steps: Vec<detail::Step> = steps;
    assert_eq!(stats.method, "detail-recursive");
    let earlier: Vec<usize> = steps.iter().map(|step| step.earlier).collect();
    assert_eq!(earlier, vec![0, 1, 2]);
    let (second, third) = (&llm.prompts[1].segments, &llm.prompts[2].segments);
    assert_eq!(second[..3], third[..3]);
    assert!(third[3].contains("Two."));
    // The third call reuses the cached prefix up to the summaries before it.
    assert!(steps[2].call.tokens.reused_tokens > steps[1].call.tokens.reused_tokens);
}

#[test]
fn recursive_detail_keeps_the_latest_summaries_that_fit() {
    let dir = tempfile::tempdir().unwrap();
    let config = detail_config(0.0, true);
    let method = Detail::new(&config);
    let summary = "A summary of forty characters or so, yes.";
    let context_tokens = 690;
    let mut llm = ScriptedLlm::new(&[summary; 6]).with_context(context_tokens);
    let (_, _, steps) = finish(&method, &mut llm, &chunks(6), dir.path());
    let steps: Vec<detail::Step> = steps;
    let earlier: Vec<usize> = steps.iter().map(|step| step.earlier).collect();
    assert!(earlier[5] < 5 && earlier[5] > 0, "{earlier:?}");
    for (prompt, step) in llm.prompts.iter().zip(&steps) {
        assert!(llm.prompt_tokens(prompt).unwrap() + step.call.max_tokens <= context_tokens);
    }
}

#[test]
fn only_detail_chooses_its_chunk_size() {
    let detail = MethodSpec::Detail {
        config: detail_config(1.0, false),
    };
    assert_eq!(detail.chunk_tokens(1000, 3000).unwrap(), 500);
    let out_of_range = MethodSpec::Detail {
        config: detail_config(1.5, false),
    };
    assert!(out_of_range.chunk_tokens(1000, 3000).is_err());
    let incremental = MethodSpec::Incremental {
        config: incremental_config(900),
    };
    assert_eq!(incremental.chunk_tokens(1000, 3000).unwrap(), 1000);
}

#[test]
fn detail_out_of_range_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let document = dir.path().join("doc.txt");
    std::fs::write(&document, "Some text.\n").unwrap();
    let out = dir.path().join("run");
    let result = run_prism(&[
        "summarize",
        document.to_str().unwrap(),
        "--method",
        "detail",
        "--detail",
        "1.5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_one_error_line(&result, "--detail must be between 0 and 1");
}

/// Run `spec` over `chunks`: once straight through, once stopped after
/// `stop_after` units and resumed with the rest of the script. Both must
/// give the same summary, calls and steps.
fn assert_resume_gives_the_same(
    spec: MethodSpec,
    chunks: &[Chunk],
    replies: &[&str],
    stop_after: usize,
) {
    let whole = tempfile::tempdir().unwrap();
    let whole_dir = RunDir::create(whole.path()).unwrap();
    let mut llm = ScriptedLlm::new(replies);
    let straight = scripted_files(&whole_dir, false, None);
    let Outcome::Finished { summary, stats } = spec
        .run(&mut llm, chunks, &straight, &mut NoProgress)
        .unwrap()
    else {
        panic!("the run should finish")
    };

    let parted = tempfile::tempdir().unwrap();
    let parted_dir = RunDir::create(parted.path()).unwrap();
    let mut first = ScriptedLlm::new(replies);
    let stopped = scripted_files(&parted_dir, false, Some(stop_after));
    let outcome = spec
        .run(&mut first, chunks, &stopped, &mut NoProgress)
        .unwrap();
    assert!(matches!(outcome, Outcome::Paused { completed } if completed == stop_after));
    let mut rest = ScriptedLlm::new(&replies[first.prompts.len()..]);
    let resumed = scripted_files(&parted_dir, true, None);
    let Outcome::Finished {
        summary: again,
        stats: stats_again,
    } = spec
        .run(&mut rest, chunks, &resumed, &mut NoProgress)
        .unwrap()
    else {
        panic!("the resumed run should finish")
    };
    assert_eq!(again, summary);
    assert_eq!(
        (stats_again.run.calls, stats_again.run.steps),
        (stats.run.calls, stats.run.steps)
    );
    assert_eq!(
        std::fs::read_to_string(whole.path().join("steps.jsonl"))
            .unwrap()
            .lines()
            .count(),
        std::fs::read_to_string(parted.path().join("steps.jsonl"))
            .unwrap()
            .lines()
            .count(),
    );
}

#[test]
fn incremental_resumes_to_the_same_summary() {
    let spec = MethodSpec::Incremental {
        config: incremental_config(60),
    };
    let replies = [
        "The ship sails.",
        "The ship sails north into the ice while the whole crew grows uneasy.",
        "The ship sails north; the crew is uneasy.",
        "The ship is trapped.",
    ];
    assert_resume_gives_the_same(spec, &chunks(3), &replies, 2);
}

#[test]
fn hierarchical_resumes_to_the_same_summary() {
    let spec = MethodSpec::Hierarchical {
        config: hierarchical_config(900),
    };
    let replies = [
        "A sails.",
        "B freezes.",
        "C returns.",
        "D sinks.",
        "All of it.",
    ];
    assert_resume_gives_the_same(spec, &chunks(4), &replies, 3);
}

#[test]
fn detail_resumes_to_the_same_summary() {
    let spec = MethodSpec::Detail {
        config: detail_config(0.0, true),
    };
    let replies = ["One.", "Two.", "Three."];
    assert_resume_gives_the_same(spec, &chunks(3), &replies, 1);
}

fn whole_config(answer_tokens: usize) -> WholeConfig {
    // A summary's budget comes from its length in words (`tokens_for`):
    // ask for the words that give `answer_tokens`.
    WholeConfig {
        query: QUERY.into(),
        answer_tokens,
        summary_words: Some((answer_tokens - 40) / 2),
        answer_form: prism::methods::AnswerForm::Summary,
    }
}

#[test]
fn whole_summarizes_every_chunk_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    // Seven words meet a target of eleven: no second call.
    let config = whole_config(62);
    let chunks = chunks(3);
    let mut llm = ScriptedLlm::new(&["  The ship sails north with its crew.\n"]);
    let (summary, stats, steps) = finish(&Whole::new(&config), &mut llm, &chunks, dir.path());
    let steps: Vec<prism::methods::whole::Step> = steps;
    assert_eq!(summary, "The ship sails north with its crew.");
    assert_eq!(
        (stats.run.calls, stats.run.steps, stats.run.chunks),
        (1, 1, 3)
    );
    assert_eq!(stats.method, "whole");
    assert_eq!(llm.prompts.len(), 1);
    // The chunks in order, a blank line between two, then the query.
    let document: Vec<&str> = chunks.iter().map(|chunk| chunk.text.trim()).collect();
    let prompt = llm.prompts[0].segments.join("");
    let at = prompt.find(&document.join("\n\n")).expect("the whole text");
    assert!(prompt[at..].contains(QUERY), "{prompt}");
    assert_eq!((steps[0].chunks, steps[0].call.max_tokens), (3, 62));
}

#[test]
fn whole_asks_again_at_length_for_a_summary_well_short_of_its_target() {
    let config = whole_config(900);
    let chunks = chunks(3);
    let short = "The ship sails north.";
    let long =
        "The ship sails north into the ice, the crew grows uneasy, and the captain turns back.";
    let dir = tempfile::tempdir().unwrap();
    let mut llm = ScriptedLlm::new(&[short, long]);
    let (summary, stats, _) = finish(&Whole::new(&config), &mut llm, &chunks, dir.path());
    assert_eq!(summary, long);
    assert_eq!((stats.run.calls, stats.run.steps), (2, 2));
    // The second prompt goes on from the first, so the document is a cached prefix.
    let (first, second) = (&llm.prompts[0], &llm.prompts[1]);
    assert_eq!(second.segments[..first.segments.len()], first.segments[..]);
    let asked = second.segments.last().unwrap();
    assert!(
        asked.contains(short) && asked.contains("about 430 words"),
        "{asked}"
    );

    // A second answer no longer than the first leaves the first.
    let dir = tempfile::tempdir().unwrap();
    let mut llm = ScriptedLlm::new(&[short, "Sails."]);
    let (summary, stats, _) = finish(&Whole::new(&config), &mut llm, &chunks, dir.path());
    assert_eq!(summary, short);
    assert_eq!(stats.run.calls, 2);
}

#[test]
fn whole_refuses_a_document_over_the_context_and_writes_no_summary() {
    let config = whole_config(50);
    let chunks = chunks(3);
    // Tokens are characters here: one more than the context holds.
    let needed = ScriptedLlm::new(&[])
        .prompt_tokens(&Whole::new(&config).prompt(&chunks))
        .unwrap()
        + 50;
    let dir = tempfile::tempdir().unwrap();
    let run_dir = RunDir::create(dir.path()).unwrap();
    let mut llm = ScriptedLlm::new(&["Too late."]).with_context(needed - 1);
    let files = scripted_files(&run_dir, false, None);
    let err = drive(
        &Whole::new(&config),
        &mut llm,
        &chunks,
        &files,
        &mut NoProgress,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "whole: the whole document is {} tokens with the prompt; with 50 to generate it does not fit the model's context of {} tokens: use a chunked method",
            needed - 50,
            needed - 1
        )
    );
    assert!(llm.prompts.is_empty(), "no call is made");
    assert!(!dir.path().join("summary.txt").exists());
    assert!(!dir.path().join("stats.json").exists());
    // Exactly full is enough.
    let fits = tempfile::tempdir().unwrap();
    let mut llm = ScriptedLlm::new(&["Just in time."]).with_context(needed);
    let (summary, _, _) = finish(&Whole::new(&config), &mut llm, &chunks, fits.path());
    assert_eq!(summary, "Just in time.");
}

#[test]
fn stats_json_reports_repeats_echoes_and_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let config = whole_config(900);
    // The first sentence is the system line word for word; the second is the
    // summary's own, said twice.
    let reply = "You write clear, faithful summaries of documents. The ship sails north today. The ship sails north today.";
    let mut llm = ScriptedLlm::new(&[reply]);
    let (_, stats, _) = finish(&Whole::new(&config), &mut llm, &chunks(2), dir.path());
    assert!(
        (stats.run.echo_share.unwrap() - 1.0 / 3.0).abs() < 1e-12,
        "{:?}",
        stats.run.echo_share
    );
    // 17 words, 14 4-grams, of which "the ship sails north" and "ship sails
    // north today" occur twice each: 4 of 14 repeated.
    assert!(
        (stats.run.repeated_ngram_share.unwrap() - 4.0 / 14.0).abs() < 1e-12,
        "{:?}",
        stats.run.repeated_ngram_share
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("stats.json")).unwrap())
            .unwrap();
    assert_eq!(saved["echo_share"], stats.run.echo_share.unwrap());
    assert_eq!(
        saved["repeated_ngram_share"],
        stats.run.repeated_ngram_share.unwrap()
    );
    assert_eq!(saved["sampling"]["temperature"], 0.0);
}

#[test]
fn every_baseline_names_its_prompt_texts() {
    let incremental = incremental_config(900);
    let hierarchical = hierarchical_config(900);
    let detail = detail_config(0.0, true);
    let whole = whole_config(900);
    let templates = [
        Incremental::new(&incremental).template_texts(),
        Hierarchical::new(&hierarchical, 1_000_000).template_texts(),
        Detail::new(&detail).template_texts(),
        Whole::new(&whole).template_texts(),
    ];
    for texts in &templates {
        assert!(texts.iter().any(|text| text.contains(QUERY)), "{texts:?}");
        assert!(texts.iter().all(|text| !text.trim().is_empty()));
    }
    // Incremental's update and compression instructions are among them.
    assert!(templates[0]
        .iter()
        .any(|text| text.contains("Rewrite the summary so that it also covers the next part")));
    assert!(templates[0]
        .iter()
        .any(|text| text.contains("Rewrite the summary below so that it is shorter")));
    // Recursive detail's heading over the earlier summaries.
    assert!(templates[2]
        .iter()
        .any(|text| text.contains("Summaries of the parts before it")));
}

/// Run `spec` over five chunks in turn, then three calls at a time: the
/// independent chunk calls come in batches of three and two, the summary and
/// every step's output are the same, and a run stopped after one step stops
/// after its first batch and resumes to the same summary.
fn assert_batches_change_nothing(spec: MethodSpec, replies: &[&str], batches: &[usize]) {
    let chunks = chunks(5);
    let steps_of = |dir: &std::path::Path| -> Vec<serde_json::Value> {
        RunDir::create(dir)
            .unwrap()
            .read_jsonl::<serde_json::Value>(RunDir::STEPS)
            .unwrap()
            .into_iter()
            .map(|step| serde_json::json!([step["output"], step["prompt_tokens"]]))
            .collect()
    };
    let in_turn = tempfile::tempdir().unwrap();
    let in_turn_dir = RunDir::create(in_turn.path()).unwrap();
    let mut llm = ScriptedLlm::new(replies);
    let Outcome::Finished { summary, stats } = spec
        .run(
            &mut llm,
            &chunks,
            &scripted_files(&in_turn_dir, false, None),
            &mut NoProgress,
        )
        .unwrap()
    else {
        panic!("the run should finish")
    };

    let batched = tempfile::tempdir().unwrap();
    let batched_dir = RunDir::create(batched.path()).unwrap();
    let mut llm = ScriptedLlm::new(replies).with_concurrency(3);
    let stopped = scripted_files(&batched_dir, false, Some(1));
    let outcome = spec
        .run(&mut llm, &chunks, &stopped, &mut NoProgress)
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Paused { completed: 3 }),
        "{outcome:?}"
    );
    let mut rest = ScriptedLlm::new(&replies[llm.prompts.len()..]).with_concurrency(3);
    let resumed = scripted_files(&batched_dir, true, None);
    let Outcome::Finished {
        summary: again,
        stats: stats_again,
    } = spec
        .run(&mut rest, &chunks, &resumed, &mut NoProgress)
        .unwrap()
    else {
        panic!("the resumed run should finish")
    };
    assert_eq!([llm.batches, rest.batches].concat(), batches);
    assert_eq!(again, summary);
    assert_eq!(
        (stats_again.run.calls, stats_again.run.steps),
        (stats.run.calls, stats.run.steps)
    );
    assert_eq!(steps_of(batched.path()), steps_of(in_turn.path()));
}

#[test]
fn hierarchical_summarizes_chunks_in_batches_to_the_same_summary() {
    let spec = MethodSpec::Hierarchical {
        config: hierarchical_config(900),
    };
    let replies = ["A.", "B.", "C.", "D.", "E.", "All five."];
    assert_batches_change_nothing(spec, &replies, &[3, 2]);
}

#[test]
fn detail_summarizes_chunks_in_batches_unless_recursive() {
    let replies = ["One.", "Two.", "Three.", "Four.", "Five."];
    let spec = MethodSpec::Detail {
        config: detail_config(0.0, false),
    };
    assert_batches_change_nothing(spec, &replies, &[3, 2]);

    // Each recursive call needs the summaries before it: one call per step.
    let dir = tempfile::tempdir().unwrap();
    let config = detail_config(0.0, true);
    let mut llm = ScriptedLlm::new(&replies).with_concurrency(3);
    let (_, stats, _) = finish(&Detail::new(&config), &mut llm, &chunks(5), dir.path());
    assert_eq!(stats.run.steps, 5);
    assert!(llm.batches.is_empty());
}
