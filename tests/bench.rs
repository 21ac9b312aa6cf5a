//! `prism bench` end to end on a tiny random model: the sweep's rows, CSV,
//! report and charts, pausing and resuming, and refusing bad input with one
//! error line.

use crate::common::{
    assert_one_error_line, run_prism, tiny_chat_model, words_document as document,
};
use std::path::{Path, PathBuf};

/// A temporary directory holding a tiny chat model and a document, and the
/// path of a bench directory in it: (dir, model, document, bench dir).
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    tiny_chat_model(&model);
    let doc = document(dir.path());
    let out = dir.path().join("bench");
    (dir, model, doc, out)
}

const METHODS: &str = "prism-amendments-unconstrained,prism-in-place-no-updates-unconstrained";

fn bench(model: &Path, doc: &Path, out: &Path, extra: &[&str]) -> (bool, String, String) {
    bench_of(METHODS, "20,40", model, doc, out, extra)
}

/// `prism bench` of `methods` at `chunk_tokens` with small token budgets.
fn bench_of(
    methods: &str,
    chunk_tokens: &str,
    model: &Path,
    doc: &Path,
    out: &Path,
    extra: &[&str],
) -> (bool, String, String) {
    let book = concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/book.json");
    let input = [doc.to_str().unwrap()];
    sweep(&input, methods, chunk_tokens, model, out, book, extra)
}

/// `prism bench INPUT… --methods … --chunk-tokens …` with `schema` and the
/// small token budgets every test here uses.
fn sweep(
    input: &[&str],
    methods: &str,
    chunk_tokens: &str,
    model: &Path,
    out: &Path,
    schema: &str,
    extra: &[&str],
) -> (bool, String, String) {
    let mut args = vec!["bench"];
    args.extend_from_slice(input);
    args.extend_from_slice(&[
        "--methods",
        methods,
        "--chunk-tokens",
        chunk_tokens,
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--revision-tokens",
        "6",
        "--answer-tokens",
        "6",
        "--schema",
        schema,
    ]);
    args.extend_from_slice(extra);
    run_prism(&args)
}

/// One question about the test document, as `prism qa generate` writes them.
fn questions_file(dir: &Path) -> PathBuf {
    let path = dir.join("qa.jsonl");
    std::fs::write(
        &path,
        "{\"question\": \"Which word comes first?\", \"answer\": \"w2\"}\n",
    )
    .unwrap();
    path
}

/// The flags that judge a sweep with `model`, and QA-F1 on `questions`.
fn judged_by<'a>(model: &'a Path, questions: &'a Path) -> [&'a str; 5] {
    [
        "--quality",
        "--judge-model",
        model.to_str().unwrap(),
        "--questions",
        questions.to_str().unwrap(),
    ]
}

fn rows(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn a_sweep_pauses_resumes_and_reports_every_run() {
    let (_dir, model, doc, out) = fixture();

    let (success, _, stderr) = bench(&model, &doc, &out, &["--stop-after-runs", "1"]);
    assert!(success, "{stderr}");
    assert!(stderr.contains("paused after 1 runs"), "{stderr}");
    assert_eq!(rows(&out).len(), 1);
    assert!(
        out.join("report.md").is_file(),
        "a paused sweep has a report"
    );
    let first_stats = out.join("runs/prism-amendments-unconstrained-20/stats.json");
    let first_written = std::fs::metadata(&first_stats).unwrap().modified().unwrap();

    assert_one_error_line(&bench(&model, &doc, &out, &[]), "pass --resume");

    let (success, stdout, stderr) = bench(&model, &doc, &out, &["--resume"]);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("3 runs to do (1 already finished)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("rough"),
        "an estimate follows the first run: {stderr}"
    );
    assert_eq!(
        std::fs::metadata(&first_stats).unwrap().modified().unwrap(),
        first_written,
        "the finished run is not run again"
    );
    let rows = rows(&out);
    let runs: Vec<(String, u64)> = rows
        .iter()
        .map(|row| {
            (
                row["method"].as_str().unwrap().to_string(),
                row["chunk_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            ("prism-amendments-unconstrained".to_string(), 20),
            ("prism-in-place-no-updates-unconstrained".to_string(), 20),
            ("prism-amendments-unconstrained".to_string(), 40),
            ("prism-in-place-no-updates-unconstrained".to_string(), 40),
        ]
    );
    for row in &rows {
        assert_eq!(row["document"], "doc.txt");
        assert_eq!(row["model"], "model");
        assert_eq!(
            row["label"], row["method"],
            "the prism label matches the name"
        );
        assert!(row["machine"]["threads"].as_u64().unwrap() > 0);
        assert!(!row["git_revision"].as_str().unwrap().is_empty());
        assert!(row["date"].as_str().unwrap().ends_with('Z'));
        assert!(row["command"].as_str().unwrap().starts_with("prism bench "));
        for key in [
            "cache_hit_rate",
            "net_tokens",
            "cost_index",
            "calls",
            "wall_seconds",
            "repeated_ngram_share",
            "echo_share",
        ] {
            assert!(row.get(key).is_some(), "row lacks {key}: {row}");
        }
        assert!(row["sampling"]["temperature"].is_number(), "{row}");
        assert!(row["document_tokens"].as_u64().unwrap() >= row["read_tokens"].as_u64().unwrap());
        let run_dir = out.join(row["run_dir"].as_str().unwrap());
        assert!(run_dir.join("stats.json").is_file() && run_dir.join("summary.txt").is_file());
    }
    // Each run starts with a cold cache: its first call reuses nothing, so
    // the runs' figures do not depend on which ran before.
    for row in &rows {
        let steps = out
            .join(row["run_dir"].as_str().unwrap())
            .join("steps.jsonl");
        let first: serde_json::Value = serde_json::from_str(
            std::fs::read_to_string(steps)
                .unwrap()
                .lines()
                .next()
                .unwrap(),
        )
        .unwrap();
        // A run starts cold: its first call, a chunk summary's when PRISM
        // reads summaries, reuses nothing.
        let first_call = first["summary_calls"].get(0).unwrap_or(&first);
        assert_eq!(first_call["reused_tokens"], 0, "{first}");
    }

    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5);
    assert!(csv.starts_with("method,chunk_tokens,model,"));
    assert!(csv.lines().next().unwrap().contains("machine.cpu"));

    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert_eq!(stdout, report, "stdout carries the report");
    for needle in [
        "- Model: model",
        "## Chunks of 20 tokens",
        "## Chunks of 40 tokens",
        "| prism-in-place-no-updates-unconstrained |",
        "| Rep. 4-gram (%) | Echo (%) |",
        "\nSampling: greedy,",
        "### Cache hit (%)\n\n| Method | 20 | 40 |",
    ] {
        assert!(
            report.contains(needle),
            "`{needle}` not in report:\n{report}"
        );
    }
    for chart in [
        "cache_hit.svg",
        "net_tokens.svg",
        "cost_index.svg",
        "output_tokens.svg",
    ] {
        let svg = std::fs::read_to_string(out.join(chart)).unwrap();
        assert!(svg.starts_with("<svg"), "{chart}");
        assert!(svg.contains("prism-amendments-unconstrained"), "{chart}");
    }

    // Everything finished: resuming again runs nothing.
    let (success, _, stderr) = bench(&model, &doc, &out, &["--resume"]);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("0 runs to do (4 already finished)"),
        "{stderr}"
    );
    assert_eq!(self::rows(&out).len(), 4);

    // The report rebuilds from results.jsonl alone.
    std::fs::remove_file(out.join("report.md")).unwrap();
    std::fs::remove_file(out.join("cache_hit.svg")).unwrap();
    let (success, stdout, stderr) = run_prism(&["bench", "report", out.to_str().unwrap()]);
    assert!(success, "{stderr}");
    assert_eq!(stdout, report);
    assert!(out.join("cache_hit.svg").is_file());
}

/// `whole` is a method bench accepts: one call over the whole document.
#[test]
fn whole_runs_in_a_sweep_as_one_call() {
    let (_dir, model, doc, out) = fixture();
    let (success, _, stderr) = bench_of("whole", "20", &model, &doc, &out, &[]);
    assert!(success, "{stderr}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["method"], "whole");
    assert_eq!(rows[0]["label"], "whole");
    // One call over the document; a random model's answer runs over the
    // target length, and condensing it adds calls.
    assert_eq!(rows[0]["steps"], 1);
    assert!(
        rows[0]["chunks"].as_u64().unwrap() > 1,
        "the document spans chunks"
    );
}

#[test]
fn an_unknown_method_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let result = run_prism(&[
        "bench",
        "doc.txt",
        "--methods",
        "prism-amendments,summarise-everything",
        "--chunk-tokens",
        "500",
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    assert_one_error_line(
        &result,
        "unknown method `summarise-everything`; valid names: prism-amendments,",
    );
}

#[test]
fn prism_flags_that_names_set_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let result = run_prism(&[
        "bench",
        "doc.txt",
        "--methods",
        "prism-amendments",
        "--chunk-tokens",
        "500",
        "--no-updates",
        "--out",
        dir.path().join("out").to_str().unwrap(),
    ]);
    assert_one_error_line(&result, "--no-updates is set by each prism method's name");
}

/// `--quality` judges every finished run's summary: each row gets a coherence
/// score (or the reason there is none) and a QA-F1, the run directory the
/// judge's reports, and report.md the quality columns.
#[test]
fn quality_adds_judge_scores_to_every_row() {
    let (dir, model, doc, out) = fixture();
    let questions = questions_file(dir.path());
    let (ok, _, stderr) = bench(&model, &doc, &out, &judged_by(&model, &questions));
    assert!(ok, "{stderr}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 4);
    for row in &rows {
        assert!(
            row["coherence"].is_number() || row["coherence_error"].is_string(),
            "{row}"
        );
        let f1 = row["qa_f1"].as_f64().expect("a QA-F1 per row");
        assert!((0.0..=1.0).contains(&f1));
        let run_dir = out.join(row["run_dir"].as_str().unwrap());
        assert!(run_dir.join("qa.json").is_file());
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| QA-F1 |"), "{report}");
}

/// With `--concurrency 3` runs go three at a time and the judge scores three
/// sentences or questions at a time: every row's scores and the judge's
/// answers are those of one at a time.
#[test]
fn the_judge_scores_the_same_three_at_a_time() {
    let (dir, model, doc, _) = fixture();
    let questions = questions_file(dir.path());
    let judged = |concurrency: &str| {
        let out = dir.path().join(format!("bench-{concurrency}"));
        let mut args = judged_by(&model, &questions).to_vec();
        // Rows side by side are the bits of rows alone where each is
        // multiplied alone, as on the CPU; a GPU's batched matmuls round
        // them otherwise, and this random model's near ties then diverge.
        args.extend(["--concurrency", concurrency, "--device", "cpu"]);
        let (ok, _, stderr) = bench(&model, &doc, &out, &args);
        assert!(ok, "{stderr}");
        rows(&out)
            .iter()
            .map(|row| {
                let run_dir = out.join(row["run_dir"].as_str().unwrap());
                let qa: serde_json::Value = serde_json::from_str(
                    &std::fs::read_to_string(run_dir.join("qa.json")).unwrap(),
                )
                .unwrap();
                serde_json::json!([
                    row["run_dir"],
                    row["coherence"],
                    row["coherence_error"],
                    row["qa_f1"],
                    qa["questions"]
                ])
            })
            .collect::<Vec<_>>()
    };
    let in_turn = judged("1");
    assert_eq!(in_turn.len(), 4);
    let mut side_by_side = judged("3");
    // Rows are written as runs finish, which side by side is in any order.
    side_by_side.sort_by_key(|row| row[0].to_string());
    let mut expected = in_turn;
    expected.sort_by_key(|row| row[0].to_string());
    assert_eq!(side_by_side, expected);
}

/// A sweep finished without `--quality` is scored by resuming it with
/// `--quality`: every row gains its scores and no run is done again.
#[test]
fn quality_on_resume_judges_runs_finished_without_it() {
    let (dir, model, doc, out) = fixture();
    let (ok, _, stderr) = bench(&model, &doc, &out, &[]);
    assert!(ok, "{stderr}");
    let before = rows(&out);
    assert!(before.iter().all(|row| row.get("coherence").is_none()));

    let questions = questions_file(dir.path());
    let mut judge = vec!["--resume"];
    judge.extend(judged_by(&model, &questions));
    let (ok, _, stderr) = bench(&model, &doc, &out, &judge);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("0 runs to do (4 already finished)"),
        "{stderr}"
    );
    let after = rows(&out);
    assert_eq!(after.len(), before.len());
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(old["run_dir"], new["run_dir"]);
        assert_eq!(
            old["wall_seconds"], new["wall_seconds"],
            "the run was redone"
        );
        assert!(
            new["coherence"].is_number() || new["coherence_error"].is_string(),
            "{new}"
        );
        assert!(new["qa_f1"].is_number(), "{new}");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| QA-F1 |"), "{report}");
}

/// `detail` splits finer than the sweep's chunk size, yet its row sits with
/// the sweep's chunk size next to the other methods.
#[test]
fn detail_runs_in_a_sweep_under_the_sweep_chunk_size() {
    let (_dir, model, doc, out) = fixture();
    let (ok, _, stderr) = bench_of(
        "prism-in-place-unconstrained,detail",
        "40",
        &model,
        &doc,
        &out,
        &[
            "--detail",
            "1",
            "--min-chunk-tokens",
            "10",
            "--max-summary-tokens",
            "6",
        ],
    );
    assert!(ok, "{stderr}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 2);
    let chunks = |row: &serde_json::Value| row["chunks"].as_u64().unwrap();
    assert!(rows.iter().all(|row| row["chunk_tokens"] == 40), "{rows:?}");
    assert_eq!(rows[1]["run_dir"], "runs/detail-40");
    assert!(chunks(&rows[1]) > chunks(&rows[0]), "{rows:?}");
}

/// Every results file committed under `results/` reads as typed rows, the
/// figures of today's methods as their own types, and writes back as the same
/// JSON: a report rebuilt by this version loses nothing that was recorded.
/// Whether `a` and `b` are the same JSON, numbers compared as the f32 some
/// settings are: older rows hold a sampling setting of 0.8 written as
/// 0.800000011920929, newer ones as 0.8.
fn same_up_to_f32(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || x as f32 == y as f32,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_up_to_f32(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| same_up_to_f32(x, y)))
        }
        _ => a == b,
    }
}

#[test]
fn committed_results_read_as_typed_rows_and_write_back_unchanged() {
    use prism::bench::results::Row;
    use prism::methods::MethodFigures;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    let mut files = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|name| name == "results.jsonl") {
                files.push(path);
            }
        }
    }
    assert!(!files.is_empty(), "no committed results found");
    let mut typed = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let row: Row = serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
            typed += usize::from(!matches!(row.method_figures, MethodFigures::Recorded(_)));
            let recorded: serde_json::Value = serde_json::from_str(line).unwrap();
            let written = serde_json::to_value(&row).unwrap();
            assert!(
                same_up_to_f32(&written, &recorded),
                "{}: {written} != {recorded}",
                file.display()
            );
        }
    }
    assert!(typed > 0, "no committed row read as today's figures");
}

/// The durations fixture's task file, built by `scripts/code-retrieval`
/// into `dir` with its repository tree beside it.
fn code_tasks(dir: &Path) -> PathBuf {
    let tasks = dir.join("tasks.json");
    let built = std::process::Command::new("python3")
        .arg("scripts/code-retrieval")
        .args(["build", "--from-dir", "tests/fixtures/code-package"])
        .args(["--name", "durations", "--version", "0.1.0"])
        .args(["--tasks-per-repository", "2", "--out"])
        .arg(&tasks)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("python3 runs");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    tasks
}

#[test]
fn a_code_retrieval_sweep_scores_each_task_and_reports_accuracy() {
    let (dir, model, _, out) = fixture();
    let tasks = code_tasks(dir.path());
    let task_args = [
        "--task",
        "code-retrieval",
        "--tasks",
        tasks.to_str().unwrap(),
    ];
    let methods = "prism-amendments-no-updates-unconstrained";
    let (success, stdout, stderr) = sweep(&task_args, methods, "60,120", &model, &out, "code", &[]);
    assert!(success, "{stderr}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 4, "two tasks at two chunk sizes");
    for row in &rows {
        let task = row["task"].as_str().unwrap();
        assert!(task.starts_with("durations/"), "{task}");
        assert_eq!(row["document"], "durations-0.1.0");
        // A random model names no function of the fixture: scored, and wrong.
        assert_eq!(row["correct"], false, "{row}");
        let run_dir = out.join(row["run_dir"].as_str().unwrap());
        assert!(run_dir.starts_with(out.join("runs").join(task)));
        let answer = std::fs::read_to_string(run_dir.join("summary.txt")).unwrap();
        assert_eq!(
            row["retrieved"].as_str(),
            None,
            "nothing defined in: {answer}"
        );
    }
    assert!(
        stdout.contains("| Method | Chunk tokens | Tasks | Accuracy (%) |"),
        "{stdout}"
    );
    assert!(stdout.contains("Answers by task"), "{stdout}");
    assert!(out.join("accuracy.svg").is_file());
}

#[test]
fn a_code_retrieval_sweep_refuses_what_cannot_answer_a_query() {
    let (dir, model, _, out) = fixture();
    let tasks = code_tasks(dir.path());
    let base = |methods: &'static str| {
        vec![
            "bench".to_string(),
            "--task".into(),
            "code-retrieval".into(),
            "--methods".into(),
            methods.into(),
            "--chunk-tokens".into(),
            "60".into(),
            "--model".into(),
            model.to_str().unwrap().into(),
            "--out".into(),
            out.to_str().unwrap().into(),
        ]
    };
    let run = |args: Vec<String>| run_prism(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_one_error_line(
        &run(base("prism-amendments")),
        "--task code-retrieval needs --tasks FILE",
    );
    let mut hierarchical = base("hierarchical");
    hierarchical.extend(["--tasks".to_string(), tasks.display().to_string()]);
    assert_one_error_line(
        &run(hierarchical),
        "--methods hierarchical: cannot answer a query",
    );
}
