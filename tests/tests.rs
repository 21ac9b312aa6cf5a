//! One integration-test binary; each module covers one capability.

mod cli;
mod common;
mod constrained;
mod engine;
mod prism_loop;
mod quality;
mod schema_gen;
mod smollm2;
mod source;
mod tokens;
