//! Benchmarks that run through the CLI: engine speed (`prism bench-engine`).

pub mod engine;
