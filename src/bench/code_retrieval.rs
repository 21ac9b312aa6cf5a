//! The code-retrieval task, after RepoQA's needle-function search: a repository read
//! as one document, and a query describing one of its functions without naming it.

use super::task::{SweepDocument, Task, Verdict};
use crate::document::read_sources;
use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A task file as `scripts/code-retrieval build` writes it.
#[derive(Debug, Clone, Deserialize)]
pub struct TaskFile {
    pub repositories: Vec<Repository>,
    pub tasks: Vec<FunctionTask>,
}

/// A package whose source is searched.
#[derive(Debug, Clone, Deserialize)]
pub struct Repository {
    pub name: String,
    pub version: String,
}

/// One function to find.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FunctionTask {
    /// `<repository>/<function>`.
    pub id: String,
    pub repository: String,
    pub function: String,
    /// The function's docstring summary, which the repository tree lacks.
    pub description: String,
}

impl TaskFile {
    /// Read and check the task file at `path`: every task's repository is
    /// listed and every id is distinct.
    pub fn read(path: &Path) -> Result<TaskFile> {
        let text = std::fs::read_to_string(path).map_err(|err| Error::io(path, err))?;
        let file: TaskFile = serde_json::from_str(&text).map_err(|err| {
            Error::invalid(
                path.display().to_string(),
                format!("not a code-retrieval task file: {err}"),
            )
        })?;
        let refuse = |reason: String| Error::invalid(path.display().to_string(), reason);
        if file.tasks.is_empty() {
            return Err(refuse("lists no tasks".into()));
        }
        for (index, task) in file.tasks.iter().enumerate() {
            if file.repository(&task.repository).is_none() {
                return Err(refuse(format!(
                    "task {} names repository {}, which it does not list",
                    task.id, task.repository
                )));
            }
            if file.tasks[..index].iter().any(|other| other.id == task.id) {
                return Err(refuse(format!("lists task {} twice", task.id)));
            }
        }
        Ok(file)
    }

    pub fn repository(&self, name: &str) -> Option<&Repository> {
        self.repositories.iter().find(|repo| repo.name == name)
    }

    /// At most `per_repository` tasks of each repository, spread evenly over
    /// its tasks (which the file lists in reading order), so that a smaller
    /// run still asks about the start, middle and end of the source.
    pub fn spread(&self, per_repository: Option<usize>) -> Vec<&FunctionTask> {
        let mut chosen = Vec::new();
        for repository in &self.repositories {
            let tasks: Vec<&FunctionTask> = self
                .tasks
                .iter()
                .filter(|task| task.repository == repository.name)
                .collect();
            let keep = per_repository.map_or(tasks.len(), |limit| limit.min(tasks.len()));
            for position in 0..keep {
                let index = match keep {
                    1 => 0,
                    _ => (position * (tasks.len() - 1) + (keep - 1) / 2) / (keep - 1),
                };
                chosen.push(tasks[index]);
            }
        }
        chosen
    }
}

impl Repository {
    /// The tree the model reads, as `scripts/code-retrieval fetch` writes it
    /// beside `task_file`; an error that says how to get it when missing.
    pub fn tree(&self, task_file: &Path) -> Result<PathBuf> {
        let dir = task_file
            .parent()
            .unwrap_or(Path::new("."))
            .join("repos")
            .join(format!("{}-{}", self.name, self.version));
        if !dir.is_dir() {
            return Err(Error::invalid(
                dir.display().to_string(),
                format!(
                    "missing; run `scripts/code-retrieval fetch {}` to download and check it",
                    task_file.display()
                ),
            ));
        }
        Ok(dir)
    }
}

/// The sweep documents of the tasks in `task_file`, `per_repository` of
/// each repository at most (see [`TaskFile::spread`]): each task's
/// repository tree read as one document, within `max_bytes`.
pub fn sweep_documents(
    task_file: &Path,
    per_repository: Option<usize>,
    max_bytes: u64,
) -> Result<Vec<SweepDocument>> {
    let file = TaskFile::read(task_file)?;
    let chosen = file.spread(per_repository);
    let mut documents = Vec::new();
    for repository in &file.repositories {
        let mut tasks = chosen
            .iter()
            .filter(|task| task.repository == repository.name);
        let Some(first) = tasks.next() else { continue };
        let tree = repository.tree(task_file)?;
        let text = read_sources(std::slice::from_ref(&tree), max_bytes)?;
        for task in std::iter::once(first).chain(tasks) {
            documents.push(SweepDocument {
                path: tree.clone(),
                text: text.clone(),
                task: Some(Arc::new((*task).clone())),
            });
        }
    }
    Ok(documents)
}

/// The query a task asks of every method: the description, and the one
/// form of answer that can be scored.
pub fn query(description: &str) -> String {
    format!(
        "Which function of the code does this description fit: \"{description}\" Answer with the function's name only."
    )
}

impl Task for FunctionTask {
    fn id(&self) -> &str {
        &self.id
    }

    fn query(&self) -> String {
        query(&self.description)
    }

    fn score(&self, answer: &str, text: &str) -> Verdict {
        score(answer, &self.function, &defined_functions(text))
    }
}

/// Score `answer` against the sought `function`: the answer's first word
/// that is the name of a function `defined` in the repository is what it
/// retrieved, and it is right when that is exactly `function`. Reading the
/// first defined name, rather than demanding a bare name, forgives the
/// words a model puts around it ("The function is `parse_size`.") without
/// crediting an answer that lists several candidates after a wrong one.
pub fn score(answer: &str, function: &str, defined: &[String]) -> Verdict {
    let retrieved = identifiers(answer)
        .find(|word| defined.iter().any(|name| name == word))
        .map(str::to_string);
    Verdict {
        correct: retrieved.as_deref() == Some(function),
        retrieved,
        sought: function.to_string(),
    }
}

/// The names of the functions `source` defines with `def` (Python's
/// `def` and `async def`, at any indentation), each once, in order.
pub fn defined_functions(source: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for line in source.lines() {
        let line = line.trim_start();
        let line = line.strip_prefix("async ").unwrap_or(line);
        let Some(rest) = line.strip_prefix("def ") else {
            continue;
        };
        if let Some(name) = identifiers(rest).next() {
            if !names.iter().any(|known| known == name) {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// The identifier-like words of `text` in order: runs of letters, digits
/// and underscores that do not start with a digit. A dotted name
/// (`Class.method`) gives its parts one by one.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|word| word.chars().next().is_some_and(|c| !c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn the_first_defined_name_in_the_answer_is_what_it_retrieved() {
        let defined = names(&["parse_size", "parse_duration", "format_size"]);
        let right = score(
            "The function is `parse_duration`.",
            "parse_duration",
            &defined,
        );
        assert_eq!(right.retrieved.as_deref(), Some("parse_duration"));
        assert!(right.correct);
        let dotted = score(
            "durations.parse.parse_duration()",
            "parse_duration",
            &defined,
        );
        assert!(dotted.correct);
        // A wrong candidate first is wrong, even with the right one after it.
        let listed = score(
            "parse_size, or maybe parse_duration",
            "parse_duration",
            &defined,
        );
        assert_eq!(listed.retrieved.as_deref(), Some("parse_size"));
        assert!(!listed.correct);
        // A name the repository does not define retrieves nothing.
        let invented = score("parse_time", "parse_duration", &defined);
        assert_eq!(invented.retrieved, None);
        assert!(!invented.correct);
        // Exact: a longer name that contains the sought one is not it.
        let defined = names(&["parse_duration", "parse_duration_ms"]);
        assert!(!score("parse_duration_ms", "parse_duration", &defined).correct);
    }

    #[test]
    fn defined_functions_are_read_off_def_lines_once_each() {
        let source = "=== File: a.py ===\nasync def fetch(url):\n    pass\n\nclass Size:\n    def __init__(self):\n        self.undefined = 1\n\n    def fetch(self): pass\nx = 'def not_a_function'\n";
        assert_eq!(defined_functions(source), ["fetch", "__init__"]);
    }

    fn task(id: &str, repository: &str) -> FunctionTask {
        FunctionTask {
            id: id.into(),
            repository: repository.into(),
            function: id.into(),
            description: "Does a thing.".into(),
        }
    }

    #[test]
    fn a_task_asks_its_description_and_scores_against_the_document_read() {
        let task: &dyn Task = &task("parse", "a");
        assert_eq!(task.id(), "parse");
        assert!(task.query().contains("\"Does a thing.\""));
        let verdict = task.score("It is `parse`.", "def parse(text):\n    pass\n");
        assert!(verdict.correct);
        assert_eq!(verdict.note(), "found parse (sought parse)");
        let missed = task.score("It is `parse`.", "def other():\n    pass\n");
        assert_eq!(missed.note(), "missed: no function named (sought parse)");
    }

    #[test]
    fn a_spread_takes_the_start_middle_and_end_of_each_repository() {
        let file = TaskFile {
            repositories: vec![
                Repository {
                    name: "a".into(),
                    version: "1".into(),
                },
                Repository {
                    name: "b".into(),
                    version: "1".into(),
                },
            ],
            tasks: ["a0", "a1", "a2", "a3", "a4"]
                .into_iter()
                .map(|id| task(id, "a"))
                .chain([task("b0", "b")])
                .collect(),
        };
        let ids =
            |tasks: Vec<&FunctionTask>| tasks.iter().map(|t| t.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(file.spread(Some(3))), ["a0", "a2", "a4", "b0"]);
        assert_eq!(ids(file.spread(Some(1))), ["a0", "b0"]);
        assert_eq!(ids(file.spread(None)).len(), 6);
    }

    #[test]
    fn a_task_file_that_does_not_hold_together_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tasks.json");
        let write = |text: &str| std::fs::write(&path, text).unwrap();
        write(
            r#"{"repositories": [], "tasks": [{"id": "x/f", "repository": "x", "file": "a.py", "function": "f", "description": "d"}]}"#,
        );
        let err = TaskFile::read(&path).unwrap_err().to_string();
        assert!(err.contains("does not list"), "{err}");
        write("{}");
        let err = TaskFile::read(&path).unwrap_err().to_string();
        assert!(err.contains("not a code-retrieval task file"), "{err}");
        write(r#"{"repositories": [{"name": "x", "version": "1"}], "tasks": []}"#);
        let err = TaskFile::read(&path).unwrap_err().to_string();
        assert!(err.contains("lists no tasks"), "{err}");
        let repository = Repository {
            name: "x".into(),
            version: "1".into(),
        };
        let err = repository.tree(&path).unwrap_err().to_string();
        assert!(err.contains("scripts/code-retrieval fetch"), "{err}");
    }
}
