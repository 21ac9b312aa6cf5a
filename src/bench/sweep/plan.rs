//! The plan of a sweep: which runs, on which split of which document, and
//! which of them an earlier session finished.

use super::{Sweep, SweepMethod, RUNS};
use crate::bench::results::{self, Row};
use crate::engine::prompt_format::PromptFormat;
use crate::engine::sampling::SamplingConfig;
use crate::error::{Error, Result, Setting};
use crate::job::{self, Chunking, Document, Documents, Job, Request};
use crate::llm::BackendIdentity;
use crate::methods::MethodSpec;
use crate::run::dir::RunDir;
use std::path::{Path, PathBuf};

/// One run of the sweep.
pub(super) struct Planned<'a> {
    pub(super) method: &'a SweepMethod,
    /// The method's spec, asking the document's task query when it has one.
    pub(super) spec: MethodSpec,
    /// The sweep's chunk size for this run (`detail` splits finer from it).
    pub(super) chunk_tokens: usize,
    /// Index into the sweep's documents.
    pub(super) source: usize,
    /// Index into the split documents (one per document and chunk size in use).
    pub(super) document: usize,
    /// `runs/<method>-<chunk tokens>` (with several documents
    /// `runs/<document>/<method>-<chunk tokens>`), relative to the bench directory.
    pub(super) run_dir: String,
    /// The same under the bench directory.
    pub(super) path: PathBuf,
}

impl Planned<'_> {
    /// How messages name the run: `method @chunk tokens`, and its document's
    /// folder when the sweep has several.
    pub(super) fn label(&self) -> String {
        self.run_dir
            .strip_prefix(&format!("{RUNS}/"))
            .unwrap_or(&self.run_dir)
            .to_string()
    }

    pub(super) fn job<'a>(
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

/// The planned runs without a finished row. A finished run is kept only if
/// this sweep would run it the same way (the same `fingerprint`).
pub(super) fn unfinished<'p>(
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
                    format!(
                        "finished with other settings than this sweep's; choose another {}",
                        Setting::Out
                    ),
                ))
            }
            Some(_) => {}
            None => pending.push(planned),
        }
    }
    Ok(pending)
}

/// The sweep's runs, document by document and within one chunk size by
/// chunk size, so a paused sweep has whole tables; each document is split
/// once per chunk size its runs use (`detail` picks its own from `--detail`),
/// and the tasks of one repository share its splits.
pub(super) fn plan<'a>(
    sweep: &'a Sweep,
    format: &PromptFormat,
    engine: &BackendIdentity,
) -> Result<(Documents, Vec<Planned<'a>>)> {
    let mut documents = Documents::default();
    let mut plan = Vec::new();
    for (source, input) in sweep.documents.iter().enumerate() {
        for &chunk_tokens in &sweep.chunk_sizes {
            for method in &sweep.methods {
                let name = format!("{}-{chunk_tokens}", method.name);
                let run_dir = match sweep.documents.len() {
                    1 => format!("{RUNS}/{name}"),
                    _ => format!("{RUNS}/{}/{name}", input.name()),
                };
                let path = sweep.out.join(&run_dir);
                let request = Request {
                    source: &input.path,
                    text: &input.text,
                    spec: &method.spec,
                    chunking: Chunking {
                        chunk_tokens,
                        first_tokens: sweep.first_tokens,
                    },
                    sampling: &sweep.sampling,
                    out: &path,
                    // A sweep's run resumes where it has a checkpoint and
                    // needs none; `unfinished` and the run itself check them.
                    resume: false,
                };
                let document = job::prepare(format, engine, &mut documents, &request)?;
                let spec = match &input.task {
                    Some(task) => method
                        .spec
                        .answering(&task.query())
                        .ok_or_else(|| cannot_answer(method))?,
                    None => method.spec.clone(),
                };
                plan.push(Planned {
                    method,
                    spec,
                    chunk_tokens,
                    source,
                    document,
                    path,
                    run_dir,
                });
            }
        }
    }
    Ok((documents, plan))
}

pub(super) fn cannot_answer(method: &SweepMethod) -> Error {
    Error::invalid(
        format!("{} {}", Setting::Methods, method.name),
        "cannot answer a query: a task runs the prism variants and whole",
    )
}

/// The documents and their sizes, for the first progress line; a
/// repository that several tasks search is named once.
pub(super) fn documents_note(sweep: &Sweep, plan: &[Planned], documents: &[Document]) -> String {
    let sizes = sweep.documents.iter().enumerate().map(|(source, input)| {
        let tokens = plan
            .iter()
            .find(|planned| planned.source == source)
            .map_or(0, |planned| documents[planned.document].tokens);
        format!("{}: {tokens} tokens", input.path.display())
    });
    results::distinct(sizes).join("; ")
}

/// The index of `planned`'s row if it has one and its run directory its stats.json.
pub(super) fn finished(rows: &[Row], planned: &Planned, out: &Path) -> Option<usize> {
    let index = rows
        .iter()
        .rposition(|row| row.run_dir == planned.run_dir)?;
    out.join(&rows[index].run_dir)
        .join(RunDir::STATS)
        .is_file()
        .then_some(index)
}
