//! Tests of the run directory: its files, checkpoints and lock.

use super::*;
use serde_json::json;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Step {
    chunk: usize,
    note: String,
}

fn step(chunk: usize) -> Step {
    Step {
        chunk,
        note: format!("read chunk {chunk}"),
    }
}

fn run_dir() -> (tempfile::TempDir, RunDir) {
    let temp = tempfile::tempdir().expect("tempdir");
    let run = RunDir::create(temp.path().join("run")).expect("create run dir");
    (temp, run)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn atomic_write_replaces_and_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("summary.txt");
    write_atomic(&path, b"first").unwrap();
    write_atomic(&path, b"second").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"second");
    assert_eq!(entries(dir.path()), ["summary.txt"]);
}

#[test]
fn atomic_write_into_missing_dir_fails_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = write_atomic(&missing.join("a.txt"), b"x").unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn atomic_write_over_a_directory_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("taken")).unwrap();
    assert!(write_atomic(&dir.path().join("taken"), b"x").is_err());
    assert_eq!(entries(dir.path()), ["taken"]);
}

#[test]
fn create_makes_parents_and_accepts_an_existing_dir() {
    let temp = tempfile::tempdir().unwrap();
    let nested = temp.path().join("a/b/run");
    let run = RunDir::create(&nested).unwrap();
    assert!(nested.is_dir());
    assert_eq!(run.path(), nested);
    run.write_text(RunDir::SUMMARY, "kept").unwrap();
    let again = RunDir::create(&nested).unwrap();
    assert_eq!(
        fs::read_to_string(again.file(RunDir::SUMMARY).unwrap()).unwrap(),
        "kept"
    );
}

#[test]
fn create_refuses_a_file() {
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("out");
    fs::write(&file, "x").unwrap();
    let err = RunDir::create(&file).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
    assert!(err.to_string().contains("out"), "{err}");
}

#[test]
fn file_names_stay_inside_the_directory() {
    let (_temp, run) = run_dir();
    for bad in ["", ".", "..", "../x", "a/b", "a\\b", "/etc/passwd"] {
        assert!(run.file(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(
        run.file("memory.json").unwrap(),
        run.path().join("memory.json")
    );
}

#[test]
fn json_round_trip_is_pretty() {
    let (_temp, run) = run_dir();
    let memory = json!({"characters": ["Victor", "the creature"], "places": {"Geneva": 1}});
    run.write_json(RunDir::MEMORY, &memory).unwrap();
    let text = fs::read_to_string(run.file(RunDir::MEMORY).unwrap()).unwrap();
    assert!(text.contains("\n  \"characters\""), "{text}");
    assert!(text.ends_with("}\n"));
    assert_eq!(
        run.read_json::<Value>(RunDir::MEMORY).unwrap(),
        Some(memory)
    );
    assert_eq!(entries(run.path()), [RunDir::MEMORY]);
}

#[test]
fn read_json_missing_is_none() {
    let (_temp, run) = run_dir();
    assert_eq!(run.read_json::<Value>(RunDir::STATS).unwrap(), None);
}

#[test]
fn read_json_corrupt_names_the_file() {
    let (_temp, run) = run_dir();
    run.write_text(RunDir::STATS, "{\"tokens\": 1").unwrap();
    let err = run
        .read_json::<Value>(RunDir::STATS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("stats.json"), "{err}");
    assert!(err.contains("corrupt"), "{err}");

    run.write_text(RunDir::STATS, "{\"chunk\": \"one\"}")
        .unwrap();
    let err = run
        .read_json::<Step>(RunDir::STATS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("stats.json"), "{err}");
    assert!(err.contains("expected fields"), "{err}");
}

#[test]
fn jsonl_append_read_and_rewrite() {
    let (_temp, run) = run_dir();
    assert!(run.read_jsonl::<Step>(RunDir::STEPS).unwrap().is_empty());
    for chunk in 0..3 {
        run.append_jsonl(RunDir::STEPS, &step(chunk)).unwrap();
    }
    let steps: Vec<Step> = run.read_jsonl(RunDir::STEPS).unwrap();
    assert_eq!(steps, [step(0), step(1), step(2)]);

    // Resuming from a checkpoint after chunk 1: the log keeps exactly two steps.
    run.rewrite_jsonl(RunDir::STEPS, &steps[..2]).unwrap();
    run.append_jsonl(RunDir::STEPS, &step(2)).unwrap();
    let steps: Vec<Step> = run.read_jsonl(RunDir::STEPS).unwrap();
    assert_eq!(steps, [step(0), step(1), step(2)]);
    assert_eq!(entries(run.path()), [RunDir::STEPS]);
}

#[test]
fn jsonl_torn_last_line_is_dropped_then_overwritten() {
    let (_temp, run) = run_dir();
    let path = run.file(RunDir::STEPS).unwrap();
    fs::write(&path, "{\"chunk\":0,\"note\":\"a\"}\n{\"chunk\":1,\"no").unwrap();
    let steps: Vec<Step> = run.read_jsonl(RunDir::STEPS).unwrap();
    assert_eq!(steps.len(), 1);

    run.append_jsonl(RunDir::STEPS, &step(1)).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    let steps: Vec<Step> = run.read_jsonl(RunDir::STEPS).unwrap();
    assert_eq!(steps[1], step(1));
}

#[test]
fn jsonl_valid_last_line_without_newline_is_kept() {
    let (_temp, run) = run_dir();
    let path = run.file(RunDir::STEPS).unwrap();
    fs::write(&path, "{\"chunk\":0,\"note\":\"a\"}").unwrap();
    assert_eq!(run.read_jsonl::<Step>(RunDir::STEPS).unwrap().len(), 1);
    run.append_jsonl(RunDir::STEPS, &step(1)).unwrap();
    assert_eq!(run.read_jsonl::<Step>(RunDir::STEPS).unwrap().len(), 2);
}

#[test]
fn jsonl_bad_middle_line_names_file_and_line() {
    let (_temp, run) = run_dir();
    let path = run.file(RunDir::STEPS).unwrap();
    fs::write(
        &path,
        "{\"chunk\":0,\"note\":\"a\"}\n\nnot json\n{\"chunk\":1,\"note\":\"b\"}\n",
    )
    .unwrap();
    let err = run
        .read_jsonl::<Step>(RunDir::STEPS)
        .unwrap_err()
        .to_string();
    assert!(err.contains("steps.jsonl:3"), "{err}");
}

#[test]
fn checkpoint_round_trip() {
    let (_temp, run) = run_dir();
    let print = fingerprint(&json!({"method": "prism", "chunk_tokens": 2048}));
    assert!(run.load_checkpoint::<Vec<Step>>(&print).unwrap().is_none());

    let checkpoint = Checkpoint::new(print.clone(), 2, vec![step(0), step(1)]);
    run.save_checkpoint(&checkpoint).unwrap();
    let loaded = run.load_checkpoint::<Vec<Step>>(&print).unwrap();
    assert_eq!(loaded, Some(checkpoint));
    assert_eq!(entries(run.path()), [RunDir::CHECKPOINT]);
}

#[test]
fn checkpoint_from_other_settings_is_refused() {
    let (_temp, run) = run_dir();
    let old = fingerprint(&json!({"chunk_tokens": 2048}));
    let new = fingerprint(&json!({"chunk_tokens": 1024}));
    run.save_checkpoint(&Checkpoint::new(old, 1, json!({})))
        .unwrap();
    let err = run.load_checkpoint::<Value>(&new).unwrap_err().to_string();
    assert!(err.contains("checkpoint.json"), "{err}");
    assert!(err.contains("different settings"), "{err}");
    assert!(err.contains("drop resume"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn checkpoint_from_another_format_is_refused() {
    let (_temp, run) = run_dir();
    let print = fingerprint(&1);
    let mut checkpoint = Checkpoint::new(print.clone(), 1, json!(null));
    checkpoint.version = CHECKPOINT_VERSION + 1;
    run.save_checkpoint(&checkpoint).unwrap();
    let err = run
        .load_checkpoint::<Value>(&print)
        .unwrap_err()
        .to_string();
    assert!(err.contains("format"), "{err}");
}

#[test]
fn checkpoint_with_unexpected_state_is_an_error() {
    let (_temp, run) = run_dir();
    let print = fingerprint(&1);
    run.save_checkpoint(&Checkpoint::new(print.clone(), 1, json!({"x": 1})))
        .unwrap();
    let err = run
        .load_checkpoint::<Vec<Step>>(&print)
        .unwrap_err()
        .to_string();
    assert!(err.contains("checkpoint.json"), "{err}");
    assert!(err.contains("state"), "{err}");
}

#[test]
fn corrupt_checkpoint_is_an_error() {
    let (_temp, run) = run_dir();
    run.write_text(RunDir::CHECKPOINT, "").unwrap();
    let err = run.load_checkpoint::<Value>("x").unwrap_err().to_string();
    assert!(err.contains("checkpoint.json"), "{err}");
}

#[test]
fn fingerprint_is_stable_and_ignores_key_order() {
    #[derive(Serialize)]
    struct Config {
        method: &'static str,
        chunk_tokens: usize,
    }
    let a = fingerprint(&Config {
        method: "prism",
        chunk_tokens: 2048,
    });
    assert_eq!(a.len(), 64);
    assert!(a
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    // Same settings, keys in another order (serde_json keeps insertion order here).
    let mut object = serde_json::Map::new();
    object.insert("chunk_tokens".into(), json!(2048));
    object.insert("method".into(), json!("prism"));
    assert_eq!(fingerprint(&Value::Object(object)), a);
    // Any change of a setting changes it.
    let b = fingerprint(&Config {
        method: "prism",
        chunk_tokens: 1024,
    });
    assert_ne!(a, b);
}

#[test]
fn a_second_lock_on_a_run_is_refused_until_the_first_is_dropped() {
    let (_temp, run) = run_dir();
    let held = run.lock().unwrap();
    let err = run.lock().unwrap_err().to_string();
    assert!(
        err.contains(&format!("prism process {}", std::process::id())),
        "{err}"
    );
    drop(held);
    run.lock().unwrap();
}

#[test]
fn a_damaged_checkpoint_falls_back_to_the_one_before() {
    let (_temp, run) = run_dir();
    run.save_checkpoint(&Checkpoint::new("f", 1, json!({"memory": 1})))
        .unwrap();
    run.save_checkpoint(&Checkpoint::new("f", 2, json!({"memory": 2})))
        .unwrap();
    fs::write(
        run.file(RunDir::CHECKPOINT).unwrap(),
        b"{\"version\": 2, \"conf",
    )
    .unwrap();
    let loaded = run.load_checkpoint::<Value>("f").unwrap().unwrap();
    assert_eq!(loaded.completed_steps, 1);
    fs::remove_file(run.file(RunDir::CHECKPOINT).unwrap()).unwrap();
    let loaded = run.load_checkpoint::<Value>("f").unwrap().unwrap();
    assert_eq!(loaded.state, json!({"memory": 1}));
    fs::remove_file(run.file(RunDir::PREVIOUS_CHECKPOINT).unwrap()).unwrap();
    assert!(run.load_checkpoint::<Value>("f").unwrap().is_none());
}
