//! The README's first command on the sample it ships: the default model's
//! PRISM summary of `tests/fixtures/keeper-log.txt` tells who and what the log
//! is about, and neither loops nor copies the prompt.
//!
//! It runs Qwen2.5-Coder-1.5B for a few minutes on two cores, so it is
//! ignored by a plain `cargo test`; `scripts/test` runs it when the model is
//! fetched.

use crate::common::{fetched_model, run_prism};

#[test]
#[ignore = "minutes on the 1.5B default model; scripts/test runs it"]
fn the_default_model_summarizes_the_sample() {
    let model = fetched_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    let out = tempfile::tempdir().unwrap();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/keeper-log.txt");
    let (success, summary, stderr) = run_prism(&[
        "summarize",
        sample,
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(success, "{stderr}");
    let said = summary.to_lowercase();
    for needle in [
        "ada penhallow",
        "tomas reddick",
        "wenna cole",
        "vass",
        "fog",
        "flare",
        "gale",
        "ladder",
        "kept",
        "principal keeper",
    ] {
        assert!(
            said.contains(needle),
            "the summary never says {needle:?}:\n{summary}"
        );
    }
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("stats.json")).unwrap())
            .unwrap();
    let share = |key: &str| stats[key].as_f64().unwrap();
    assert!(share("repeated_ngram_share") <= 0.05, "{stats}");
    assert_eq!(share("echo_share"), 0.0, "{stats}");
}
