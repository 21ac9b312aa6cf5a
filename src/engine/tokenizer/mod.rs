//! A model's tokenizer: text ↔ token ids, built from a Hugging Face `tokenizer.json`
//! (`hf.rs`) or from the `tokenizer.ggml.*` metadata of a GGUF file (`gguf.rs`).

mod gguf;
mod hf;

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

#[cfg(test)]
mod tests;
