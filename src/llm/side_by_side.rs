//! Independent calls run side by side on siblings of the backend, so `--concurrency N`
//! keeps N calls in flight while the method still sees one [`Llm`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use super::{Backend, Completion, Llm, ModelInfo, Prompt, Request};
use crate::engine::constraint::Grammar;
use crate::engine::GenerateOptions;
use crate::error::Result;

/// An [`Llm`] whose [`Llm::complete_each`] spreads independent calls over
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
    /// A set whose calls are all independent, with no line check (which
    /// could not go to another thread), is spread; any other runs on `primary`.
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>> {
        let spread = requests
            .iter()
            .all(|request| request.independent && request.line_check.is_none());
        if !spread {
            return self.primary.complete_each(requests, done);
        }
        let calls: Vec<Call> = requests
            .iter()
            .map(|request| (request.prompt, request.max_tokens, request.grammar))
            .collect();
        self.spread(&calls, done)
    }

    fn info(&self) -> ModelInfo<'_> {
        ModelInfo {
            concurrency: self.workers.len(),
            ..self.primary.info()
        }
    }
}

/// A request's prompt, budget and grammar, which unlike its line check
/// may be read from any thread.
type Call<'a> = (&'a Prompt, usize, Option<&'a Grammar>);

impl SideBySide<'_> {
    /// Each worker takes the next call not yet taken until none is left.
    /// The first failure stops new calls from starting, lets those in flight
    /// finish, and is returned.
    fn spread(&mut self, calls: &[Call], done: &mut dyn FnMut(usize)) -> Result<Vec<Completion>> {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let (finished, received) = mpsc::channel();
        let options = &self.options;
        std::thread::scope(|scope| {
            for worker in self.workers.iter_mut().take(calls.len()) {
                let (finished, next, failed) = (finished.clone(), &next, &failed);
                scope.spawn(move || {
                    let mut llm = worker.llm(options.clone());
                    while !failed.load(Ordering::Relaxed) {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(prompt, max_tokens, grammar)) = calls.get(index) else {
                            break;
                        };
                        let completion = llm.complete(prompt, max_tokens, grammar);
                        failed.fetch_or(completion.is_err(), Ordering::Relaxed);
                        let _ = finished.send((index, completion));
                    }
                });
            }
            drop(finished);
            let mut completions: Vec<Option<Completion>> = vec![None; calls.len()];
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
}
