//! The index of one model's folder: which blocks it holds, how they chain
//! and when each was last used, with the pure policies over it (lookup,
//! eviction) and the lock that serializes processes sharing the folder.

use super::block::Geometry;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

pub(super) const INDEX: &str = "index.json";
pub(super) const LOCK: &str = "index.lock";

/// Every block of one model and KV dtype, by key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Index {
    pub format: String,
    pub model_sha256: String,
    /// As `--kv-dtype` spells it.
    pub kv_dtype: String,
    /// Of every block; `None` until the first block is stored.
    pub geometry: Option<Geometry>,
    /// Counts uses, so that least recently used is well ordered even for
    /// uses within one second.
    pub clock: u64,
    pub blocks: BTreeMap<String, BlockEntry>,
}

/// One stored block, as the index lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlockEntry {
    /// The block before it in its chain; `None` for a chain's first block.
    pub parent: Option<String>,
    pub tokens: Vec<u32>,
    /// Of the block's file.
    pub bytes: u64,
    /// The index's clock when the block was last stored or restored.
    pub last_used: u64,
    /// The same moment in seconds since the Unix epoch, for people.
    pub used_at_unix: u64,
}

/// What a folder's index file holds.
pub(super) enum Loaded {
    Missing,
    /// Not an index this version writes; the reason says why.
    Unreadable(String),
    Found(Index),
}

impl Index {
    pub fn new(format: &str, model_sha256: &str, kv_dtype: &str) -> Index {
        Index {
            format: format.to_string(),
            model_sha256: model_sha256.to_string(),
            kv_dtype: kv_dtype.to_string(),
            geometry: None,
            clock: 0,
            blocks: BTreeMap::new(),
        }
    }

    /// The index in `dir`, checked to be of `format`.
    pub fn load(dir: &Path, format: &str) -> Result<Loaded> {
        let path = dir.join(INDEX);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Ok(Loaded::Unreadable(e.to_string()))
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        let value: serde_json::Value = match serde_json::from_str(&text) {
            Ok(value) => value,
            Err(e) => return Ok(Loaded::Unreadable(e.to_string())),
        };
        let written_as = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
        if written_as != format {
            return Ok(Loaded::Unreadable(format!(
                "its format is `{written_as}`, not `{format}`"
            )));
        }
        Ok(match serde_json::from_value(value) {
            Ok(index) => Loaded::Found(index),
            Err(e) => Loaded::Unreadable(e.to_string()),
        })
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec(self)
            .map_err(|e| Error::invalid("prompt cache index", e.to_string()))?;
        write_atomically(dir, &dir.join(INDEX), &json)
    }

    pub fn total_bytes(&self) -> u64 {
        self.blocks.values().map(|b| b.bytes).sum()
    }

    /// The blocks that follow `parent` (the chains' first blocks for `None`).
    pub fn children<'a>(
        &'a self,
        parent: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a String, &'a BlockEntry)> + 'a {
        self.blocks
            .iter()
            .filter(move |(_, block)| block.parent.as_deref() == parent)
    }

    /// The stored chain that matches the most of `prompt` from its start, as
    /// (key, tokens of the block used) pairs. Whole blocks are found by
    /// their key (`key_of(parent, tokens)`); after the last whole block
    /// that matches, the block that follows it sharing the most tokens with
    /// the rest of the prompt is used for as many tokens as it shares.
    pub fn lookup(
        &self,
        prompt: &[u32],
        block_tokens: usize,
        key_of: impl Fn(Option<&str>, &[u32]) -> String,
    ) -> Vec<(String, usize)> {
        let mut chain: Vec<(String, usize)> = Vec::new();
        let mut start = 0;
        while prompt.len() - start >= block_tokens {
            let parent = chain.last().map(|(key, _)| key.as_str());
            let key = key_of(parent, &prompt[start..start + block_tokens]);
            if !self.blocks.contains_key(&key) {
                break;
            }
            chain.push((key, block_tokens));
            start += block_tokens;
        }
        let parent = chain.last().map(|(key, _)| key.as_str());
        let rest = &prompt[start..];
        let best = self
            .children(parent)
            .map(|(key, block)| (key, super::common_prefix(&block.tokens, rest)))
            .filter(|&(_, shared)| shared > 0)
            .max_by_key(|&(_, shared)| shared);
        if let Some((key, shared)) = best {
            let partial = (key.clone(), shared);
            chain.push(partial);
        }
        chain
    }

    /// Mark `keys` used now.
    pub fn touch<'a>(&mut self, keys: impl IntoIterator<Item = &'a String>) {
        self.clock += 1;
        let now = unix_seconds();
        for key in keys {
            if let Some(block) = self.blocks.get_mut(key) {
                block.last_used = self.clock;
                block.used_at_unix = now;
            }
        }
    }

    /// Drop `key` and every block after it, which cannot be reached without
    /// it; returns the keys dropped.
    pub fn remove_chain_from(&mut self, key: &str) -> Vec<String> {
        let mut removed = Vec::new();
        let mut pending = vec![key.to_string()];
        while let Some(key) = pending.pop() {
            if self.blocks.remove(&key).is_some() {
                pending.extend(
                    self.children(Some(key.as_str()))
                        .map(|(child, _)| child.clone()),
                );
                removed.push(key);
            }
        }
        removed
    }

    /// The blocks to drop, in order, for the rest to fit `budget_bytes`:
    /// always the least recently used of the leaves (blocks no other block
    /// follows), so that no kept block loses a block it follows.
    pub fn evictions(&self, budget_bytes: u64) -> Vec<String> {
        let mut children: BTreeMap<&str, usize> = BTreeMap::new();
        for block in self.blocks.values() {
            if let Some(parent) = &block.parent {
                *children.entry(parent.as_str()).or_default() += 1;
            }
        }
        let mut kept: BTreeMap<&str, &BlockEntry> = self
            .blocks
            .iter()
            .map(|(key, block)| (key.as_str(), block))
            .collect();
        let mut total = self.total_bytes();
        let mut evicted = Vec::new();
        while total > budget_bytes {
            let leaf = kept
                .iter()
                .filter(|(key, _)| children.get(*key).copied().unwrap_or(0) == 0)
                .min_by_key(|(key, block)| (block.last_used, **key))
                .map(|(key, _)| *key);
            let Some(leaf) = leaf else { break };
            let block = kept.remove(leaf).expect("the leaf was just found in kept");
            total -= block.bytes;
            if let Some(parent) = &block.parent {
                if let Some(count) = children.get_mut(parent.as_str()) {
                    *count -= 1;
                }
            }
            evicted.push(leaf.to_string());
        }
        evicted
    }

    /// Each chain from its first block to a leaf, as keys in order.
    pub fn chains(&self) -> Vec<Vec<String>> {
        let leaves = self
            .blocks
            .keys()
            .filter(|key| self.children(Some(key.as_str())).next().is_none());
        leaves
            .map(|leaf| {
                let mut chain = vec![leaf.clone()];
                let mut at = leaf;
                while let Some(parent) = self.blocks.get(at).and_then(|b| b.parent.as_ref()) {
                    if chain.len() > self.blocks.len() {
                        break; // A cycle, which only a hand-edited index has.
                    }
                    chain.push(parent.clone());
                    at = parent;
                }
                chain.reverse();
                chain
            })
            .collect()
    }
}

/// Holds the folder's lock until dropped: the file's lock is released when
/// it is closed. Every reader and writer of the index holds it, so each
/// reads the index as the last writer left it and writes it back merged
/// with what it did, never over another process's changes.
pub(super) struct Locked {
    _file: std::fs::File,
}

/// Wait for the exclusive lock of the folder `dir`.
pub(super) fn lock(dir: &Path) -> Result<Locked> {
    let path = dir.join(LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    file.lock().map_err(|e| Error::io(&path, e))?;
    Ok(Locked { _file: file })
}

/// Write `bytes` to `path` so that a reader sees the old file or the new,
/// never part of one: a temporary file in the same directory, synced to
/// disk, then renamed over it.
pub(super) fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
    file.write_all(bytes).map_err(|e| Error::io(path, e))?;
    file.as_file().sync_all().map_err(|e| Error::io(path, e))?;
    file.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Files in `dir` that only a block store writes and its index must vouch
/// for: block files and temporary files a writer left when it died.
pub(super) fn block_store_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    listing
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".safetensors") || name.starts_with(".tmp")
        })
        .collect()
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
