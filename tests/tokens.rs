//! GGUF tokenizers agree with llama.cpp, id for id, on the texts recorded in
//! `tests/fixtures/llama_cpp_tokens.json` (written by `scripts/llama-cpp-tokens.py`).

use prism::engine::tokenizer::Tokenizer;
use serde::Deserialize;

use crate::common;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Deserialize)]
struct Fixture {
    generated_by: String,
    models: std::collections::BTreeMap<String, Model>,
}

#[derive(Deserialize)]
struct Model {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    /// The text contains special tokens, so it does not decode back to itself with them
    /// skipped (and llama.cpp's ids for it count the specials as one id each).
    #[serde(default)]
    special: bool,
    ids: Vec<u32>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/llama_cpp_tokens.json"
    );
    let text = std::fs::read_to_string(path).expect("read the llama.cpp fixture");
    serde_json::from_str(&text).expect("parse the llama.cpp fixture")
}

fn gguf_tokenizer(path: &std::path::Path) -> Tokenizer {
    let mut file = std::fs::File::open(path).expect("open the GGUF file");
    let content =
        candle_core::quantized::gguf_file::Content::read(&mut file).expect("read GGUF metadata");
    Tokenizer::from_gguf(&content, &path.display().to_string()).expect("build the tokenizer")
}

/// Every case of one model: same ids as llama.cpp, and ordinary text decodes to itself.
fn check_model(file_name: &str, model: &Model, generated_by: &str) {
    let tokenizer = gguf_tokenizer(&common::fetched_model(file_name));
    let mut mismatches = Vec::new();
    for case in &model.cases {
        let ids = tokenizer.encode(&case.text).expect("encode");
        if ids != case.ids {
            mismatches.push(format!(
                "{:?}\n  prism:     {ids:?}\n  llama.cpp: {:?}",
                case.text, case.ids
            ));
        }
        if !case.special {
            let text = tokenizer.decode(&ids, false).expect("decode");
            assert_eq!(text, case.text, "{file_name}: decode(encode(text)) != text");
        }
    }
    assert!(
        mismatches.is_empty(),
        "{file_name}: {} of {} cases differ from {generated_by}:\n{}",
        mismatches.len(),
        model.cases.len(),
        mismatches.join("\n")
    );
}

#[test]
fn gguf_tokenizers_match_llama_cpp() {
    let fixture = fixture();
    assert!(
        fixture.models.contains_key(SMOLLM2),
        "the fixture lacks {SMOLLM2}"
    );
    for (file_name, model) in &fixture.models {
        let present = prism::models::models_dir().join(file_name).is_file();
        if file_name != SMOLLM2 && !present {
            eprintln!(
                "note: skipping the llama.cpp comparison for {file_name}: the model was not \
                 fetched (run scripts/setup to fetch it; CI fetches every model)"
            );
            continue;
        }
        check_model(file_name, model, &fixture.generated_by);
    }
}

#[test]
fn smollm2_gguf_facts() {
    let tokenizer = gguf_tokenizer(&common::fetched_model(SMOLLM2));
    assert_eq!(tokenizer.bos_token(), Some("<|im_start|>"));
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert_eq!(tokenizer.eos_token(), Some("<|im_end|>"));
    assert_eq!(tokenizer.stop_token_ids(), [0, 2]);
    assert!(!tokenizer.add_bos());
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert!(tokenizer
        .chat_template()
        .is_some_and(|t| t.contains("<|im_start|>")));
    // Special tokens written in the text are one id each, and skip_special drops them.
    let ids = tokenizer
        .encode("<|im_start|>user\nHi<|im_end|>")
        .expect("encode");
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tokenizer.decode(&ids, true).expect("decode"), "user\nHi");
}

#[test]
fn qwen25_gguf_facts() {
    let file_name = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
    if !prism::models::models_dir().join(file_name).is_file() {
        eprintln!("note: skipping qwen25_gguf_facts: {file_name} was not fetched");
        return;
    }
    let tokenizer = gguf_tokenizer(&common::fetched_model(file_name));
    assert_eq!(tokenizer.bos_token(), Some("<|endoftext|>"));
    assert_eq!(tokenizer.bos_token_id(), Some(151643));
    assert_eq!(tokenizer.eos_token(), Some("<|im_end|>"));
    assert_eq!(tokenizer.stop_token_ids(), [151643, 151645]);
    assert!(!tokenizer.add_bos());
    assert_eq!(tokenizer.vocab_size(), 151936);
    // `<tool_call>` is user-defined: one id, and kept when special tokens are skipped.
    let ids = tokenizer.encode("<|im_start|><tool_call>").expect("encode");
    assert_eq!(ids, [151644, 151657]);
    assert_eq!(tokenizer.decode(&ids, true).expect("decode"), "<tool_call>");
}

/// A document read whole counts the tokens of the whole text, even where
/// its chunks' own counts add up differently (a chunk's edge can split what
/// the whole text tokenizes as one); `--first-tokens` counts the chunks kept.
#[test]
fn a_document_read_whole_counts_the_whole_text() {
    use prism::engine::prompt_format::PromptFormat;
    use prism::engine::source::ModelSource;
    use prism::job::Document;
    let format = PromptFormat::load(&ModelSource::Gguf {
        path: common::fetched_model(SMOLLM2),
        name: "smollm2".into(),
    })
    .unwrap();
    let text: String = (0..40)
        .map(|i| {
            format!("Paragraph {i} of the log: the lamp was lit at dusk and the fog held.\n\n")
        })
        .collect();
    let tokens = format.tokenizer().encode(&text).unwrap().len();
    let whole = Document::split(&format, &text, tokens, 100, None).unwrap();
    assert!(whole.chunks.len() > 3);
    assert_eq!(whole.read_tokens, tokens);

    let first = Document::split(&format, &text, tokens, 100, Some(250)).unwrap();
    let kept: usize = first.chunks.iter().map(|chunk| chunk.tokens).sum();
    assert!(first.chunks.len() < whole.chunks.len());
    assert_eq!(first.read_tokens, kept);
    assert!(kept <= 250);
}
