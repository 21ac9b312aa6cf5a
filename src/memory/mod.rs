//! Structured memory: a JSON value shaped by a schema, which the model changes only
//! through small checked revisions. No I/O apart from [`Schema::from_file`].

pub mod grammar;
pub mod parse;
pub mod path;
pub mod render;
pub mod revise;
pub mod revision;
pub mod schema;
pub mod screen;
pub mod shipped;

pub use parse::{parse_memory, parse_revisions, ParsedMemory};
pub use path::{JsonPath, PathError, Segment};
pub use render::{render_in_place, render_revision, Amendments};
pub use revision::{apply, Op, Rejection, RejectionKind, Revision};
pub use schema::{Next, NodeKind, PathPattern, Schema, SchemaNode};
pub use screen::{Dropped, Redundancy, Screen, Screened};

/// Helpers shared by the tests of this module's files.
#[cfg(test)]
pub(crate) mod testing {
    use super::{JsonPath, Op, Revision, Schema};
    use serde_json::Value;
    use std::path::Path;

    /// One of the schemas shipped in `schemas/`.
    pub fn load(name: &str) -> Schema {
        Schema::from_file(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("schemas")
                .join(name),
        )
        .unwrap()
    }

    pub fn rev(op: Op, path: &str, value: Value) -> Revision {
        Revision {
            op,
            path: JsonPath::parse(path).unwrap(),
            value,
        }
    }
}
