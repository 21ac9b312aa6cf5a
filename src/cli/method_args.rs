//! The method flags `summarize` and `bench` share; `method_spec` turns them
//! into a method's settings.

use clap::{Args, ValueEnum};
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
