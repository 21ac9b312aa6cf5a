//! A whole `--prompt-cache` directory, one model folder at a time: what it
//! holds, whether every block passes its checks, and clearing it, for
//! `prism cache`. Each folder is read under its lock, as the engine reads it.

use super::block::Expected;
use super::index::{self, BlockEntry, Index, Loaded, INDEX};
use super::{block_path, KvDtype, FORMAT};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One model folder, as its index lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Folder {
    pub path: PathBuf,
    /// Empty when the index is missing or unreadable (see `problem`).
    pub model_sha256: String,
    pub kv_dtype: String,
    pub blocks: usize,
    pub bytes: u64,
    pub tokens: usize,
    pub chains: Vec<Chain>,
    /// Why the index could not be read, if it could not.
    pub problem: Option<String>,
}

/// A chain from its first block to a leaf. Blocks it shares with other
/// chains count in each of them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Chain {
    /// The leaf block's key.
    pub leaf: String,
    pub blocks: usize,
    pub tokens: usize,
    pub bytes: u64,
    /// When a block of the chain was last stored or restored, in seconds
    /// since the Unix epoch.
    pub last_used_unix: u64,
}

/// What `verify` found and removed.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Verification {
    pub blocks_checked: usize,
    /// Blocks (or indexes) that failed a check, all removed.
    pub bad: Vec<BadFile>,
    /// Sound blocks removed because a block before them in their chain was
    /// bad, and temporary files a writer left.
    pub also_removed: usize,
}

impl Verification {
    pub fn is_sound(&self) -> bool {
        self.bad.is_empty()
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BadFile {
    pub path: PathBuf,
    pub reason: String,
}

/// What `clear` removed.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Cleared {
    pub folders: usize,
    pub files: usize,
    pub bytes: u64,
}

/// Every model folder under `root`, with its chains.
pub fn list(root: &Path) -> Result<Vec<Folder>> {
    model_folders(root)?
        .into_iter()
        .map(|dir| {
            let _locked = index::lock(&dir)?;
            Ok(match Index::load(&dir, FORMAT)? {
                Loaded::Found(index) => folder_of(dir, &index),
                Loaded::Missing => unreadable(dir, "it has no index".into()),
                Loaded::Unreadable(reason) => unreadable(dir, reason),
            })
        })
        .collect()
}

/// Check every block under `root` (its header, shapes and checksum against
/// its index entry) and remove the bad ones, with the blocks after them,
/// and block files no index lists.
pub fn verify(root: &Path) -> Result<Verification> {
    let mut found = Verification::default();
    for dir in model_folders(root)? {
        let _locked = index::lock(&dir)?;
        let index = match Index::load(&dir, FORMAT)? {
            Loaded::Found(index) => Some(index),
            Loaded::Missing => None,
            Loaded::Unreadable(reason) => {
                let path = dir.join(INDEX);
                remove(&path);
                found.bad.push(BadFile { path, reason });
                None
            }
        };
        let mut index = index.unwrap_or_else(|| Index::new(FORMAT, "", ""));
        let bad: BTreeMap<String, String> = index
            .blocks
            .iter()
            .filter_map(|(key, entry)| {
                let checked = check_block(&dir, &index, key, entry);
                checked.err().map(|reason| (key.clone(), reason))
            })
            .collect();
        found.blocks_checked += index.blocks.len();
        let changed = !bad.is_empty();
        for key in bad.keys() {
            for removed in index.remove_chain_from(key) {
                remove(&block_path(&dir, &removed));
                if !bad.contains_key(&removed) {
                    found.also_removed += 1;
                }
            }
        }
        for (key, reason) in bad {
            let path = block_path(&dir, &key);
            found.bad.push(BadFile { path, reason });
        }
        for path in index::block_store_files(&dir) {
            let key = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if !index.blocks.contains_key(key) {
                remove(&path);
                if path.extension().is_some_and(|e| e == "safetensors") {
                    let reason = "no index lists it".to_string();
                    found.bad.push(BadFile { path, reason });
                } else {
                    found.also_removed += 1;
                }
            }
        }
        if changed {
            index.save(&dir)?;
        }
    }
    Ok(found)
}

/// Remove every block and index under `root`. The folders and their lock
/// files stay: a process may be waiting on a lock.
pub fn clear(root: &Path) -> Result<Cleared> {
    let mut cleared = Cleared::default();
    for dir in model_folders(root)? {
        let _locked = index::lock(&dir)?;
        cleared.folders += 1;
        let mut files = index::block_store_files(&dir);
        files.push(dir.join(INDEX));
        for path in files {
            let Ok(metadata) = std::fs::metadata(&path) else {
                continue;
            };
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            cleared.files += 1;
            cleared.bytes += metadata.len();
        }
    }
    Ok(cleared)
}

/// Why the block `key` of `index` (listed as `entry`) fails a check, if it does.
fn check_block(dir: &Path, index: &Index, key: &str, entry: &BlockEntry) -> Result<(), String> {
    let kv_dtype: KvDtype = index.kv_dtype.parse().map_err(|e: Error| e.to_string())?;
    let geometry = index.geometry.ok_or("the index records no shape")?;
    if let Some(parent) = &entry.parent {
        if !index.blocks.contains_key(parent) {
            return Err("the block before it is gone".into());
        }
    }
    let expected = Expected {
        model_sha256: &index.model_sha256,
        kv_dtype,
        parent: entry.parent.as_deref(),
        tokens: &entry.tokens,
        geometry,
    };
    if expected.key() != key {
        return Err("its key is not the hash of what the index says it holds".into());
    }
    let bytes = std::fs::read(block_path(dir, key)).map_err(|e| e.to_string())?;
    if bytes.len() as u64 != entry.bytes {
        return Err(format!(
            "it has {} bytes, not the {} stored",
            bytes.len(),
            entry.bytes
        ));
    }
    expected.check(&bytes)
}

fn folder_of(path: PathBuf, index: &Index) -> Folder {
    let chains = index
        .chains()
        .into_iter()
        .map(|keys| {
            let blocks: Vec<_> = keys.iter().filter_map(|k| index.blocks.get(k)).collect();
            Chain {
                leaf: keys.last().cloned().unwrap_or_default(),
                blocks: blocks.len(),
                tokens: blocks.iter().map(|b| b.tokens.len()).sum(),
                bytes: blocks.iter().map(|b| b.bytes).sum(),
                last_used_unix: blocks.iter().map(|b| b.used_at_unix).max().unwrap_or(0),
            }
        })
        .collect();
    Folder {
        path,
        model_sha256: index.model_sha256.clone(),
        kv_dtype: index.kv_dtype.clone(),
        blocks: index.blocks.len(),
        bytes: index.total_bytes(),
        tokens: index.blocks.values().map(|b| b.tokens.len()).sum(),
        chains,
        problem: None,
    }
}

fn unreadable(path: PathBuf, problem: String) -> Folder {
    Folder {
        path,
        model_sha256: String::new(),
        kv_dtype: String::new(),
        blocks: 0,
        bytes: 0,
        tokens: 0,
        chains: Vec::new(),
        problem: Some(problem),
    }
}

/// The folders under `root` that a prompt cache made: those with an index,
/// a lock or block files.
fn model_folders(root: &Path) -> Result<Vec<PathBuf>> {
    let listing = std::fs::read_dir(root).map_err(|e| Error::io(root, e))?;
    let mut folders: Vec<PathBuf> = listing
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.is_dir())
        .filter(|dir| {
            dir.join(INDEX).exists()
                || dir.join(index::LOCK).exists()
                || !index::block_store_files(dir).is_empty()
        })
        .collect();
    folders.sort();
    Ok(folders)
}

/// Delete a file that failed a check; one already gone is no loss.
fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
}
