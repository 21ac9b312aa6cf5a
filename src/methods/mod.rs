//! Methods turn a long document into an answer through a series of model calls.
//!
//! They deal in text and token counts only: [`llm::Llm`] is their view of the
//! engine, and every call's usage goes into the run's ledger.

pub mod llm;
pub mod prism;
pub mod revision_grammar;
