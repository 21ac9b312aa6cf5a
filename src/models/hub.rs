//! Hugging Face hub repos: found in the hf-hub cache when complete there,
//! else downloaded into it, within a deadline.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use hf_hub::api::sync::{Api, ApiBuilder};
use hf_hub::api::RepoInfo;
use hf_hub::Cache;

use super::{check_model_dir, safetensors_shards};
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

    pub(super) fn resolve(&self, repo_id: &str) -> Result<ModelSource> {
        if let Some(dir) = self.cached_dir(repo_id) {
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
        self.download(repo_id)
    }

    /// The cached snapshot directory of `repo_id`, if it holds a complete model.
    fn cached_dir(&self, repo_id: &str) -> Option<PathBuf> {
        let config = self.cache.model(repo_id.to_string()).get("config.json")?;
        let dir = config.parent()?.to_path_buf();
        check_model_dir(&dir).ok().map(|()| dir)
    }

    fn download(&self, repo_id: &str) -> Result<ModelSource> {
        let mut builder = ApiBuilder::from_cache(self.cache.clone());
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        if self.token.is_some() {
            builder = builder.with_token(self.token.clone());
        }
        let api = builder
            .build()
            .map_err(|err| self.error(repo_id, err.to_string()))?;
        let info = self.repo_info(&api, repo_id)?;
        let listed = |file: &str| info.siblings.iter().any(|s| s.rfilename == file);

        let mut files = Vec::new();
        for required in ["config.json", "tokenizer.json"] {
            if !listed(required) {
                return Err(Error::BadModelFile {
                    path: PathBuf::from(repo_id),
                    reason: format!(
                        "the repo has no {required}; prism loads hub repos with config.json, \
                         tokenizer.json and safetensors weights (for a GGUF repo, download the \
                         .gguf file and pass its path)"
                    ),
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
        if listed(index) {
            files.extend(safetensors_shards(&get(index)?)?);
        } else if listed("model.safetensors") {
            files.push("model.safetensors".to_string());
        } else {
            return Err(Error::BadModelFile {
                path: PathBuf::from(repo_id),
                reason: "the repo has neither model.safetensors nor model.safetensors.index.json"
                    .into(),
            });
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
        check_model_dir(&dir)?;
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
