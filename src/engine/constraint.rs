//! Grammar-constrained decoding: at each step only the tokens that keep the output
//! inside a grammar (JSON Schema, Lark or regex) may be sampled; llguidance masks.

use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// What decoding is constrained to.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grammar {
    /// A JSON value that validates against this schema.
    JsonSchema(serde_json::Value),
    /// Text in llguidance's Lark dialect (which may inline `%json { … }` schemas).
    Lark(String),
    /// One grammar in two dialects: Lark, which this engine and vLLM read, and
    /// llama.cpp's GBNF, for servers that read only that.
    Dialects { lark: String, gbnf: String },
    /// Text matching this regular expression (Rust `regex` syntax).
    Regex(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_fixed_spacing(schema))
            }
            Grammar::Lark(lark) | Grammar::Dialects { lark, .. } => {
                TopLevelGrammar::from_lark(lark.clone())
            }
            Grammar::Regex(regex) => TopLevelGrammar::from_regex(regex),
        }
    }
}

/// How constrained JSON is spaced, as an llguidance `x-guidance` setting:
/// `", "` and `": "` between items and no other whitespace. With free
/// whitespace a small model can fill its whole budget with blanks.
pub fn fixed_spacing() -> serde_json::Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with [`fixed_spacing`] unless it says otherwise.
fn with_fixed_spacing(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(fixed_spacing);
    }
    schema
}

/// Makes constraints for one model's vocabulary. Building the token trie takes
/// a moment on a 150k vocabulary, so an engine makes this once.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// `vocab_size` is the width of the model's logits, which may exceed the
    /// tokenizer's vocabulary (padding rows never get sampled).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, model: &str) -> Result<Self> {
        let bad = |reason: String| Error::Tokenizer {
            model: model.to_string(),
            reason: format!("building the grammar vocabulary: {reason}"),
        };
        let mut words = token_bytes(tokenizer.inner()).map_err(bad)?;
        if words.len() > vocab_size {
            return Err(bad(format!(
                "the tokenizer has {} tokens, the model only {vocab_size} logits",
                words.len()
            )));
        }
        words.resize(vocab_size, Vec::new());
        let eos = tokenizer
            .eos_token_id()
            .ok_or_else(|| bad("the tokenizer names no end-of-sequence token".into()))?;
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let env = Arc::new(TokenEnv {
            trie: TokTrie::from(&info, &words),
            tokenizer: tokenizer.inner().clone(),
        });
        let tok_env: TokEnv = env;
        let mut factory = ParserFactory::new_simple(&tok_env).map_err(|e| bad(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A fresh constraint that starts at the beginning of `grammar`.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint> {
        let parser = self.factory.create_parser(grammar.top_level());
        let matcher = Matcher::new(parser);
        if let Some(error) = matcher.get_error() {
            return Err(Error::invalid("grammar", error));
        }
        Ok(Constraint { matcher })
    }
}

/// The state of one constrained generation.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// Set every forbidden token's logit to −∞. When the grammar is complete
    /// only end-of-sequence stays allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| Error::invalid("grammar", e.to_string()))?;
        for (id, logit) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advance past a sampled token.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::invalid("grammar", e.to_string()))
    }

    /// Whether `tokens`, from where this constraint stands, are all text the
    /// grammar admits; nothing is consumed. Unlike [`Constraint::accept`],
    /// which trusts that a sampled token passed the mask, this checks.
    pub fn admits(&mut self, tokens: &[u32]) -> Result<bool> {
        let valid = self
            .matcher
            .validate_tokens(tokens)
            .map_err(|e| Error::invalid("grammar", e.to_string()))?;
        Ok(valid == tokens.len())
    }

    /// Go back before the last `count` accepted tokens.
    pub fn rollback(&mut self, count: usize) -> Result<()> {
        self.matcher
            .rollback(count)
            .map_err(|e| Error::invalid("grammar", e.to_string()))
    }
}

/// The bytes each token stands for, special tokens marked with the 0xFF byte
/// the token trie expects. llguidance reads byte-level and byte-fallback
/// tokenizers from their JSON; for any other kind (no decoder, or a word-level
/// vocabulary) a token's bytes are its vocabulary string.
fn token_bytes(tokenizer: &tokenizers::Tokenizer) -> std::result::Result<Vec<Vec<u8>>, String> {
    let json = tokenizer.to_string(false).map_err(|e| e.to_string())?;
    let json: serde_json::Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    if matches!(
        json["decoder"]["type"].as_str(),
        Some("ByteLevel" | "Sequence")
    ) {
        return llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| e.to_string());
    }
    let specials: std::collections::HashSet<u32> = tokenizer
        .get_added_tokens_decoder()
        .iter()
        .filter(|(_, token)| token.special)
        .map(|(id, _)| *id)
        .collect();
    let size = tokenizer.get_vocab_size(true) as u32;
    Ok((0..size)
        .map(|id| match tokenizer.id_to_token(id) {
            Some(token) if specials.contains(&id) => [&[0xFF][..], token.as_bytes()].concat(),
            Some(token) => token.into_bytes(),
            None => Vec::new(),
        })
        .collect())
}

/// The tokenizer as llguidance sees it: a trie of token bytes, and a way to
/// tokenize the literal text of a grammar.
struct TokenEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        let text = String::from_utf8_lossy(bytes);
        self.tokenizer
            .encode(text.as_ref(), false)
            .map(|encoding| encoding.get_ids().to_vec())
            .unwrap_or_default()
    }
}
