//! Methods turn a long document into an answer through a series of model calls,
//! dealing in text and token counts only ([`Llm`] is their view of the engine).

pub mod baseline;
pub mod cok;
pub mod cos;
pub mod detail;
pub mod hierarchical;
pub mod incremental;
pub mod length;
pub mod prism;
pub mod whole;

use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::Llm;
use crate::memory::Schema;
use crate::run::{drive, Method, NoFigures, Outcome, Progress, RunFiles};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// What a run's final answer is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnswerForm {
    /// A summary of the document in prose (`summarize`).
    #[default]
    Summary,
    /// Whatever the query asks for, answered directly (`query`, the
    /// code-retrieval benchmark).
    Direct,
}

impl AnswerForm {
    /// Whether this is the default, which run identities leave out so that
    /// runs begun before the field existed still resume.
    pub fn is_summary(&self) -> bool {
        *self == AnswerForm::Summary
    }
}

/// A method and every setting that decides its result: what `summarize
/// --method` and `bench --methods` build, and part of a run's identity.
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
    /// This spec asked `query` instead, answered directly: what `prism
    /// query` and each code-retrieval task run. Only the methods that can
    /// answer a question rather than summarize have such a spec: PRISM,
    /// whose memory and final answer follow the query, and `whole`; the
    /// others give `None`.
    pub fn answering(&self, query: &str) -> Option<MethodSpec> {
        let mut spec = self.clone();
        match &mut spec {
            MethodSpec::Prism { config, .. } => {
                config.query = query.to_string();
                config.answer_form = AnswerForm::Direct;
                // A question may hinge on the text's exact words (a
                // function's name), which a summary would lose.
                config.reading = prism::Reading::Text;
            }
            MethodSpec::Whole { config } => {
                config.query = query.to_string();
                config.answer_form = AnswerForm::Direct;
            }
            _ => return None,
        }
        Some(spec)
    }

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
    ) -> Result<Outcome<MethodFigures>> {
        let mut run = Runner {
            llm,
            chunks,
            files,
            progress,
        };
        match self {
            MethodSpec::Prism { config, schema } => {
                let schema = Schema::from_value(schema)?;
                run.drive(&prism::Prism::new(config, &schema), MethodFigures::Prism)
            }
            MethodSpec::Incremental { config } => run.drive(
                &incremental::Incremental::new(config),
                MethodFigures::Incremental,
            ),
            MethodSpec::Hierarchical { config } => {
                let context_tokens = run.llm.context_tokens();
                run.drive(
                    &hierarchical::Hierarchical::new(config, context_tokens),
                    MethodFigures::Hierarchical,
                )
            }
            MethodSpec::Detail { config } => {
                run.drive(&detail::Detail::new(config), MethodFigures::None)
            }
            MethodSpec::CokFamily {
                variant,
                config,
                schema,
            } => {
                let schema = schema.as_ref().map(Schema::from_value).transpose()?;
                let method = cok::Cok::new(*variant, config, schema.as_ref())?;
                run.drive(&method, MethodFigures::Cok)
            }
            MethodSpec::Cos { config } => run.drive(&cos::Cos::new(config), MethodFigures::Cos),
            MethodSpec::Whole { config } => {
                run.drive(&whole::Whole::new(config), MethodFigures::None)
            }
        }
    }
}

/// What [`MethodSpec::run`] hands to [`drive`] whatever the method.
struct Runner<'a> {
    llm: &'a mut dyn Llm,
    chunks: &'a [Chunk],
    files: &'a RunFiles<'a>,
    progress: &'a mut dyn Progress,
}

impl Runner<'_> {
    /// Drive `method`, naming its figures with `name`.
    fn drive<M: Method>(
        &mut self,
        method: &M,
        name: fn(M::Figures) -> MethodFigures,
    ) -> Result<Outcome<MethodFigures>> {
        let outcome = drive(method, self.llm, self.chunks, self.files, self.progress)?;
        Ok(outcome.map_figures(name))
    }
}

/// Every method's own figures in `stats.json`, under one type.
///
/// It serializes as the figures it holds, with no tag, so `stats.json` reads
/// the same whatever the method. Reading back (bench rows) goes by the set of
/// fields: each method's figures refuse fields they do not have.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MethodFigures {
    Prism(prism::PrismFigures),
    Incremental(incremental::IncrementalFigures),
    Hierarchical(hierarchical::HierarchicalFigures),
    Cok(cok::CokFigures),
    Cos(cos::CosFigures),
    /// `whole` and `detail`, which report nothing of their own.
    None(NoFigures),
    /// Figures recorded by an earlier prism, whose fields differ from any of
    /// today's methods; kept as they were, so a results file rewritten by
    /// this version loses nothing.
    Recorded(Map<String, Value>),
}

impl Default for MethodFigures {
    fn default() -> Self {
        MethodFigures::None(NoFigures {})
    }
}

impl MethodFigures {
    /// The figures `fields` hold, as the one method's type that reads them.
    /// Each type refuses fields it does not have and requires those every
    /// run of its method writes, so no two read the same fields.
    pub fn from_fields(fields: Map<String, Value>) -> Self {
        fn read<T: DeserializeOwned>(value: &Value) -> Option<T> {
            T::deserialize(value).ok()
        }
        let value = Value::Object(fields.clone());
        None.or_else(|| read(&value).map(MethodFigures::Prism))
            .or_else(|| read(&value).map(MethodFigures::Incremental))
            .or_else(|| read(&value).map(MethodFigures::Hierarchical))
            .or_else(|| read(&value).map(MethodFigures::Cok))
            .or_else(|| read(&value).map(MethodFigures::Cos))
            .or_else(|| read(&value).map(MethodFigures::None))
            .unwrap_or(MethodFigures::Recorded(fields))
    }
}

impl<'de> Deserialize<'de> for MethodFigures {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        Ok(MethodFigures::from_fields(Map::deserialize(deserializer)?))
    }
}
