//! `--prompt-cache`: prefixes kept on disk are restored by later processes,
//! which then encode only what a process that never stopped would have.

use crate::common::{max_abs_diff, run_prism, tiny_chat_model, words_document};
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, GenerateOptions, PromptCacheConfig};
use std::path::{Path, PathBuf};

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
    // The store keeps the whole blocks of the prefix the next step shares
    // (instructions and memory), so a resume computes again what is left
    // of it past the last whole block, and nothing more.
    let block = prism::engine::prompt_cache::BLOCK_TOKENS as u64;
    let reused = count(expected, "reused_tokens");
    assert_eq!(
        count(resumed, "restored_tokens"),
        reused / block * block,
        "{resumed}\n{expected}"
    );
    assert_eq!(
        count(resumed, "net_tokens"),
        count(expected, "net_tokens") + reused % block
    );
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

/// The tiny chat model in `dir`, with its prompt cache in `kv` when given.
fn tiny_engine(dir: &Path, kv: Option<&Path>) -> Engine {
    let source = ModelSource::HfDir {
        dir: dir.to_path_buf(),
        name: "tiny".into(),
    };
    let config = EngineConfig {
        prompt_cache: kv.map(|kv| PromptCacheConfig {
            dir: kv.to_path_buf(),
            budget_bytes: 1 << 30,
        }),
        ..EngineConfig::new(source)
    };
    Engine::open(&config).unwrap()
}

/// `n` word ids of the tiny model that do not repeat in short runs.
fn word_ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 2 + (i * 7 + i / 62) % 62).collect()
}

/// Generate one token after `prompt` with the prompt cache in `kv`, which
/// stores the prompt's KV there.
fn store_prompt(model: &Path, kv: &Path, prompt: &[u32]) {
    let options = GenerateOptions {
        max_tokens: 1,
        ..GenerateOptions::default()
    };
    let mut engine = tiny_engine(model, Some(kv));
    engine.generate(prompt, &options).unwrap();
}

/// Two whole blocks and part of a third, restored by another engine, give
/// the logits of the whole prompt computed afresh (to the 1e-4 in-memory
/// reuse keeps to, see `engine.rs`).
#[test]
fn a_prefix_restored_from_blocks_gives_the_logits_of_a_fresh_prefill() {
    let dir = tempfile::tempdir().unwrap();
    tiny_chat_model(dir.path());
    let kv = dir.path().join("kv");
    let prompt = word_ids(600);
    store_prompt(dir.path(), &kv, &prompt[..560]);

    let mut restoring = tiny_engine(dir.path(), Some(&kv));
    let (restored, usage) = restoring.prefill(&prompt).unwrap();
    assert!(usage.restored_tokens >= 560, "{usage:?}");
    let (fresh, fresh_usage) = tiny_engine(dir.path(), None).prefill(&prompt).unwrap();
    assert_eq!(fresh_usage.restored_tokens, 0);
    let diff = max_abs_diff(&restored, &fresh);
    assert!(diff <= 1e-4, "logits differ by {diff}");
}

fn block_files(kv: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for folder in std::fs::read_dir(kv).unwrap() {
        for file in std::fs::read_dir(folder.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn prism_cache_verify_fails_on_a_corrupt_store_and_passes_on_a_sound_one() {
    let dir = tempfile::tempdir().unwrap();
    tiny_chat_model(dir.path());
    let kv = dir.path().join("kv");
    store_prompt(dir.path(), &kv, &word_ids(300));
    let kv_arg = kv.to_str().unwrap();
    let cache = |command: &str| run_prism(&["cache", command, "--dir", kv_arg]);

    let (sound, stdout, stderr) = cache("verify");
    assert!(sound, "{stdout}{stderr}");
    assert!(stdout.contains("2 blocks checked, 0 bad"), "{stdout}");
    let (listed, stdout, _) = cache("list");
    assert!(listed && stdout.contains("300 tokens"), "{stdout}");

    let files = block_files(&kv);
    assert_eq!(files.len(), 2);
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&files[0], bytes).unwrap();
    let (sound, stdout, stderr) = cache("verify");
    assert!(!sound, "{stdout}");
    assert!(stdout.contains("bad: "), "{stdout}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    let (sound, stdout, stderr) = cache("verify");
    assert!(sound, "{stdout}{stderr}");

    let (cleared, stdout, stderr) = cache("clear");
    assert!(cleared, "{stderr}");
    assert!(block_files(&kv).is_empty(), "{stdout}");
    let (counted, stdout, _) = cache("stats");
    assert!(
        counted && stdout.contains("total: 1 model folders  0 blocks"),
        "{stdout}"
    );
}
