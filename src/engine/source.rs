//! Where a model's files come from: a manifest name, a local path, or a hub repo id.

use std::path::PathBuf;

/// The directory fetched models are stored in: `$PRISM_HOME/models`, else
/// `$XDG_CACHE_HOME/prism/models`, else `~/.cache/prism/models`. Outside git on purpose.
pub fn models_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("PRISM_HOME") {
        return PathBuf::from(home).join("models");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("prism").join("models")
}
