//! The README's first command on the sample it ships: the default model's
//! PRISM summary of `tests/fixtures/keeper-log.txt` names the log's four
//! people and tells its storms and the Board's decision, in a third of its
//! words or fewer, in the third person, without copying the log out,
//! looping or copying the prompt.
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
        "gale",
        "ladder",
    ] {
        assert!(
            said.contains(needle),
            "the summary never says {needle:?}:\n{summary}"
        );
    }
    // The decision is to keep the light and electrify it; a summary says
    // either ("an electric lamp", "new electrical equipment").
    assert!(
        said.contains("keep gull rock") || said.contains("electric"),
        "the summary never tells the Board's decision:\n{summary}"
    );
    let words: Vec<String> = said
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(str::to_string)
        .collect();
    for first_person in ["i", "we", "me", "us", "my", "our"] {
        assert!(
            !words.iter().any(|word| word == first_person),
            "the summary speaks in the first person ({first_person:?}):\n{summary}"
        );
    }
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("stats.json")).unwrap())
            .unwrap();
    let share = |key: &str| stats[key].as_f64().unwrap();
    assert!(share("compression") <= 1.0 / 3.0, "{summary}\n{stats}");
    assert!(share("copied_8gram_share") <= 0.25, "{summary}\n{stats}");
    assert!(share("notes_copied_8gram_share") <= 0.40, "{stats}");
    assert!(share("repeated_ngram_share") <= 0.05, "{stats}");
    assert_eq!(share("echo_share"), 0.0, "{stats}");
}
