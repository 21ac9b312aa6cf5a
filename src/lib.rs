//! prism summarizes documents far longer than a model's context on a local
//! Llama or Qwen model, and reports exactly what each call cost.
//!
//! Data flows one way:
//!
//! ```text
//! document → chunks → prompts → engine (reuse cached prefix, prefill, decode)
//!          → revisions → memory → next prompt … → answer
//! ```
//!
//! and the modules are layered the same way; each uses only those above it
//! in this list:
//!
//! - [`error`], [`document`], [`chunk`], [`sentences`]: plain text in, typed errors out.
//! - [`engine`] loads a model and its tokenizer, keeps the KV caches of the last
//!   token sequences it encoded, and for each new prompt computes only what follows
//!   the longest common token prefix. Every call returns a [`engine::Usage`].
//! - [`models`]: which file a model name means (manifests, paths, hub repo ids),
//!   and fetching it.
//! - [`metrics`] sums usages into a [`metrics::Ledger`] and derives cache hit rate,
//!   net tokens and cost index from it, and how far a text repeats itself.
//! - [`llm`]: the view of the engine every method and judge has (prompt in,
//!   completion and usage out).
//! - [`memory`]: schemas, revisions, their grammar, and the memory they build.
//! - [`run`]: drives any method chunk by chunk with one ledger, run files and checkpoints.
//! - [`qa`]: question–answer pairs written from a passage and answered from a summary.
//! - [`methods`]: PRISM and the baselines; [`schema_gen`] writes schemas for new domains.
//! - [`job`]: one method over one split document into one run directory.
//! - [`quality`] and [`bench`]: judging summaries, and sweeps of methods × chunk sizes.
//! - [`serve`]: the engine behind an OpenAI-compatible HTTP API.

pub mod bench;
pub mod chunk;
pub mod document;
pub mod engine;
pub mod error;
pub mod job;
pub mod llm;
pub mod memory;
pub mod methods;
pub mod metrics;
pub mod models;
pub mod qa;
pub mod quality;
pub mod run;
pub mod schema_gen;
pub mod sentences;
pub mod serve;

pub use error::{Error, Result};
