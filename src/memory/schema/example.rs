//! A schema's own worked example (`x-worked-example` at its top level): a memory, a
//! text and the revisions a good reader writes for it.

use serde::Deserialize;
use serde_json::Value;

use super::Schema;
use crate::memory::revision::{apply, Op, Revision};

/// An example of a schema's own task, shown in PRISM's prompt instead of the
/// stock one.
///
/// The prompt teaches the revision format by example, and a small model copies
/// the shape of the example rather than the schema: the stock example keeps
/// summary notes (`$.events`, `$.people`), and under the code schema
/// Qwen2.5-Coder-1.5B keyed its notes by the package's name instead of by
/// function. A schema that serves another task can therefore carry an example
/// of that task.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkedExample {
    /// The example's own query, when the task needs one to make sense of it.
    #[serde(default)]
    pub query: Option<String>,
    /// The memory before the text is read.
    pub memory: Value,
    /// The text read.
    pub text: String,
    /// What the reader writes for it, in order; empty when it adds nothing.
    pub revisions: Vec<Revision>,
}

impl WorkedExample {
    /// The schema keyword that holds it.
    pub const KEYWORD: &str = "x-worked-example";

    /// Read the keyword's value and check it against `schema`: its memory must
    /// fit the schema and each revision must apply to it in turn, as `add`s
    /// only, so that it teaches nothing the run would refuse with updates
    /// switched off.
    pub(super) fn load(value: &Value, schema: &Schema) -> Result<WorkedExample, String> {
        let at = format!("#/{}", Self::KEYWORD);
        let example = WorkedExample::deserialize(value).map_err(|e| format!("{at}: {e}"))?;
        schema
            .validate(&example.memory)
            .map_err(|e| format!("{at}/memory: {e}"))?;
        let mut memory = example.memory.clone();
        for (index, revision) in example.revisions.iter().enumerate() {
            if revision.op != Op::Add {
                return Err(format!(
                    "{at}/revisions/{index}: only add revisions may be shown, since runs without updates refuse the rest"
                ));
            }
            memory = apply(&memory, revision, schema)
                .map_err(|e| format!("{at}/revisions/{index}: {}", e.reason))?;
        }
        Ok(example)
    }
}
