//! One integration-test binary; each module covers one capability.

mod bad_input;
mod baselines;
mod bench;
mod cli;
mod code_retrieval_tasks;
mod cok;
mod common;
mod constrained;
mod cos;
mod draft_model;
mod drafting;
mod engine;
mod layers;
mod perplexity;
mod prism_loop;
mod prompt_cache;
mod quality;
mod query;
mod remote;
mod repetition;
mod sample;
mod schema_gen;
mod serve;
mod smollm2;
mod source;
mod tokens;
