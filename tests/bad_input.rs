//! Malformed files, interrupted runs and absurd flags, each as a user would
//! meet them: one `error:` line, a failing exit status, no panic or hang,
//! and nothing saved before is lost.

use crate::common::{
    assert_ends_with_one_error_line, assert_one_error_line, prism, run_prism, tiny_chat_model,
    words_document, write_tiny_model, TinyArch,
};
use std::path::Path;
use std::process::Stdio;

/// GGUF value types, as the format numbers them.
const GGUF_U32: u32 = 4;
const GGUF_STRING: u32 = 8;
const GGUF_ARRAY: u32 = 9;

/// A GGUF metadata value.
enum Meta<'a> {
    U32(u32),
    Str(&'a str),
    Strings(&'a [&'a str]),
}

/// A GGUF file with `metadata` and the header entries of `tensors` (name,
/// dimensions, all f32), followed by enough zero bytes for their data.
fn write_gguf(path: &Path, metadata: &[(&str, Meta)], tensors: &[(&str, &[u64])]) {
    fn string(out: &mut Vec<u8>, text: &str) {
        out.extend((text.len() as u64).to_le_bytes());
        out.extend(text.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        string(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend(GGUF_U32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Str(text) => {
                out.extend(GGUF_STRING.to_le_bytes());
                string(&mut out, text);
            }
            Meta::Strings(items) => {
                out.extend(GGUF_ARRAY.to_le_bytes());
                out.extend(GGUF_STRING.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in *items {
                    string(&mut out, item);
                }
            }
        }
    }
    let mut offset = 0u64;
    for (name, dims) in tensors {
        string(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        for dim in *dims {
            out.extend(dim.to_le_bytes());
        }
        out.extend(0u32.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += 4 * dims.iter().product::<u64>();
    }
    out.resize(out.len().next_multiple_of(32) + offset as usize + 64, 0);
    std::fs::write(path, out).unwrap();
}

/// The metadata of a small Llama, with `overrides` put in place of (or
/// added to) its entries.
fn llama_metadata<'a>(overrides: Vec<(&'a str, Meta<'a>)>) -> Vec<(&'a str, Meta<'a>)> {
    const TOKENS: &[&str] = &["<s>", "</s>", "a", "b"];
    let mut metadata = vec![
        ("general.architecture", Meta::Str("llama")),
        ("llama.embedding_length", Meta::U32(8)),
        ("llama.attention.head_count", Meta::U32(2)),
        ("llama.feed_forward_length", Meta::U32(16)),
        ("llama.block_count", Meta::U32(1)),
        ("llama.context_length", Meta::U32(64)),
        ("tokenizer.ggml.model", Meta::Str("llama")),
        ("tokenizer.ggml.tokens", Meta::Strings(TOKENS)),
    ];
    for (key, value) in overrides {
        metadata.retain(|(existing, _)| *existing != key);
        metadata.push((key, value));
    }
    metadata
}

fn generate_with(model: &Path) -> (bool, String, String) {
    run_prism(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "a",
    ])
}

#[test]
fn an_embedding_without_dimensions_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    write_gguf(
        &path,
        &llama_metadata(vec![]),
        &[("token_embd.weight", &[])],
    );
    assert_one_error_line(&generate_with(&path), "token_embd.weight has no dimensions");
}

#[test]
fn a_zero_alignment_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let metadata = llama_metadata(vec![("general.alignment", Meta::U32(0))]);
    write_gguf(&path, &metadata, &[("token_embd.weight", &[8, 4])]);
    assert_one_error_line(&generate_with(&path), "general.alignment");
}

#[test]
fn a_huge_context_length_in_a_gguf_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let metadata = llama_metadata(vec![("llama.context_length", Meta::U32(1 << 31))]);
    write_gguf(&path, &metadata, &[("token_embd.weight", &[8, 4])]);
    assert_one_error_line(&generate_with(&path), "context length of 2147483648");
}

#[test]
fn a_huge_context_length_in_a_config_json_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let config_path = dir.path().join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let config = config.replace(
        "\"max_position_embeddings\":256",
        "\"max_position_embeddings\":2147483000",
    );
    std::fs::write(&config_path, config).unwrap();
    assert_one_error_line(&generate_with(dir.path()), "context length of 2147483000");
}

#[test]
fn a_weights_file_cut_short_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let weights = dir.path().join("model.safetensors");
    let length = std::fs::metadata(&weights).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap();
    file.set_len(length - 100).unwrap();
    assert_one_error_line(&generate_with(dir.path()), "model.safetensors");
}

#[test]
fn a_chat_template_that_loops_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let looping =
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::json!({ "chat_template": looping }).to_string(),
    )
    .unwrap();
    let result = run_prism(&[
        "generate",
        "--model",
        dir.path().to_str().unwrap(),
        "--chat",
        "--prompt",
        "w2",
    ]);
    assert_ends_with_one_error_line(&result, "seems to loop");
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let mut child = prism()
        .args(["models", "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn a_device_is_not_a_document() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let out = dir.path().join("run");
    let result = run_prism(&[
        "summarize",
        "/dev/zero",
        "--model",
        dir.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_one_error_line(&result, "not a regular file");
}

#[test]
fn absurd_threads_and_cache_slots_are_one_error_line_each() {
    for (flag, value) in [("--threads", "100000"), ("--cache-slots", "65535")] {
        let result = run_prism(&["generate", "--prompt", "hi", flag, value]);
        let (success, _, stderr) = &result;
        assert!(!success);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(flag),
            "{stderr}"
        );
    }
}

#[test]
fn bench_engine_refuses_empty_runs_and_long_contexts_before_measuring() {
    for flag in ["--context", "--decode-steps", "--repeats"] {
        assert_one_error_line(&run_prism(&["bench-engine", flag, "0"]), flag);
    }
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), TinyArch::Llama, 3);
    let model = dir.path().to_str().unwrap();
    let result = run_prism(&[
        "bench-engine",
        "--model",
        model,
        "--threads",
        "1",
        "--context",
        "8,1000",
        "--decode-steps",
        "2",
        "--repeats",
        "1",
    ]);
    assert_ends_with_one_error_line(&result, "exceeds the model's context");
    assert!(
        result.1.is_empty(),
        "measured before refusing: {}",
        result.1
    );
}

/// A tiny chat model and a document in a fresh directory, and `summarize`
/// on them into `run` with small budgets and `extra` flags.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("model")).unwrap();
        tiny_chat_model(&dir.path().join("model"));
        words_document(dir.path());
        Fixture { dir }
    }

    fn run_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("run")
    }

    fn summarize(&self, extra: &[&str]) -> (bool, String, String) {
        let model = self.dir.path().join("model");
        let doc = self.dir.path().join("doc.txt");
        let out = self.run_dir();
        let mut args = vec![
            "summarize",
            doc.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--chunk-tokens",
            "20",
            "--constrained",
            "off",
            "--revision-tokens",
            "6",
            "--answer-tokens",
            "6",
            "--schema",
            concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/book.json"),
        ];
        args.extend_from_slice(extra);
        run_prism(&args)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.run_dir().join(name)).unwrap()
    }
}

#[test]
fn resume_without_a_checkpoint_refuses_and_touches_nothing() {
    let fixture = Fixture::new();
    std::fs::create_dir(fixture.run_dir()).unwrap();
    assert_one_error_line(&fixture.summarize(&["--resume"]), "nothing to resume");
    assert_eq!(std::fs::read_dir(fixture.run_dir()).unwrap().count(), 0);

    // Steps whose checkpoint is gone are not thrown away by a fresh start.
    let (success, _, stderr) = fixture.summarize(&["--stop-after-chunks", "2"]);
    assert!(success, "{stderr}");
    let steps = fixture.read("steps.jsonl");
    for name in ["checkpoint.json", "checkpoint.prev.json"] {
        std::fs::remove_file(fixture.run_dir().join(name)).unwrap();
    }
    assert_ends_with_one_error_line(&fixture.summarize(&[]), "no readable checkpoint");
    assert_eq!(fixture.read("steps.jsonl"), steps);
}

#[test]
fn resume_with_other_settings_refuses_and_touches_nothing() {
    let fixture = Fixture::new();
    let (success, _, stderr) = fixture.summarize(&["--stop-after-chunks", "2"]);
    assert!(success, "{stderr}");
    let (steps, checkpoint) = (fixture.read("steps.jsonl"), fixture.read("checkpoint.json"));
    assert_ends_with_one_error_line(
        &fixture.summarize(&["--resume", "--temperature", "0.5"]),
        "this run directory was started with different settings",
    );
    assert_eq!(fixture.read("steps.jsonl"), steps);
    assert_eq!(fixture.read("checkpoint.json"), checkpoint);
}

#[test]
fn a_corrupt_checkpoint_costs_one_step_not_the_run() {
    let fixture = Fixture::new();
    let (success, _, stderr) = fixture.summarize(&["--stop-after-chunks", "2"]);
    assert!(success, "{stderr}");
    std::fs::write(
        fixture.run_dir().join("checkpoint.json"),
        "{\"version\": 2, \"con",
    )
    .unwrap();
    let (success, _, stderr) = fixture.summarize(&["--resume"]);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("resuming from the checkpoint before it"),
        "{stderr}"
    );
    let stats: serde_json::Value = serde_json::from_str(&fixture.read("stats.json")).unwrap();
    let steps = fixture.read("steps.jsonl").lines().count();
    assert_eq!(stats["steps"], steps);
    assert!(steps > 2, "{steps} steps");
}

#[test]
fn a_second_writer_on_one_run_is_refused() {
    let fixture = Fixture::new();
    std::fs::create_dir(fixture.run_dir()).unwrap();
    let lock = std::fs::File::create(fixture.run_dir().join(".lock")).unwrap();
    lock.try_lock().unwrap();
    std::fs::write(fixture.run_dir().join(".lock"), "4242").unwrap();
    assert_ends_with_one_error_line(
        &fixture.summarize(&[]),
        "prism process 4242 is writing this run",
    );
    drop(lock);
    let (success, _, stderr) = fixture.summarize(&[]);
    assert!(success, "{stderr}");
}

mod mutations {
    //! Random byte mutations of small model files, loaded in-process: the
    //! loader may refuse them, never panic.

    use super::{llama_metadata, write_gguf};
    use crate::common::{write_tiny_model, TinyArch};
    use prism::engine::source::ModelSource;
    use prism::engine::{Engine, EngineConfig};
    use proptest::prelude::*;

    /// Overwrite one byte in each of `edits` (position taken modulo the length).
    fn mutate(bytes: &mut [u8], edits: &[(usize, u8)]) {
        for &(at, byte) in edits {
            let len = bytes.len();
            bytes[at % len] = byte;
        }
    }

    fn load(source: &ModelSource) {
        // Ok or Err are both fine; a panic fails the case.
        let _ = Engine::open(&EngineConfig::new(source.clone()));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn a_mutated_gguf_header_is_refused_not_a_panic(
            edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("model.gguf");
            write_gguf(&path, &llama_metadata(vec![]), &[("token_embd.weight", &[8, 4])]);
            let mut bytes = std::fs::read(&path).unwrap();
            mutate(&mut bytes, &edits);
            std::fs::write(&path, bytes).unwrap();
            load(&ModelSource::Gguf { path, name: "mutated".into() });
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn a_mutated_config_or_tokenizer_is_refused_not_a_panic(
            file in prop::sample::select(vec!["config.json", "tokenizer.json"]),
            edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)
        ) {
            let dir = tempfile::tempdir().unwrap();
            write_tiny_model(dir.path(), TinyArch::Qwen2, 1);
            let path = dir.path().join(file);
            let mut bytes = std::fs::read(&path).unwrap();
            mutate(&mut bytes, &edits);
            std::fs::write(&path, bytes).unwrap();
            load(&ModelSource::HfDir { dir: dir.path().to_path_buf(), name: "mutated".into() });
        }
    }
}
