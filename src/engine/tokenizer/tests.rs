//! Tests of both tokenizer sources: the GGUF pre-tokenizer table and metadata checks, and Hugging Face directories.

use super::gguf::{pre_tokenizer_rule, split_merge, PRE_TOKENIZERS};
use super::*;
use candle_core::quantized::gguf_file::VersionedMagic;
use candle_core::quantized::gguf_file::{Content, Value};
use std::collections::HashMap;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::SplitDelimiterBehavior;

/// The byte-level symbol of each byte (GPT-2's table): printable Latin-1 bytes stand for
/// themselves, the others are shifted to U+0100 and up in byte order.
fn byte_symbols() -> Vec<String> {
    let mut shifted = 0u32;
    (0u32..256)
        .map(|byte| {
            let printable = (0x21..=0x7e).contains(&byte)
                || (0xa1..=0xac).contains(&byte)
                || (0xae..=0xff).contains(&byte);
            let code = if printable {
                byte
            } else {
                shifted += 1;
                255 + shifted
            };
            char::from_u32(code).expect("valid code point").to_string()
        })
        .collect()
}

/// A tiny GGUF vocabulary: three control tokens, the 256 byte symbols, and merges that
/// build "Ġthe", "12" and "ab".
fn tiny_gguf(pre: &str) -> Content {
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    tokens.extend(byte_symbols());
    let merges = ["Ġ t", "h e", "Ġt he", "1 2", "a b"];
    for merge in merges {
        tokens.push(merge.replace(' ', ""));
    }
    tokens.push("<tool_call>".to_string());
    let mut types = vec![3i32; specials.len()];
    types.extend(std::iter::repeat_n(1, tokens.len() - specials.len() - 1));
    types.push(4);

    let strings = |items: Vec<String>| Value::Array(items.into_iter().map(Value::String).collect());
    let mut metadata = HashMap::new();
    metadata.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
    metadata.insert("tokenizer.ggml.pre".into(), Value::String(pre.into()));
    metadata.insert("tokenizer.ggml.tokens".into(), strings(tokens));
    metadata.insert(
        "tokenizer.ggml.token_type".into(),
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    metadata.insert(
        "tokenizer.ggml.merges".into(),
        strings(merges.iter().map(|m| m.to_string()).collect()),
    );
    metadata.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1));
    metadata.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
    metadata.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(false));
    metadata.insert(
        "tokenizer.chat_template".into(),
        Value::String("{{ x }}".into()),
    );
    Content {
        magic: VersionedMagic::GgufV3,
        metadata,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    }
}

fn pieces(tokenizer: &Tokenizer, text: &str) -> Vec<String> {
    let ids = tokenizer.encode(text).expect("encode");
    ids.iter()
        .map(|id| tokenizer.inner().id_to_token(*id).expect("known id"))
        .collect()
}

fn reason_of(error: Error) -> String {
    match error {
        Error::Tokenizer { reason, .. } => reason,
        other => panic!("expected a tokenizer error, got {other}"),
    }
}

#[test]
fn table_knows_only_listed_pre_tokenizers() {
    assert!(pre_tokenizer_rule("smollm").is_some());
    assert!(pre_tokenizer_rule("qwen2").is_some());
    assert!(pre_tokenizer_rule("llama-bpe").is_some());
    assert!(pre_tokenizer_rule("default").is_none());
    assert!(pre_tokenizer_rule("starcoder2").is_none());
    assert!(pre_tokenizer_rule("").is_none());
}

#[test]
fn every_table_regex_compiles() {
    for rule in PRE_TOKENIZERS {
        for pattern in rule.splits {
            let split = Split::new(
                SplitPattern::Regex((*pattern).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            );
            assert!(split.is_ok(), "{:?}: {pattern}", rule.names);
        }
    }
}

#[test]
fn gguf_with_unknown_pre_is_refused() {
    let err = Tokenizer::from_gguf(&tiny_gguf("mystery-bpe"), "tiny").unwrap_err();
    let reason = reason_of(err);
    assert!(reason.contains("`mystery-bpe`"), "{reason}");
    assert!(reason.contains("smollm"), "{reason}");
}

#[test]
fn gguf_without_pre_is_refused() {
    let mut content = tiny_gguf("smollm");
    content.metadata.remove("tokenizer.ggml.pre");
    let reason = reason_of(Tokenizer::from_gguf(&content, "tiny").unwrap_err());
    assert!(reason.contains("tokenizer.ggml.pre is missing"), "{reason}");
}

#[test]
fn sentencepiece_gguf_is_refused() {
    let mut content = tiny_gguf("smollm");
    content
        .metadata
        .insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
    let reason = reason_of(Tokenizer::from_gguf(&content, "tiny").unwrap_err());
    assert!(reason.contains("`llama` (SentencePiece)"), "{reason}");
}

#[test]
fn bad_metadata_is_an_error_not_a_panic() {
    let mut content = tiny_gguf("smollm");
    content
        .metadata
        .insert("tokenizer.ggml.eos_token_id".into(), Value::U32(100_000));
    let reason = reason_of(Tokenizer::from_gguf(&content, "tiny").unwrap_err());
    assert!(reason.contains("outside the vocabulary"), "{reason}");

    let mut content = tiny_gguf("smollm");
    content
        .metadata
        .insert("tokenizer.ggml.merges".into(), Value::String("a b".into()));
    let reason = reason_of(Tokenizer::from_gguf(&content, "tiny").unwrap_err());
    assert!(
        reason.contains("tokenizer.ggml.merges should be"),
        "{reason}"
    );

    let mut content = tiny_gguf("smollm");
    content.metadata.insert(
        "tokenizer.ggml.merges".into(),
        Value::Array(vec![Value::String("nospace".into())]),
    );
    let reason = reason_of(Tokenizer::from_gguf(&content, "tiny").unwrap_err());
    assert!(reason.contains("`nospace`"), "{reason}");
}

#[test]
fn smollm_splits_digits_one_by_one() {
    let tokenizer = Tokenizer::from_gguf(&tiny_gguf("smollm"), "tiny").expect("tokenizer");
    // The merge "1 2" exists, but smollm never lets two digits meet.
    assert_eq!(pieces(&tokenizer, "12 the"), ["1", "2", "Ġthe"]);
    // No prefix space is added at the start.
    assert_eq!(pieces(&tokenizer, "ab"), ["ab"]);

    let qwen = Tokenizer::from_gguf(&tiny_gguf("qwen2"), "tiny").expect("tokenizer");
    assert_eq!(pieces(&qwen, "12"), ["1", "2"]);
    let gpt2 = Tokenizer::from_gguf(&tiny_gguf("gpt-2"), "tiny").expect("tokenizer");
    assert_eq!(pieces(&gpt2, "12"), ["12"]);
}

#[test]
fn gguf_special_tokens_and_facts() {
    let tokenizer = Tokenizer::from_gguf(&tiny_gguf("smollm"), "tiny").expect("tokenizer");
    let text = "<|im_start|>ab<tool_call><|im_end|>";
    let ids = tokenizer.encode(text).expect("encode");
    let tool_call = tokenizer.inner().token_to_id("<tool_call>").expect("added");
    let ab = tokenizer.inner().token_to_id("ab").expect("merged");
    assert_eq!(ids, [1, ab, tool_call, 2]);
    assert_eq!(tokenizer.decode(&ids, false).expect("decode"), text);
    // Control tokens go, user-defined ones stay.
    assert_eq!(
        tokenizer.decode(&ids, true).expect("decode"),
        "ab<tool_call>"
    );

    assert_eq!(tokenizer.bos_token(), Some("<|im_start|>"));
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert_eq!(tokenizer.eos_token(), Some("<|im_end|>"));
    assert_eq!(tokenizer.stop_token_ids(), [0, 2]);
    assert!(!tokenizer.add_bos());
    assert_eq!(tokenizer.chat_template(), Some("{{ x }}"));
    assert_eq!(tokenizer.vocab_size(), 3 + 256 + 5 + 1);

    let unknown = tokenizer.vocab_size() as u32;
    let reason = reason_of(tokenizer.decode(&[unknown], false).unwrap_err());
    assert!(reason.contains(&format!("id {unknown}")), "{reason}");
}

#[test]
fn add_bos_defaults_follow_the_table() {
    let mut content = tiny_gguf("llama-bpe");
    content.metadata.remove("tokenizer.ggml.add_bos_token");
    let llama3 = Tokenizer::from_gguf(&content, "tiny").expect("tokenizer");
    assert!(llama3.add_bos());

    let mut content = tiny_gguf("smollm");
    content.metadata.remove("tokenizer.ggml.add_bos_token");
    let smollm = Tokenizer::from_gguf(&content, "tiny").expect("tokenizer");
    assert!(!smollm.add_bos());
}

#[test]
fn merges_split_at_the_first_inner_space() {
    assert_eq!(split_merge("Ġ t"), Some(("Ġ".into(), "t".into())));
    assert_eq!(split_merge("ab cd"), Some(("ab".into(), "cd".into())));
    assert_eq!(split_merge("abc"), None);
    assert_eq!(split_merge("a "), None);
    assert_eq!(split_merge(""), None);
}

/// A word-level tokenizer.json: enough to check what from_hf_dir reads around it.
const TINY_TOKENIZER_JSON: &str = r#"{
      "version": "1.0",
      "truncation": null,
      "padding": null,
      "added_tokens": [
        {"id": 0, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 1, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 2, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
      ],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": null,
      "decoder": null,
      "model": {
        "type": "WordLevel",
        "vocab": {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<unk>": 3, "user": 4, "hello": 5},
        "unk_token": "<unk>"
      }
    }"#;

#[test]
fn hf_dir_reads_config_and_matches_special_tokens_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tokenizer.json"), TINY_TOKENIZER_JSON).expect("write");
    let config = serde_json::json!({
        "add_bos_token": false,
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ messages }}"}
        ]
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("write");

    let tokenizer = Tokenizer::from_hf_dir(dir.path()).expect("tokenizer");
    assert_eq!(tokenizer.chat_template(), Some("{{ messages }}"));
    assert_eq!(tokenizer.bos_token(), Some("<|im_start|>"));
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    assert_eq!(tokenizer.eos_token(), Some("<|im_end|>"));
    assert_eq!(tokenizer.eos_token_id(), Some(2));
    assert_eq!(tokenizer.stop_token_ids(), [0, 2]);
    assert!(!tokenizer.add_bos());
    assert_eq!(tokenizer.vocab_size(), 6);

    let ids = tokenizer
        .encode("<|im_start|>user hello<|im_end|>")
        .expect("encode");
    assert_eq!(ids, [1, 4, 5, 2]);
    assert_eq!(tokenizer.decode(&ids, true).expect("decode"), "user hello");
}

#[test]
fn hf_dir_without_config_has_no_extras() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tokenizer.json"), TINY_TOKENIZER_JSON).expect("write");
    let tokenizer = Tokenizer::from_hf_dir(dir.path()).expect("tokenizer");
    assert_eq!(tokenizer.chat_template(), None);
    assert_eq!(tokenizer.bos_token_id(), None);
    assert!(!tokenizer.add_bos());
    // The end-of-turn tokens found in the vocabulary still stop generation.
    assert_eq!(tokenizer.stop_token_ids(), [0, 2]);
}

#[test]
fn hf_dir_errors_name_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(matches!(
        Tokenizer::from_hf_dir(dir.path()),
        Err(Error::Io { .. })
    ));

    std::fs::write(dir.path().join("tokenizer.json"), "{ not json").expect("write");
    assert!(reason_of(Tokenizer::from_hf_dir(dir.path()).unwrap_err()).contains("tokenizer.json"));

    std::fs::write(dir.path().join("tokenizer.json"), TINY_TOKENIZER_JSON).expect("write");
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "<|nope|>"}"#,
    )
    .expect("write");
    let reason = reason_of(Tokenizer::from_hf_dir(dir.path()).unwrap_err());
    assert!(reason.contains("`<|nope|>`"), "{reason}");
}
