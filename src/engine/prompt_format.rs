//! A model's text side (tokenizer, chat template, context length): all it takes to
//! turn a prompt into token ids, so a remote backend needs no weights.

use super::chat::{ChatMessage, ChatTemplate};
use super::model::Config;
use super::source::ModelSource;
use super::tokenizer::Tokenizer;
use crate::error::{Error, Result, Setting};

pub struct PromptFormat {
    name: String,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    context_tokens: usize,
}

impl PromptFormat {
    /// Read only what prompts need from the model `source` points at: a GGUF
    /// file's header, or a model directory's config and tokenizer files.
    pub fn load(source: &ModelSource) -> Result<Self> {
        match source {
            ModelSource::Gguf { path, name } => {
                let (content, _) = super::read_gguf_header(path)?;
                let config = Config::from_gguf(&content, path)?;
                PromptFormat::new(name, Tokenizer::from_gguf(&content, name)?, &config)
            }
            ModelSource::HfDir { dir, name } => {
                let config_path = dir.join("config.json");
                let json = std::fs::read_to_string(&config_path)
                    .map_err(|e| Error::io(&config_path, e))?;
                let config = Config::from_hf_json(&json, &config_path)?;
                PromptFormat::new(name, Tokenizer::from_hf_dir(dir)?, &config)
            }
        }
    }

    pub(crate) fn new(name: &str, tokenizer: Tokenizer, config: &Config) -> Result<Self> {
        let chat_template = match tokenizer.chat_template() {
            Some(source) => Some(ChatTemplate::new(
                source,
                tokenizer.bos_token(),
                tokenizer.eos_token(),
            )?),
            None => None,
        };
        Ok(PromptFormat {
            name: name.to_string(),
            tokenizer,
            chat_template,
            context_tokens: config.context_tokens,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The longest sequence the model accepts, prompt and generated tokens together.
    pub fn context_tokens(&self) -> usize {
        self.context_tokens
    }

    /// Token ids of a plain-text prompt, with BOS first when the model expects it.
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.bos_for("");
        ids.extend(self.tokenizer.encode(text)?);
        Ok(ids)
    }

    /// The chat template's text for `messages`, ending with the assistant's turn opener.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        let template = self
            .chat_template
            .as_ref()
            .ok_or_else(|| Error::ChatTemplate {
                reason: format!(
                    "{} has no chat template; run without {}",
                    self.name,
                    Setting::Chat
                ),
            })?;
        template.render(messages, true)
    }

    /// Token ids of a chat prompt rendered with the model's template.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let text = self.render_chat(messages)?;
        let mut ids = self.bos_for(&text);
        ids.extend(self.tokenizer.encode(&text)?);
        Ok(ids)
    }

    /// Token ids of a chat of an optional system turn and one user turn whose
    /// content is `user_segments` joined. Each segment is tokenized on its own,
    /// so a prompt that appends segments to another keeps that one's token ids
    /// as its prefix (BPE merges across a boundary could otherwise change them).
    pub fn segmented_chat_prompt(
        &self,
        system: Option<&str>,
        user_segments: &[String],
    ) -> Result<Vec<u32>> {
        // The template is rendered around a marker that stands for the user
        // turn; the text before and after it is tokenized separately.
        const MARKER: &str = "\u{1}prism-user-turn\u{1}";
        let mut messages = Vec::new();
        messages.extend(system.map(ChatMessage::system));
        messages.push(ChatMessage::user(MARKER));
        let text = self.render_chat(&messages)?;
        let (before, after) = text.split_once(MARKER).ok_or_else(|| Error::ChatTemplate {
            reason: "the template altered the user message; cannot place prompt segments".into(),
        })?;
        let mut ids = self.bos_for(&text);
        ids.extend(self.tokenizer.encode(before)?);
        for segment in user_segments {
            ids.extend(self.tokenizer.encode(segment)?);
        }
        ids.extend(self.tokenizer.encode(after)?);
        Ok(ids)
    }

    /// BOS when the model expects one and the rendered prompt does not start with it.
    fn bos_for(&self, rendered: &str) -> Vec<u32> {
        let writes_bos = self
            .tokenizer
            .bos_token()
            .is_some_and(|bos| rendered.starts_with(bos));
        match self.tokenizer.bos_token_id() {
            Some(bos) if self.tokenizer.add_bos() && !writes_bos => vec![bos],
            _ => Vec::new(),
        }
    }
}
