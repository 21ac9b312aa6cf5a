//! The model as methods see it: prompts of text segments in, text and usage out; a
//! [`Backend`] is where the calls run, the local engine or a remote server.

mod dialect;
mod grammar_check;
pub mod probe;
pub mod remote;
mod side_by_side;
pub mod wire;

use crate::engine::constraint::Grammar;
use crate::engine::prompt_format::PromptFormat;
use crate::engine::{check_lines_after, Engine, EngineIdentity, GenerateOptions, LineCheck, Usage};
use crate::error::Result;
use remote::{CacheFigures, RemoteIdentity, RemoteLlm, RemoteModel};
use side_by_side::SideBySide;

/// A chat prompt: an optional system turn and a user turn given as segments.
///
/// Segments are tokenized one at a time, so a prompt that only appends
/// segments to the previous one shares its token prefix, which the engine
/// then takes from its KV cache. Put what never changes first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    pub system: Option<String>,
    pub segments: Vec<String>,
    /// The segment that holds the text to summarize (local engine only).
    pub source: Option<Source>,
}

/// The segment of a prompt the output may not copy long runs of tokens from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub segment: usize,
    /// Runs of this many tokens are masked; `None` leaves it to the
    /// sampling options' `no_copy_ngram`, where 0 is off.
    pub no_copy_tokens: Option<usize>,
}

impl Source {
    /// `segment`, copied from only as the sampling options allow.
    pub fn segment(segment: usize) -> Self {
        Source {
            segment,
            no_copy_tokens: None,
        }
    }
}

/// What one call produced and cost.
#[derive(Debug, Clone)]
pub struct Completion {
    pub text: String,
    pub usage: Usage,
}

/// One of a set of calls that do not depend on one another's answers
/// (see [`Llm::complete_each`]).
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Prompt,
    pub max_tokens: usize,
    pub grammar: Option<Grammar>,
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
    /// [`complete`](Llm::complete), with each whole line of the text checked
    /// by `refuse_line`: a skipped line is replaced by what the model writes
    /// instead, and the text ends before a line it stops at (see
    /// [`Engine::generate_checking_lines`]). This default applies the check
    /// to the finished text; a model that checks while it generates spends
    /// no tokens past a stop and writes on after a skip.
    fn complete_checking_lines(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
        refuse_line: &LineCheck,
    ) -> Result<Completion> {
        let mut completion = self.complete(prompt, max_tokens, grammar)?;
        completion.text = check_lines_after(&completion.text, refuse_line);
        Ok(completion)
    }
    /// Complete every one of `requests`, answers in their order, telling
    /// `done` how many are finished after each. This default runs them in
    /// turn; a backend opened with [`Backend::llm_side_by_side`] runs several
    /// at once.
    fn complete_each(
        &mut self,
        requests: &[Request],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>> {
        complete_in_turn(self, requests, done)
    }
    /// How many of [`complete_each`](Llm::complete_each)'s calls run at
    /// once. A method hands it that many independent calls per step, so a
    /// step waits on no call it could have started later.
    fn concurrency(&self) -> usize {
        1
    }
    /// Tokens in `text` on its own.
    fn count_tokens(&self, text: &str) -> Result<usize>;
    /// Tokens in the whole prompt, chat template included.
    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize>;
    /// The most tokens a prompt and its completion may hold together.
    fn context_tokens(&self) -> usize;
    /// Whether the reuse in the usages is counted or estimated.
    fn cache_figures(&self) -> CacheFigures {
        CacheFigures::Measured
    }
}

/// [`Llm::complete_each`] one request after another, for models that run
/// one call at a time.
pub fn complete_in_turn<L: Llm + ?Sized>(
    llm: &mut L,
    requests: &[Request],
    done: &mut dyn FnMut(usize),
) -> Result<Vec<Completion>> {
    let mut completions = Vec::with_capacity(requests.len());
    for request in requests {
        completions.push(llm.complete(
            &request.prompt,
            request.max_tokens,
            request.grammar.as_ref(),
        )?);
        done(completions.len());
    }
    Ok(completions)
}

/// Where a method's calls run.
pub enum Backend {
    Local(Box<Engine>),
    Remote(Box<RemoteModel>),
}

/// What decides a backend's results; the local case serializes exactly as
/// [`EngineIdentity`] does, so fingerprints of local runs are unchanged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum BackendIdentity {
    Local(EngineIdentity),
    Remote(RemoteIdentity),
}

impl Backend {
    /// How prompts become token ids, for counting and splitting.
    pub fn format(&self) -> &PromptFormat {
        match self {
            Backend::Local(engine) => engine.format(),
            Backend::Remote(model) => model.format(),
        }
    }

    pub fn name(&self) -> &str {
        self.format().name()
    }

    pub fn identity(&self) -> BackendIdentity {
        match self {
            Backend::Local(engine) => BackendIdentity::Local(engine.identity()),
            Backend::Remote(model) => BackendIdentity::Remote(model.identity()),
        }
    }

    /// Where the model runs, in a word or two, for reports.
    pub fn device(&self) -> String {
        match self {
            Backend::Local(engine) => serde_json::to_value(engine.identity().device)
                .ok()
                .and_then(|value| value.as_str().map(str::to_string))
                .unwrap_or_default(),
            Backend::Remote(model) => format!("remote {}", model.identity().base_url),
        }
    }

    /// Start the next run cold: the local cache is emptied; a remote server
    /// keeps its own, and only prism's estimate of it is reset.
    pub fn clear_cache(&mut self) {
        match self {
            Backend::Local(engine) => engine.clear_cache(),
            Backend::Remote(model) => model.forget(),
        }
    }

    /// A second backend on the same model for work that runs beside this
    /// one's on another thread: another client of a remote server, or a
    /// sibling of the local engine whose decode steps batch with this one's.
    pub fn sibling(&mut self) -> Result<Backend> {
        Ok(match self {
            Backend::Local(engine) => Backend::Local(Box::new(engine.sibling()?)),
            Backend::Remote(model) => Backend::Remote(Box::new(model.sibling())),
        })
    }

    /// The backend as an [`Llm`] with these generation settings.
    pub fn llm(&mut self, options: GenerateOptions) -> Box<dyn Llm + '_> {
        match self {
            Backend::Local(engine) => Box::new(EngineLlm::new(engine, options)),
            Backend::Remote(model) => Box::new(RemoteLlm::new(model, options)),
        }
    }

    /// [`Backend::llm`], but [`Llm::complete_each`] keeps up to
    /// `concurrency` calls in flight, each on a sibling of this backend.
    /// Every other call, and everything at a concurrency of 1, runs here.
    pub fn llm_side_by_side(
        &mut self,
        options: GenerateOptions,
        concurrency: usize,
    ) -> Result<Box<dyn Llm + '_>> {
        if concurrency <= 1 {
            return Ok(self.llm(options));
        }
        let workers = (0..concurrency)
            .map(|_| self.sibling())
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(SideBySide {
            primary: self.llm(options.clone()),
            workers,
            options,
        }))
    }
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
        let no_copy_ngram = prompt
            .source
            .and_then(|source| source.no_copy_tokens)
            .unwrap_or(self.options.sampling.no_copy_ngram);
        let source_text = prompt
            .source
            .and_then(|source| prompt.segments.get(source.segment));
        let copy_source = match source_text {
            Some(text) if no_copy_ngram > 0 => self.engine.tokenizer().encode(text)?,
            _ => Vec::new(),
        };
        let mut options = GenerateOptions {
            max_tokens,
            grammar: grammar.cloned(),
            copy_source,
            ..self.options.clone()
        };
        options.sampling.no_copy_ngram = no_copy_ngram;
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
