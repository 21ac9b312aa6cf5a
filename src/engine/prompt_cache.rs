//! A KV cache on disk, so that a prefix one process encoded is restored by the
//! next (a resumed run, a run with the same instructions) instead of encoded again.

use super::kv_cache::{common_prefix, KvCache, KvDtype};
use crate::error::{Error, Result};
use candle_core::safetensors::Load;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const INDEX: &str = "index.json";
const FORMAT: &str = "prism-kv-1";

/// Where the entries of one model live, and how many bytes they may take.
#[derive(Debug, Clone)]
pub struct PromptCache {
    dir: PathBuf,
    budget_bytes: u64,
    model_sha256: String,
}

/// One stored sequence, as the index lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// The file's name without `.safetensors`: the sha256 of its token ids.
    key: String,
    tokens: Vec<u32>,
    bytes: u64,
    /// Of the whole file.
    sha256: String,
    /// The index's clock when the entry was last stored or restored.
    last_used: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    format: String,
    clock: u64,
    entries: Vec<Entry>,
}

/// A stored prefix that matches a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    key: String,
    /// Tokens of the prompt the entry holds, from the start.
    pub matched: usize,
}

impl Hit {
    /// The same entry, restoring only its first `len` matching tokens.
    pub fn shortened(self, len: usize) -> Hit {
        Hit {
            matched: self.matched.min(len),
            ..self
        }
    }
}

impl PromptCache {
    /// The cache of the model whose weights hash to `model_sha256`, in `root`,
    /// keeping at most `budget_bytes` of entries. Creates the directory.
    pub fn open(
        root: &Path,
        budget_bytes: u64,
        model_sha256: &str,
        kv_dtype: KvDtype,
    ) -> Result<Self> {
        // A cache of another dtype is another model's as far as entries go:
        // its own folder, and its name in each file's metadata.
        let model = match kv_dtype {
            KvDtype::F32 => model_sha256.to_string(),
            other => format!("{model_sha256}-{}", other.name()),
        };
        let short = match kv_dtype {
            KvDtype::F32 => model_sha256.get(..16).unwrap_or(model_sha256).to_string(),
            other => format!(
                "{}-{}",
                model_sha256.get(..16).unwrap_or(model_sha256),
                other.name()
            ),
        };
        let dir = root.join(short);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(PromptCache {
            dir,
            budget_bytes,
            model_sha256: model,
        })
    }

    /// The stored entry sharing the longest prefix with `prompt`, if any
    /// shares at least one token.
    pub fn longest_prefix(&self, prompt: &[u32]) -> Result<Option<Hit>> {
        let index = self.read_index()?;
        Ok(index
            .entries
            .iter()
            .map(|entry| Hit {
                key: entry.key.clone(),
                matched: common_prefix(&entry.tokens, prompt),
            })
            .filter(|hit| hit.matched > 0)
            .max_by_key(|hit| hit.matched))
    }

    /// Fill `cache` with the first `hit.matched` positions of the entry, after
    /// checking it. `Ok(false)` when the entry is gone or fails a check; a
    /// failing entry is deleted, and `cache` is left as it was.
    pub fn restore(&self, hit: &Hit, cache: &mut KvCache) -> Result<bool> {
        let mut index = self.read_index()?;
        let Some(position) = index.entries.iter().position(|e| e.key == hit.key) else {
            return Ok(false);
        };
        let entry = &index.entries[position];
        let path = self.path_of(&entry.key);
        match self.read_entry(&path, entry, hit.matched, cache) {
            Ok(layers) => {
                if let Err(err) = cache.load_prefix(&entry.tokens[..hit.matched], &layers) {
                    tracing::warn!(
                        "prompt cache: {} does not fit this model: {err}; removed",
                        path.display()
                    );
                    self.remove(&mut index, position)?;
                    return Ok(false);
                }
                index.clock += 1;
                index.entries[position].last_used = index.clock;
                self.write_index(&index)?;
                Ok(true)
            }
            Err(reason) => {
                tracing::warn!(
                    "prompt cache: refused {}: {reason}; removed",
                    path.display()
                );
                self.remove(&mut index, position)?;
                Ok(false)
            }
        }
    }

    /// Store every position of `cache`, unless an entry already holds them
    /// (or more after them). Entries that `cache` extends are replaced, and
    /// the least recently used go until the total fits the budget. A
    /// sequence larger than the whole budget is not stored.
    pub fn store(&self, cache: &KvCache) -> Result<()> {
        let tokens = cache.tokens();
        if tokens.is_empty() {
            return Ok(());
        }
        let mut index = self.read_index()?;
        if index.entries.iter().any(|e| e.tokens.starts_with(tokens)) {
            return Ok(());
        }
        let bytes = self.encode(cache)?;
        if bytes.len() as u64 > self.budget_bytes {
            return Ok(());
        }
        let key = token_key(tokens);
        let path = self.path_of(&key);
        let mut file =
            tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        file.write_all(&bytes).map_err(|e| Error::io(&path, e))?;
        file.persist(&path).map_err(|e| Error::io(&path, e.error))?;
        let mut superseded: Vec<usize> = (0..index.entries.len())
            .filter(|&i| tokens.starts_with(&index.entries[i].tokens))
            .collect();
        superseded.sort_unstable_by(|a, b| b.cmp(a));
        for position in superseded {
            self.remove_file(&index.entries.remove(position).key);
        }
        index.clock += 1;
        index.entries.push(Entry {
            key,
            tokens: tokens.to_vec(),
            bytes: bytes.len() as u64,
            sha256: format!("{:x}", Sha256::digest(&bytes)),
            last_used: index.clock,
        });
        while index.entries.iter().map(|e| e.bytes).sum::<u64>() > self.budget_bytes {
            let oldest = (0..index.entries.len())
                .min_by_key(|&i| index.entries[i].last_used)
                .expect("over budget means at least one entry");
            self.remove_file(&index.entries.remove(oldest).key);
        }
        self.write_index(&index)
    }

    /// The file's bytes: each layer's keys `k.N` and values `v.N`, and
    /// metadata naming the format, the model and the tokens.
    fn encode(&self, cache: &KvCache) -> Result<Vec<u8>> {
        let layers = cache.prefix_tensors(cache.len())?;
        let named: Vec<(String, &candle_core::Tensor)> = layers
            .iter()
            .enumerate()
            .flat_map(|(layer, (keys, values))| {
                [(format!("k.{layer}"), keys), (format!("v.{layer}"), values)]
            })
            .collect();
        let metadata = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("model_sha256".to_string(), self.model_sha256.clone()),
            ("tokens_sha256".to_string(), token_key(cache.tokens())),
        ]);
        safetensors::serialize(named, Some(metadata))
            .map_err(|e| Error::invalid("prompt cache entry", e.to_string()))
    }

    /// The first `len` positions of each layer of the entry at `path`, after
    /// checking its bytes against the index and its metadata against this
    /// model and the entry's tokens. The error is the reason to refuse it.
    fn read_entry(
        &self,
        path: &Path,
        entry: &Entry,
        len: usize,
        cache: &KvCache,
    ) -> std::result::Result<Vec<(candle_core::Tensor, candle_core::Tensor)>, String> {
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        if format!("{:x}", Sha256::digest(&bytes)) != entry.sha256 {
            return Err("its bytes do not match the sha256 recorded when it was stored".into());
        }
        let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
        let (_, header) =
            safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| e.to_string())?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let field = |name: &str| metadata.get(name).map(String::as_str);
        if field("format") != Some(FORMAT) {
            return Err("it is not a prism KV file".into());
        }
        if field("model_sha256") != Some(self.model_sha256.as_str()) {
            return Err("it was computed by another model".into());
        }
        if field("tokens_sha256") != Some(token_key(&entry.tokens).as_str()) {
            return Err("it holds another token sequence than the index says".into());
        }
        let layers = cache.layer_count();
        // Loaded where the cache lives: a GPU cache refused CPU tensors.
        let tensor = |name: String| -> std::result::Result<candle_core::Tensor, String> {
            let view = file.tensor(&name).map_err(|e| format!("{name}: {e}"))?;
            let tensor = view
                .load(cache.device())
                .map_err(|e| format!("{name}: {e}"))?;
            let prefix = tensor.narrow(2, 0, len).and_then(|t| t.contiguous());
            prefix.map_err(|e| format!("{name}: {e}"))
        };
        if file.len() != 2 * layers {
            return Err(format!(
                "it holds {} tensors where this model has {layers} layers of keys and values",
                file.len()
            ));
        }
        (0..layers)
            .map(|layer| Ok((tensor(format!("k.{layer}"))?, tensor(format!("v.{layer}"))?)))
            .collect()
    }

    fn path_of(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.safetensors"))
    }

    fn remove(&self, index: &mut Index, position: usize) -> Result<()> {
        self.remove_file(&index.entries.remove(position).key);
        self.write_index(index)
    }

    /// Delete an entry's file; one already gone is no loss.
    fn remove_file(&self, key: &str) {
        let _ = std::fs::remove_file(self.path_of(key));
    }

    /// The index, or an empty one when there is none or it cannot be read:
    /// then the files it named are unknown, and are deleted rather than trusted.
    fn read_index(&self) -> Result<Index> {
        let path = self.dir.join(INDEX);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(self.fresh_index()),
            Err(e) => return Err(Error::io(&path, e)),
        };
        match serde_json::from_str::<Index>(&text) {
            Ok(index) if index.format == FORMAT => Ok(index),
            _ => {
                tracing::warn!(
                    "prompt cache: {} is unreadable; starting afresh",
                    path.display()
                );
                Ok(self.fresh_index())
            }
        }
    }

    /// An empty index, with every entry file in the directory deleted: with
    /// no index to vouch for them they would only take space.
    fn fresh_index(&self) -> Index {
        if let Ok(listing) = std::fs::read_dir(&self.dir) {
            for file in listing.flatten() {
                if file
                    .path()
                    .extension()
                    .is_some_and(|ext| ext == "safetensors")
                {
                    let _ = std::fs::remove_file(file.path());
                }
            }
        }
        Index {
            format: FORMAT.to_string(),
            ..Index::default()
        }
    }

    fn write_index(&self, index: &Index) -> Result<()> {
        let path = self.dir.join(INDEX);
        let json = serde_json::to_vec(index)
            .map_err(|e| Error::invalid("prompt cache index", e.to_string()))?;
        let mut file =
            tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        file.write_all(&json).map_err(|e| Error::io(&path, e))?;
        file.persist(&path).map_err(|e| Error::io(&path, e.error))?;
        Ok(())
    }
}

/// The hex sha256 of a token sequence (its ids as little-endian u32).
fn token_key(tokens: &[u32]) -> String {
    let mut hasher = Sha256::new();
    for token in tokens {
        hasher.update(token.to_le_bytes());
    }
    format!("{:x}", hasher.finalize())
}

#[cfg(test)]
mod tests;
