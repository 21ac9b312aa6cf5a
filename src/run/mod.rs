//! What every method shares when it runs: the driver that asks a [`Method`] for one
//! unit of work at a time, the ledger, per-step lines, checkpoints and final files.

pub mod dir;

use crate::chunk::Chunk;
use crate::engine::sampling::SamplingConfig;
use crate::error::{Error, Result, Setting};
use crate::llm::remote::CacheFigures;
use crate::llm::{Completion, Llm, ModelInfo, Prompt, Request};
use crate::metrics::copying::{Copying, DocumentWords};
use crate::metrics::degeneration::{echo_share, repeated_ngram_share};
use crate::metrics::{Figures, Ledger};
use crate::run::dir::{Checkpoint, RunDir};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::time::Instant;

/// A summarization method, as a sequence of resumable units of work.
pub trait Method {
    /// Everything carried from one unit to the next; saved in checkpoints.
    type State: Clone + Serialize + DeserializeOwned;
    /// What one unit did, as a line of `steps.jsonl`.
    type Step: Serialize + DeserializeOwned;
    /// The method's own figures in `stats.json`, beside the [`RunStats`]
    /// every run reports ([`NoFigures`] when it has none).
    type Figures: Serialize + std::fmt::Debug;

    /// The name `stats.json` reports, e.g. `prism-amendments`.
    fn label(&self) -> String;
    /// The constant text of this method's prompts (instructions, worked
    /// examples, schema description) that a summary should never copy; what
    /// `stats.json`'s `echo_share` looks for in the summary.
    fn template_texts(&self) -> Vec<String>;
    /// The state before the first unit.
    fn start(&self, chunks: &[Chunk]) -> Self::State;
    /// Where the run stands, for progress reports.
    fn position(&self, state: &Self::State, chunks: &[Chunk]) -> Position;
    /// Do the next unit of work: one model call or a few, or several units
    /// at once when their calls are independent and the model runs calls
    /// side by side ([`ModelInfo::concurrency`]). It must leave `state` complete,
    /// since the run may stop right after it.
    fn advance(
        &self,
        llm: &mut dyn Llm,
        state: &mut Self::State,
        chunks: &[Chunk],
    ) -> Result<Advance<Self::Step, Self::Figures>>;
}

/// The texts of `prompts`, built without document text (a [`blank_chunk`],
/// empty summaries and memories), as [`Method::template_texts`] returns
/// them: system turns and segments, trimmed, each once, blanks left out.
pub fn prompt_texts(prompts: &[Prompt]) -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    for prompt in prompts {
        for text in prompt.system.iter().chain(&prompt.segments) {
            let text = text.trim();
            if !text.is_empty() && !texts.iter().any(|seen| seen == text) {
                texts.push(text.to_string());
            }
        }
    }
    texts
}

/// A chunk with no text, to build a method's prompts without a document
/// for [`prompt_texts`].
pub fn blank_chunk() -> Chunk {
    Chunk {
        index: 0,
        text: String::new(),
        tokens: 0,
        start_byte: 0,
    }
}

/// What a unit of work ended with.
#[derive(Debug)]
pub enum Advance<S, F = NoFigures> {
    /// More work follows.
    Step(S),
    /// Several units were done at once, in this order; more work follows.
    Steps(Vec<S>),
    /// The summary is written; no step line is recorded for this unit.
    Done(Finish<F>),
}

/// A finished method's output.
#[derive(Debug, Default)]
pub struct Finish<F = NoFigures> {
    pub summary: String,
    /// Further JSON files for the run directory, e.g. `memory.json`.
    pub files: Vec<(&'static str, Value)>,
    /// The notes of the method's memory, one string each, for the copying
    /// figures of `stats.json`; empty for methods that keep no notes.
    pub notes: Vec<String>,
    /// The length in words the summary aimed at, for methods that aim at one.
    pub summary_words_target: Option<usize>,
    /// The method's own figures, added to `stats.json` next to the shared ones.
    pub figures: F,
}

/// The figures of a method that reports none of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoFigures {}

/// How far a run is: `done` of about `total` units; `stage` names the next one.
///
/// `total` is an estimate for methods whose work depends on what the model
/// writes (compression retries, merge levels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub done: usize,
    pub total: usize,
    pub stage: String,
}

/// Where a run reports its progress (the CLI draws a progress bar).
pub trait Progress {
    /// The run starts or resumes at `position`.
    fn begin(&mut self, position: &Position);
    /// A unit finished; `figures` are the run's totals so far.
    fn step_done(&mut self, position: &Position, figures: &Figures);
}

/// Progress that goes nowhere, for tests and quiet runs.
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&mut self, _: &Position) {}
    fn step_done(&mut self, _: &Position, _: &Figures) {}
}

/// Where and how a run keeps its files.
pub struct RunFiles<'a> {
    pub dir: &'a RunDir,
    /// Identifies the run's settings; a checkpoint made with others is refused.
    pub fingerprint: String,
    /// Continue from the checkpoint in `dir` instead of starting afresh.
    pub resume: bool,
    /// Stop after this many units in this session (the run stays resumable).
    pub stop_after: Option<usize>,
    /// How the model picks tokens in this run, recorded in `stats.json`.
    pub sampling: SamplingConfig,
}

/// The final figures of a run, as `stats.json`: the method's label, what
/// every run reports, and the method's own figures.
#[derive(Debug, Clone, Serialize)]
pub struct Stats<F> {
    pub method: String,
    #[serde(flatten)]
    pub figures: Figures,
    #[serde(flatten)]
    pub run: RunStats,
    #[serde(flatten)]
    pub method_figures: F,
}

impl<F> Stats<F> {
    /// The same stats with the method's figures converted, e.g. into the
    /// one type that names every method's figures.
    pub fn map_figures<G>(self, convert: impl FnOnce(F) -> G) -> Stats<G> {
        Stats {
            method: self.method,
            figures: self.figures,
            run: self.run,
            method_figures: convert(self.method_figures),
        }
    }
}

/// What every run reports besides its [`Figures`], whatever its method.
///
/// The fields that are optional are always present in `stats.json`; they are
/// `None` only in bench rows recorded before prism measured them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct RunStats {
    pub calls: usize,
    pub chunks: usize,
    /// Units of work, one line of `steps.jsonl` each.
    pub steps: usize,
    pub summary_tokens: usize,
    pub summary_words: usize,
    /// The length in words the summary aimed at (`--summary-words`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_words_target: Option<usize>,
    /// Words of the document as the method read it (its chunks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document_words: Option<usize>,
    /// Summary words ÷ document words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<f64>,
    /// The share of the summary's word 8-grams found verbatim in the
    /// document, in 0..1 ([`Copying`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_8gram_share: Option<f64>,
    /// The longest run of the summary's words copied from the document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_copy_words: Option<usize>,
    /// Words of the memory's notes, for methods that keep notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes_words: Option<usize>,
    /// The share of the notes' word 8-grams found verbatim in the document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes_copied_8gram_share: Option<f64>,
    /// The longest run of one note's words copied from the document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes_longest_copy_words: Option<usize>,
    /// The share of the summary's word 4-grams that occur in it more than
    /// once, in 0..1 ([`repeated_ngram_share`]): high when it loops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated_ngram_share: Option<f64>,
    /// The share of the summary's sentences copied from the method's prompt
    /// texts, in 0..1 ([`echo_share`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo_share: Option<f64>,
    /// Seconds of work over every session of the run.
    pub wall_seconds: f64,
    /// How the model picked tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingConfig>,
    /// `estimated` when a remote server did not report its cached tokens.
    #[serde(default, skip_serializing_if = "CacheFigures::is_measured")]
    pub cache_figures: CacheFigures,
}

/// How a call to [`drive`] ended.
// One is returned per run, so the size of `Finished` costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Outcome<F> {
    /// The method finished; the summary and stats are written.
    Finished { summary: String, stats: Stats<F> },
    /// `stop_after` units ran this time; `--resume` continues.
    Paused { completed: usize },
}

impl<F> Outcome<F> {
    /// The same outcome with the method's figures converted ([`Stats::map_figures`]).
    pub fn map_figures<G>(self, convert: impl FnOnce(F) -> G) -> Outcome<G> {
        match self {
            Outcome::Finished { summary, stats } => Outcome::Finished {
                summary,
                stats: stats.map_figures(convert),
            },
            Outcome::Paused { completed } => Outcome::Paused { completed },
        }
    }
}

/// What a checkpoint holds besides the method's own state.
#[derive(Clone, Serialize, serde::Deserialize)]
struct Saved<S> {
    method: S,
    ledger: Ledger,
    /// Seconds spent in earlier sessions of this run.
    seconds: f64,
}

/// Run `method` over `chunks` to the end (or to `files.stop_after`),
/// checkpointing after every unit. Every method runs here with the same
/// ledger, run files and checkpoints, so their figures compare. The method
/// sees only an [`Llm`] that records every call in the run's ledger and
/// refuses a prompt that would not fit the context, so no method can forget
/// either.
pub fn drive<M: Method>(
    method: &M,
    llm: &mut dyn Llm,
    chunks: &[Chunk],
    files: &RunFiles,
    progress: &mut dyn Progress,
) -> Result<Outcome<M::Figures>> {
    let dir = files.dir;
    let _lock = dir.lock()?;
    let (mut saved, mut completed) = restore(method, chunks, files)?;
    progress.begin(&method.position(&saved.method, chunks));
    let session = Instant::now();
    let mut seconds_at_save = 0.0;
    let mut this_session = 0;
    let finish = loop {
        if files.stop_after.is_some_and(|limit| this_session >= limit) {
            return Ok(Outcome::Paused { completed });
        }
        let position = method.position(&saved.method, chunks);
        let mut metered = Metered {
            stage: &position.stage,
            inner: &mut *llm,
            ledger: &mut saved.ledger,
        };
        let advance = method.advance(&mut metered, &mut saved.method, chunks)?;
        let now = session.elapsed().as_secs_f64();
        saved.seconds += now - seconds_at_save;
        seconds_at_save = now;
        let steps = match advance {
            Advance::Done(finish) => break finish,
            Advance::Step(step) => vec![step],
            Advance::Steps(steps) => steps,
        };
        // Written before the checkpoint that accounts for them; a crash in
        // between leaves lines that the next resume cuts back.
        for step in &steps {
            dir.append_jsonl(RunDir::STEPS, step)?;
        }
        completed += steps.len();
        this_session += steps.len();
        dir.save_checkpoint(&Checkpoint::new(
            files.fingerprint.clone(),
            completed,
            saved.clone(),
        ))?;
        progress.step_done(
            &method.position(&saved.method, chunks),
            &saved.ledger.figures(),
        );
    };
    let (summary, stats) = write_finish(method, &*llm, chunks, files, &saved, completed, finish)?;
    Ok(Outcome::Finished { summary, stats })
}

/// Where the run in `files.dir` stands: the checkpoint's state when resuming,
/// else a fresh start; with `steps.jsonl` cut back to the steps it accounts for.
fn restore<M: Method>(
    method: &M,
    chunks: &[Chunk],
    files: &RunFiles,
) -> Result<(Saved<M::State>, usize)> {
    let dir = files.dir;
    let checkpoint = dir.load_checkpoint::<Saved<M::State>>(&files.fingerprint)?;
    let (saved, completed) = match checkpoint {
        Some(checkpoint) if files.resume => (checkpoint.state, checkpoint.completed_steps),
        Some(_) => {
            return Err(Error::invalid(
                dir.path().display().to_string(),
                format!(
                    "holds a run already; pass {} to continue it, or choose another {}",
                    Setting::Resume,
                    Setting::Out
                ),
            ))
        }
        None => {
            // Steps with no checkpoint to account for them are work that
            // starting over would throw away; say so instead.
            let steps = dir.read_jsonl::<Value>(RunDir::STEPS)?.len();
            if steps > 0 {
                return Err(Error::invalid(
                    dir.path().display().to_string(),
                    format!(
                        "holds {steps} steps but no readable checkpoint to resume them from; move {} away to start over, or choose another {}",
                        RunDir::STEPS,
                        Setting::Out
                    ),
                ));
            }
            let fresh = Saved {
                method: method.start(chunks),
                ledger: Ledger::default(),
                seconds: 0.0,
            };
            (fresh, 0)
        }
    };
    // Keep steps.jsonl in step with the checkpoint: a crash between the two
    // writes must not leave a step recorded twice.
    let mut steps: Vec<M::Step> = dir.read_jsonl(RunDir::STEPS)?;
    steps.truncate(completed);
    dir.rewrite_jsonl(RunDir::STEPS, &steps)?;
    Ok((saved, completed))
}

/// Write the finished run's `summary.txt`, its method's files and
/// `stats.json`, and return the summary and stats.
fn write_finish<M: Method>(
    method: &M,
    llm: &dyn Llm,
    chunks: &[Chunk],
    files: &RunFiles,
    saved: &Saved<M::State>,
    completed: usize,
    finish: Finish<M::Figures>,
) -> Result<(String, Stats<M::Figures>)> {
    let summary = finish.summary.trim().to_string();
    let document: Vec<&str> = chunks.iter().map(|chunk| chunk.text.as_str()).collect();
    let document = DocumentWords::new(&document.join("\n"));
    let copying = document.copying(&[&summary]);
    let notes = (!finish.notes.is_empty()).then(|| document.copying(&finish.notes));
    let stats = Stats {
        method: method.label(),
        figures: saved.ledger.figures(),
        run: RunStats {
            calls: saved.ledger.calls,
            chunks: chunks.len(),
            steps: completed,
            summary_tokens: llm.count_tokens(&summary)?,
            summary_words: summary.split_whitespace().count(),
            summary_words_target: finish.summary_words_target,
            document_words: Some(document.len()),
            compression: Some(copying.words as f64 / document.len().max(1) as f64),
            copied_8gram_share: Some(copying.copied_8gram_share),
            longest_copy_words: Some(copying.longest_copy_words),
            notes_words: notes.map(|notes| notes.words),
            notes_copied_8gram_share: notes.map(|notes| notes.copied_8gram_share),
            notes_longest_copy_words: notes.map(|notes: Copying| notes.longest_copy_words),
            repeated_ngram_share: Some(repeated_ngram_share(&summary)),
            echo_share: Some(echo_share(&summary, &method.template_texts())),
            wall_seconds: saved.seconds,
            sampling: Some(files.sampling.clone()),
            cache_figures: llm.info().cache_figures,
        },
        method_figures: finish.figures,
    };
    let dir = files.dir;
    dir.write_text(RunDir::SUMMARY, &format!("{summary}\n"))?;
    for (name, value) in &finish.files {
        dir.write_json(name, value)?;
    }
    dir.write_json(RunDir::STATS, &stats)?;
    Ok((summary, stats))
}

/// An [`Llm`] that records every call in the run's ledger and refuses a
/// prompt that leaves no room for the tokens asked of it.
struct Metered<'a> {
    /// The unit of work calling, to name it in errors.
    stage: &'a str,
    inner: &'a mut dyn Llm,
    ledger: &'a mut Ledger,
}

impl Metered<'_> {
    /// Refuse a call whose prompt and budget do not fit the context, naming the stage.
    fn check_fits(&self, prompt: &Prompt, max_tokens: usize) -> Result<()> {
        let prompt_tokens = self.inner.prompt_tokens(prompt)?;
        let context = self.inner.context_tokens();
        if prompt_tokens + max_tokens > context {
            return Err(Error::invalid(
                self.stage,
                format!(
                    "{prompt_tokens} tokens plus {max_tokens} to generate do not fit the model's context of {context} tokens; use a smaller {}",
                    Setting::ChunkTokens
                ),
            ));
        }
        Ok(())
    }
}

impl Llm for Metered<'_> {
    /// Every prompt is checked before the first call starts, so a batch
    /// that cannot run spends nothing.
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>> {
        for request in requests {
            self.check_fits(request.prompt, request.max_tokens)?;
        }
        let completions = self.inner.complete_each(requests, done)?;
        for completion in &completions {
            self.ledger.record(&completion.usage);
        }
        Ok(completions)
    }

    fn info(&self) -> ModelInfo<'_> {
        self.inner.info()
    }
}
