//! The method flags `summarize` and `bench` share, and how they become a
//! [`MethodSpec`]: which method, and every setting that decides its result.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use prism::memory::{shipped, Schema};
use prism::methods::cok::{CokConfig, Variant};
use prism::methods::cos::CosConfig;
use prism::methods::detail::DetailConfig;
use prism::methods::hierarchical::HierarchicalConfig;
use prism::methods::incremental::IncrementalConfig;
use prism::methods::prism::{MemoryMode, PrismConfig, Reading};
use prism::methods::whole::WholeConfig;
use prism::methods::{AnswerForm, MethodSpec};
use std::path::PathBuf;

/// The methods `--method` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MethodName {
    /// Structured memory with revisions (PRISM).
    Prism,
    /// A running summary updated with each chunk and compressed when too long (BooookScore).
    Incremental,
    /// Chunk summaries merged level by level into one (BooookScore).
    Hierarchical,
    /// Chunk summaries joined in order, as many chunks as --detail asks for (OpenAI cookbook).
    Detail,
    /// Generate-update, prose memory: the model rewrites the memory after each chunk (CoK paper).
    GuText,
    /// Generate-update, JSON memory: the model rewrites the memory after each chunk (CoK paper).
    GuJson,
    /// Generate-merge, JSON memory: a memory per chunk, merged by key, then rid of repeats (CoK paper).
    GmJson,
    /// Chain-of-key: the model lists the memory's keys, then revises the matching ones and adds new ones.
    Cok,
    /// Chain of Summaries: refine a summary against questions it fails, keep the best on held-out questions.
    Cos,
    /// The whole document in one prompt, when it fits the model's context (else an error): the reference for chunked methods.
    Whole,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadingArg {
    Summary,
    Text,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MemoryArg {
    InPlace,
    Amendments,
}

/// The settings of every method; each method reads the ones it has.
#[derive(Debug, Clone, Args)]
pub struct MethodArgs {
    /// What the final answer should be.
    #[arg(
        long,
        default_value = "Summarize the document: the main events in order, the people involved and what drives them, the setting and the central themes."
    )]
    pub query: String,
    /// The length of the summary in words, the same target for every method (detail and cos
    /// excepted); by default a tenth of the document's words, at least 120 and at most 600.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub summary_words: Option<u32>,
    /// The most tokens of a direct answer (query; cos: of every summary; gu/gm/cok: of the answer).
    #[arg(long, default_value_t = 900)]
    pub answer_tokens: usize,
    /// prism: how the memory is shown to the model.
    #[arg(long, value_enum, default_value = "amendments")]
    pub memory: MemoryArg,
    /// prism: what the revision step reads of each chunk: a summary of it that a call of its own
    /// writes first (notes in the model's words), or its text (as the paper does).
    #[arg(long, value_enum, default_value = "summary")]
    pub reads: ReadingArg,
    /// prism: allow `add` revisions only (the paper's "without updates" ablation).
    #[arg(long)]
    pub no_updates: bool,
    /// prism, gu-json, gm-json, cok: the memory schema: a JSON Schema file, or
    /// a schema prism ships by name (summary, book, cok-book, code, entity, sql).
    #[arg(long, default_value = "summary")]
    pub schema: PathBuf,
    /// prism, cok: the most tokens one revision step may write; gm-json: the most a chunk's own memory may have; gu-text, gu-json, gm-json: how far a rewrite of the memory may outgrow it.
    #[arg(long, default_value_t = 1024)]
    pub revision_tokens: usize,
    /// prism, gu-json, gm-json, cok: decode under a grammar derived from the schema (output parses and type-checks);
    /// cos: write question-answer pairs under a JSON Schema.
    #[arg(long, value_enum, default_value = "on")]
    pub constrained: OnOff,
    /// incremental, hierarchical, detail: the most tokens of a summary (incremental: the running summary; hierarchical: the top one, lower levels get less; detail: each chunk's).
    #[arg(long, default_value_t = 900)]
    pub max_summary_tokens: usize,
    /// detail: from 0 (the fewest chunks of --chunk-tokens) to 1 (the most chunks of --min-chunk-tokens).
    #[arg(long, default_value_t = 0.0)]
    pub detail: f64,
    /// detail: the smallest chunk worth a summary of its own.
    #[arg(long, default_value_t = 500)]
    pub min_chunk_tokens: usize,
    /// detail: show each chunk's call the summaries of the chunks before it.
    #[arg(long)]
    pub recursive: bool,
    /// gu-text, gu-json, gm-json, cok: have the model compress the memory when it grows past this many tokens (0: never).
    #[arg(long, default_value_t = 1000)]
    pub memory_token_limit: usize,
    /// cos: question-answer pairs to generate over the whole document, spread over its chunks.
    #[arg(long, default_value_t = 24)]
    pub qa_pairs: usize,
    /// cos: refinement rounds.
    #[arg(long, default_value_t = 3)]
    pub iterations: usize,
    /// cos: failed train questions each round refines with.
    #[arg(long, default_value_t = 3)]
    pub questions_per_iteration: usize,
    /// cos: a train question counts as failed when its answer scores below this Correct-F1.
    #[arg(long, default_value_t = 0.5)]
    pub fail_f1: f64,
    /// cos: seed of the train/validation/test split of the questions.
    #[arg(long, default_value_t = 0)]
    pub qa_seed: u64,
}

impl MethodArgs {
    /// The spec of `method` with these settings.
    pub fn spec(&self, method: MethodName) -> Result<MethodSpec> {
        Ok(match method {
            MethodName::Prism => MethodSpec::Prism {
                config: PrismConfig {
                    memory: match self.memory {
                        MemoryArg::InPlace => MemoryMode::InPlace,
                        MemoryArg::Amendments => MemoryMode::Amendments,
                    },
                    updates: !self.no_updates,
                    query: self.query.clone(),
                    revision_tokens: self.revision_tokens,
                    answer_tokens: self.answer_tokens,
                    summary_words: self.summary_words(),
                    constrained: self.constrained == OnOff::On,
                    reading: match self.reads {
                        ReadingArg::Summary => Reading::Summary,
                        ReadingArg::Text => Reading::Text,
                    },
                    answer_form: AnswerForm::Summary,
                },
                schema: self.schema_json()?,
            },
            MethodName::Incremental => MethodSpec::Incremental {
                config: IncrementalConfig {
                    query: self.query.clone(),
                    max_summary_tokens: self.max_summary_tokens()?,
                    summary_words: self.summary_words(),
                },
            },
            MethodName::Hierarchical => MethodSpec::Hierarchical {
                config: HierarchicalConfig {
                    query: self.query.clone(),
                    max_summary_tokens: self.max_summary_tokens()?,
                    summary_words: self.summary_words(),
                },
            },
            MethodName::Detail => self.detail_spec()?,
            MethodName::GuText => self.cok_spec(Variant::GuText, None),
            MethodName::GuJson => self.cok_spec(Variant::GuJson, Some(self.schema_json()?)),
            MethodName::GmJson => self.cok_spec(Variant::GmJson, Some(self.schema_json()?)),
            MethodName::Cok => self.cok_spec(Variant::Cok, Some(self.schema_json()?)),
            MethodName::Cos => self.cos_spec()?,
            MethodName::Whole => {
                anyhow::ensure!(self.answer_tokens > 0, "--answer-tokens must be at least 1");
                MethodSpec::Whole {
                    config: WholeConfig {
                        query: self.query.clone(),
                        answer_tokens: self.answer_tokens,
                        summary_words: self.summary_words(),
                        answer_form: AnswerForm::Summary,
                    },
                }
            }
        })
    }

    fn detail_spec(&self) -> Result<MethodSpec> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.detail),
            "--detail must be between 0 and 1, not {}",
            self.detail
        );
        anyhow::ensure!(
            self.min_chunk_tokens > 0,
            "--min-chunk-tokens must be at least 1"
        );
        Ok(MethodSpec::Detail {
            config: DetailConfig {
                query: self.query.clone(),
                detail: self.detail,
                min_chunk_tokens: self.min_chunk_tokens,
                recursive: self.recursive,
                max_summary_tokens: self.max_summary_tokens()?,
            },
        })
    }

    fn cos_spec(&self) -> Result<MethodSpec> {
        anyhow::ensure!(
            self.questions_per_iteration > 0,
            "--questions-per-iteration must be at least 1"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.fail_f1),
            "--fail-f1 must be between 0 and 1"
        );
        Ok(MethodSpec::Cos {
            config: CosConfig {
                qa_pairs: self.qa_pairs,
                iterations: self.iterations,
                questions_per_iteration: self.questions_per_iteration,
                fail_f1: self.fail_f1,
                seed: self.qa_seed,
                summary_tokens: self.answer_tokens,
                constrained: self.constrained == OnOff::On,
            },
        })
    }

    fn summary_words(&self) -> Option<usize> {
        self.summary_words.map(|words| words as usize)
    }

    fn max_summary_tokens(&self) -> Result<usize> {
        anyhow::ensure!(
            self.max_summary_tokens > 0,
            "--max-summary-tokens must be at least 1"
        );
        Ok(self.max_summary_tokens)
    }

    fn cok_spec(&self, variant: Variant, schema: Option<serde_json::Value>) -> MethodSpec {
        MethodSpec::CokFamily {
            variant,
            config: self.cok_config(),
            schema,
        }
    }

    fn cok_config(&self) -> CokConfig {
        CokConfig {
            query: self.query.clone(),
            step_tokens: self.revision_tokens,
            answer_tokens: self.answer_tokens,
            summary_words: self.summary_words(),
            memory_token_limit: (self.memory_token_limit > 0).then_some(self.memory_token_limit),
            constrained: self.constrained == OnOff::On,
        }
    }

    /// The `--schema` file's contents or, when no such file exists, the
    /// shipped schema of that name; checked as `summarize` will use it.
    fn schema_json(&self) -> Result<serde_json::Value> {
        let path = &self.schema;
        let shipped = path.to_str().and_then(shipped::text);
        let text = match (std::fs::read_to_string(path), shipped) {
            (Ok(text), _) => text,
            (Err(err), Some(text)) if err.kind() == std::io::ErrorKind::NotFound => {
                text.to_string()
            }
            (Err(err), None) if err.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
                "schema {}: no such file, nor a schema prism ships ({})",
                path.display(),
                shipped::ALL.map(|(name, _)| name).join(", ")
            ),
            (Err(err), _) => {
                return Err(err).with_context(|| format!("reading schema {}", path.display()))
            }
        };
        let json: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        Schema::from_value(&json).with_context(|| format!("schema {}", path.display()))?;
        Ok(json)
    }
}
