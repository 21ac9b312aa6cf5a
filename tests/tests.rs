//! One integration-test binary; each module covers one capability.

mod cli;
mod common;
mod engine;
mod source;
mod tokens;
