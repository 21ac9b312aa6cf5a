//! A sweep's documents, and the task a document may carry: what a sweep asks of
//! it besides a summary.

use crate::document::{book_text, expand_directories, read_document};
use crate::error::Result;
use std::path::PathBuf;
use std::sync::Arc;

/// A document of the sweep, read.
#[derive(Debug, Clone)]
pub struct SweepDocument {
    pub path: PathBuf,
    pub text: String,
    /// The question this document's runs answer, in place of the methods'
    /// own queries; none for a document to summarize.
    pub task: Option<Arc<dyn Task>>,
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
            .map_or_else(|| self.file_name(), |task| task.id().to_string())
    }
}

/// The documents `paths` name to summarize (a directory stands for the files
/// in it, see [`expand_directories`]), each read within `max_bytes`; of a
/// Project Gutenberg ebook only the book unless `whole_file` ([`book_text`]).
pub fn summary_documents(
    paths: &[PathBuf],
    max_bytes: u64,
    whole_file: bool,
) -> Result<Vec<SweepDocument>> {
    expand_directories(paths)?
        .into_iter()
        .map(|path| {
            Ok(SweepDocument {
                text: book_text(read_document(&path, max_bytes)?, whole_file),
                path,
                task: None,
            })
        })
        .collect()
}

/// A question about a document with one right answer. Every run on the
/// document answers the task's query in place of its method's own, and the
/// answer is scored by the task; a document without a task is summarized
/// and judged by `--quality` instead.
///
/// Tasks such as code retrieval implement this trait, and the sweep runs them
/// without knowing which task it is.
pub trait Task: std::fmt::Debug + Send + Sync {
    /// Names the document's runs and rows, in place of its file name.
    fn id(&self) -> &str;
    /// The query every method answers.
    fn query(&self) -> String;
    /// Score a run's final `answer`, given the `text` of the document it read.
    fn score(&self, answer: &str, text: &str) -> Verdict;
}

/// How a task scored one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What the answer named, where it named something the task knows.
    pub retrieved: Option<String>,
    /// What the task sought.
    pub sought: String,
    pub correct: bool,
}

impl Verdict {
    /// The verdict as the start of a progress line.
    pub fn note(&self) -> String {
        format!(
            "{} {} (sought {})",
            if self.correct { "found" } else { "missed:" },
            self.retrieved.as_deref().unwrap_or("no function named"),
            self.sought
        )
    }
}
