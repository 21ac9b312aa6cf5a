//! A KV cache on disk, so that a prefix one process encoded is restored by the
//! next (a resumed run, a run with the same instructions) instead of encoded again.
//!
//! Sequences are stored as chains of blocks of [`BLOCK_TOKENS`] tokens, each
//! block a file named by a hash of its tokens and everything before them
//! (see `block`), so sequences that share a prefix share its files and
//! storing a longer sequence writes only the blocks it adds. An index per
//! model folder lists the blocks, locked across processes (see `index`).

mod block;
mod index;
pub mod survey;

pub use block::Geometry;

use super::kv_cache::{common_prefix, KvCache, KvDtype};
use crate::error::{CandleContext, Error, Result};
use block::{Expected, FORMAT};
use index::{BlockEntry, Index, Loaded};
use std::path::{Path, PathBuf};

/// Tokens per block. Small enough that a prompt diverging from a stored one
/// loses little of the shared part to its last, partly matching block (a
/// 256-token block of SmolLM2's f32 KV is 16 MiB), large enough that a
/// context of thousands of tokens is a few dozen files and index entries.
pub const BLOCK_TOKENS: usize = 256;

/// Where the blocks of one model live, and how many bytes they may take.
#[derive(Debug, Clone)]
pub struct PromptCache {
    dir: PathBuf,
    budget_bytes: u64,
    model_sha256: String,
    kv_dtype: KvDtype,
}

/// A stored chain of blocks that matches a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The chain's blocks, from the first.
    blocks: Vec<String>,
    /// Tokens of the prompt the chain holds, from the start.
    pub matched: usize,
}

impl Hit {
    /// The same chain, restoring only its first `len` matching tokens.
    pub fn shortened(self, len: usize) -> Hit {
        Hit {
            matched: self.matched.min(len),
            ..self
        }
    }
}

impl PromptCache {
    /// The cache of the model whose weights hash to `model_sha256`, with
    /// `kv_dtype` keys and values, in `root`, keeping at most `budget_bytes`
    /// of blocks. Creates the model's folder.
    pub fn open(
        root: &Path,
        budget_bytes: u64,
        model_sha256: &str,
        kv_dtype: KvDtype,
    ) -> Result<Self> {
        let short = model_sha256.get(..16).unwrap_or(model_sha256);
        // A cache of another dtype is another model's as far as blocks go:
        // its own folder, and its dtype in each block's key.
        let folder = match kv_dtype {
            KvDtype::F32 => short.to_string(),
            other => format!("{short}-{}", other.name()),
        };
        let dir = root.join(folder);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(PromptCache {
            dir,
            budget_bytes,
            model_sha256: model_sha256.to_string(),
            kv_dtype,
        })
    }

    /// The stored chain sharing the longest prefix with `prompt`, if any
    /// shares at least one token.
    pub fn longest_prefix(&self, prompt: &[u32]) -> Result<Option<Hit>> {
        let _locked = index::lock(&self.dir)?;
        let index = self.read_index()?;
        let chain = index.lookup(prompt, BLOCK_TOKENS, |parent, tokens| {
            self.key(parent, tokens)
        });
        let matched = chain.iter().map(|(_, used)| used).sum();
        Ok((matched > 0).then(|| Hit {
            blocks: chain.into_iter().map(|(key, _)| key).collect(),
            matched,
        }))
    }

    /// Fill `cache` with the first `hit.matched` tokens of the chain, checking
    /// each block first, and return how many tokens it now holds from the
    /// chain. A block that fails a check is deleted with the blocks after
    /// it, and only the blocks before it are restored. Returns 0, leaving
    /// `cache` as it was, when that is no more than `cache` already holds.
    pub fn restore(&self, hit: &Hit, cache: &mut KvCache) -> Result<usize> {
        let _locked = index::lock(&self.dir)?;
        let mut index = self.read_index()?;
        let geometry = geometry_of(cache);
        let mut tokens: Vec<u32> = Vec::new();
        let mut parts: Vec<block::Layers> = Vec::new();
        let mut used_keys: Vec<String> = Vec::new();
        let mut changed = false;
        for key in &hit.blocks {
            let want = hit.matched - tokens.len();
            let Some(entry) = index.blocks.get(key).filter(|_| want > 0).cloned() else {
                break;
            };
            let parent = used_keys.last().map(String::as_str);
            let used = want.min(entry.tokens.len());
            match self.read_block(key, &entry, parent, geometry, used, cache) {
                Ok(layers) => {
                    tokens.extend_from_slice(&entry.tokens[..used]);
                    parts.push(layers);
                    used_keys.push(key.clone());
                }
                Err(reason) => {
                    tracing::warn!(
                        "prompt cache: refused {}: {reason}; removed",
                        self.path_of(key).display()
                    );
                    self.remove_chain_from(&mut index, key);
                    changed = true;
                    break;
                }
            }
        }
        let gain = tokens.len() > cache.common_prefix(&tokens);
        if gain {
            cache.load_prefix(&tokens, &concatenate(parts)?)?;
            index.touch(&used_keys);
        }
        if gain || changed {
            index.save(&self.dir)?;
        }
        Ok(if gain { tokens.len() } else { 0 })
    }

    /// Store every position of `cache` as a chain of blocks, writing only
    /// the blocks not stored yet, then drop least recently used blocks
    /// until the total fits the budget. A chain is stored only as far as
    /// its blocks fit the budget together.
    pub fn store(&self, cache: &KvCache) -> Result<()> {
        self.store_first(cache, cache.len())
    }

    /// Store only the whole blocks within the first `shared` positions of
    /// `cache`: the prefix later prompts may share. What follows it (a
    /// chunk read once, the answer to it) no later prompt starts with, and
    /// a prefix that grows call by call, as PRISM's memory does, would have
    /// its last, partial block written again at every call; whole blocks are
    /// written once. Up to a block's worth of the prefix is computed again
    /// when it is restored.
    pub fn store_prefix(&self, cache: &KvCache, shared: usize) -> Result<()> {
        let whole_blocks = shared.min(cache.len()) / BLOCK_TOKENS * BLOCK_TOKENS;
        self.store_first(cache, whole_blocks)
    }

    /// Store the first `len` positions of `cache`, as [`PromptCache::store`] says.
    fn store_first(&self, cache: &KvCache, len: usize) -> Result<()> {
        let tokens = &cache.tokens()[..len];
        if tokens.is_empty() {
            return Ok(());
        }
        let _locked = index::lock(&self.dir)?;
        let mut index = self.read_index()?;
        let geometry = geometry_of(cache);
        if index.geometry.is_some_and(|stored| stored != geometry) {
            tracing::warn!(
                "prompt cache: {} holds blocks of another shape; starting afresh",
                self.dir.display()
            );
            index = self.fresh_index();
        }
        index.geometry = Some(geometry);
        let mut layers = None;
        let mut chain: Vec<String> = Vec::new();
        let mut chain_bytes = 0;
        for (start, block_tokens) in (0..).step_by(BLOCK_TOKENS).zip(tokens.chunks(BLOCK_TOKENS)) {
            let parent = chain.last().map(String::as_str);
            let key = self.key(parent, block_tokens);
            if let Some(stored) = index.blocks.get(&key) {
                chain_bytes += stored.bytes;
                chain.push(key);
                continue;
            }
            // A block that a stored one already holds, and more after it.
            let longer = index
                .children(parent)
                .find(|(_, child)| child.tokens.starts_with(block_tokens))
                .map(|(key, _)| key.clone());
            if let Some(longer) = longer {
                chain.push(longer);
                break;
            }
            // Read once, and only when some block is new.
            if layers.is_none() {
                layers = Some(cache.prefix_tensors(len)?);
            }
            let all = layers.as_ref().expect("the prefix tensors were just read");
            let bytes = self.encode_block(parent, block_tokens, geometry, all, start)?;
            if chain_bytes + bytes.len() as u64 > self.budget_bytes {
                break;
            }
            // Partial blocks this one extends hold nothing it does not.
            let shorter: Vec<String> = index
                .children(parent)
                .filter(|(_, child)| block_tokens.starts_with(&child.tokens))
                .map(|(key, _)| key.clone())
                .collect();
            for key in shorter {
                self.remove_chain_from(&mut index, &key);
            }
            let path = self.path_of(&key);
            index::write_atomically(&self.dir, &path, &bytes)?;
            let entry = BlockEntry {
                parent: parent.map(str::to_string),
                tokens: block_tokens.to_vec(),
                bytes: bytes.len() as u64,
                last_used: 0,
                used_at_unix: 0,
            };
            index.blocks.insert(key.clone(), entry);
            chain_bytes += bytes.len() as u64;
            chain.push(key);
        }
        index.touch(&chain);
        for key in index.evictions(self.budget_bytes) {
            index.blocks.remove(&key);
            self.remove_file(&key);
        }
        index.save(&self.dir)
    }

    fn key(&self, parent: Option<&str>, tokens: &[u32]) -> String {
        block::key(&self.model_sha256, self.kv_dtype, parent, tokens)
    }

    fn expected<'a>(
        &'a self,
        parent: Option<&'a str>,
        tokens: &'a [u32],
        geometry: Geometry,
    ) -> Expected<'a> {
        Expected {
            model_sha256: &self.model_sha256,
            kv_dtype: self.kv_dtype,
            parent,
            tokens,
            geometry,
        }
    }

    /// The file's bytes of the block of `tokens` at `start` in `layers`.
    fn encode_block(
        &self,
        parent: Option<&str>,
        tokens: &[u32],
        geometry: Geometry,
        layers: &[(candle_core::Tensor, candle_core::Tensor)],
        start: usize,
    ) -> Result<Vec<u8>> {
        let part = |t: &candle_core::Tensor| t.narrow(2, start, tokens.len())?.contiguous();
        let block: Vec<_> = layers
            .iter()
            .map(|(keys, values)| Ok((part(keys)?, part(values)?)))
            .collect::<candle_core::Result<_>>()
            .context("cutting a prompt cache block")?;
        self.expected(parent, tokens, geometry)
            .encode(&block)
            .map_err(|reason| Error::invalid("prompt cache block", reason))
    }

    /// The block `key` (which the index lists as `entry`, after `parent`)
    /// checked and narrowed to its first `used` tokens, on `cache`'s device.
    /// The error is the reason to refuse it.
    fn read_block(
        &self,
        key: &str,
        entry: &BlockEntry,
        parent: Option<&str>,
        geometry: Geometry,
        used: usize,
        cache: &KvCache,
    ) -> std::result::Result<block::Layers, String> {
        if entry.parent.as_deref() != parent {
            return Err("the index places it after another block".into());
        }
        let expected = self.expected(parent, &entry.tokens, geometry);
        if expected.key() != key {
            return Err("its key is not the hash of what the index says it holds".into());
        }
        let bytes = std::fs::read(self.path_of(key)).map_err(|e| e.to_string())?;
        expected.decode(&bytes, used, cache.device())
    }

    fn path_of(&self, key: &str) -> PathBuf {
        block_path(&self.dir, key)
    }

    /// Drop `key` and the blocks after it from `index`, with their files.
    fn remove_chain_from(&self, index: &mut Index, key: &str) {
        for removed in index.remove_chain_from(key) {
            self.remove_file(&removed);
        }
    }

    /// Delete a block's file; one already gone is no loss.
    fn remove_file(&self, key: &str) {
        let _ = std::fs::remove_file(self.path_of(key));
    }

    /// The index, or a fresh one when there is none, or when it cannot be
    /// read or is another model's: then the blocks it named are unknown,
    /// and are deleted rather than trusted. The caller holds the lock.
    fn read_index(&self) -> Result<Index> {
        let problem = match Index::load(&self.dir, FORMAT)? {
            Loaded::Missing => return Ok(self.fresh_index()),
            Loaded::Found(index)
                if index.model_sha256 == self.model_sha256
                    && index.kv_dtype == self.kv_dtype.name() =>
            {
                return Ok(index)
            }
            Loaded::Found(_) => "it belongs to another model or KV dtype".to_string(),
            Loaded::Unreadable(reason) => reason,
        };
        tracing::warn!(
            "prompt cache: {} is not usable ({problem}); its blocks are removed",
            self.dir.join(index::INDEX).display()
        );
        let index = self.fresh_index();
        index.save(&self.dir)?;
        Ok(index)
    }

    /// An empty index, with every block file in the folder deleted: with no
    /// index to vouch for them they would only take space.
    fn fresh_index(&self) -> Index {
        for path in index::block_store_files(&self.dir) {
            let _ = std::fs::remove_file(path);
        }
        Index::new(FORMAT, &self.model_sha256, self.kv_dtype.name())
    }
}

fn block_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.safetensors"))
}

fn geometry_of(cache: &KvCache) -> Geometry {
    let (kv_heads, row_width) = cache.row_shape();
    Geometry {
        layers: cache.layer_count(),
        kv_heads,
        row_width,
    }
}

/// The blocks' keys and values as one tensor per layer, in order.
fn concatenate(parts: Vec<block::Layers>) -> Result<block::Layers> {
    let Some(layers) = parts.first().map(Vec::len) else {
        return Ok(Vec::new());
    };
    (0..layers)
        .map(|layer| {
            let keys: Vec<_> = parts.iter().map(|p| p[layer].0.clone()).collect();
            let values: Vec<_> = parts.iter().map(|p| p[layer].1.clone()).collect();
            let joined = candle_core::Tensor::cat(&keys, 2)
                .and_then(|keys| Ok((keys, candle_core::Tensor::cat(&values, 2)?)));
            joined.context("joining prompt cache blocks")
        })
        .collect()
}

#[cfg(test)]
mod tests;
