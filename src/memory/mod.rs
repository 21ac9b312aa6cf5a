//! Structured memory: a JSON value shaped by a schema, which the model changes
//! only through small checked revisions.
//!
//! - [`schema`] loads a schema from `schemas/*.json`, checks values against it
//!   and describes it for the prompt.
//! - [`path`] parses and prints the paths revisions point at.
//! - [`revision`] applies one revision to a memory, or says why not.
//! - [`render`] turns a memory (in place, or as amendments) into prompt text.
//! - [`parse`] reads revisions out of raw model output.
//!
//! Nothing here does I/O apart from [`Schema::from_file`].

pub mod parse;
pub mod path;
pub mod render;
pub mod revision;
pub mod schema;

pub use parse::parse_revisions;
pub use path::{JsonPath, PathError, Segment};
pub use render::{render_in_place, render_revision, Amendments};
pub use revision::{apply, Op, Rejection, RejectionKind, Revision};
pub use schema::{Next, NodeKind, PathPattern, Schema, SchemaNode};
