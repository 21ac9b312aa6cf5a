//! A sweep: documents × methods × chunk sizes on one loaded backend, one run
//! directory each.

mod estimate;
mod judge;
mod plan;
mod runs;

use super::results::{self, Row};
use super::task::SweepDocument;
use super::{charts, report};
use crate::engine::device::DeviceChoice;
use crate::engine::sampling::SamplingConfig;
use crate::error::{Error, Result, Setting};
use crate::llm::Backend;
use crate::methods::MethodSpec;
use crate::qa::QaPair;
use crate::run::dir::RunDir;
use crate::run::Progress;
use plan::{cannot_answer, documents_note, plan, unfinished};
use runs::{Finisher, Session, SweepContext};
use std::path::{Path, PathBuf};

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
        distinct(&names).map_err(|reason| Error::invalid_setting(Setting::Methods, reason))?;
        distinct(&self.chunk_sizes)
            .map_err(|reason| Error::invalid_setting(Setting::ChunkSizes, reason))?;
        let documents: Vec<String> = self.documents.iter().map(SweepDocument::name).collect();
        distinct(&documents)
            .map_err(|reason| Error::invalid("the documents' file names", reason))?;
        if self.concurrency == 0 {
            return Err(Error::invalid_setting(
                Setting::Concurrency,
                "must be at least 1",
            ));
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
            return Err(Error::invalid_setting(
                Setting::Judging,
                "judges summaries; a task's runs are scored by their answers",
            ));
        }
        let is_nonempty_dir =
            std::fs::read_dir(&self.out).is_ok_and(|mut entries| entries.next().is_some());
        if !self.resume && is_nonempty_dir {
            return Err(Error::invalid(
                self.out.display().to_string(),
                format!(
                    "not empty; pass {} to continue the sweep in it, or choose another {}",
                    Setting::Resume,
                    Setting::Out
                ),
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

/// Run the sweep's unfinished runs on `backend`, each from a cold cache, and
/// judge them when asked; runs an earlier session finished are kept (and
/// judged now if they were not). `results.jsonl`, `results.csv`, `report.md`
/// and the charts are rewritten after every run, so a paused or interrupted
/// sweep still has a report and resumes where it stopped.
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
    let identity = backend.identity();
    let (documents, plan) = plan(sweep, backend.format(), &identity)?;
    let pending = unfinished(&plan, &rows, out, |planned| {
        planned
            .job(&documents, &sweep.sampling, sweep.resume)
            .fingerprint(&identity)
    })?;
    progress.note(&format!(
        "{}; {}",
        documents_note(sweep, &plan, &documents),
        estimate::runs_to_do_note(&rows, &plan, &pending, &documents, sweep.concurrency),
    ));

    let mut judge: Option<Backend> = None;
    if let Some(judging) = &sweep.judging {
        judge::judge_earlier_runs(&bench, &mut rows, &plan, judging, &mut judge, progress)?;
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
            "{}: paused after {this_session} runs; continue with {}",
            out.display(),
            Setting::Resume
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

/// Refuse an empty list or one with repeats, saying which.
fn distinct<T: PartialEq + std::fmt::Display>(values: &[T]) -> std::result::Result<(), String> {
    if values.is_empty() {
        return Err("lists nothing".into());
    }
    for (index, value) in values.iter().enumerate() {
        if values[..index].contains(value) {
            return Err(format!("lists {value} twice"));
        }
    }
    Ok(())
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
        assert!(distinct(&[500, 1000]).is_ok());
        assert_eq!(distinct(&[500, 500]), Err("lists 500 twice".into()));
        assert!(distinct::<usize>(&[]).is_err());
    }
}
