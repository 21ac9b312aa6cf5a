//! Hugging Face hub repos, found complete in the hf-hub cache or downloaded into it
//! within a deadline; from a repo of GGUF files one is picked by its quantization tag.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use hf_hub::api::sync::{Api, ApiBuilder};
use hf_hub::api::RepoInfo;
use hf_hub::{Cache, Repo};

use super::{check_gguf_file, check_model_dir, safetensors_shards, Need};
use crate::engine::source::ModelSource;
use crate::{Error, Result};

/// How long the first hub request may take before we call the hub unreachable.
/// ureq has no deadline on DNS resolution, so the request runs on its own thread.
const HUB_DEADLINE: Duration = Duration::from_secs(15);

/// Where hub repos are looked up: the hf-hub cache, the endpoint, and whether the
/// network may be used at all.
pub(super) struct Hub {
    pub(super) cache: Cache,
    /// `None` means hf-hub's default, https://huggingface.co.
    pub(super) endpoint: Option<String>,
    pub(super) token: Option<String>,
    pub(super) offline: bool,
    pub(super) deadline: Duration,
}

impl Hub {
    /// `HF_HUB_CACHE` (else `HF_HOME`), `HF_ENDPOINT`, `HF_TOKEN` and
    /// `HF_HUB_OFFLINE`, as the Python tools read them.
    pub(super) fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|value| {
            ["1", "true", "yes", "on"]
                .iter()
                .any(|truthy| value.trim().eq_ignore_ascii_case(truthy))
        });
        // hf-hub reads only HF_HOME; the Python tools let HF_HUB_CACHE (and its
        // older name) point at the cache itself, and so does prism.
        let cache = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map_or_else(Cache::from_env, |dir| Cache::new(PathBuf::from(dir)));
        Hub {
            cache,
            endpoint: var("HF_ENDPOINT"),
            token: var("HF_TOKEN"),
            offline,
            deadline: HUB_DEADLINE,
        }
    }

    fn endpoint(&self) -> &str {
        self.endpoint.as_deref().unwrap_or("https://huggingface.co")
    }

    fn error(&self, repo_id: &str, reason: impl Into<String>) -> Error {
        Error::Hub {
            repo: repo_id.to_string(),
            reason: reason.into(),
        }
    }

    pub(super) fn resolve(&self, repo_id: &str, need: Need) -> Result<ModelSource> {
        if let Some(dir) = self.cached_dir(repo_id, need) {
            return Ok(ModelSource::HfDir {
                dir,
                name: repo_id.to_string(),
            });
        }
        if self.offline {
            return Err(self.error(
                repo_id,
                format!(
                    "HF_HUB_OFFLINE is set and the repo is not complete in the cache at {}",
                    self.cache.path().display()
                ),
            ));
        }
        self.download(repo_id, need)
    }

    /// The GGUF file of `repo_id` tagged `quant`: from the cached snapshot
    /// when it is there, else downloaded.
    pub(super) fn resolve_gguf(&self, repo_id: &str, quant: &str) -> Result<ModelSource> {
        let spec = format!("{repo_id}:{quant}");
        if let Some(snapshot) = self.cached_snapshot(repo_id) {
            let files = gguf_files_in(&snapshot);
            if let Ok(file) = pick_gguf(&files, quant) {
                return gguf_source(snapshot.join(file));
            }
        }
        if self.offline {
            return Err(self.error(
                &spec,
                format!(
                    "HF_HUB_OFFLINE is set and no GGUF file tagged {quant} is in the cache at {}",
                    self.cache.path().display()
                ),
            ));
        }
        let api = self.api(repo_id)?;
        let info = self.repo_info(&api, repo_id)?;
        let files: Vec<String> = info
            .siblings
            .iter()
            .map(|sibling| sibling.rfilename.clone())
            .filter(|name| name.to_ascii_lowercase().ends_with(".gguf"))
            .collect();
        let file = pick_gguf(&files, quant).map_err(|reason| self.error(&spec, reason))?;
        let path = api
            .model(repo_id.to_string())
            .get(&file)
            .map_err(|err| self.error(&spec, format!("downloading {file}: {err}")))?;
        gguf_source(path)
    }

    /// The directory of the cached snapshot `refs/main` points at, if any.
    fn cached_snapshot(&self, repo_id: &str) -> Option<PathBuf> {
        let repo = self
            .cache
            .path()
            .join(Repo::model(repo_id.to_string()).folder_name());
        let commit = std::fs::read_to_string(repo.join("refs").join("main")).ok()?;
        let snapshot = repo.join("snapshots").join(commit.trim());
        snapshot.is_dir().then_some(snapshot)
    }

    /// The cached snapshot directory of `repo_id`, if it holds what is needed.
    fn cached_dir(&self, repo_id: &str, need: Need) -> Option<PathBuf> {
        let config = self.cache.model(repo_id.to_string()).get("config.json")?;
        let dir = config.parent()?.to_path_buf();
        check_model_dir(&dir, need).ok().map(|()| dir)
    }

    /// A hub client on our cache, endpoint and token.
    fn api(&self, repo_id: &str) -> Result<Api> {
        let mut builder = ApiBuilder::from_cache(self.cache.clone());
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        if self.token.is_some() {
            builder = builder.with_token(self.token.clone());
        }
        builder
            .build()
            .map_err(|err| self.error(repo_id, err.to_string()))
    }

    fn download(&self, repo_id: &str, need: Need) -> Result<ModelSource> {
        let api = self.api(repo_id)?;
        let info = self.repo_info(&api, repo_id)?;
        let listed = |file: &str| info.siblings.iter().any(|s| s.rfilename == file);

        let mut files = Vec::new();
        for required in ["config.json", "tokenizer.json"] {
            if !listed(required) {
                let has_gguf = info
                    .siblings
                    .iter()
                    .any(|s| s.rfilename.to_ascii_lowercase().ends_with(".gguf"));
                let hint = if has_gguf {
                    format!(
                        "it holds GGUF files: name one by its quantization, e.g. {repo_id}:Q4_K_M"
                    )
                } else {
                    "prism loads hub repos with config.json, tokenizer.json and safetensors \
                     weights, or a GGUF file named as owner/repo:QUANT"
                        .to_string()
                };
                return Err(Error::BadModelFile {
                    path: PathBuf::from(repo_id),
                    reason: format!("the repo has no {required}; {hint}"),
                });
            }
            files.push(required.to_string());
        }
        if listed("tokenizer_config.json") {
            files.push("tokenizer_config.json".to_string());
        }

        let repo = api.model(repo_id.to_string());
        let get = |file: &str| {
            repo.get(file)
                .map_err(|err| self.error(repo_id, format!("downloading {file}: {err}")))
        };
        let index = "model.safetensors.index.json";
        // Without Need::Weights the weights stay on the server that runs them.
        if need == Need::Weights {
            if listed(index) {
                files.extend(safetensors_shards(&get(index)?)?);
            } else if listed("model.safetensors") {
                files.push("model.safetensors".to_string());
            } else {
                return Err(Error::BadModelFile {
                    path: PathBuf::from(repo_id),
                    reason:
                        "the repo has neither model.safetensors nor model.safetensors.index.json"
                            .into(),
                });
            }
        }
        let mut dir = None;
        for file in &files {
            let path = get(file)?;
            if dir.is_none() {
                dir = path.parent().map(Path::to_path_buf);
            }
        }
        let dir = dir.ok_or_else(|| {
            self.error(repo_id, "hf-hub returned a file path without a directory")
        })?;
        // All files must have landed in one snapshot directory (one revision).
        check_model_dir(&dir, need)?;
        Ok(ModelSource::HfDir {
            dir,
            name: repo_id.to_string(),
        })
    }

    /// List the repo's files. This is the first request to the hub, so it carries
    /// the deadline: on its own thread, since DNS resolution inside ureq cannot be
    /// interrupted. A thread left behind by a timeout ends when the resolver gives up.
    fn repo_info(&self, api: &Api, repo_id: &str) -> Result<RepoInfo> {
        let (sender, receiver) = mpsc::channel();
        let request = api
            .model(repo_id.to_string())
            .info_request()
            .timeout(self.deadline);
        std::thread::spawn(move || {
            let answer = match request.call() {
                Ok(response) => response
                    .into_json::<RepoInfo>()
                    .map_err(|err| format!("unreadable answer from the hub: {err}")),
                Err(err) => {
                    let text = err.to_string();
                    Err(
                        match err.into_response().map(|response| response.status()) {
                            Some(status @ (401 | 403 | 404)) => format!(
                                "HTTP {status}: no such model repo, or it is private or gated \
                             (log in with `huggingface-cli login` or set HF_TOKEN)"
                            ),
                            Some(status) => format!("HTTP {status}"),
                            None => format!(
                            "{text} (set HF_HUB_OFFLINE=1 to use only models already in the cache)"
                        ),
                        },
                    )
                }
            };
            // The receiver is gone if the deadline passed; nobody needs the answer then.
            let _ = sender.send(answer);
        });
        let grace = Duration::from_secs(1);
        match receiver.recv_timeout(self.deadline + grace) {
            Ok(answer) => answer.map_err(|reason| self.error(repo_id, reason)),
            Err(_) => Err(self.error(
                repo_id,
                format!(
                    "no answer from {} within {} s (offline? set HF_HUB_OFFLINE=1 to use only \
                     the cache)",
                    self.endpoint(),
                    self.deadline.as_secs()
                ),
            )),
        }
    }
}

/// The names of the GGUF files directly in `dir`.
fn gguf_files_in(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.to_ascii_lowercase().ends_with(".gguf"))
        .collect()
}

/// The one file of `files` whose name ends in the quantization tag `quant`
/// (any case), after a `-`, `.` or `_`: `model-Q4_K_M.gguf` for `q4_k_m`.
/// Split files (`-00001-of-00003.gguf`) are refused, since prism loads one
/// file; so is a tag that matches none or several.
pub(super) fn pick_gguf(files: &[String], quant: &str) -> std::result::Result<String, String> {
    let tag = quant.to_ascii_lowercase();
    let tagged = |name: &String| {
        let lower = name.to_ascii_lowercase();
        let stem = lower.strip_suffix(".gguf").unwrap_or(&lower);
        stem.strip_suffix(tag.as_str())
            .is_some_and(|before| before.is_empty() || before.ends_with(['-', '.', '_']))
    };
    let matches: Vec<&String> = files.iter().filter(|name| tagged(name)).collect();
    match matches.as_slice() {
        [one] => Ok(one.to_string()),
        [] if files.iter().any(|name| {
            name.to_ascii_lowercase()
                .contains(&format!("{tag}-00001-of-"))
        }) =>
        {
            Err(format!(
                "the {quant} weights are split into several files; prism loads one GGUF file \
             (merge them with llama.cpp's `llama-gguf-split --merge`)"
            ))
        }
        [] if files.is_empty() => Err("the repo holds no GGUF file".to_string()),
        [] => Err(format!(
            "no GGUF file tagged {quant}; the repo has {}",
            files.join(", ")
        )),
        several => Err(format!(
            "several GGUF files are tagged {quant}: {}",
            several
                .iter()
                .map(|name| name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// A downloaded or cached GGUF file as a model source named after the file.
fn gguf_source(path: PathBuf) -> Result<ModelSource> {
    check_gguf_file(&path)?;
    let name = path.file_stem().unwrap_or(path.as_os_str());
    let name = name.to_string_lossy().into_owned();
    Ok(ModelSource::Gguf { path, name })
}
