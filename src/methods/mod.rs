//! Methods turn a long document into an answer through a series of model calls.
//!
//! They deal in text and token counts only: [`Llm`] is their view of the
//! engine. [`drive`] runs any of them with the same ledger, run files
//! and checkpoints, so their figures compare. [`MethodSpec`] names a method
//! with its settings; it is what `summarize --method` and `bench --methods`
//! build, and part of a run's identity.

pub mod baseline;
pub mod cok;
pub mod cos;
pub mod detail;
pub mod hierarchical;
pub mod incremental;
pub mod prism;
pub mod whole;

use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::Llm;
use crate::memory::Schema;
use crate::run::{drive, Outcome, Progress, RunFiles};

/// A method and every setting that decides its result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "method", rename_all = "kebab-case")]
pub enum MethodSpec {
    Prism {
        config: prism::PrismConfig,
        /// The memory schema, as JSON Schema.
        schema: serde_json::Value,
    },
    Incremental {
        config: incremental::IncrementalConfig,
    },
    Hierarchical {
        config: hierarchical::HierarchicalConfig,
    },
    Detail {
        config: detail::DetailConfig,
    },
    /// The CoK paper's methods: generate-update (prose or JSON memory),
    /// generate-merge, and chain-of-key revisions.
    CokFamily {
        variant: cok::Variant,
        config: cok::CokConfig,
        /// The memory schema of the JSON variants; none for gu-text.
        schema: Option<serde_json::Value>,
    },
    Cos {
        config: cos::CosConfig,
    },
    /// The whole document in one call, when it fits the context: the
    /// reference the chunked methods are judged against.
    Whole {
        config: whole::WholeConfig,
    },
}

impl MethodSpec {
    /// The chunk size to split a document of `document_tokens` with, when
    /// `requested` is the largest that fits: the requested one, except for
    /// `detail`, whose level of detail sets it.
    pub fn chunk_tokens(&self, requested: usize, document_tokens: usize) -> Result<usize> {
        match self {
            MethodSpec::Detail { config } => detail::chunk_tokens(
                document_tokens,
                config.detail,
                requested,
                config.min_chunk_tokens,
            ),
            _ => Ok(requested),
        }
    }

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
            MethodSpec::Incremental { config } => drive(
                &incremental::Incremental::new(config),
                llm,
                chunks,
                files,
                progress,
            ),
            MethodSpec::Hierarchical { config } => {
                let context_tokens = llm.context_tokens();
                drive(
                    &hierarchical::Hierarchical::new(config, context_tokens),
                    llm,
                    chunks,
                    files,
                    progress,
                )
            }
            MethodSpec::Detail { config } => {
                drive(&detail::Detail::new(config), llm, chunks, files, progress)
            }
            MethodSpec::CokFamily {
                variant,
                config,
                schema,
            } => {
                let schema = schema.as_ref().map(Schema::from_value).transpose()?;
                let method = cok::Cok::new(*variant, config, schema.as_ref())?;
                drive(&method, llm, chunks, files, progress)
            }
            MethodSpec::Cos { config } => {
                drive(&cos::Cos::new(config), llm, chunks, files, progress)
            }
            MethodSpec::Whole { config } => {
                drive(&whole::Whole::new(config), llm, chunks, files, progress)
            }
        }
    }
}
