//! `--prompt-cache`: prefixes kept on disk are restored by later processes,
//! which then encode only what a process that never stopped would have.

use crate::common::{run_prism, tiny_chat_model, words_document};
use std::path::Path;

/// `prism summarize` of the words document with PRISM and small budgets.
fn summarize(model: &Path, doc: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "summarize",
        doc.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--chunk-tokens",
        "12",
        // Each revision call alone: a summary call before it would share its opening.
        "--reads",
        "text",
        // The tiny model's tokenizer names no end of sequence, which a grammar needs.
        "--constrained",
        "off",
        "--revision-tokens",
        "24",
        "--answer-tokens",
        "16",
        "--threads",
        "1",
    ];
    args.extend(extra);
    let (success, _, stderr) = run_prism(&args);
    assert!(success, "{stderr}");
}

fn steps(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("steps.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn count(step: &serde_json::Value, field: &str) -> u64 {
    step.get(field).and_then(|v| v.as_u64()).unwrap_or(0)
}

#[test]
fn a_run_resumed_with_the_prompt_cache_encodes_only_what_an_unbroken_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    tiny_chat_model(&model);
    let doc = words_document(dir.path());
    let cache = dir.path().join("kv");
    let cache = cache.to_str().unwrap();

    let unbroken = dir.path().join("unbroken");
    summarize(&model, &doc, &unbroken, &[]);
    let broken = dir.path().join("broken");
    let stop = ["--prompt-cache", cache, "--stop-after-chunks", "2"];
    summarize(&model, &doc, &broken, &stop);
    summarize(
        &model,
        &doc,
        &broken,
        &["--prompt-cache", cache, "--resume"],
    );

    let (unbroken_steps, broken_steps) = (steps(&unbroken), steps(&broken));
    assert_eq!(unbroken_steps.len(), broken_steps.len());
    assert!(unbroken_steps.len() > 3, "{unbroken_steps:?}");
    let (expected, resumed) = (&unbroken_steps[2], &broken_steps[2]);
    assert!(count(resumed, "restored_tokens") > 0, "{resumed}");
    assert_eq!(count(resumed, "reused_tokens"), 0, "{resumed}");
    assert_eq!(
        count(resumed, "restored_tokens"),
        count(expected, "reused_tokens"),
        "{resumed}\n{expected}"
    );
    assert_eq!(count(resumed, "net_tokens"), count(expected, "net_tokens"));
    // After the first resumed step the memory serves, as in the unbroken run.
    assert_eq!(count(&broken_steps[3], "restored_tokens"), 0);
    let read = |run: &Path, file: &str| std::fs::read_to_string(run.join(file)).unwrap();
    assert_eq!(read(&broken, "memory.json"), read(&unbroken, "memory.json"));
    assert_eq!(read(&broken, "summary.txt"), read(&unbroken, "summary.txt"));
}

#[test]
fn a_second_process_restores_the_shared_instructions_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    tiny_chat_model(dir.path());
    let model = dir.path().to_str().unwrap();
    let cache = dir.path().join("kv");
    let cache = cache.to_str().unwrap();
    let system = "w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21";
    let generate = |prompt: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            model,
            "--chat",
            "--system",
            system,
            "--prompt",
            prompt,
            "--max-tokens",
            "8",
            "--json",
            "--threads",
            "1",
        ];
        args.extend(extra);
        let (success, stdout, stderr) = run_prism(&args);
        assert!(success, "{stderr}");
        let first: serde_json::Value =
            serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
        first
    };
    generate("w30 w31 w32", &["--prompt-cache", cache]);
    let second = generate("w40 w41", &["--prompt-cache", cache]);
    let cold = generate("w40 w41", &[]);
    assert!(count(&second, "restored_tokens") >= 20, "{second}");
    assert_eq!(count(&second, "reused_tokens"), 0);
    assert_eq!(
        count(&second, "net_tokens") + count(&second, "restored_tokens"),
        count(&cold, "net_tokens")
    );
    assert_eq!(second["text"], cold["text"]);
}
