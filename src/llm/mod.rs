//! The model as methods see it: prompts of text segments in, text and usage out; a
//! [`Backend`] is where the calls run, the local engine or a remote server.

mod dialect;
#[cfg(test)]
pub mod fake;
mod grammar_check;
pub mod probe;
pub mod remote;
mod side_by_side;
pub mod wire;

use crate::engine::constraint::Grammar;
use crate::engine::kv_cache::common_prefix;
use crate::engine::prompt_format::PromptFormat;
use crate::engine::{check_lines_after, Engine, EngineIdentity, GenerateOptions, LineCheck, Usage};
use crate::error::{Error, Result};
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
    /// How many leading segments later prompts may start with: a prompt
    /// cache on disk keeps only their KV, not the one-off rest. `None`:
    /// the whole sequence may be shared.
    pub shared_segments: Option<usize>,
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

/// One call of a model (see [`Llm::complete_each`]).
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub prompt: &'a Prompt,
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// The grammar the text must keep to.
    pub grammar: Option<&'a Grammar>,
    /// A check on each whole line of the text: a skipped line is replaced by
    /// what the model writes instead, and the text ends before a line it
    /// stops at (see [`Engine::generate_checking_lines`]).
    pub line_check: Option<&'a LineCheck<'a>>,
    /// Whether the call is one of a set that needs none of the others'
    /// answers. A model that runs calls side by side spreads only such calls;
    /// any other runs where the calls before it ran, whose cache it may reuse.
    pub independent: bool,
}

impl<'a> Request<'a> {
    /// One of a set of calls that need none of the others' answers, with
    /// no grammar and no line check.
    pub fn independent(prompt: &'a Prompt, max_tokens: usize) -> Self {
        Request {
            prompt,
            max_tokens,
            grammar: None,
            line_check: None,
            independent: true,
        }
    }
}

/// What a model is, as the methods that call it need to know.
#[derive(Clone, Copy)]
pub struct ModelInfo<'a> {
    /// The most tokens a prompt and its completion may hold together.
    pub context_tokens: usize,
    /// How many of [`Llm::complete_each`]'s independent calls run at once.
    /// A method hands it that many per step, so a step waits on no call it
    /// could have started later.
    pub concurrency: usize,
    /// Whether the reuse in the usages is counted or estimated.
    pub cache_figures: CacheFigures,
    /// Counts tokens as the model reads them.
    pub counter: &'a dyn TokenCounter,
}

/// How a model counts tokens.
pub trait TokenCounter {
    /// Tokens in `text` on its own.
    fn count_tokens(&self, text: &str) -> Result<usize>;
    /// Tokens in the whole prompt, chat template included.
    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize>;
}

impl TokenCounter for PromptFormat {
    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.tokenizer().encode(text)?.len())
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize> {
        Ok(self
            .segmented_chat_prompt(prompt.system.as_deref(), &prompt.segments)?
            .len())
    }
}

/// A language model that completes prompts and counts tokens.
///
/// An implementor writes [`complete_each`](Llm::complete_each) and
/// [`info`](Llm::info); the other methods are built on those two and are
/// not meant to be overridden, so that a wrapper sees every call.
pub trait Llm {
    /// Complete every one of `requests`, answers in their order, telling
    /// `done` how many are finished after each. A model that runs one call
    /// at a time uses [`complete_in_turn`] or
    /// [`complete_in_turn_checking_after`]; a backend opened with
    /// [`Backend::llm_side_by_side`] runs independent calls several at once.
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>>;
    /// What the model is: its context, concurrency and token counts.
    fn info(&self) -> ModelInfo<'_>;

    /// Generate at most `max_tokens` tokens after `prompt`, inside `grammar` when given.
    fn complete(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
    ) -> Result<Completion> {
        complete_one(self, prompt, max_tokens, grammar, None)
    }
    /// [`complete`](Llm::complete), with each whole line of the text checked
    /// by `refuse_line` (see [`Request::line_check`]).
    fn complete_checking_lines(
        &mut self,
        prompt: &Prompt,
        max_tokens: usize,
        grammar: Option<&Grammar>,
        refuse_line: &LineCheck,
    ) -> Result<Completion> {
        complete_one(self, prompt, max_tokens, grammar, Some(refuse_line))
    }
    /// Tokens in `text` on its own.
    fn count_tokens(&self, text: &str) -> Result<usize> {
        self.info().counter.count_tokens(text)
    }
    /// Tokens in the whole prompt, chat template included.
    fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize> {
        self.info().counter.prompt_tokens(prompt)
    }
    /// The most tokens a prompt and its completion may hold together.
    fn context_tokens(&self) -> usize {
        self.info().context_tokens
    }
}

/// One call on its own, as a set of one that depends on the calls before it.
fn complete_one<L: Llm + ?Sized>(
    llm: &mut L,
    prompt: &Prompt,
    max_tokens: usize,
    grammar: Option<&Grammar>,
    line_check: Option<&LineCheck>,
) -> Result<Completion> {
    let request = Request {
        prompt,
        max_tokens,
        grammar,
        line_check,
        independent: false,
    };
    llm.complete_each(&[request], &mut |_| {})?
        .pop()
        .ok_or_else(|| Error::invalid("model", "gave no completion for its one call"))
}

/// [`Llm::complete_each`] one request after another, by `complete`, for
/// models that run one call at a time and honour each request's line check
/// as they generate.
pub fn complete_in_turn(
    requests: &[Request<'_>],
    done: &mut dyn FnMut(usize),
    mut complete: impl FnMut(&Request<'_>) -> Result<Completion>,
) -> Result<Vec<Completion>> {
    let mut completions = Vec::with_capacity(requests.len());
    for request in requests {
        completions.push(complete(request)?);
        done(completions.len());
    }
    Ok(completions)
}

/// [`complete_in_turn`] for models that cannot check lines while they
/// generate: `complete` writes each text unchecked, and the request's line
/// check is applied to the finished text. Such a model spends tokens past a
/// stop, and writes nothing in place of a skipped line.
pub fn complete_in_turn_checking_after(
    requests: &[Request<'_>],
    done: &mut dyn FnMut(usize),
    mut complete: impl FnMut(&Request<'_>) -> Result<Completion>,
) -> Result<Vec<Completion>> {
    complete_in_turn(requests, done, |request| {
        let mut completion = complete(request)?;
        if let Some(check) = request.line_check {
            completion.text = check_lines_after(&completion.text, check);
        }
        Ok(completion)
    })
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

    /// One call, its lines checked while it generates.
    fn run(&mut self, request: &Request<'_>) -> Result<Completion> {
        let prompt = request.prompt;
        let ids = self
            .engine
            .segmented_chat_prompt(prompt.system.as_deref(), &prompt.segments)?;
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
        // Only a prompt cache on disk reads the mark; without one the
        // shared segments are not tokenized a second time.
        let shared_segments = prompt
            .shared_segments
            .filter(|_| self.engine.keeps_prompts_on_disk());
        let shared_prefix_tokens = match shared_segments {
            Some(shared) => {
                let segments = &prompt.segments[..shared.min(prompt.segments.len())];
                let shared_ids = self
                    .engine
                    .segmented_chat_prompt(prompt.system.as_deref(), segments)?;
                Some(common_prefix(&ids, &shared_ids))
            }
            None => None,
        };
        let mut options = GenerateOptions {
            max_tokens: request.max_tokens,
            grammar: request.grammar.cloned(),
            copy_source,
            shared_prefix_tokens,
            ..self.options.clone()
        };
        options.sampling.no_copy_ngram = no_copy_ngram;
        let generation = self
            .engine
            .generate_checking_lines(&ids, &options, request.line_check)?;
        Ok(Completion {
            text: generation.text,
            usage: generation.usage,
        })
    }
}

impl Llm for EngineLlm<'_> {
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>> {
        complete_in_turn(requests, done, |request| self.run(request))
    }

    fn info(&self) -> ModelInfo<'_> {
        ModelInfo {
            context_tokens: self.engine.context_tokens(),
            concurrency: 1,
            cache_figures: CacheFigures::Measured,
            counter: self.engine.format(),
        }
    }
}
