//! A stand-in model for unit tests of the methods: it answers each prompt
//! with what a test's [`Reply`] writes, and counts tokens as words.

use super::remote::CacheFigures;
use super::{
    complete_in_turn_checking_after, Completion, Llm, ModelInfo, Prompt, Request, TokenCounter,
};
use crate::error::Result;

/// What a test's model writes for a prompt.
pub trait Reply {
    fn reply(&mut self, prompt: &Prompt) -> String;
}

/// A model that answers as `R` writes, one request after the other, with
/// a 4096-token context.
pub struct Fake<R>(pub R);

impl<R: Reply> Llm for Fake<R> {
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>> {
        complete_in_turn_checking_after(requests, done, |request| {
            Ok(Completion {
                text: self.0.reply(request.prompt),
                usage: Default::default(),
            })
        })
    }
    fn info(&self) -> ModelInfo<'_> {
        ModelInfo {
            context_tokens: 4096,
            concurrency: 1,
            cache_figures: CacheFigures::Measured,
            counter: &Words,
        }
    }
}

/// Tokens counted as words.
struct Words;

impl TokenCounter for Words {
    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(text.split_whitespace().count())
    }
    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize> {
        Ok(prompt.segments.concat().split_whitespace().count())
    }
}
