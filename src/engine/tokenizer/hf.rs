//! A tokenizer from a Hugging Face model directory: `tokenizer.json`, and where
//! present `tokenizer_config.json`, `chat_template.jinja` and `generation_config.json`.

use std::path::Path;

use super::{tokenizer_error, Tokenizer, END_OF_TURN_TOKENS};
use crate::error::without_panic;
use crate::{Error, Result};

impl Tokenizer {
    /// From a Hugging Face model dir: tokenizer.json, plus tokenizer_config.json when present
    /// (chat_template — a string, or a list of {name, template} where "default" wins —,
    /// bos_token, eos_token which may be a string or an {"content": ..} object,
    /// add_bos_token). A `chat_template.jinja` file is used when the config has no template,
    /// and the `eos_token_id`s of generation_config.json, when present, also stop generation.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let model = dir.display().to_string();
        let inner = read_tokenizer_json(dir, &model)?;
        let config = read_json_if_present(&dir.join("tokenizer_config.json"), &model)?;
        let config = config.as_ref();
        let special = |key: &str| special_token(&inner, config, key, &model);
        let bos = special("bos_token")?;
        let eos = special("eos_token")?;
        let add_bos = adds_bos(&inner, config, bos.as_ref(), &model)?;
        let chat_template = chat_template(dir, config, &model)?;
        let stop_ids = stop_ids(dir, &inner, eos.as_ref(), &model)?;
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
}

/// `tokenizer.json` of `dir`, with padding and truncation turned off.
fn read_tokenizer_json(dir: &Path, model: &str) -> Result<tokenizers::Tokenizer> {
    let tokenizer_path = dir.join("tokenizer.json");
    let bytes = std::fs::read(&tokenizer_path).map_err(|e| Error::io(&tokenizer_path, e))?;
    // The tokenizers crate panics on some malformed files instead of
    // returning its error.
    let mut inner = without_panic(|| tokenizers::Tokenizer::from_bytes(&bytes))
        .unwrap_or_else(|| Err("it does not have the shape of a tokenizer.json".into()))
        .map_err(|e| tokenizer_error(model, format!("tokenizer.json: {e}")))?;
    // prism counts and cuts tokens itself; a tokenizer.json that pads or truncates
    // would change ids behind its back.
    inner
        .with_truncation(None)
        .map_err(|e| tokenizer_error(model, format!("tokenizer.json: {e}")))?;
    inner.with_padding(None);
    Ok(inner)
}

/// The token tokenizer_config.json names under `key`, with its id; an error
/// when the vocabulary lacks it.
fn special_token(
    inner: &tokenizers::Tokenizer,
    config: Option<&serde_json::Value>,
    key: &str,
    model: &str,
) -> Result<Option<(String, u32)>> {
    let Some(content) = config.and_then(|c| c.get(key)).and_then(token_content) else {
        return Ok(None);
    };
    let id = inner.token_to_id(content).ok_or_else(|| {
        tokenizer_error(
            model,
            format!("tokenizer_config.json: {key} `{content}` is not in the vocabulary"),
        )
    })?;
    Ok(Some((content.to_string(), id)))
}

/// Whether prompts start with BOS: `add_bos_token` when the config says,
/// else whether the post-processor puts BOS first (Llama 3 style).
fn adds_bos(
    inner: &tokenizers::Tokenizer,
    config: Option<&serde_json::Value>,
    bos: Option<&(String, u32)>,
    model: &str,
) -> Result<bool> {
    if let Some(serde_json::Value::Bool(add)) = config.and_then(|c| c.get("add_bos_token")) {
        return Ok(*add);
    }
    let Some((_, bos_id)) = bos else {
        return Ok(false);
    };
    let probe = inner
        .encode_fast("", true)
        .map_err(|e| tokenizer_error(model, format!("encoding \"\": {e}")))?;
    Ok(probe.get_ids().first() == Some(bos_id))
}

/// The chat template: the config's, else `chat_template.jinja` when present.
fn chat_template(
    dir: &Path,
    config: Option<&serde_json::Value>,
    model: &str,
) -> Result<Option<String>> {
    if let Some(value) = config.and_then(|c| c.get("chat_template")) {
        return chat_template_from_config(value).map(Some).ok_or_else(|| {
            tokenizer_error(
                model,
                "tokenizer_config.json: chat_template is neither a string nor a list of {name, template}",
            )
        });
    }
    let path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// The ids that end generation: eos, generation_config.json's
/// `eos_token_id`s, and the end-of-turn tokens the vocabulary holds.
fn stop_ids(
    dir: &Path,
    inner: &tokenizers::Tokenizer,
    eos: Option<&(String, u32)>,
    model: &str,
) -> Result<Vec<u32>> {
    let mut stop_ids: Vec<u32> = eos.iter().map(|(_, id)| *id).collect();
    let generation = read_json_if_present(&dir.join("generation_config.json"), model)?;
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
                        model,
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
    Ok(stop_ids)
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
