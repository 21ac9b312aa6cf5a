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
//! - [`engine`] loads a model and its tokenizer, keeps the KV cache of the last
//!   token sequence it encoded, and for each new prompt computes only what follows
//!   the longest common token prefix. Every call returns a [`engine::Usage`].
//! - [`metrics`] sums usages into a [`metrics::Ledger`] and derives cache hit rate,
//!   net tokens and cost index from it.

pub mod bench;
pub mod chunk;
pub mod document;
pub mod engine;
pub mod error;
pub mod memory;
pub mod methods;
pub mod metrics;
pub mod quality;
pub mod rundir;

pub use error::{Error, Result};
