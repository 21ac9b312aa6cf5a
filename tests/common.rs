//! Helpers shared by the integration tests.

use std::path::PathBuf;

/// Path of a model file that `scripts/setup` fetched into the models directory.
/// Panics with the command to run when it is missing: tests never download.
pub fn fetched_model(file_name: &str) -> PathBuf {
    let path = prism::engine::source::models_dir().join(file_name);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/setup` (or `prism models fetch`) before the tests",
        path.display()
    );
    path
}
