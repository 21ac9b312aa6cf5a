//! A tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::{tokenizer_error, Tokenizer, END_OF_TURN_TOKENS};
use crate::{Error, Result};

/// The GPT-2 split: contractions, letter runs, digit runs and other runs (each with one
/// optional leading space), then whitespace. llama.cpp's copy lacks the final `|\s+`, but its
/// splitter keeps unmatched text as pieces of their own, which gives the same pieces.
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Every digit on its own (llama.cpp's first SmolLM/StarCoder pass).
const DIGITS_SPLIT: &str = r"\p{N}";

/// Qwen2's split: like Llama 3's but with single digits. The contractions are spelled with
/// explicit case classes, as llama.cpp does, instead of `(?i:..)`, whose Unicode case folding
/// would also accept letters such as `ſ` or the Kelvin sign.
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's split: digits in groups of up to three.
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is cut into words before byte-level BPE for one family of `tokenizer.ggml.pre`
/// values, restated from llama.cpp's `llm_tokenizer_bpe` and `llama_vocab::impl::load`.
#[derive(Debug)]
pub(super) struct PreTokenizerRule {
    /// The `tokenizer.ggml.pre` values that select this rule.
    pub(super) names: &'static [&'static str],
    /// Regexes applied in order; each one cuts every piece left by the previous one into its
    /// matches and the text between them. No prefix space is ever added.
    pub(super) splits: &'static [&'static str],
    /// llama.cpp's `ignore_merges`: a word that is already a vocabulary entry becomes that
    /// token without running the merges (they can disagree on a few Llama 3 words).
    ignore_merges: bool,
    /// Whether a prompt starts with BOS when the file has no `tokenizer.ggml.add_bos_token`.
    add_bos_default: bool,
}

/// The pre-tokenizers prism supports. NFC is not applied for any of them: llama.cpp does not
/// normalize byte-level BPE input even where the Hugging Face tokenizer.json (Qwen2) does.
///
/// A GGUF file carries no pre-tokenizer description, only a name (`tokenizer.ggml.pre`);
/// the rules behind each name live in llama.cpp (`src/llama-vocab.cpp`) and are restated
/// here. Any other name is refused rather than guessed, because a wrong split silently
/// changes every prompt's token ids.
pub(super) const PRE_TOKENIZERS: &[PreTokenizerRule] = &[
    PreTokenizerRule {
        // SmolLM/SmolLM2. The Hugging Face tokenizer.json says Digits(individual) then
        // ByteLevel(use_regex) — the same two passes.
        names: &["smollm"],
        splits: &[DIGITS_SPLIT, GPT2_SPLIT],
        ignore_merges: false,
        add_bos_default: false,
    },
    PreTokenizerRule {
        names: &["qwen2", "deepseek-r1-qwen"],
        splits: &[QWEN2_SPLIT],
        ignore_merges: false,
        add_bos_default: false,
    },
    PreTokenizerRule {
        names: &["llama-bpe", "llama3", "llama-v3"],
        splits: &[LLAMA3_SPLIT],
        ignore_merges: true,
        add_bos_default: true,
    },
    PreTokenizerRule {
        names: &["gpt-2"],
        splits: &[GPT2_SPLIT],
        ignore_merges: false,
        add_bos_default: false,
    },
];

/// The rule for a `tokenizer.ggml.pre` value, if prism knows it.
pub(super) fn pre_tokenizer_rule(pre: &str) -> Option<&'static PreTokenizerRule> {
    PRE_TOKENIZERS.iter().find(|rule| rule.names.contains(&pre))
}

fn known_pre_names() -> String {
    let names: Vec<&str> = PRE_TOKENIZERS
        .iter()
        .flat_map(|rule| rule.names.iter().copied())
        .collect();
    names.join(", ")
}

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
mod token_type {
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
}

impl Tokenizer {
    /// From GGUF metadata (`tokenizer.ggml.*`). `model` is a display name used in errors.
    ///
    /// Only byte-level BPE (`tokenizer.ggml.model` = `gpt2`) with a `tokenizer.ggml.pre`
    /// listed in `PRE_TOKENIZERS` is accepted; the result tokenizes as llama.cpp does.
    pub fn from_gguf(content: &Content, model: &str) -> Result<Self> {
        let meta = Metadata {
            values: &content.metadata,
            model,
        };
        check_byte_level_bpe(&meta)?;
        let (pre, rule) = pre_tokenizer_of(&meta)?;
        let tokens = meta
            .strings("tokenizer.ggml.tokens")?
            .ok_or_else(|| tokenizer_error(model, "tokenizer.ggml.tokens is missing"))?;
        let types = token_types(&meta, tokens.len())?;

        let mut inner = tokenizers::Tokenizer::new(bpe_model(&meta, &tokens, rule)?);
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre, rule, model)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let id_in_vocab = |key: &str| -> Result<Option<u32>> {
            match meta.uint(key)? {
                Some(id) if (id as usize) < tokens.len() => Ok(Some(id)),
                Some(id) => Err(tokenizer_error(
                    model,
                    format!(
                        "{key} = {id} is outside the vocabulary of {} tokens",
                        tokens.len()
                    ),
                )),
                None => Ok(None),
            }
        };
        let bos_id = id_in_vocab("tokenizer.ggml.bos_token_id")?;
        let eos_id = id_in_vocab("tokenizer.ggml.eos_token_id")?;
        let eot_id = id_in_vocab("tokenizer.ggml.eot_token_id")?;
        let named = [bos_id, eos_id, eot_id];
        add_whole_tokens(&mut inner, &tokens, types.as_deref(), &named, model)?;
        let token_at = |id: u32| (tokens[id as usize].to_string(), id);
        Ok(Self {
            inner,
            model: model.to_string(),
            bos: bos_id.map(token_at),
            eos: eos_id.map(token_at),
            stop_ids: stop_ids(&tokens, eos_id, eot_id),
            add_bos: meta
                .bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(rule.add_bos_default),
            chat_template: meta.string("tokenizer.chat_template")?.map(str::to_string),
        })
    }
}

/// Refuse any tokenizer but byte-level BPE (`gpt2`), naming what the file has.
fn check_byte_level_bpe(meta: &Metadata) -> Result<()> {
    let model = meta.model;
    let kind = meta.string("tokenizer.ggml.model")?.ok_or_else(|| {
        tokenizer_error(
            model,
            "the GGUF file has no tokenizer (tokenizer.ggml.model)",
        )
    })?;
    if kind == "gpt2" {
        return Ok(());
    }
    let what = match kind {
        "llama" => " (SentencePiece)",
        "bert" => " (WordPiece)",
        "t5" => " (Unigram)",
        _ => "",
    };
    Err(tokenizer_error(
        model,
        format!(
            "tokenizer.ggml.model is `{kind}`{what}; prism reads only byte-level BPE \
             (`gpt2`) tokenizers from GGUF files — use the model's tokenizer.json instead"
        ),
    ))
}

/// The file's `tokenizer.ggml.pre` and prism's rule for it.
fn pre_tokenizer_of<'a>(meta: &Metadata<'a>) -> Result<(&'a str, &'static PreTokenizerRule)> {
    let model = meta.model;
    let pre = meta.string("tokenizer.ggml.pre")?.ok_or_else(|| {
        tokenizer_error(
            model,
            format!(
                "tokenizer.ggml.pre is missing, so the pre-tokenizer is unknown \
                 (prism knows: {})",
                known_pre_names()
            ),
        )
    })?;
    let rule = pre_tokenizer_rule(pre).ok_or_else(|| {
        tokenizer_error(
            model,
            format!(
                "unsupported pre-tokenizer tokenizer.ggml.pre = `{pre}` (prism knows: {})",
                known_pre_names()
            ),
        )
    })?;
    Ok((pre, rule))
}

/// `tokenizer.ggml.token_type`, when present, checked to cover every token.
fn token_types(meta: &Metadata, n_tokens: usize) -> Result<Option<Vec<i64>>> {
    let types = meta.ints("tokenizer.ggml.token_type")?;
    match &types {
        Some(types) if types.len() < n_tokens => Err(tokenizer_error(
            meta.model,
            format!(
                "tokenizer.ggml.token_type has {} entries for {n_tokens} tokens",
                types.len()
            ),
        )),
        _ => Ok(types),
    }
}

/// The BPE model of the vocabulary `tokens` and the file's merges.
fn bpe_model(meta: &Metadata, tokens: &[&str], rule: &PreTokenizerRule) -> Result<BPE> {
    let model = meta.model;
    let mut vocab = Vocab::default();
    vocab.reserve(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        let id =
            u32::try_from(id).map_err(|_| tokenizer_error(model, "more than u32::MAX tokens"))?;
        if let Some(first) = vocab.insert(token.to_string(), id) {
            return Err(tokenizer_error(
                model,
                format!("token `{token}` appears twice in the vocabulary (ids {first} and {id})"),
            ));
        }
    }
    let merges = meta
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| tokenizer_error(model, "tokenizer.ggml.merges is missing"))?;
    let merges = merges
        .iter()
        .map(|merge| {
            split_merge(merge).ok_or_else(|| {
                tokenizer_error(
                    model,
                    format!("merge `{merge}` is not two tokens separated by a space"),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(rule.ignore_merges)
        .build()
        .map_err(|e| tokenizer_error(model, format!("building the BPE model: {e}")))
}

/// The rule's splits, then byte-level mapping.
fn pre_tokenizer(pre: &str, rule: &PreTokenizerRule, model: &str) -> Result<Sequence> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(rule.splits.len() + 1);
    for pattern in rule.splits {
        let split = Split::new(
            SplitPattern::Regex((*pattern).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| tokenizer_error(model, format!("pre-tokenizer regex for `{pre}`: {e}")))?;
        steps.push(split.into());
    }
    // The splits above already cut the words: byte-level only maps bytes to symbols.
    steps.push(ByteLevel::new(false, false, false).into());
    Ok(Sequence::new(steps))
}

/// Add the tokens that are matched whole in the text before BPE runs, as llama.cpp's
/// `tokenizer_st_partition` does with its special-token cache: control and unknown
/// tokens (special: left out when decoding with skip_special), user-defined ones (kept
/// in decoded text), plus the `named` ids (bos, eos, eot) and the end-of-turn tokens,
/// which llama.cpp forces to control when a converter forgot to.
fn add_whole_tokens(
    inner: &mut tokenizers::Tokenizer,
    tokens: &[&str],
    types: Option<&[i64]>,
    named: &[Option<u32>],
    model: &str,
) -> Result<()> {
    let mut specials = Vec::new();
    let mut user_defined = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        let kind = types.map(|types| types[id]);
        let is_named = named.contains(&Some(id as u32)) || END_OF_TURN_TOKENS.contains(token);
        if is_named || matches!(kind, Some(token_type::CONTROL | token_type::UNKNOWN)) {
            specials.push(AddedToken::from(token.to_string(), true).normalized(false));
        } else if kind == Some(token_type::USER_DEFINED) {
            user_defined.push(AddedToken::from(token.to_string(), false).normalized(false));
        }
    }
    inner
        .add_special_tokens(specials)
        .map_err(|e| tokenizer_error(model, format!("adding special tokens: {e}")))?;
    inner
        .add_tokens(user_defined)
        .map_err(|e| tokenizer_error(model, format!("adding user-defined tokens: {e}")))?;
    Ok(())
}

/// The ids that end generation: eos, eot and the end-of-turn tokens of the vocabulary.
fn stop_ids(tokens: &[&str], eos_id: Option<u32>, eot_id: Option<u32>) -> Vec<u32> {
    let mut stop_ids: Vec<u32> = [eos_id, eot_id].into_iter().flatten().collect();
    stop_ids.extend(
        tokens
            .iter()
            .enumerate()
            .filter(|(_, token)| END_OF_TURN_TOKENS.contains(token))
            .map(|(id, _)| id as u32),
    );
    stop_ids.sort_unstable();
    stop_ids.dedup();
    stop_ids
}

/// A merge line "a b" as its two halves. The first half is never empty, so the split is at the
/// first space after the first character (as llama.cpp reads them).
pub(super) fn split_merge(merge: &str) -> Option<(String, String)> {
    let first_len = merge.chars().next()?.len_utf8();
    let space = first_len + merge[first_len..].find(' ')?;
    let (left, right) = (&merge[..space], &merge[space + 1..]);
    if right.is_empty() {
        return None;
    }
    Some((left.to_string(), right.to_string()))
}

/// Typed reads of GGUF metadata that report the key and the model when a value has the
/// wrong type. Absent keys are `Ok(None)`.
struct Metadata<'a> {
    values: &'a HashMap<String, Value>,
    model: &'a str,
}

impl<'a> Metadata<'a> {
    fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> Error {
        tokenizer_error(
            self.model,
            format!("{key} should be {expected}, found {:?}", found.value_type()),
        )
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = value else {
            return Err(self.wrong_type(key, "an array of strings", value));
        };
        items
            .iter()
            .map(|item| match item {
                Value::String(text) => Ok(text.as_str()),
                other => Err(self.wrong_type(key, "an array of strings", other)),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = value else {
            return Err(self.wrong_type(key, "an array of integers", value));
        };
        items
            .iter()
            .map(|item| {
                integer(item).ok_or_else(|| self.wrong_type(key, "an array of integers", item))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A token id: any integer type, as long as it fits in u32.
    fn uint(&self, key: &str) -> Result<Option<u32>> {
        let Some(value) = self.values.get(key) else {
            return Ok(None);
        };
        let id = integer(value).ok_or_else(|| self.wrong_type(key, "an integer", value))?;
        u32::try_from(id)
            .map(Some)
            .map_err(|_| tokenizer_error(self.model, format!("{key} = {id} is not a token id")))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(other) => Err(self.wrong_type(key, "a bool", other)),
        }
    }
}

fn integer(value: &Value) -> Option<i64> {
    match *value {
        Value::U8(v) => Some(v.into()),
        Value::I8(v) => Some(v.into()),
        Value::U16(v) => Some(v.into()),
        Value::I16(v) => Some(v.into()),
        Value::U32(v) => Some(v.into()),
        Value::I32(v) => Some(v.into()),
        Value::U64(v) => i64::try_from(v).ok(),
        Value::I64(v) => Some(v),
        _ => None,
    }
}
