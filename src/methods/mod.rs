//! Methods turn a long document into an answer through a series of model calls.
//!
//! They deal in text and token counts only: [`llm::Llm`] is their view of the
//! engine. [`run::drive`] runs any of them with the same ledger, run files
//! and checkpoints, so their figures compare. [`MethodSpec`] names a method
//! with its settings; it is what `summarize --method` and `bench --methods`
//! build, and part of a run's identity.

pub mod llm;
pub mod prism;
pub mod revision_grammar;
pub mod run;
pub mod schema_gen;

use crate::chunk::Chunk;
use crate::error::Result;
use crate::memory::Schema;
use llm::Llm;
use run::{drive, Outcome, Progress, RunFiles};

/// A method and every setting that decides its result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "method", rename_all = "kebab-case")]
pub enum MethodSpec {
    Prism {
        config: prism::PrismConfig,
        /// The memory schema, as JSON Schema.
        schema: serde_json::Value,
    },
}

impl MethodSpec {
    /// Run the method over `chunks` with [`drive`].
    pub fn run(
        &self,
        llm: &mut dyn Llm,
        chunks: &[Chunk],
        files: &RunFiles,
        progress: &mut dyn Progress,
    ) -> Result<Outcome> {
        match self {
            MethodSpec::Prism { config, schema } => {
                let schema = Schema::from_value(schema)?;
                drive(
                    &prism::Prism::new(config, &schema),
                    llm,
                    chunks,
                    files,
                    progress,
                )
            }
        }
    }
}
