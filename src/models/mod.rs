//! Which model a name means (a manifest name, a local path, or a hub repo id), and
//! how its files get onto this machine.

pub mod fetch;
mod hub;
pub mod manifest;
mod pypi;

pub use fetch::{fetch, fetch_with, FetchOptions, WHEELHOUSE_ENV};
pub use manifest::{find_manifest, manifests, models_dir, Manifest, PypiPart};
pub use pypi::{DEFAULT_INDEX, INDEX_ENV};

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::Path;

use serde::Deserialize;

use crate::engine::source::ModelSource;
use crate::{Error, Result, Setting};
use hub::Hub;

/// The model `--model` defaults to: the smallest shipped model whose
/// summaries are worth reading (SmolLM2-135M loops, Qwen2.5-Coder-0.5B copies).
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b-instruct";

/// The smallest shipped model: fast enough for tests and cache benchmarks.
pub const SMALLEST_MODEL: &str = "smollm2-135m-instruct";

/// Resolve `--model`. `spec` is, tried in this order:
///
/// 1. a manifest name or alias; the model must already be fetched, otherwise
///    [`Error::NotFetched`] says to run `prism models fetch NAME`;
/// 2. an existing path: a `.gguf` file (checked by its magic), or a directory
///    holding config.json, tokenizer.json and *.safetensors;
/// 3. an `owner/name` Hugging Face repo id, taken from the hf-hub cache when
///    complete there, else downloaded into it (config.json, tokenizer.json,
///    tokenizer_config.json when present, and model.safetensors or the shards of
///    model.safetensors.index.json). With `HF_HUB_OFFLINE=1` only the cache is
///    used; an unreachable hub is an [`Error::Hub`] within about 15 s;
/// 4. `owner/name:QUANT`, the GGUF file of that repo whose name ends in the
///    quantization tag (`Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M`), from
///    the cache or downloaded, as llama.cpp's `-hf` and Ollama name them.
///
/// Anything else, including a path that does not exist, is [`Error::UnknownModel`].
pub fn resolve(spec: &str) -> Result<ModelSource> {
    resolve_with(spec, &models_dir(), &Hub::from_env(), Need::Weights)
}

/// As [`resolve`], for a model whose weights live on a remote server: a
/// directory or hub repo needs only its config and tokenizer files, so
/// naming a 70B model does not download 140 GB. A GGUF file holds its
/// tokenizer inside, so it is needed whole.
pub fn resolve_prompt_format(spec: &str) -> Result<ModelSource> {
    resolve_with(spec, &models_dir(), &Hub::from_env(), Need::PromptFormat)
}

/// What of a model the caller will read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Weights,
    /// config.json and the tokenizer files only.
    PromptFormat,
}

/// [`resolve`] with the models directory and hub settings given instead of read
/// from the environment.
fn resolve_with(spec: &str, models_dir: &Path, hub: &Hub, need: Need) -> Result<ModelSource> {
    let unknown = || Error::UnknownModel {
        name: spec.to_string(),
    };
    if spec.trim().is_empty() {
        return Err(unknown());
    }
    if let Some(manifest) = find_manifest(spec) {
        let path = models_dir.join(&manifest.file);
        return if path.is_file() {
            Ok(ModelSource::Gguf {
                path,
                name: manifest.name,
            })
        } else {
            Err(Error::NotFetched {
                model: manifest.name,
                path,
            })
        };
    }
    let path = Path::new(spec);
    if path.is_file() {
        check_gguf_file(path)?;
        let name = path.file_stem().unwrap_or(path.as_os_str());
        return Ok(ModelSource::Gguf {
            path: path.to_path_buf(),
            name: name.to_string_lossy().into_owned(),
        });
    }
    if path.is_dir() {
        check_model_dir(path, need)?;
        let name = fs::canonicalize(path)
            .ok()
            .and_then(|full| full.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| spec.to_string());
        return Ok(ModelSource::HfDir {
            dir: path.to_path_buf(),
            name,
        });
    }
    if path.exists() {
        return Err(Error::BadModelFile {
            path: path.to_path_buf(),
            reason: "neither a regular file nor a directory".into(),
        });
    }
    if is_repo_id(spec) {
        return hub.resolve(spec, need);
    }
    if let Some((repo_id, quant)) = spec.rsplit_once(':') {
        if is_repo_id(repo_id) && is_quant_tag(quant) {
            return hub.resolve_gguf(repo_id, quant);
        }
    }
    Err(unknown())
}

/// Whether `tag` looks like a GGUF quantization tag: `Q4_K_M`, `q8_0`, `IQ3_XXS`, `F16`.
fn is_quant_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 32
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `spec` has the shape of a Hugging Face repo id, `owner/name`, rather than
/// of a relative path to a model file (`models/x.gguf` does not count).
fn is_repo_id(spec: &str) -> bool {
    let Some((owner, name)) = spec.split_once('/') else {
        return false;
    };
    let part_ok = |part: &str| {
        !part.is_empty()
            && part.len() <= 96
            && part.as_bytes()[0].is_ascii_alphanumeric()
            && !part.contains("..")
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    let lower = name.to_ascii_lowercase();
    let file_like = [".gguf", ".safetensors", ".bin", ".json", ".pt", ".pth"]
        .iter()
        .any(|ext| lower.ends_with(ext));
    part_ok(owner) && part_ok(name) && !file_like
}

/// A GGUF file starts with these four bytes.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";

fn check_gguf_file(path: &Path) -> Result<()> {
    let mut magic = [0u8; 4];
    let read = File::open(path).and_then(|mut file| file.read_exact(&mut magic));
    match read {
        Ok(()) if &magic == GGUF_MAGIC => Ok(()),
        Ok(()) => Err(Error::BadModelFile {
            path: path.to_path_buf(),
            reason: format!(
                "not a GGUF file (no GGUF magic); {} takes a .gguf file, a directory with \
                 config.json, tokenizer.json and *.safetensors, a model name, an owner/name \
                 repo id or owner/name:QUANT",
                Setting::Model
            ),
        }),
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => Err(Error::BadModelFile {
            path: path.to_path_buf(),
            reason: "too short to be a GGUF file".into(),
        }),
        Err(err) => Err(Error::io(path, err)),
    }
}

/// Check that `dir` holds what the safetensors loader needs: config.json,
/// tokenizer.json, and (for [`Need::Weights`]) model.safetensors or every
/// shard the index names.
fn check_model_dir(dir: &Path, need: Need) -> Result<()> {
    let missing = |what: &str| Error::BadModelFile {
        path: dir.to_path_buf(),
        reason: format!(
            "no {what}: a model directory needs config.json, tokenizer.json and *.safetensors"
        ),
    };
    for required in ["config.json", "tokenizer.json"] {
        if !dir.join(required).is_file() {
            return Err(missing(required));
        }
    }
    if need == Need::PromptFormat {
        return Ok(());
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        for shard in safetensors_shards(&index)? {
            if !dir.join(&shard).is_file() {
                return Err(missing(&format!("{shard} (listed in {})", index.display())));
            }
        }
        return Ok(());
    }
    let entries = fs::read_dir(dir).map_err(|err| Error::io(dir, err))?;
    let has_weights = entries.filter_map(|entry| entry.ok()).any(|entry| {
        entry
            .path()
            .extension()
            .is_some_and(|ext| ext == "safetensors")
            && entry.path().is_file()
    });
    if has_weights {
        Ok(())
    } else {
        Err(missing("*.safetensors weights"))
    }
}

/// The distinct shard file names of a `model.safetensors.index.json`, sorted.
fn safetensors_shards(index: &Path) -> Result<Vec<String>> {
    #[derive(Deserialize)]
    struct Index {
        weight_map: std::collections::BTreeMap<String, String>,
    }
    let bad = |reason: String| Error::BadModelFile {
        path: index.to_path_buf(),
        reason,
    };
    let text = fs::read_to_string(index).map_err(|err| Error::io(index, err))?;
    let parsed: Index = serde_json::from_str(&text).map_err(|err| bad(err.to_string()))?;
    let mut shards: Vec<String> = parsed.weight_map.into_values().collect();
    shards.sort();
    shards.dedup();
    if let Some(odd) = shards
        .iter()
        .find(|shard| Path::new(shard).file_name() != Some(shard.as_ref()))
    {
        return Err(bad(format!("shard `{odd}` is not a plain file name")));
    }
    if shards.is_empty() {
        return Err(bad("weight_map is empty".into()));
    }
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::hub::pick_gguf;
    use super::*;
    use hf_hub::Cache;
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn repo_ids_are_told_apart_from_paths() {
        for id in [
            "Qwen/Qwen2.5-0.5B-Instruct",
            "HuggingFaceTB/SmolLM2-135M",
            "a/b",
        ] {
            assert!(is_repo_id(id), "{id}");
        }
        for not_id in [
            "smollm2",
            "models/x.gguf",
            "./model",
            "/abs/dir",
            "a/b/c",
            "../up",
            "a/",
            "/b",
            "owner/name with space",
            "owner/model.safetensors",
        ] {
            assert!(!is_repo_id(not_id), "{not_id}");
        }
    }
    fn offline_hub(cache_dir: &Path) -> Hub {
        Hub {
            cache: Cache::new(cache_dir.to_path_buf()),
            endpoint: None,
            token: None,
            offline: true,
            deadline: Duration::from_secs(2),
        }
    }
    #[test]
    fn unfetched_manifest_names_the_fetch_command() {
        let empty = tempfile::tempdir().unwrap();
        let hub = offline_hub(empty.path());
        let err = resolve_with("smollm2", empty.path(), &hub, Need::Weights).unwrap_err();
        assert!(matches!(err, Error::NotFetched { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains("prism models fetch smollm2-135m-instruct"),
            "{message}"
        );

        fs::write(
            empty.path().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
            b"GGUF",
        )
        .unwrap();
        let source = resolve_with("SmolLM2", empty.path(), &hub, Need::Weights).unwrap();
        assert_eq!(source.name(), SMALLEST_MODEL);
    }
    #[test]
    fn offline_hub_uses_a_complete_cached_snapshot_only() {
        let cache = tempfile::tempdir().unwrap();
        let hub = offline_hub(cache.path());
        let err =
            resolve_with("someone/tiny-model", cache.path(), &hub, Need::Weights).unwrap_err();
        assert!(matches!(err, Error::Hub { .. }), "{err:?}");
        assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");

        // The layout hf-hub writes: refs/main holds the commit, snapshots/<commit>/ the files.
        let repo = cache.path().join("models--someone--tiny-model");
        fs::create_dir_all(repo.join("refs")).unwrap();
        fs::write(repo.join("refs/main"), "abc123").unwrap();
        let snapshot = repo.join("snapshots/abc123");
        fs::create_dir_all(&snapshot).unwrap();
        fs::write(snapshot.join("config.json"), "{}").unwrap();
        fs::write(snapshot.join("tokenizer.json"), "{}").unwrap();
        assert!(resolve_with("someone/tiny-model", cache.path(), &hub, Need::Weights).is_err());
        let prompt_format =
            resolve_with("someone/tiny-model", cache.path(), &hub, Need::PromptFormat);
        assert_eq!(prompt_format.unwrap().name(), "someone/tiny-model");

        fs::write(snapshot.join("model.safetensors"), b"").unwrap();
        let source = resolve_with("someone/tiny-model", cache.path(), &hub, Need::Weights).unwrap();
        assert_eq!(
            source,
            ModelSource::HfDir {
                dir: snapshot,
                name: "someone/tiny-model".into()
            }
        );
    }
    /// A cached snapshot of `repo_id` in hf-hub's layout (refs/main holds the
    /// commit, snapshots/<commit>/ the files), holding `files`.
    fn cached_snapshot(cache: &Path, repo_id: &str, files: &[(&str, &[u8])]) -> PathBuf {
        let repo = cache.join(format!("models--{}", repo_id.replace('/', "--")));
        fs::create_dir_all(repo.join("refs")).unwrap();
        fs::write(repo.join("refs/main"), "abc123").unwrap();
        let snapshot = repo.join("snapshots/abc123");
        fs::create_dir_all(&snapshot).unwrap();
        for (name, bytes) in files {
            fs::write(snapshot.join(name), bytes).unwrap();
        }
        snapshot
    }

    #[test]
    fn a_quantization_tag_picks_that_gguf_of_a_cached_repo() {
        let cache = tempfile::tempdir().unwrap();
        let hub = offline_hub(cache.path());
        let err = resolve_with(
            "someone/tiny-GGUF:Q4_K_M",
            cache.path(),
            &hub,
            Need::Weights,
        )
        .unwrap_err();
        assert!(matches!(err, Error::Hub { .. }), "{err:?}");
        assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");

        let snapshot = cached_snapshot(
            cache.path(),
            "someone/tiny-GGUF",
            &[
                ("tiny-Q4_K_M.gguf", b"GGUF"),
                ("tiny-IQ4_K_M.gguf", b"GGUF"),
                ("tiny.Q8_0.gguf", b"GGUF"),
                ("README.md", b"hi"),
            ],
        );
        for (spec, file) in [
            ("someone/tiny-GGUF:Q4_K_M", "tiny-Q4_K_M.gguf"),
            ("someone/tiny-GGUF:q8_0", "tiny.Q8_0.gguf"),
        ] {
            let source = resolve_with(spec, cache.path(), &hub, Need::Weights).unwrap();
            assert_eq!(
                source,
                ModelSource::Gguf {
                    path: snapshot.join(file),
                    name: file.trim_end_matches(".gguf").into()
                }
            );
        }
        let err = resolve_with(
            "someone/tiny-GGUF:Q5_K_M",
            cache.path(),
            &hub,
            Need::Weights,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("no GGUF file tagged Q5_K_M"),
            "{err}"
        );
    }

    #[test]
    fn tags_match_whole_and_split_files_are_refused() {
        let files = |names: &[&str]| {
            names
                .iter()
                .map(|name| name.to_string())
                .collect::<Vec<_>>()
        };
        let picked = pick_gguf(&files(&["m-Q4_K_M.gguf", "m-IQ4_K_M.gguf"]), "q4_k_m");
        assert_eq!(picked.unwrap(), "m-Q4_K_M.gguf");
        let split = files(&["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]);
        assert!(pick_gguf(&split, "Q8_0")
            .unwrap_err()
            .contains("llama-gguf-split"));
        let twice = files(&["a-Q8_0.gguf", "b-Q8_0.gguf"]);
        assert!(pick_gguf(&twice, "Q8_0").unwrap_err().contains("several"));
        assert!(pick_gguf(&[], "Q8_0").unwrap_err().contains("no GGUF file"));
    }

    #[test]
    fn unreachable_hub_is_an_error_not_a_hang() {
        let cache = tempfile::tempdir().unwrap();
        let hub = Hub {
            // `.invalid` never resolves (RFC 6761).
            endpoint: Some("https://hub.prism-test.invalid".into()),
            offline: false,
            ..offline_hub(cache.path())
        };
        let started = std::time::Instant::now();
        let err =
            resolve_with("someone/tiny-model", cache.path(), &hub, Need::Weights).unwrap_err();
        assert!(matches!(err, Error::Hub { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    }
}
