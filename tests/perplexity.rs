//! Fidelity: prism's perplexity of a text under a GGUF file is within 1% of
//! llama.cpp's for the same windows (`tests/fixtures/llama_cpp_perplexity.json`,
//! written by `scripts/llama_cpp_perplexity.py`), so prism computes what the
//! file means.

use crate::common::fetched_model;
use prism::engine::perplexity::Windows;
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    generated_by: String,
    model: String,
    text: String,
    context: usize,
    perplexity: f64,
    windows: usize,
    scored_tokens: usize,
}

#[test]
fn smollm2_perplexity_is_within_one_percent_of_llama_cpps() {
    let manifest = env!("CARGO_MANIFEST_DIR");
    let fixture = std::fs::read_to_string(format!(
        "{manifest}/tests/fixtures/llama_cpp_perplexity.json"
    ));
    let fixture: Fixture = serde_json::from_str(&fixture.unwrap()).unwrap();
    let source = ModelSource::Gguf {
        path: fetched_model(&fixture.model),
        name: fixture.model.clone(),
    };
    let mut engine = Engine::open(&EngineConfig::new(source)).unwrap();
    let text = std::fs::read_to_string(format!("{manifest}/{}", fixture.text)).unwrap();
    let windows = Windows {
        context: fixture.context,
        stride: fixture.context,
    };
    let ours = engine.perplexity(&text, windows, &mut |_, _| {}).unwrap();
    assert_eq!(ours.windows, fixture.windows);
    assert_eq!(ours.scored_tokens, fixture.scored_tokens);
    let difference = ours.perplexity / fixture.perplexity - 1.0;
    assert!(
        difference.abs() < 0.01,
        "prism {:.4}, llama.cpp {:.4} ({}): {:+.2}%",
        ours.perplexity,
        fixture.perplexity,
        fixture.generated_by,
        100.0 * difference
    );
}
