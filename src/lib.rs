//! prism summarizes documents far longer than a model's context on a local Llama or
//! Qwen model, and reports exactly what each call cost (see `docs/DESIGN.md`).

// The layers, lowest first: each `use` points to an earlier group, or within a
// group down the exact order that tests/layers.rs holds and checks.

// Plain text in, typed errors out.
pub mod chunk;
pub mod document;
pub mod error;
pub mod sentences;

// The model, its tokenizer and KV caches; every call returns a `Usage`.
pub mod engine;

// Which file a model name means, and fetching it.
pub mod models;

// The ledger of usages and the figures derived from it and from texts.
pub mod metrics;

// The view of the engine every method and judge has, local or remote.
pub mod llm;

// Schemas, revisions, their grammar, and the memory they build.
pub mod memory;

// The `Method` trait and the driver: one ledger, run files, checkpoints.
pub mod run;

// Question answering, the methods, schema writing, jobs, judging, benches and
// the HTTP server.
pub mod bench;
pub mod job;
pub mod methods;
pub mod qa;
pub mod quality;
pub mod schema_gen;
pub mod serve;

pub use error::{Error, Result, Setting};
