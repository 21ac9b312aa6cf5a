//! A task: what a sweep asks of a document besides a summary.

/// A question about a document with one right answer. Every run on the
/// document answers the task's query in place of its method's own, and the
/// answer is scored by the task; a document without a task is summarized
/// and judged by `--quality` instead.
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
