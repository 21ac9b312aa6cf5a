//! Independent calls run side by side on siblings of the backend, so `--concurrency N`
//! keeps N calls in flight while the method still sees one [`Llm`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use super::{Backend, Completion, Llm, Prompt, Request};
use crate::engine::constraint::Grammar;
use crate::engine::{GenerateOptions, LineCheck};
use crate::error::Result;
use crate::llm::remote::CacheFigures;

/// An [`Llm`] whose [`Llm::complete_each`] spreads its calls over
/// `workers`; every other call goes to `primary`. Each worker is a sibling of
/// the backend: a local engine whose decode steps batch with the others', or
/// another client of a remote server. The calls spread are the independent
/// ones: a QA score's questions, a judge's sentences, the chunks that
/// hierarchical merging and detail summarize on their own.
pub struct SideBySide<'a> {
    pub(super) primary: Box<dyn Llm + 'a>,
    pub(super) workers: Vec<Backend>,
    pub(super) options: GenerateOptions,
}

impl Llm for SideBySide<'_> {
    fn complete(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
    ) -> Result<Completion> {
        self.primary.complete(prompt, max_tokens, grammar)
    }

    fn complete_checking_lines(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
        refuse_line: &LineCheck,
    ) -> Result<Completion> {
        self.primary
            .complete_checking_lines(prompt, max_tokens, grammar, refuse_line)
    }

    /// Each worker takes the next request not yet taken until none is left.
    /// The first failure stops new calls from starting, lets those in flight
    /// finish, and is returned.
    fn complete_each(
        &mut self,
        requests: &[Request],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let (finished, received) = mpsc::channel();
        let options = &self.options;
        std::thread::scope(|scope| {
            for worker in self.workers.iter_mut().take(requests.len()) {
                let (finished, next, failed) = (finished.clone(), &next, &failed);
                scope.spawn(move || {
                    let mut llm = worker.llm(options.clone());
                    while !failed.load(Ordering::Relaxed) {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(request) = requests.get(index) else {
                            break;
                        };
                        let completion = llm.complete(
                            &request.prompt,
                            request.max_tokens,
                            request.grammar.as_ref(),
                        );
                        failed.fetch_or(completion.is_err(), Ordering::Relaxed);
                        let _ = finished.send((index, completion));
                    }
                });
            }
            drop(finished);
            let mut completions: Vec<Option<Completion>> = vec![None; requests.len()];
            let mut first_error = None;
            let mut count = 0;
            for (index, completion) in received {
                match completion {
                    Ok(completion) => {
                        completions[index] = Some(completion);
                        count += 1;
                        done(count);
                    }
                    Err(err) => {
                        first_error.get_or_insert(err);
                    }
                }
            }
            match first_error {
                Some(err) => Err(err),
                None => Ok(completions
                    .into_iter()
                    .map(|completion| completion.expect("every request was answered"))
                    .collect()),
            }
        })
    }

    fn concurrency(&self) -> usize {
        self.workers.len()
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        self.primary.count_tokens(text)
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize> {
        self.primary.prompt_tokens(prompt)
    }

    fn context_tokens(&self) -> usize {
        self.primary.context_tokens()
    }

    fn cache_figures(&self) -> CacheFigures {
        self.primary.cache_figures()
    }
}
