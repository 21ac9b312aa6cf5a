//! The engine: a model, its tokenizer and one KV cache that survives across calls.

pub mod source;
pub mod tokenizer;
