//! How the method flags become a [`MethodSpec`]: which method, and every
//! setting that decides its result, checked.

use super::method_args::{MemoryArg, MethodArgs, MethodName, OnOff, ReadingArg};
use anyhow::{Context, Result};
use prism::memory::{shipped, Schema};
use prism::methods::cok::{CokConfig, Variant};
use prism::methods::cos::CosConfig;
use prism::methods::detail::DetailConfig;
use prism::methods::hierarchical::HierarchicalConfig;
use prism::methods::incremental::IncrementalConfig;
use prism::methods::prism::{MemoryMode, PrismConfig, Reading};
use prism::methods::whole::WholeConfig;
use prism::methods::{AnswerForm, MethodSpec};

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
