//! Owns the files of one run's output directory and writes each so that a crash at
//! any moment leaves either the old or the new version, never a torn one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{Error, Result, Setting};

/// Replace `path` with `bytes` atomically: readers see the old file or the new
/// one, and after a crash the file is one of the two.
///
/// The bytes go to a temp file next to `path` (same filesystem, so the rename is
/// atomic), which is flushed to disk before it is renamed over `path`. If anything
/// fails, the temp file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid(path.display().to_string(), "not a file path"))?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    let prefix = format!(".{}.", name.to_string_lossy());
    builder.prefix(&prefix).suffix(".tmp");
    // tempfile makes owner-only files; run outputs are ordinary files (umask still applies).
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let mut temp = builder
        .tempfile_in(dir)
        .map_err(|err| Error::io(dir, err))?;
    temp.write_all(bytes)
        .and_then(|()| temp.as_file().sync_all())
        .map_err(|err| Error::io(temp.path(), err))?;
    temp.persist(path)
        .map_err(|err| Error::io(path, err.error))?;
    sync_dir(dir);
    Ok(())
}

/// Flush the directory entry of a rename to disk. Best effort: some filesystems
/// refuse to fsync a directory, and the data itself is already on disk by then.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(handle) = File::open(dir) {
        let _ = handle.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// The output directory of one run: [`RunDir::SUMMARY`], [`RunDir::MEMORY`],
/// [`RunDir::STEPS`], [`RunDir::STATS`] and [`RunDir::CHECKPOINT`]. Whole files
/// are replaced with [`write_atomic`]. The one append-only file, a JSON-lines
/// log, can at worst end in a line cut short by a crash; readers and writers
/// here recognise and drop that line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// The final answer, as plain text.
    pub const SUMMARY: &'static str = "summary.txt";
    /// The structured memory after the last chunk.
    pub const MEMORY: &'static str = "memory.json";
    /// One JSON line per unit of work of the run (for PRISM: per chunk).
    pub const STEPS: &'static str = "steps.jsonl";
    /// The run's totals: tokens, cache hits, cost, time.
    pub const STATS: &'static str = "stats.json";
    /// Where a stopped run resumes from; see [`Checkpoint`].
    pub const CHECKPOINT: &'static str = "checkpoint.json";
    /// The checkpoint before the last one, kept so that a damaged or missing
    /// [`RunDir::CHECKPOINT`] costs one step, not the run.
    pub const PREVIOUS_CHECKPOINT: &'static str = "checkpoint.prev.json";
    /// Locked while a process writes the run; see [`RunDir::lock`].
    pub const LOCK: &'static str = ".lock";

    /// Use `path` as a run directory, creating it (and its parents) if needed.
    /// Fails if `path` exists but is not a directory.
    pub fn create(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        match fs::metadata(&path) {
            Ok(metadata) if !metadata.is_dir() => {
                return Err(Error::invalid(
                    path.display().to_string(),
                    "exists and is not a directory; a run needs a directory for its output",
                ))
            }
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&path).map_err(|err| Error::io(&path, err))?
            }
            Err(err) => return Err(Error::io(&path, err)),
        }
        Ok(RunDir { path })
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of file `name` in this directory. `name` must be a plain file
    /// name, so nothing is ever written outside the directory.
    pub fn file(&self, name: &str) -> Result<PathBuf> {
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains(['/', '\\'])
            && Path::new(name).is_relative();
        if !plain {
            return Err(Error::invalid(
                format!("run file `{name}`"),
                "must be a plain file name inside the run directory",
            ));
        }
        Ok(self.path.join(name))
    }

    /// Write `value` as pretty JSON to `name`, atomically.
    pub fn write_json<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<()> {
        let path = self.file(name)?;
        let mut bytes = serde_json::to_vec_pretty(value).map_err(|err| unwritable(&path, err))?;
        bytes.push(b'\n');
        write_atomic(&path, &bytes)
    }

    /// Read `name` as JSON: `None` if it does not exist, an error naming the file
    /// if it is not valid JSON or not of the expected shape.
    pub fn read_json<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        let path = self.file(name)?;
        let Some(bytes) = read_if_present(&path)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|err| unreadable(&path.display().to_string(), &err))
    }

    /// Write `text` to `name`, atomically.
    pub fn write_text(&self, name: &str, text: &str) -> Result<()> {
        write_atomic(&self.file(name)?, text.as_bytes())
    }

    /// Append `value` as one JSON line to `name`, creating the file if needed, and
    /// flush it to disk.
    ///
    /// If the file ends in an unfinished line (a crash during an earlier append),
    /// that line is cut off first when it is not valid JSON, so the log never
    /// holds a garbled line followed by good ones.
    pub fn append_jsonl<T: Serialize + ?Sized>(&self, name: &str, value: &T) -> Result<()> {
        let path = self.file(name)?;
        let mut line = serde_json::to_vec(value).map_err(|err| unwritable(&path, err))?;
        line.push(b'\n');
        let io_err = |err| Error::io(&path, err);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err)?;
        let end = complete_end(&mut file).map_err(io_err)?;
        file.set_len(end).map_err(io_err)?;
        file.seek(SeekFrom::Start(end)).map_err(io_err)?;
        file.write_all(&line).map_err(io_err)?;
        file.sync_data().map_err(io_err)
    }

    /// Replace `name` with exactly `values`, one JSON line each, atomically.
    /// On resume a caller rewrites the log with the steps its checkpoint
    /// covers, so steps done again after the last checkpoint are never
    /// listed twice.
    pub fn rewrite_jsonl<T: Serialize>(&self, name: &str, values: &[T]) -> Result<()> {
        let path = self.file(name)?;
        let mut bytes = Vec::new();
        for value in values {
            serde_json::to_writer(&mut bytes, value).map_err(|err| unwritable(&path, err))?;
            bytes.push(b'\n');
        }
        write_atomic(&path, &bytes)
    }

    /// Read every line of the JSON-lines file `name`; no file reads as no lines.
    ///
    /// Blank lines are skipped, and so is a last line that has no newline and does
    /// not parse (a crash during an append). Any other bad line is an error naming
    /// the file and line number.
    pub fn read_jsonl<T: DeserializeOwned>(&self, name: &str) -> Result<Vec<T>> {
        let path = self.file(name)?;
        let Some(bytes) = read_if_present(&path)? else {
            return Ok(Vec::new());
        };
        let finished = bytes.ends_with(b"\n");
        let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
        let mut values = Vec::with_capacity(lines.len());
        for (at, line) in lines.iter().enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let torn = !finished && at == lines.len() - 1;
            match serde_json::from_slice(line) {
                Ok(value) => values.push(value),
                Err(_) if torn && serde_json::from_slice::<Value>(line).is_err() => {}
                Err(err) => {
                    let place = format!("{}:{}", path.display(), at + 1);
                    return Err(unreadable(&place, &err));
                }
            }
        }
        Ok(values)
    }

    /// Take the run's lock for as long as the returned guard lives, so that
    /// two processes never write one run's steps and checkpoints at once.
    /// Fails at once, naming the directory, when another process holds it.
    /// The operating system releases the lock when the process ends, however
    /// it ends.
    pub fn lock(&self) -> Result<RunLock> {
        let path = self.file(Self::LOCK)?;
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|err| Error::io(&path, err))?;
        match file.try_lock() {
            Ok(()) => {
                // The holder's process id, for the error a second writer gets.
                file.set_len(0)
                    .and_then(|()| write!(file, "{}", std::process::id()))
                    .map_err(|err| Error::io(&path, err))?;
                Ok(RunLock { _file: file })
            }
            Err(fs::TryLockError::WouldBlock) => {
                let holder = fs::read_to_string(&path).unwrap_or_default();
                let holder = match holder.trim() {
                    "" => "another prism process".to_string(),
                    pid => format!("prism process {pid}"),
                };
                Err(Error::invalid(
                    self.path.display().to_string(),
                    format!(
                        "{holder} is writing this run; wait for it or choose another {}",
                        Setting::Out
                    ),
                ))
            }
            Err(fs::TryLockError::Error(err)) => Err(Error::io(&path, err)),
        }
    }

    /// Save `checkpoint` to [`RunDir::CHECKPOINT`], atomically, keeping the
    /// one it replaces as [`RunDir::PREVIOUS_CHECKPOINT`].
    pub fn save_checkpoint<S: Serialize>(&self, checkpoint: &Checkpoint<S>) -> Result<()> {
        let current = self.file(Self::CHECKPOINT)?;
        let previous = self.file(Self::PREVIOUS_CHECKPOINT)?;
        match fs::rename(&current, &previous) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(Error::io(&current, err)),
        }
        self.write_json(Self::CHECKPOINT, checkpoint)
    }

    /// Load the checkpoint, if there is one, for a run whose settings have
    /// `expected_fingerprint` (see [`fingerprint`]).
    ///
    /// Fails if the checkpoint was written with other settings or by another
    /// checkpoint format, since resuming from it would mix two different runs.
    pub fn load_checkpoint<S: DeserializeOwned>(
        &self,
        expected_fingerprint: &str,
    ) -> Result<Option<Checkpoint<S>>> {
        let Some((raw, name)) = self.matching_checkpoint(expected_fingerprint, true)? else {
            return Ok(None);
        };
        let path = self.file(name)?.display().to_string();
        let state = serde_json::from_value(raw.state).map_err(|err| {
            Error::invalid(
                path,
                format!("checkpoint state has an unexpected shape: {err}"),
            )
        })?;
        Ok(Some(Checkpoint {
            version: raw.version,
            config_fingerprint: raw.config_fingerprint,
            completed_steps: raw.completed_steps,
            state,
        }))
    }

    /// Refuse a checkpoint written with settings other than
    /// `expected_fingerprint`'s or by another checkpoint format, before a run
    /// begins; says nothing of a damaged one, which loading warns of.
    pub fn check_checkpoint(&self, expected_fingerprint: &str) -> Result<()> {
        self.matching_checkpoint(expected_fingerprint, false)
            .map(|_| ())
    }

    /// The checkpoint, or the one before it when it is missing or damaged,
    /// with its file name, once its format and fingerprint are checked;
    /// `warn` tells the user when it falls back on the one before.
    fn matching_checkpoint(
        &self,
        expected_fingerprint: &str,
        warn: bool,
    ) -> Result<Option<(Checkpoint<Value>, &'static str)>> {
        // Check version and settings before the state: a state from other settings
        // may not even parse, and "different settings" is the useful message then.
        let (raw, name) = match self.read_json::<Checkpoint<Value>>(Self::CHECKPOINT) {
            Ok(Some(raw)) => (raw, Self::CHECKPOINT),
            current => match self.read_json::<Checkpoint<Value>>(Self::PREVIOUS_CHECKPOINT) {
                Ok(Some(previous)) => {
                    if warn {
                        tracing::warn!(
                            "{}: {} is missing or damaged; resuming from the checkpoint before it",
                            self.path.display(),
                            Self::CHECKPOINT
                        );
                    }
                    (previous, Self::PREVIOUS_CHECKPOINT)
                }
                _ => return current.map(|_| None),
            },
        };
        let path = self.file(name)?.display().to_string();
        let start_over = format!("use a new {} or drop {}", Setting::Out, Setting::Resume);
        if raw.version != CHECKPOINT_VERSION {
            return Err(Error::invalid(
                path,
                format!(
                    "written in checkpoint format {}, but this prism reads format {CHECKPOINT_VERSION}; {start_over}",
                    raw.version
                ),
            ));
        }
        if raw.config_fingerprint != expected_fingerprint {
            return Err(Error::invalid(
                path,
                format!(
                    "this run directory was started with different settings (fingerprint {}, now {}); {start_over}",
                    short(&raw.config_fingerprint),
                    short(expected_fingerprint)
                ),
            ));
        }
        Ok(Some((raw, name)))
    }
}

/// Holds a run directory's lock until dropped; see [`RunDir::lock`].
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// The format of [`Checkpoint`] this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 2;

/// Everything a run needs to carry on after its first `completed_steps` units of work:
/// the settings it was started with (as a fingerprint) and the method's own `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint<S> {
    /// [`CHECKPOINT_VERSION`] when written.
    pub version: u32,
    /// [`fingerprint`] of the run's settings.
    pub config_fingerprint: String,
    /// How many units of work (lines of `steps.jsonl`) are fully reflected in `state`.
    pub completed_steps: usize,
    /// Whatever the method needs to resume: memory, partial summaries, ledger.
    pub state: S,
}

impl<S> Checkpoint<S> {
    /// A checkpoint in the current format.
    pub fn new(config_fingerprint: impl Into<String>, completed_steps: usize, state: S) -> Self {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            config_fingerprint: config_fingerprint.into(),
            completed_steps,
            state,
        }
    }
}

/// A stable identity for a run's settings: the lowercase hex sha256 of `config`
/// serialized to JSON with object keys sorted, so that map order (a `HashMap`
/// field, or struct fields reordered) does not change it.
///
/// # Panics
///
/// If `config` cannot be represented as JSON, which for a settings struct only
/// happens with a map keyed by something other than strings or numbers. That is
/// a bug in the config type, not bad input.
pub fn fingerprint<T: Serialize + ?Sized>(config: &T) -> String {
    let value = serde_json::to_value(config).expect("run settings serialize to JSON");
    let bytes = serde_json::to_vec(&sorted_keys(value)).expect("a JSON value serializes");
    format!("{:x}", Sha256::digest(bytes))
}

fn sorted_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key, sorted_keys(value)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted_keys).collect()),
        other => other,
    }
}

/// The first 12 hex digits of a fingerprint, enough to tell two apart in a message.
fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

/// The contents of `path`, or `None` if it does not exist.
fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(Error::io(path, err)),
    }
}

/// Length of `file` up to the end of its last line that is either finished or
/// valid JSON; anything past it is a torn append. Leaves a newline-less but valid
/// last line in place after adding its missing newline.
fn complete_end(file: &mut File) -> io::Result<u64> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut bytes)?;
    let line_start = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    if serde_json::from_slice::<Value>(&bytes[line_start..]).is_ok() {
        file.seek(SeekFrom::End(0))?;
        file.write_all(b"\n")?;
        return Ok(len + 1);
    }
    Ok(line_start as u64)
}

fn unwritable(path: &Path, err: serde_json::Error) -> Error {
    Error::invalid(
        path.display().to_string(),
        format!("cannot be written as JSON: {err}"),
    )
}

/// Say whether a file is damaged or merely of another shape than expected.
fn unreadable(place: &str, err: &serde_json::Error) -> Error {
    let reason = match err.classify() {
        serde_json::error::Category::Data => format!("does not have the expected fields: {err}"),
        _ => format!("is corrupt (not valid JSON: {err})"),
    };
    Error::invalid(place, reason)
}

#[cfg(test)]
mod tests;
