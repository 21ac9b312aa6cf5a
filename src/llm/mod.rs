//! The model as methods see it: prompts made of text segments in, text and
//! usage out. Methods never touch tensors or token ids.

use crate::engine::constraint::Grammar;
use crate::engine::{first_refused_line, Engine, GenerateOptions, LineCheck, Usage};
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
    /// [`complete`](Llm::complete), but the text ends before the first whole
    /// line that `refuse_line` refuses (see [`Engine::generate_checking_lines`]).
    /// This default cuts the finished text; a model that checks while it
    /// generates stops there and spends no more tokens.
    fn complete_checking_lines(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
        refuse_line: &LineCheck,
    ) -> Result<Completion> {
        let mut completion = self.complete(prompt, max_tokens, grammar)?;
        if let Some(cut) = first_refused_line(&completion.text, &mut 0, refuse_line) {
            completion.text.truncate(cut);
        }
        Ok(completion)
    }
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

    fn run(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
        refuse_line: Option<&LineCheck>,
    ) -> Result<Completion> {
        let ids = self.token_ids(prompt)?;
        tracing::trace!(target: "prism::prompt", system = ?prompt.system, "{}", prompt.segments.concat());
        let options = GenerateOptions {
            max_tokens,
            grammar: grammar.cloned(),
            ..self.options.clone()
        };
        let generation = self
            .engine
            .generate_checking_lines(&ids, &options, refuse_line)?;
        Ok(Completion {
            text: generation.text,
            usage: generation.usage,
        })
    }
}

impl Llm for EngineLlm<'_> {
    fn complete(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
    ) -> Result<Completion> {
        self.run(prompt, max_tokens, grammar, None)
    }

    fn complete_checking_lines(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
        refuse_line: &LineCheck,
    ) -> Result<Completion> {
        self.run(prompt, max_tokens, grammar, Some(refuse_line))
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
