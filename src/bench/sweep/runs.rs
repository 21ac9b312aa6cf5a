//! Running the planned runs, in turn or side by side, and recording each
//! finished one as a row.

use super::estimate::estimate_note;
use super::judge::{judge_summary, loaded_judge, read_answer};
use super::plan::{finished, Planned};
use super::{write_reports, Sweep, SweepProgress, RESULTS};
use crate::bench::results::{self, Machine, Row, Scores};
use crate::bench::task::SweepDocument;
use crate::error::{Error, Result};
use crate::job::{Document, Job};
use crate::llm::Backend;
use crate::methods::MethodFigures;
use crate::run::dir::RunDir;
use crate::run::{NoProgress, Outcome, Progress, Stats};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{SystemTime, UNIX_EPOCH};

/// What the runs of one sweep session share.
pub(super) struct Session<'a> {
    pub(super) sweep: &'a Sweep,
    pub(super) documents: &'a [Document],
    pub(super) context: SweepContext,
}

impl Session<'_> {
    pub(super) fn job<'a>(&'a self, planned: &'a Planned) -> Job<'a> {
        planned.job(self.documents, &self.sweep.sampling, self.sweep.resume)
    }

    /// The runs one after another on `backend`, with their progress shown.
    pub(super) fn run_in_turn(
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
    pub(super) fn run_side_by_side(
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
pub(super) struct Finisher<'a> {
    pub(super) bench: &'a RunDir,
    pub(super) rows: &'a mut Vec<Row>,
    pub(super) judge: &'a mut Option<Backend>,
    pub(super) session: &'a Session<'a>,
    pub(super) pending: &'a [&'a Planned<'a>],
    pub(super) plan_len: usize,
}

impl Finisher<'_> {
    /// Where the next run stands in the plan, as `run 3/8`.
    pub(super) fn position(&self) -> String {
        let finished_before = self.plan_len - self.pending.len();
        let done_now = self.rows.len().saturating_sub(finished_before);
        format!("run {}/{}", finished_before + done_now + 1, self.plan_len)
    }

    pub(super) fn finish(
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
        let verdict = match &input.task {
            Some(task) => {
                let verdict = task.score(&read_answer(&planned.path)?, &input.text);
                row.scores.retrieved = verdict.retrieved.clone();
                row.scores.correct = Some(verdict.correct);
                format!("{}, ", verdict.note())
            }
            None => String::new(),
        };
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

/// What every row of this session shares.
pub(super) struct SweepContext {
    pub(super) model: String,
    /// The documents' file names, by `Planned::source`.
    pub(super) document_names: Vec<String>,
    /// Their code-retrieval tasks' ids, where they have one.
    pub(super) tasks: Vec<Option<String>>,
    pub(super) device: String,
    pub(super) machine: Machine,
    pub(super) git_revision: String,
    pub(super) git_dirty: Option<bool>,
    pub(super) command: String,
}

impl SweepContext {
    pub(super) fn new(sweep: &Sweep, backend: &Backend) -> Self {
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
                .map(|document| document.task.as_ref().map(|task| task.id().to_string()))
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
    pub(super) fn run(
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

/// The short revision of prism's source tree and whether it has uncommitted
/// changes: ("unknown", None) when git or the tree is not there.
pub(super) fn git_state() -> (String, Option<bool>) {
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
