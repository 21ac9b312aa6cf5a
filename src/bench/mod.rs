//! Benchmarks that run through the CLI: engine speed (`prism bench-engine`)
//! and the method × chunk-size sweep (`prism bench`): its rows, report and
//! charts.

pub mod charts;
pub mod engine;
pub mod report;
pub mod sweep;
