//! Benchmarks: engine speed (`prism bench-engine`, [`engine`]) and the method ×
//! chunk-size sweep (`prism bench`, [`sweep`]) with its rows, report and charts.

pub mod charts;
pub mod code_retrieval;
pub mod engine;
pub mod report;
pub mod results;
pub mod sweep;
pub mod task;
