//! The model as methods see it: prompts made of text segments in, text and
//! usage out. Methods never touch tensors or token ids.

use crate::engine::constraint::Grammar;
use crate::engine::{Engine, GenerateOptions, Usage};
use crate::error::Result;

/// A chat prompt: an optional system turn and a user turn given as segments.
///
/// Segments are tokenized one at a time, so a prompt that only appends
/// segments to the previous one shares its token prefix, which the engine
/// then takes from its KV cache. Put what never changes first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    pub system: Option<String>,
    pub segments: Vec<String>,
}

/// What one call produced and cost.
#[derive(Debug, Clone)]
pub struct Completion {
    pub text: String,
    pub usage: Usage,
}

/// A language model that completes prompts and counts tokens.
pub trait Llm {
    /// Generate at most `max_tokens` tokens after `prompt`, inside `grammar` when given.
    fn complete(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
    ) -> Result<Completion>;
    /// Tokens in `text` on its own.
    fn count_tokens(&self, text: &str) -> Result<usize>;
    /// Tokens in the whole prompt, chat template included.
    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize>;
    /// The most tokens a prompt and its completion may hold together.
    fn context_tokens(&self) -> usize;
}

/// An [`Engine`] with fixed generation settings, as an [`Llm`].
pub struct EngineLlm<'a> {
    engine: &'a mut Engine,
    options: GenerateOptions,
}

impl<'a> EngineLlm<'a> {
    /// `options.max_tokens` and `options.grammar` are replaced by each call's own.
    pub fn new(engine: &'a mut Engine, options: GenerateOptions) -> Self {
        EngineLlm { engine, options }
    }

    fn token_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        self.engine
            .segmented_chat_prompt(prompt.system.as_deref(), &prompt.segments)
    }
}

impl Llm for EngineLlm<'_> {
    fn complete(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
    ) -> Result<Completion> {
        let ids = self.token_ids(prompt)?;
        tracing::trace!(target: "prism::prompt", system = ?prompt.system, "{}", prompt.segments.concat());
        let options = GenerateOptions {
            max_tokens,
            grammar: grammar.cloned(),
            ..self.options.clone()
        };
        let generation = self.engine.generate(&ids, &options)?;
        Ok(Completion {
            text: generation.text,
            usage: generation.usage,
        })
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.engine.tokenizer().encode(text)?.len())
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize> {
        Ok(self.token_ids(prompt)?.len())
    }

    fn context_tokens(&self) -> usize {
        self.engine.context_tokens()
    }
}
