//! A sweep: documents × methods × chunk sizes on one loaded backend, one run
//! directory each. The bench directory's results.jsonl, results.csv,
//! report.md and charts are rewritten after every run, so a paused or
//! interrupted sweep still has a report and resumes where it stopped.
//!
//! On a remote backend runs can proceed side by side (`concurrency`), each
//! on its own client: a run's calls stay in order, so its prefix locality on
//! the server is what it would be alone.

use super::code_retrieval::{self, Task};
use super::results::{self, Machine, Pending, Row, Scores};
use super::{charts, report};
use crate::engine::device::DeviceChoice;
use crate::engine::prompt_format::PromptFormat;
use crate::engine::sampling::SamplingConfig;
use crate::engine::{Engine, GenerateOptions, LoadOptions};
use crate::error::{Error, Result};
use crate::job::{Document, Job};
use crate::llm::Backend;
use crate::methods::{MethodFigures, MethodSpec};
use crate::models;
use crate::qa::{score_summary, QaPair};
use crate::quality::coherence::{score_coherence, CoherenceConfig};
use crate::run::dir::{Checkpoint, RunDir};
use crate::run::{NoProgress, Outcome, Progress, Stats};
use serde::de::IgnoredAny;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{SystemTime, UNIX_EPOCH};

/// One line per finished run.
pub const RESULTS: &str = "results.jsonl";
pub const RESULTS_CSV: &str = "results.csv";
pub const REPORT: &str = "report.md";
/// The folder of the run directories, `runs/<method>-<chunk tokens>`.
pub const RUNS: &str = "runs";

/// A method of the sweep, under the name its runs and rows carry.
#[derive(Debug, Clone)]
pub struct SweepMethod {
    /// As `--methods` named it, e.g. `prism-in-place-no-updates`.
    pub name: String,
    pub spec: MethodSpec,
}

/// How `--quality` judges each finished summary.
#[derive(Debug, Clone)]
pub struct Judging {
    /// The judge model, as `--model` would name it; loaded when first needed.
    pub judge_model: String,
    pub device: DeviceChoice,
    /// Question–answer pairs for QA-F1; without them only coherence is scored.
    pub questions: Option<Vec<QaPair>>,
    /// The judge's calls in flight at once (sentences, questions), each on a
    /// sibling of the judge.
    pub concurrency: usize,
}

/// A document of the sweep, read.
#[derive(Debug, Clone)]
pub struct SweepDocument {
    pub path: PathBuf,
    pub text: String,
    /// Set when the document is a repository of the code-retrieval task:
    /// the function this document's runs look for. Its query replaces the
    /// methods' own, and each finished run is scored by the name it gives.
    pub task: Option<Task>,
}

impl SweepDocument {
    /// The file name, as rows carry it.
    pub fn file_name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        )
    }

    /// What tells this document's runs apart from the others': the task
    /// when it has one, else the file name. Run directories go by it.
    pub fn name(&self) -> String {
        self.task
            .as_ref()
            .map_or_else(|| self.file_name(), |task| task.id.clone())
    }
}

/// Everything a sweep needs besides the loaded engine.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// One or more; with several, each has its own folder under `runs/`.
    pub documents: Vec<SweepDocument>,
    pub methods: Vec<SweepMethod>,
    pub chunk_sizes: Vec<usize>,
    /// Read only the first chunks, up to this many tokens in all.
    pub first_tokens: Option<usize>,
    pub sampling: SamplingConfig,
    /// The bench directory.
    pub out: PathBuf,
    /// Continue the sweep in `out`; without it `out` must be empty.
    pub resume: bool,
    /// Pause after this many runs of this session.
    pub stop_after_runs: Option<usize>,
    pub judging: Option<Judging>,
    /// The command line that started this session, recorded in every row.
    pub command: String,
    /// Runs in flight at once; above 1 only on a backend that has siblings.
    pub concurrency: usize,
}

impl Sweep {
    /// Refuse repeated methods or chunk sizes, and a bench directory that
    /// holds something when not resuming; cheap, so a caller can check before
    /// it loads a model.
    pub fn validate(&self) -> Result<()> {
        let names: Vec<&str> = self.methods.iter().map(|m| m.name.as_str()).collect();
        distinct(&names, "--methods")?;
        distinct(&self.chunk_sizes, "--chunk-tokens")?;
        let documents: Vec<String> = self.documents.iter().map(SweepDocument::name).collect();
        distinct(&documents, "the documents' file names")?;
        if self.concurrency == 0 {
            return Err(Error::invalid("--concurrency", "must be at least 1"));
        }
        let has_tasks = self
            .documents
            .iter()
            .any(|document| document.task.is_some());
        if let Some(method) = self
            .methods
            .iter()
            .find(|method| has_tasks && method.spec.answering("").is_none())
        {
            return Err(cannot_answer(method));
        }
        if has_tasks && self.judging.is_some() {
            return Err(Error::invalid(
                "--quality",
                "judges summaries; code-retrieval runs are scored by the function they name",
            ));
        }
        let is_nonempty_dir =
            std::fs::read_dir(&self.out).is_ok_and(|mut entries| entries.next().is_some());
        if !self.resume && is_nonempty_dir {
            return Err(Error::invalid(
                self.out.display().to_string(),
                "not empty; pass --resume to continue the sweep in it, or choose another --out",
            ));
        }
        Ok(())
    }
}

/// What a caller shows while a sweep runs.
pub trait SweepProgress: Progress {
    /// A run, or the judging of one, begins; `label` names it.
    fn run_begins(&mut self, label: &str);
    /// A line for the user: the plan, a finished run, a pause.
    fn note(&mut self, line: &str);
}

/// How a sweep session ended, with every row of the bench directory.
#[derive(Debug)]
pub struct SweepOutcome {
    pub rows: Vec<Row>,
    /// Set when `stop_after_runs` paused the sweep: the runs done this session.
    pub paused_after: Option<usize>,
}

/// One run of the sweep.
struct Planned<'a> {
    method: &'a SweepMethod,
    /// The method's spec, asking the document's task query when it has one.
    spec: MethodSpec,
    /// The sweep's chunk size for this run (`detail` splits finer from it).
    chunk_tokens: usize,
    /// Index into the sweep's documents.
    source: usize,
    /// Index into the split documents (one per document and chunk size in use).
    document: usize,
    /// `runs/<method>-<chunk tokens>` (with several documents
    /// `runs/<document>/<method>-<chunk tokens>`), relative to the bench directory.
    run_dir: String,
    /// The same under the bench directory.
    path: PathBuf,
}

impl Planned<'_> {
    /// How messages name the run: `method @chunk tokens`, and its document's
    /// folder when the sweep has several.
    fn label(&self) -> String {
        self.run_dir
            .strip_prefix(&format!("{RUNS}/"))
            .unwrap_or(&self.run_dir)
            .to_string()
    }

    fn job<'a>(
        &'a self,
        documents: &'a [Document],
        sampling: &'a SamplingConfig,
        resume: bool,
    ) -> Job<'a> {
        Job {
            spec: &self.spec,
            document: &documents[self.document],
            sampling,
            out: &self.path,
            resume,
            stop_after: None,
            // A sweep runs whole runs side by side instead (`concurrency`).
            concurrency: 1,
        }
    }
}

/// Run the sweep's unfinished runs on `backend`, each from a cold cache, and
/// judge them when asked; runs an earlier session finished are kept (and
/// judged now if they were not).
pub fn run(
    sweep: &Sweep,
    backend: &mut Backend,
    progress: &mut dyn SweepProgress,
) -> Result<SweepOutcome> {
    sweep.validate()?;
    let out = sweep.out.as_path();
    let bench = RunDir::create(out)?;
    let mut rows: Vec<Row> = bench.read_jsonl(RESULTS)?;
    write_reports(&bench, &rows)?;
    let (documents, plan) = plan(sweep, backend.format())?;
    let identity = backend.identity();
    let pending = unfinished(&plan, &rows, out, |planned| {
        planned
            .job(&documents, &sweep.sampling, sweep.resume)
            .fingerprint(&identity)
    })?;
    progress.note(&format!(
        "{}; {}",
        documents_note(sweep, &plan, &documents),
        runs_to_do_note(&rows, &plan, &pending, &documents, sweep.concurrency),
    ));

    let mut judge: Option<Backend> = None;
    if let Some(judging) = &sweep.judging {
        judge_earlier_runs(&bench, &mut rows, &plan, judging, &mut judge, progress)?;
    }

    let this_session = sweep
        .stop_after_runs
        .map_or(pending.len(), |limit| limit.min(pending.len()));
    let session = Session {
        sweep,
        documents: &documents,
        context: SweepContext::new(sweep, backend),
    };
    let mut finisher = Finisher {
        bench: &bench,
        rows: &mut rows,
        judge: &mut judge,
        session: &session,
        pending: &pending,
        plan_len: plan.len(),
    };
    match sweep.concurrency {
        1 => session.run_in_turn(backend, &pending[..this_session], &mut finisher, progress)?,
        workers => session.run_side_by_side(
            backend,
            workers,
            &pending[..this_session],
            &mut finisher,
            progress,
        )?,
    }
    if this_session < pending.len() {
        progress.note(&format!(
            "{}: paused after {this_session} runs; continue with --resume",
            out.display()
        ));
        return Ok(SweepOutcome {
            rows,
            paused_after: Some(this_session),
        });
    }
    progress.note(&format!(
        "{}: sweep finished; report in {REPORT}",
        out.display()
    ));
    Ok(SweepOutcome {
        rows,
        paused_after: None,
    })
}

/// What the runs of one sweep session share.
struct Session<'a> {
    sweep: &'a Sweep,
    documents: &'a [Document],
    context: SweepContext,
}

impl Session<'_> {
    fn job<'a>(&'a self, planned: &'a Planned) -> Job<'a> {
        planned.job(self.documents, &self.sweep.sampling, self.sweep.resume)
    }

    /// The runs one after another on `backend`, with their progress shown.
    fn run_in_turn(
        &self,
        backend: &mut Backend,
        runs: &[&Planned],
        finisher: &mut Finisher,
        progress: &mut dyn SweepProgress,
    ) -> Result<()> {
        for planned in runs {
            progress.run_begins(&format!("{} [{}] ", planned.label(), finisher.position()));
            let row = self
                .context
                .run(backend, &self.job(planned), planned, progress)?;
            finisher.finish(planned, row, progress)?;
        }
        Ok(())
    }

    /// The runs `workers` at a time, each worker on its own sibling of
    /// `backend`; rows are judged and written here as runs finish. The first
    /// failure stops new runs from starting, lets those in flight finish, and
    /// is returned.
    fn run_side_by_side(
        &self,
        backend: &mut Backend,
        workers: usize,
        runs: &[&Planned],
        finisher: &mut Finisher,
        progress: &mut dyn SweepProgress,
    ) -> Result<()> {
        let mut siblings = Vec::new();
        for _ in 0..workers.min(runs.len()) {
            siblings.push(backend.sibling()?);
        }
        enum Event {
            Begins(usize),
            Finished(usize, Result<Box<Row>>),
        }
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let (events, received) = mpsc::channel();
        std::thread::scope(|scope| {
            for mut sibling in siblings {
                let (events, next, failed) = (events.clone(), &next, &failed);
                scope.spawn(move || {
                    while !failed.load(Ordering::Relaxed) {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(planned) = runs.get(index) else {
                            break;
                        };
                        let _ = events.send(Event::Begins(index));
                        let job = self.job(planned);
                        let row = self
                            .context
                            .run(&mut sibling, &job, planned, &mut NoProgress)
                            .map(Box::new);
                        failed.fetch_or(row.is_err(), Ordering::Relaxed);
                        let _ = events.send(Event::Finished(index, row));
                    }
                });
            }
            drop(events);
            let mut first_error = None;
            for event in received {
                match event {
                    Event::Begins(index) => {
                        progress.note(&format!("{} begins", runs[index].label()))
                    }
                    Event::Finished(index, row) => {
                        let finished =
                            row.and_then(|row| finisher.finish(runs[index], *row, progress));
                        if let Err(err) = finished {
                            failed.store(true, Ordering::Relaxed);
                            first_error.get_or_insert(err);
                        }
                    }
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }
}

/// Judges, records and reports each finished run.
struct Finisher<'a> {
    bench: &'a RunDir,
    rows: &'a mut Vec<Row>,
    judge: &'a mut Option<Backend>,
    session: &'a Session<'a>,
    pending: &'a [&'a Planned<'a>],
    plan_len: usize,
}

impl Finisher<'_> {
    /// Where the next run stands in the plan, as `run 3/8`.
    fn position(&self) -> String {
        let finished_before = self.plan_len - self.pending.len();
        let done_now = self.rows.len().saturating_sub(finished_before);
        format!("run {}/{}", finished_before + done_now + 1, self.plan_len)
    }

    fn finish(
        &mut self,
        planned: &Planned,
        mut row: Row,
        progress: &mut dyn SweepProgress,
    ) -> Result<()> {
        let sweep = self.session.sweep;
        if let Some(judging) = &sweep.judging {
            let judge = loaded_judge(self.judge, judging)?;
            progress.run_begins(&format!("judging {} ", planned.label()));
            row.scores = judge_summary(judge, &planned.path, judging)?;
        }
        let input = &sweep.documents[planned.source];
        if let Some(task) = &input.task {
            let answer = read_answer(&planned.path)?;
            let defined = code_retrieval::defined_functions(&input.text);
            let verdict = code_retrieval::score(&answer, &task.function, &defined);
            row.scores.retrieved = verdict.retrieved;
            row.scores.correct = Some(verdict.correct);
        }
        self.bench.append_jsonl(RESULTS, &row)?;
        self.rows.push(row);
        write_reports(self.bench, self.rows)?;
        let last = self.rows.last().expect("a row was just added");
        let left: Vec<&Planned> = self
            .pending
            .iter()
            .filter(|planned| finished(self.rows, planned, &sweep.out).is_none())
            .copied()
            .collect();
        let verdict = match (&input.task, last.scores.correct) {
            (Some(task), Some(correct)) => format!(
                "{} {} (sought {}), ",
                if correct { "found" } else { "missed:" },
                last.scores
                    .retrieved
                    .as_deref()
                    .unwrap_or("no function named"),
                task.function
            ),
            _ => String::new(),
        };
        progress.note(&format!(
            "{}: {verdict}cache hit {:.1}%, net {} tokens, output {}, cost index {:.4}, {:.0}s{}",
            planned.path.display(),
            100.0 * last.figures.cache_hit_rate,
            last.figures.net_tokens,
            last.figures.output_tokens,
            last.figures.cost_index,
            last.run.wall_seconds,
            estimate_note(self.rows, &left, self.session.documents, sweep.concurrency),
        ));
        Ok(())
    }
}

/// The planned runs without a finished row. A finished run is kept only if
/// this sweep would run it the same way (the same `fingerprint`).
fn unfinished<'p>(
    plan: &'p [Planned<'p>],
    rows: &[Row],
    out: &Path,
    fingerprint: impl Fn(&Planned) -> String,
) -> Result<Vec<&'p Planned<'p>>> {
    let mut pending = Vec::new();
    for planned in plan {
        match finished(rows, planned, out) {
            Some(index) if rows[index].fingerprint != fingerprint(planned) => {
                return Err(Error::invalid(
                    out.join(&rows[index].run_dir).display().to_string(),
                    "finished with other settings than this sweep's; choose another --out",
                ))
            }
            Some(_) => {}
            None => pending.push(planned),
        }
    }
    Ok(pending)
}

/// Judge the runs an earlier session finished without `--quality`, so a
/// sweep can be scored after the fact without redoing it.
fn judge_earlier_runs(
    bench: &RunDir,
    rows: &mut [Row],
    plan: &[Planned],
    judging: &Judging,
    judge: &mut Option<Backend>,
    progress: &mut dyn SweepProgress,
) -> Result<()> {
    let unjudged = plan
        .iter()
        .filter_map(|planned| finished(rows, planned, bench.path()))
        .filter(|&index| !rows[index].scores.complete(judging.questions.is_some()))
        .collect::<Vec<_>>();
    for index in unjudged {
        let judge = loaded_judge(judge, judging)?;
        let run_dir = bench.path().join(&rows[index].run_dir);
        progress.note(&format!("judging {}", run_dir.display()));
        rows[index].scores = judge_summary(judge, &run_dir, judging)?;
        bench.rewrite_jsonl(RESULTS, rows)?;
        write_reports(bench, rows)?;
    }
    Ok(())
}

/// The sweep's runs, document by document and within one chunk size by
/// chunk size, so a paused sweep has whole tables; each document is split
/// once per chunk size its runs use (`detail` picks its own from `--detail`),
/// and the tasks of one repository share its splits.
fn plan<'a>(sweep: &'a Sweep, format: &PromptFormat) -> Result<(Vec<Document>, Vec<Planned<'a>>)> {
    let mut documents: Vec<Document> = Vec::new();
    // The file each split was made from, by index into `documents`.
    let mut split_from: Vec<&Path> = Vec::new();
    let mut plan = Vec::new();
    for (source, input) in sweep.documents.iter().enumerate() {
        let earlier = split_from.iter().position(|path| *path == input.path);
        let document_tokens = match earlier {
            Some(index) => documents[index].tokens,
            None => Document::count(format, &input.path, &input.text)?,
        };
        for &chunk_tokens in &sweep.chunk_sizes {
            for method in &sweep.methods {
                let size = method.spec.chunk_tokens(chunk_tokens, document_tokens)?;
                let split = (0..documents.len()).find(|&index| {
                    split_from[index] == input.path && documents[index].chunk_tokens == size
                });
                let document = match split {
                    Some(index) => index,
                    None => {
                        documents.push(Document::split(
                            format,
                            &input.text,
                            document_tokens,
                            size,
                            sweep.first_tokens,
                        )?);
                        split_from.push(&input.path);
                        documents.len() - 1
                    }
                };
                let spec = match &input.task {
                    Some(task) => method
                        .spec
                        .answering(&code_retrieval::query(&task.description))
                        .ok_or_else(|| cannot_answer(method))?,
                    None => method.spec.clone(),
                };
                let name = format!("{}-{chunk_tokens}", method.name);
                let run_dir = match sweep.documents.len() {
                    1 => format!("{RUNS}/{name}"),
                    _ => format!("{RUNS}/{}/{name}", input.name()),
                };
                plan.push(Planned {
                    method,
                    spec,
                    chunk_tokens,
                    source,
                    document,
                    path: sweep.out.join(&run_dir),
                    run_dir,
                });
            }
        }
    }
    Ok((documents, plan))
}

fn cannot_answer(method: &SweepMethod) -> Error {
    Error::invalid(
        format!("--methods {}", method.name),
        "cannot answer a query: code retrieval runs the prism variants and whole",
    )
}

/// The documents and their sizes, for the first progress line; a
/// repository that several tasks search is named once.
fn documents_note(sweep: &Sweep, plan: &[Planned], documents: &[Document]) -> String {
    let sizes = sweep.documents.iter().enumerate().map(|(source, input)| {
        let tokens = plan
            .iter()
            .find(|planned| planned.source == source)
            .map_or(0, |planned| documents[planned.document].tokens);
        format!("{}: {tokens} tokens", input.path.display())
    });
    results::distinct(sizes).join("; ")
}

/// `prism bench report DIR`: rebuild results.csv, report.md and the charts
/// from results.jsonl, and return its rows.
pub fn regenerate(dir: &Path) -> Result<Vec<Row>> {
    if !dir.join(RESULTS).is_file() {
        return Err(Error::invalid(
            dir.display().to_string(),
            format!("no {RESULTS} here; is it a bench directory?"),
        ));
    }
    let bench = RunDir::create(dir)?;
    let rows: Vec<Row> = bench.read_jsonl(RESULTS)?;
    write_reports(&bench, &rows)?;
    Ok(rows)
}

/// `values`, refusing an empty list or one with repeats.
fn distinct<T: PartialEq + std::fmt::Display>(values: &[T], flag: &str) -> Result<()> {
    if values.is_empty() {
        return Err(Error::invalid(flag, "lists nothing"));
    }
    for (index, value) in values.iter().enumerate() {
        if values[..index].contains(value) {
            return Err(Error::invalid(flag, format!("lists {value} twice")));
        }
    }
    Ok(())
}

/// The index of `planned`'s row if it has one and its run directory its stats.json.
fn finished(rows: &[Row], planned: &Planned, out: &Path) -> Option<usize> {
    let index = rows
        .iter()
        .rposition(|row| row.run_dir == planned.run_dir)?;
    out.join(&rows[index].run_dir)
        .join(RunDir::STATS)
        .is_file()
        .then_some(index)
}

/// How many runs are left and how many were finished before, with a
/// rough time estimate for the rest.
fn runs_to_do_note(
    rows: &[Row],
    plan: &[Planned],
    pending: &[&Planned],
    documents: &[Document],
    concurrency: usize,
) -> String {
    format!(
        "{} run{} to do ({} already finished){}",
        pending.len(),
        if pending.len() == 1 { "" } else { "s" },
        plan.len() - pending.len(),
        estimate_note(rows, pending, documents, concurrency),
    )
}

/// A rough estimate of the `pending` runs' time, as a suffix for a progress
/// line. With `concurrency` runs in flight, the rest takes about the sum of their
/// times divided by it, as each run's own time already includes the wait for
/// a shared server.
fn estimate_note(
    rows: &[Row],
    pending: &[&Planned],
    documents: &[Document],
    concurrency: usize,
) -> String {
    if pending.is_empty() {
        return String::new();
    }
    let in_flight = concurrency.clamp(1, pending.len()) as f64;
    let pending: Vec<Pending> = pending
        .iter()
        .map(|planned| {
            let chunks = &documents[planned.document].chunks;
            Pending {
                method: planned.method.name.clone(),
                chunk_tokens: planned.chunk_tokens,
                read_tokens: documents[planned.document].read_tokens,
                chunks: chunks.len(),
                steps_done: steps_done(&planned.path),
            }
        })
        .collect();
    let forecast = results::estimate(rows, &pending);
    let seconds = forecast.seconds / in_flight;
    let unpaced = forecast.unpaced_methods.join(", ");
    match (forecast.unpaced_methods.is_empty(), forecast.seconds > 0.0) {
        (true, _) => format!(
            "; the rest may take roughly {} (paced by the finished runs)",
            duration(seconds)
        ),
        (false, true) => format!(
            "; the rest may take roughly {} plus the runs of {unpaced}, \
             which get an estimate after their first finished run",
            duration(seconds)
        ),
        (false, false) => {
            "; a rough time estimate follows each method's first finished run".to_string()
        }
    }
}

/// Steps an earlier session of the run in `run_dir` completed, for the time
/// estimate only: 0 when it has no checkpoint or one that cannot be read (the
/// run itself reports that when it starts).
fn steps_done(run_dir: &Path) -> usize {
    std::fs::read(run_dir.join(RunDir::CHECKPOINT))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Checkpoint<IgnoredAny>>(&bytes).ok())
        .map_or(0, |checkpoint| checkpoint.completed_steps)
}

fn duration(seconds: f64) -> String {
    let minutes = (seconds / 60.0).round() as u64;
    match minutes {
        0 => format!("{seconds:.0}s"),
        1..=119 => format!("{minutes} min"),
        _ => format!("{:.1} h", seconds / 3600.0),
    }
}

/// What every row of this session shares.
struct SweepContext {
    model: String,
    /// The documents' file names, by `Planned::source`.
    document_names: Vec<String>,
    /// Their code-retrieval tasks' ids, where they have one.
    tasks: Vec<Option<String>>,
    device: String,
    machine: Machine,
    git_revision: String,
    git_dirty: Option<bool>,
    command: String,
}

impl SweepContext {
    fn new(sweep: &Sweep, backend: &Backend) -> Self {
        let (git_revision, git_dirty) = git_state();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        SweepContext {
            model: backend.name().to_string(),
            document_names: sweep
                .documents
                .iter()
                .map(SweepDocument::file_name)
                .collect(),
            tasks: sweep
                .documents
                .iter()
                .map(|document| document.task.as_ref().map(|task| task.id.clone()))
                .collect(),
            device: backend.device(),
            machine: Machine::from_proc(
                std::fs::read_to_string("/proc/cpuinfo").ok().as_deref(),
                std::fs::read_to_string("/proc/meminfo").ok().as_deref(),
                threads,
                crate::engine::device::default_threads(),
            ),
            git_revision,
            git_dirty,
            command: sweep.command.clone(),
        }
    }

    /// Run `job` from a cold cache, as it would run on a freshly loaded
    /// engine, and make its row.
    fn run(
        &self,
        backend: &mut Backend,
        job: &Job,
        planned: &Planned,
        progress: &mut dyn Progress,
    ) -> Result<Row> {
        backend.clear_cache();
        let Outcome::Finished { stats, .. } = job.run(backend, progress)? else {
            return Err(Error::invalid(
                job.out.display().to_string(),
                "stopped before finishing",
            ));
        };
        let fingerprint = job.fingerprint(&backend.identity());
        Ok(self.row(planned, job.document, fingerprint, stats))
    }

    fn row(
        &self,
        planned: &Planned,
        document: &Document,
        fingerprint: String,
        stats: Stats<MethodFigures>,
    ) -> Row {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        Row {
            method: planned.method.name.clone(),
            chunk_tokens: planned.chunk_tokens,
            model: self.model.clone(),
            document: self.document_names[planned.source].clone(),
            task: self.tasks[planned.source].clone(),
            document_sha256: document.sha256.clone(),
            document_tokens: document.tokens,
            read_tokens: document.read_tokens,
            device: self.device.clone(),
            machine: self.machine.clone(),
            git_revision: self.git_revision.clone(),
            git_dirty: self.git_dirty,
            date: results::utc_timestamp(now),
            command: self.command.clone(),
            run_dir: planned.run_dir.clone(),
            fingerprint,
            scores: Scores::default(),
            label: stats.method,
            figures: stats.figures,
            run: stats.run,
            method_figures: stats.method_figures,
        }
    }
}

/// The judge of `--quality`, loaded on the sweep's device the first time it is needed.
fn loaded_judge<'a>(judge: &'a mut Option<Backend>, judging: &Judging) -> Result<&'a mut Backend> {
    match judge {
        Some(judge) => Ok(judge),
        None => {
            let source = models::resolve(&judging.judge_model)?;
            let options = LoadOptions {
                device: judging.device,
                ..LoadOptions::default()
            };
            let engine = Engine::load(&source, &options)?;
            Ok(judge.insert(Backend::Local(Box::new(engine))))
        }
    }
}

/// The final answer a finished run wrote.
fn read_answer(run_dir: &Path) -> Result<String> {
    let path = run_dir.join(RunDir::SUMMARY);
    std::fs::read_to_string(&path).map_err(|err| Error::io(&path, err))
}

/// Score the summary in `run_dir` with `judge`: coherence, and QA-F1 when
/// `questions` are given; the judges' reports go into the run directory as
/// coherence.json and qa.json. A summary the judge cannot score (no
/// sentences) gets a `coherence_error`, so one odd run does not stop the sweep.
fn judge_summary(judge: &mut Backend, run_dir: &Path, judging: &Judging) -> Result<Scores> {
    let dir = RunDir::create(run_dir)?;
    let summary = read_answer(run_dir)?;
    judge.clear_cache();
    let mut llm = judge.llm_side_by_side(GenerateOptions::default(), judging.concurrency)?;
    let config = CoherenceConfig { constrained: true };
    let mut scores = Scores::default();
    match score_coherence(&mut *llm, &summary, &config, &mut |_, _| {}) {
        Ok(report) => {
            scores.coherence = Some(report.score);
            scores.coherence_unparsed = Some(report.unparsed);
            dir.write_json("coherence.json", &report)?;
        }
        Err(err) => scores.coherence_error = Some(err.to_string()),
    }
    if let Some(questions) = &judging.questions {
        let score = score_summary(&mut *llm, &summary, questions)?;
        scores.qa_f1 = Some(score.correct_f1);
        dir.write_json("qa.json", &score)?;
    }
    Ok(scores)
}

/// The short revision of prism's source tree and whether it has uncommitted
/// changes: ("unknown", None) when git or the tree is not there.
fn git_state() -> (String, Option<bool>) {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(revision) if !revision.is_empty() => {
            // Committed results change while a sweep runs; they are not the source.
            let dirty = git(&[
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)results",
            ])
            .map(|status| !status.is_empty());
            (revision, dirty)
        }
        _ => ("unknown".to_string(), None),
    }
}

/// Rebuild results.csv, report.md and the charts from `rows`.
fn write_reports(bench: &RunDir, rows: &[Row]) -> Result<()> {
    bench.write_text(RESULTS_CSV, &results::csv(rows))?;
    bench.write_text(REPORT, &report::markdown(rows))?;
    for metric in results::measured(rows) {
        let chart = charts::svg(metric, &results::series(rows, metric))?;
        bench.write_text(metric.chart_file(), &chart)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_values_are_refused() {
        assert!(distinct(&[500, 1000], "--chunk-tokens").is_ok());
        let err = distinct(&[500, 500], "--chunk-tokens").unwrap_err();
        assert_eq!(err.to_string(), "--chunk-tokens: lists 500 twice");
        assert!(distinct::<usize>(&[], "--chunk-tokens").is_err());
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(20.0), "20s");
        assert_eq!(duration(600.0), "10 min");
        assert_eq!(duration(3.0 * 3600.0), "3.0 h");
    }
}
