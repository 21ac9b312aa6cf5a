//! The command line on bad input: one clear error line, a non-zero exit, no panic.

use crate::common::{
    assert_one_error_line, prism, run_prism, write_tiny_model, TinyArch, TINY_CONTEXT,
};

#[test]
fn a_missing_model_file_is_one_error_line() {
    let result = run_prism(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
    ]);
    assert_one_error_line(&result, "/nonexistent/model.gguf");
}

#[test]
fn perplexity_refuses_a_draft_model_before_loading_anything() {
    // Neither model exists: the refusal comes before either is opened.
    let result = run_prism(&[
        "perplexity",
        "/nonexistent/text.txt",
        "--model",
        "/nonexistent/model.gguf",
        "--draft-model",
        "/nonexistent/draft.gguf",
    ]);
    assert_one_error_line(
        &result,
        "--draft-model /nonexistent/draft.gguf does not apply",
    );
}

#[test]
fn a_bad_repetition_setting_is_one_error_line() {
    let result = run_prism(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
        "--dry-multiplier",
        "0.8",
        "--dry-base",
        "1",
    ]);
    assert_one_error_line(&result, "--dry-base");
}

#[test]
fn a_corrupt_gguf_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corrupt.gguf");
    std::fs::write(&path, vec![0xAB; 4096]).unwrap();
    let result = run_prism(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert_one_error_line(&result, "not a usable model file");
}

#[test]
fn an_unknown_architecture_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let config_path = dir.path().join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, config.replace("\"llama\"", "\"mamba\"")).unwrap();
    let result = run_prism(&[
        "generate",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt",
        "w2",
    ]);
    assert_one_error_line(&result, "unsupported architecture `mamba`");
}

#[test]
fn a_prompt_longer_than_the_context_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Qwen2, 3);
    let prompt = vec!["w5"; TINY_CONTEXT + 10].join(" ");
    let model = dir.path().to_str().unwrap();
    let (success, stdout, stderr) = run_prism(&["generate", "--model", model, "--prompt", &prompt]);
    assert!(!success);
    assert!(stdout.is_empty());
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("do not fit the model's context of 256 tokens"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"));
}

#[test]
fn a_binary_prompt_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let binary = dir.path().join("blob.bin");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x41]).unwrap();
    let model = dir.path().to_str().unwrap();
    let result = run_prism(&[
        "generate",
        "--model",
        model,
        "--prompt-file",
        binary.to_str().unwrap(),
    ]);
    assert_one_error_line(&result, "not UTF-8 text");
}

#[test]
fn generate_json_reports_every_call_and_the_total() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let model = dir.path().to_str().unwrap();
    let first = "w2 w3 w4 w5 w6 w7 w8 w9";
    let second = "w2 w3 w4 w5 w6 w7 w8 w9 w10 w11";
    let (success, stdout, stderr) = run_prism(&[
        "generate",
        "--model",
        model,
        "--prompt",
        first,
        "--prompt",
        second,
        "--max-tokens",
        "3",
        "--json",
    ]);
    assert!(success, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["prompt_tokens"], 8);
    assert_eq!(lines[0]["reused_tokens"], 0);
    // The second prompt shares the first's eight tokens.
    assert_eq!(lines[1]["prompt_tokens"], 10);
    assert_eq!(lines[1]["reused_tokens"], 8);
    assert_eq!(lines[1]["net_tokens"], 2);
    for key in [
        "text",
        "output_tokens",
        "cache_hit_rate",
        "cost_index",
        "prefill_tokens_per_second",
        "decode_tokens_per_second",
    ] {
        assert!(lines[1].get(key).is_some(), "missing {key}");
    }
    assert_eq!(lines[2]["calls"], 2);
    assert_eq!(lines[2]["total"]["reused_tokens"], 8);
}

#[test]
fn no_prefix_cache_recomputes_everything() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Qwen2, 3);
    let model = dir.path().to_str().unwrap();
    let (success, stdout, stderr) = run_prism(&[
        "generate",
        "--model",
        model,
        "--prompt",
        "w2 w3 w4",
        "--prompt",
        "w2 w3 w4 w5",
        "--max-tokens",
        "2",
        "--json",
        "--no-prefix-cache",
    ]);
    assert!(success, "{stderr}");
    let total: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(total["total"]["reused_tokens"], 0);
    assert_eq!(total["total"]["prompt_tokens"], 7);
}

fn summarize_with_tiny_model(document: &std::path::Path, extra: &[&str]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let out = dir.path().join("run");
    let mut args = vec![
        "summarize",
        document.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run_prism(&args)
}

#[test]
fn summarize_refuses_an_empty_document() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "  \n\n").unwrap();
    assert_one_error_line(&summarize_with_tiny_model(&empty, &[]), "is empty");
}

#[test]
fn summarize_refuses_a_binary_document() {
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("image.png");
    std::fs::write(&binary, [0x89, b'P', b'N', b'G', 0, 0, 0, 13, 0xff, 0xd8]).unwrap();
    assert_one_error_line(&summarize_with_tiny_model(&binary, &[]), "image.png");
}

#[test]
fn summarize_refuses_chunks_larger_than_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("doc.txt");
    std::fs::write(&doc, "w2 w3 w4.\n\nw5 w6.\n").unwrap();
    let (success, stdout, stderr) = summarize_with_tiny_model(&doc, &["--chunk-tokens", "4096"]);
    assert!(!success && stdout.is_empty());
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("does not fit the model's context of 256 tokens"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"));
}

/// `prism summarize doc.txt --model . --chunk-tokens 20` in `dir` with
/// `extra` flags, stopped before its first chunk: its stderr, once it has
/// succeeded and its run directory is removed.
fn summarize_up_to_the_first_chunk(dir: &std::path::Path, extra: &[&str]) -> String {
    let mut command = prism();
    command.current_dir(dir).args([
        "summarize",
        "doc.txt",
        "--model",
        ".",
        "--out",
        "run",
        "--chunk-tokens",
        "20",
        "--stop-after-chunks",
        "0",
    ]);
    let output = command.args(extra).output().expect("prism runs");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{extra:?}: {stderr}");
    std::fs::remove_dir_all(dir.join("run")).unwrap();
    stderr
}

#[test]
fn summarize_finds_a_shipped_schema_by_name_outside_the_checkout() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    std::fs::write(dir.path().join("doc.txt"), "w2 w3 w4.\n\nw5 w6.\n").unwrap();
    let budgets = ["--revision-tokens", "16", "--answer-tokens", "16"];
    summarize_up_to_the_first_chunk(dir.path(), &budgets);
    summarize_up_to_the_first_chunk(
        dir.path(),
        &[&budgets[..], &["--schema", "entity"]].concat(),
    );
}

#[test]
fn summarize_reads_a_gutenberg_ebook_between_its_markers_unless_asked_for_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let ebook = "w9 w9 w9 w9 w9 w9 w9 w9.\n\
        *** START OF THE PROJECT GUTENBERG EBOOK W2 ***\n\
        w2 w3 w4.\n\
        *** END OF THE PROJECT GUTENBERG EBOOK W2 ***\n\
        w8 w8 w8 w8 w8 w8 w8 w8 w8 w8 w8 w8.\n";
    std::fs::write(dir.path().join("doc.txt"), ebook).unwrap();
    let read_tokens = |whole_file: bool| {
        let extra: &[&str] = if whole_file { &["--whole-file"] } else { &[] };
        let stderr = summarize_up_to_the_first_chunk(dir.path(), extra);
        let tokens: usize = stderr
            .lines()
            .find_map(|line| {
                line.strip_prefix("doc.txt: ")?
                    .split(" tokens")
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no token count in {stderr}"));
        (
            tokens,
            stderr.contains("between its Project Gutenberg START and END lines"),
        )
    };
    let (book, noted) = read_tokens(false);
    let (whole, noted_whole) = read_tokens(true);
    assert!(noted && !noted_whole);
    assert!(
        book < whole,
        "the book is {book} tokens, the whole file {whole}"
    );
}

#[test]
fn summarize_names_the_shipped_schemas_when_the_schema_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("doc.txt");
    std::fs::write(&doc, "w2 w3 w4.\n").unwrap();
    assert_one_error_line(
        &summarize_with_tiny_model(&doc, &["--schema", "novel"]),
        "schema novel: no such file, nor a schema prism ships (book, cok-book, code, entity, sql, summary)",
    );
}

#[test]
fn score_qa_refuses_a_missing_or_malformed_question_file() {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.txt");
    std::fs::write(&summary, "The ship sails north.\n").unwrap();
    let summary = summary.to_str().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let result = run_prism(&[
        "score",
        "qa",
        summary,
        "--questions",
        missing.to_str().unwrap(),
    ]);
    assert_one_error_line(&result, "missing.jsonl");

    let malformed = dir.path().join("qa.jsonl");
    std::fs::write(
        &malformed,
        "{\"question\": \"Who sails?\", \"answer\": \"Walton\"}\n{\"question\": \"Where?\"}\n",
    )
    .unwrap();
    let result = run_prism(&[
        "score",
        "qa",
        summary,
        "--questions",
        malformed.to_str().unwrap(),
    ]);
    assert_one_error_line(&result, "line 2: not a question-answer pair");
}

#[test]
fn qa_generate_writes_a_pairs_file_even_when_the_model_writes_none() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    // A chat template that just joins the turns.
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "</s>", "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}"#,
    )
    .unwrap();
    let doc = dir.path().join("doc.txt");
    std::fs::write(&doc, "w2 w3 w4.\n\nw5 w6.\n").unwrap();
    let out = dir.path().join("qa.jsonl");
    let (success, _, stderr) = run_prism(&[
        "qa",
        "generate",
        doc.to_str().unwrap(),
        "--n",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--chunk-tokens",
        "20",
        "--constrained",
        "off",
        "--model",
        dir.path().to_str().unwrap(),
    ]);
    assert!(success, "{stderr}");
    assert!(stderr.contains("pairs from 1 chunk;"), "{stderr}");
    // Random weights write no parsable pair; the file is there, empty.
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "");
}

#[test]
fn completions_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let (success, stdout, stderr) = run_prism(&["completions", shell]);
        assert!(success, "{stderr}");
        for subcommand in ["summarize", "bench", "generate", "models"] {
            assert!(stdout.contains(subcommand), "{shell}: no {subcommand}");
        }
    }
    assert_one_error_line(&run_prism(&["completions", "tcsh"]), "tcsh");
}

#[test]
fn quiet_prints_results_and_nothing_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let model = dir.path().to_str().unwrap();
    let generate = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", model, "--prompt", "w2 w3 w4"];
        args.extend_from_slice(&["--max-tokens", "2", "--json"]);
        args.extend_from_slice(extra);
        run_prism(&args)
    };
    let (success, stdout, stderr) = generate(&[]);
    assert!(success && !stderr.is_empty(), "{stderr}");
    let (success, quiet_stdout, stderr) = generate(&["--quiet"]);
    assert!(success, "{stderr}");
    assert_eq!(stderr, "", "--quiet leaves stderr empty");
    let text = |stdout: &str| -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(stdout.lines().next().unwrap()).unwrap()["text"]
            .clone()
    };
    assert_eq!(
        text(&quiet_stdout),
        text(&stdout),
        "--quiet changes nothing on stdout"
    );
    // The flag is global: it may come before the subcommand too.
    let (success, _, stderr) = run_prism(&[
        "-q",
        "generate",
        "--model",
        model,
        "--prompt",
        "w2",
        "--max-tokens",
        "1",
    ]);
    assert!(success && stderr.is_empty(), "{stderr}");
    assert_one_error_line(&generate(&["-q", "-v"]), "cannot be used with");
}

/// `prism query` over the fixture package's directory with a tiny model.
fn query_with_tiny_model(extra: &[&str]) -> (bool, String, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    crate::common::tiny_chat_model(dir.path());
    let out = dir.path().join("run");
    let mut args = vec![
        "query",
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/code-package"),
        "--model",
        dir.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--chunk-tokens",
        "100",
        "--revision-tokens",
        "4",
        "--answer-tokens",
        "4",
        "--constrained",
        "off",
    ];
    args.extend_from_slice(extra);
    let (success, stdout, stderr) = run_prism(&args);
    (success, stdout, stderr, dir)
}

#[test]
fn query_reads_a_directory_in_chunks_and_keeps_a_memory() {
    let (success, _, stderr, dir) =
        query_with_tiny_model(&["--schema", "code", "--query", "Which function parses?"]);
    assert!(success, "{stderr}");
    assert!(stderr.contains("code-package: "), "{stderr}");
    let run = dir.path().join("run");
    assert!(run.join("memory.json").is_file());
    let steps = std::fs::read_to_string(run.join("steps.jsonl")).unwrap();
    assert!(steps.lines().count() > 2, "several chunks: {steps}");
}

#[test]
fn query_needs_a_query_and_a_schema_of_its_own() {
    let (success, _, stderr, _dir) = query_with_tiny_model(&["--schema", "code"]);
    assert_one_error_line(
        &(success, String::new(), stderr),
        "prism query needs --query",
    );
    let result = query_with_tiny_model(&[
        "--query",
        "Which?",
        "--schema",
        "code",
        "--method",
        "hierarchical",
    ]);
    assert_one_error_line(
        &(result.0, result.1, result.2),
        "prism query runs --method prism or whole",
    );
}

/// `--concurrency` reaches the questions: with the tiny model, four at a
/// time give the answers, calls and token counts of one at a time.
#[test]
fn score_qa_answers_the_same_four_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    crate::common::tiny_chat_model(dir.path());
    let summary = dir.path().join("summary.txt");
    std::fs::write(&summary, "w1 w2 w3. w4 w5 w6.\n").unwrap();
    let questions = dir.path().join("qa.jsonl");
    let pairs: String = (1..=6)
        .map(|i| format!("{{\"question\": \"w{i} w7?\", \"answer\": \"w{i}\"}}\n"))
        .collect();
    std::fs::write(&questions, pairs).unwrap();
    let score = |concurrency: &str| -> serde_json::Value {
        let (success, stdout, stderr) = run_prism(&[
            "score",
            "qa",
            summary.to_str().unwrap(),
            "--questions",
            questions.to_str().unwrap(),
            "--model",
            dir.path().to_str().unwrap(),
            "--concurrency",
            concurrency,
            "--json",
            // Side by side gives alone's bits only where each row is multiplied alone: the CPU.
            "--device",
            "cpu",
        ]);
        assert!(success, "{stderr}");
        serde_json::from_str(&stdout).unwrap()
    };
    let (in_turn, side_by_side) = (score("1"), score("4"));
    assert_eq!(side_by_side["questions"], in_turn["questions"]);
    assert_eq!(side_by_side["calls"], 6);
    for figure in ["prompt_tokens", "output_tokens"] {
        assert_eq!(side_by_side["figures"][figure], in_turn["figures"][figure]);
    }
    let refused = run_prism(&[
        "score",
        "qa",
        summary.to_str().unwrap(),
        "--questions",
        questions.to_str().unwrap(),
        "--concurrency",
        "0",
    ]);
    assert_one_error_line(&refused, "--concurrency");
}

/// `summarize --concurrency` on the tiny model: hierarchical's chunks,
/// three at a time on siblings of the engine, give the summary, the step
/// outputs and the token counts of one at a time.
#[test]
fn hierarchical_summarizes_three_chunks_at_a_time_to_the_same_summary() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    crate::common::tiny_chat_model(&model);
    let document = crate::common::words_document(dir.path());
    let summarize = |concurrency: &str| -> (String, Vec<serde_json::Value>, serde_json::Value) {
        let out = dir.path().join(format!("run-{concurrency}"));
        let (success, _, stderr) = run_prism(&[
            "summarize",
            document.to_str().unwrap(),
            "--method",
            "hierarchical",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--chunk-tokens",
            "10",
            "--max-summary-tokens",
            "6",
            "--concurrency",
            concurrency,
            // Side by side gives alone's bits only where each row is multiplied alone: the CPU.
            "--device",
            "cpu",
        ]);
        assert!(success, "{stderr}");
        let steps = std::fs::read_to_string(out.join("steps.jsonl"))
            .unwrap()
            .lines()
            .map(|line| {
                let step: serde_json::Value = serde_json::from_str(line).unwrap();
                serde_json::json!([step["level"], step["output"], step["prompt_tokens"]])
            })
            .collect();
        let stats: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("stats.json")).unwrap())
                .unwrap();
        let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
        (summary, steps, stats)
    };
    let (summary, steps, stats) = summarize("1");
    let (summary_3, steps_3, stats_3) = summarize("3");
    assert!(steps.len() >= 5, "several chunks and a merge: {steps:?}");
    assert_eq!(summary_3, summary);
    assert_eq!(steps_3, steps);
    for figure in ["calls", "prompt_tokens", "output_tokens"] {
        assert_eq!(stats_3[figure], stats[figure], "{figure}");
    }
}

#[test]
fn bench_engine_prints_each_sequence_counts_gain_over_the_first() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let model = dir.path().to_str().unwrap();
    let (success, stdout, stderr) = run_prism(&[
        "bench-engine",
        "--model",
        model,
        "--context",
        "8",
        "--decode-steps",
        "2",
        "--repeats",
        "1",
        "--sequences",
        "2,3",
        "--quiet",
    ]);
    assert!(success, "{stderr}");
    assert!(stdout.contains("| gain over 2 |"), "{stdout}");
    // | context | sequences | decode tok/s, all together | per sequence | gain |
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells.len() == 5 && cells[0] == "8")
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    let rate = |row: &[&str]| row[2].parse::<f64>().unwrap();
    let gain = |row: &[&str]| row[4].trim_end_matches('×').parse::<f64>().unwrap();
    assert_eq!((rows[0][1], gain(&rows[0])), ("2", 1.0));
    assert_eq!(rows[1][1], "3");
    let expected = rate(&rows[1]) / rate(&rows[0]);
    assert!(
        (gain(&rows[1]) - expected).abs() < 0.01 * expected.max(1.0),
        "{stdout}"
    );
}
