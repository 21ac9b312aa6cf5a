//! A model's tokenizer: text ↔ token ids, built from a Hugging Face `tokenizer.json` or from
//! the `tokenizer.ggml.*` metadata of a GGUF file.
//!
//! GGUF files carry no pre-tokenizer description, only a name (`tokenizer.ggml.pre`). The
//! rules behind each name live in llama.cpp (`src/llama-vocab.cpp`); `PRE_TOKENIZERS`
//! restates the ones prism supports, and every other name is refused rather than guessed,
//! because a wrong split silently changes every prompt's token ids.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::without_panic;
use crate::{Error, Result};

/// Tokens that end a turn in the chat formats prism meets; whichever of them the vocabulary
/// holds stops generation, besides the eos token itself.
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
];

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
struct PreTokenizerRule {
    /// The `tokenizer.ggml.pre` values that select this rule.
    names: &'static [&'static str],
    /// Regexes applied in order; each one cuts every piece left by the previous one into its
    /// matches and the text between them. No prefix space is ever added.
    splits: &'static [&'static str],
    /// llama.cpp's `ignore_merges`: a word that is already a vocabulary entry becomes that
    /// token without running the merges (they can disagree on a few Llama 3 words).
    ignore_merges: bool,
    /// Whether a prompt starts with BOS when the file has no `tokenizer.ggml.add_bos_token`.
    add_bos_default: bool,
}

/// The pre-tokenizers prism supports. NFC is not applied for any of them: llama.cpp does not
/// normalize byte-level BPE input even where the Hugging Face tokenizer.json (Qwen2) does.
const PRE_TOKENIZERS: &[PreTokenizerRule] = &[
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
fn pre_tokenizer_rule(pre: &str) -> Option<&'static PreTokenizerRule> {
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

/// A model's tokenizer plus the facts about it that generation needs (BOS, stop tokens,
/// chat template).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Display name of the model, for errors.
    model: String,
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
    /// Sorted and deduplicated.
    stop_ids: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// From a Hugging Face model dir: tokenizer.json, plus tokenizer_config.json when present
    /// (chat_template — a string, or a list of {name, template} where "default" wins —,
    /// bos_token, eos_token which may be a string or an {"content": ..} object,
    /// add_bos_token). A `chat_template.jinja` file is used when the config has no template,
    /// and the `eos_token_id`s of generation_config.json, when present, also stop generation.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let model = dir.display().to_string();
        let tokenizer_path = dir.join("tokenizer.json");
        let bytes = std::fs::read(&tokenizer_path).map_err(|e| Error::io(&tokenizer_path, e))?;
        // The tokenizers crate panics on some malformed files instead of
        // returning its error.
        let mut inner = without_panic(|| tokenizers::Tokenizer::from_bytes(&bytes))
            .unwrap_or_else(|| Err("it does not have the shape of a tokenizer.json".into()))
            .map_err(|e| tokenizer_error(&model, format!("tokenizer.json: {e}")))?;
        // prism counts and cuts tokens itself; a tokenizer.json that pads or truncates
        // would change ids behind its back.
        inner
            .with_truncation(None)
            .map_err(|e| tokenizer_error(&model, format!("tokenizer.json: {e}")))?;
        inner.with_padding(None);

        let config = read_json_if_present(&dir.join("tokenizer_config.json"), &model)?;
        let config = config.as_ref();

        let special = |key: &str| -> Result<Option<(String, u32)>> {
            let Some(content) = config.and_then(|c| c.get(key)).and_then(token_content) else {
                return Ok(None);
            };
            let id = inner.token_to_id(content).ok_or_else(|| {
                tokenizer_error(
                    &model,
                    format!("tokenizer_config.json: {key} `{content}` is not in the vocabulary"),
                )
            })?;
            Ok(Some((content.to_string(), id)))
        };
        let bos = special("bos_token")?;
        let eos = special("eos_token")?;

        let add_bos = match config.and_then(|c| c.get("add_bos_token")) {
            Some(serde_json::Value::Bool(add)) => *add,
            // Llama 3 style: no flag, the post-processor adds BOS. Ask it.
            _ => match &bos {
                Some((_, bos_id)) => {
                    let probe = inner
                        .encode_fast("", true)
                        .map_err(|e| tokenizer_error(&model, format!("encoding \"\": {e}")))?;
                    probe.get_ids().first() == Some(bos_id)
                }
                None => false,
            },
        };

        let chat_template = match config.and_then(|c| c.get("chat_template")) {
            Some(value) => Some(chat_template_from_config(value).ok_or_else(|| {
                tokenizer_error(
                    &model,
                    "tokenizer_config.json: chat_template is neither a string nor a list of {name, template}",
                )
            })?),
            None => {
                let path = dir.join("chat_template.jinja");
                match std::fs::read_to_string(&path) {
                    Ok(text) => Some(text),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(Error::io(path, e)),
                }
            }
        };

        let mut stop_ids: Vec<u32> = eos.iter().map(|(_, id)| *id).collect();
        let generation = read_json_if_present(&dir.join("generation_config.json"), &model)?;
        if let Some(ids) = generation.as_ref().and_then(|g| g.get("eos_token_id")) {
            let ids = match ids {
                serde_json::Value::Array(list) => list.clone(),
                other => vec![other.clone()],
            };
            for id in ids {
                let id = id
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        tokenizer_error(
                            &model,
                            format!("generation_config.json: eos_token_id {id} is not a token id"),
                        )
                    })?;
                stop_ids.push(id);
            }
        }
        stop_ids.extend(
            END_OF_TURN_TOKENS
                .iter()
                .filter_map(|token| inner.token_to_id(token)),
        );
        stop_ids.sort_unstable();
        stop_ids.dedup();

        Ok(Self {
            inner,
            model,
            bos,
            eos,
            stop_ids,
            add_bos,
            chat_template,
        })
    }

    /// From GGUF metadata (`tokenizer.ggml.*`). `model` is a display name used in errors.
    ///
    /// Only byte-level BPE (`tokenizer.ggml.model` = `gpt2`) with a `tokenizer.ggml.pre`
    /// listed in `PRE_TOKENIZERS` is accepted; the result tokenizes as llama.cpp does.
    pub fn from_gguf(content: &Content, model: &str) -> Result<Self> {
        let meta = Metadata {
            values: &content.metadata,
            model,
        };

        let kind = meta.string("tokenizer.ggml.model")?.ok_or_else(|| {
            tokenizer_error(
                model,
                "the GGUF file has no tokenizer (tokenizer.ggml.model)",
            )
        })?;
        if kind != "gpt2" {
            let what = match kind {
                "llama" => " (SentencePiece)",
                "bert" => " (WordPiece)",
                "t5" => " (Unigram)",
                _ => "",
            };
            return Err(tokenizer_error(
                model,
                format!(
                    "tokenizer.ggml.model is `{kind}`{what}; prism reads only byte-level BPE \
                     (`gpt2`) tokenizers from GGUF files — use the model's tokenizer.json instead"
                ),
            ));
        }

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

        let tokens = meta
            .strings("tokenizer.ggml.tokens")?
            .ok_or_else(|| tokenizer_error(model, "tokenizer.ggml.tokens is missing"))?;
        let n_tokens = tokens.len();
        let types = meta.ints("tokenizer.ggml.token_type")?;
        if let Some(types) = &types {
            if types.len() < n_tokens {
                return Err(tokenizer_error(
                    model,
                    format!(
                        "tokenizer.ggml.token_type has {} entries for {n_tokens} tokens",
                        types.len()
                    ),
                ));
            }
        }

        let mut vocab = Vocab::default();
        vocab.reserve(n_tokens);
        for (id, token) in tokens.iter().enumerate() {
            let id = u32::try_from(id)
                .map_err(|_| tokenizer_error(model, "more than u32::MAX tokens"))?;
            if let Some(first) = vocab.insert(token.to_string(), id) {
                return Err(tokenizer_error(
                    model,
                    format!(
                        "token `{token}` appears twice in the vocabulary (ids {first} and {id})"
                    ),
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

        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(rule.ignore_merges)
            .build()
            .map_err(|e| tokenizer_error(model, format!("building the BPE model: {e}")))?;

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

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(Sequence::new(steps)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let id_in_vocab = |key: &str| -> Result<Option<u32>> {
            match meta.uint(key)? {
                Some(id) if (id as usize) < n_tokens => Ok(Some(id)),
                Some(id) => Err(tokenizer_error(
                    model,
                    format!("{key} = {id} is outside the vocabulary of {n_tokens} tokens"),
                )),
                None => Ok(None),
            }
        };
        let bos_id = id_in_vocab("tokenizer.ggml.bos_token_id")?;
        let eos_id = id_in_vocab("tokenizer.ggml.eos_token_id")?;
        let eot_id = id_in_vocab("tokenizer.ggml.eot_token_id")?;
        let token_at = |id: u32| (tokens[id as usize].to_string(), id);

        // Tokens that are matched whole in the text before BPE runs, as llama.cpp's
        // `tokenizer_st_partition` does with its special-token cache: control and unknown
        // tokens (special: left out when decoding with skip_special), user-defined ones (kept
        // in decoded text), plus the ids named as bos/eos/eot and the end-of-turn tokens,
        // which llama.cpp forces to control when a converter forgot to.
        let mut specials = Vec::new();
        let mut user_defined = Vec::new();
        for (id, token) in tokens.iter().enumerate() {
            let id = id as u32;
            let kind = types.as_ref().map(|types| types[id as usize]);
            let named =
                [bos_id, eos_id, eot_id].contains(&Some(id)) || END_OF_TURN_TOKENS.contains(token);
            if named || matches!(kind, Some(token_type::CONTROL | token_type::UNKNOWN)) {
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

        Ok(Self {
            inner,
            model: model.to_string(),
            bos: bos_id.map(token_at),
            eos: eos_id.map(token_at),
            stop_ids,
            add_bos: meta
                .bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(rule.add_bos_default),
            chat_template: meta.string("tokenizer.chat_template")?.map(str::to_string),
        })
    }

    /// Token ids of `text`. Special tokens written literally in the text (e.g. "<|im_start|>")
    /// become their ids; nothing (no BOS) is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| tokenizer_error(&self.model, format!("encoding: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; special tokens are left out when `skip_special` is true. An id outside
    /// the vocabulary is an error (the `tokenizers` crate would drop it silently).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(bad) = ids.iter().find(|id| self.inner.id_to_token(**id).is_none()) {
            return Err(tokenizer_error(
                &self.model,
                format!(
                    "cannot decode id {bad}: not in the vocabulary of {} tokens",
                    self.vocab_size()
                ),
            ));
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| tokenizer_error(&self.model, format!("decoding: {e}")))
    }

    /// The BOS string, e.g. "<|im_start|>" or "<|endoftext|>".
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_ref().map(|(token, _)| token.as_str())
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|(_, id)| *id)
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_ref().map(|(token, _)| token.as_str())
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos.as_ref().map(|(_, id)| *id)
    }

    /// Every id that ends generation: the eos id plus end-of-turn tokens present in the vocab
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|eom_id|>`, `<|end_of_text|>`, and
    /// `tokenizer.ggml.eot_token_id` when set). Sorted, deduplicated.
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether the model expects BOS before a prompt (GGUF `tokenizer.ggml.add_bos_token`, or
    /// add_bos_token in tokenizer_config.json; default false, except where llama.cpp defaults
    /// to true for the pre-tokenizer (Llama 3) or a tokenizer.json post-processor adds BOS).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The chat template (GGUF `tokenizer.chat_template`, or tokenizer_config.json).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers::Tokenizer` (constrained decoding needs its JSON).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn tokenizer_error(model: &str, reason: impl Into<String>) -> Error {
    Error::Tokenizer {
        model: model.to_string(),
        reason: reason.into(),
    }
}

/// A merge line "a b" as its two halves. The first half is never empty, so the split is at the
/// first space after the first character (as llama.cpp reads them).
fn split_merge(merge: &str) -> Option<(String, String)> {
    let first_len = merge.chars().next()?.len_utf8();
    let space = first_len + merge[first_len..].find(' ')?;
    let (left, right) = (&merge[..space], &merge[space + 1..]);
    if right.is_empty() {
        return None;
    }
    Some((left.to_string(), right.to_string()))
}

/// A token named in tokenizer_config.json: either the string itself or `{"content": ..}`.
fn token_content(value: &serde_json::Value) -> Option<&str> {
    match value {
        serde_json::Value::String(token) => Some(token),
        serde_json::Value::Object(object) => object.get("content")?.as_str(),
        _ => None,
    }
}

/// `chat_template` of tokenizer_config.json: a string, or a list of `{name, template}` of
/// which the one named "default" wins (else the first).
fn chat_template_from_config(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(template) => Some(template.clone()),
        serde_json::Value::Array(list) => {
            let named = |entry: &serde_json::Value| -> Option<(String, String)> {
                let name = entry.get("name")?.as_str()?;
                let template = entry.get("template")?.as_str()?;
                Some((name.to_string(), template.to_string()))
            };
            let entries = list.iter().map(named).collect::<Option<Vec<_>>>()?;
            let default = entries.iter().find(|(name, _)| name == "default");
            default
                .or(entries.first())
                .map(|(_, template)| template.clone())
        }
        _ => None,
    }
}

fn read_json_if_present(path: &Path, model: &str) -> Result<Option<serde_json::Value>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| tokenizer_error(model, format!("{name}: {e}")))
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::VersionedMagic;

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

        let strings =
            |items: Vec<String>| Value::Array(items.into_iter().map(Value::String).collect());
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
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string())
            .expect("write");

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
        assert!(
            reason_of(Tokenizer::from_hf_dir(dir.path()).unwrap_err()).contains("tokenizer.json")
        );

        std::fs::write(dir.path().join("tokenizer.json"), TINY_TOKENIZER_JSON).expect("write");
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"eos_token": "<|nope|>"}"#,
        )
        .expect("write");
        let reason = reason_of(Tokenizer::from_hf_dir(dir.path()).unwrap_err());
        assert!(reason.contains("`<|nope|>`"), "{reason}");
    }
}
