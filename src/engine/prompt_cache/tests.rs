use super::*;
use candle_core::{Device, Tensor};

const MODEL: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER_MODEL: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn empty_cache() -> KvCache {
    empty_cache_of(KvDtype::F32)
}

fn empty_cache_of(dtype: KvDtype) -> KvCache {
    KvCache::new(2, 2, 3, 4096, dtype, &Device::Cpu)
}

/// A cache holding `tokens`, each position's keys and values derived from
/// its token id, position and layer so that a wrong restore shows.
fn cache_of(tokens: &[u32]) -> KvCache {
    cache_in(KvDtype::F32, tokens)
}

fn cache_in(dtype: KvDtype, tokens: &[u32]) -> KvCache {
    let mut cache = empty_cache_of(dtype);
    cache.reserve(tokens.len()).unwrap();
    for layer in 0..2u32 {
        let values: Vec<f32> = (0..2u32)
            .flat_map(|head| {
                tokens.iter().zip(0u32..).flat_map(move |(&t, at)| {
                    (0..3u32).map(move |d| {
                        (t * 100 + head * 10 + d + layer * 1000) as f32 + at as f32 / 8.0
                    })
                })
            })
            .collect();
        let keys = Tensor::from_vec(values, (1, 2, tokens.len(), 3), &Device::Cpu).unwrap();
        let values = (&keys * -1.0).unwrap();
        cache.append(layer as usize, &keys, &values).unwrap();
    }
    cache.commit(tokens);
    cache
}

fn contents(cache: &KvCache) -> Vec<Vec<f32>> {
    cache
        .prefix_tensors(cache.len())
        .unwrap()
        .into_iter()
        .flat_map(|(k, v)| [k, v])
        .map(|t| {
            let t = t.to_dtype(candle_core::DType::F32).unwrap();
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        })
        .collect()
}

fn open(root: &Path, budget_bytes: u64) -> PromptCache {
    PromptCache::open(root, budget_bytes, MODEL, KvDtype::F32).unwrap()
}

/// The block files of `cache`'s folder, sorted.
fn block_files(cache: &PromptCache) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(&cache.dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    files
}

fn file_bytes(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum()
}

/// Restore the longest stored prefix of `prompt` into a fresh cache, and
/// return the cache (empty when nothing was restored).
fn restored(cache: &PromptCache, prompt: &[u32]) -> KvCache {
    let mut into = empty_cache();
    if let Some(hit) = cache.longest_prefix(prompt).unwrap() {
        let count = cache.restore(&hit, &mut into).unwrap();
        assert_eq!(count, into.len());
    }
    into
}

/// `n` tokens from `first` on, cycling under the 64-token vocabulary of the
/// tiny models, with the token count mixed in so long runs do not repeat.
fn tokens(first: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| first + i * 7 % 61 + i / 61).collect()
}

/// The path of the block after `count` whole blocks of `prompt`.
fn path_of_block(cache: &PromptCache, prompt: &[u32], count: usize) -> PathBuf {
    let hit = cache.longest_prefix(prompt).unwrap().unwrap();
    cache.path_of(&hit.blocks[count])
}

#[test]
fn a_stored_prefix_comes_back_exactly_in_another_instance() {
    let dir = tempfile::tempdir().unwrap();
    let stored = tokens(1, 40);
    open(dir.path(), 1 << 20).store(&cache_of(&stored)).unwrap();

    let later = open(dir.path(), 1 << 20);
    let mut prompt = stored[..30].to_vec();
    prompt.extend([99, 99, 99]);
    let hit = later.longest_prefix(&prompt).unwrap().unwrap();
    assert_eq!(hit.matched, 30);
    let mut cache = empty_cache();
    assert_eq!(later.restore(&hit, &mut cache).unwrap(), 30);
    assert_eq!(cache.tokens(), &stored[..30]);
    assert_eq!(contents(&cache), contents(&cache_of(&stored[..30])));
    assert_eq!(later.longest_prefix(&[99, 1]).unwrap(), None);
}

#[test]
fn a_chain_of_several_blocks_comes_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let stored = tokens(3, 2 * BLOCK_TOKENS + 77);
    cache.store(&cache_of(&stored)).unwrap();
    assert_eq!(block_files(&cache).len(), 3);
    let mut prompt = stored[..2 * BLOCK_TOKENS + 10].to_vec();
    prompt.push(999);
    let back = restored(&cache, &prompt);
    assert_eq!(back.tokens(), &prompt[..2 * BLOCK_TOKENS + 10]);
    assert_eq!(contents(&back), contents(&cache_of(back.tokens())));
}

/// An 8-bit cache's blocks hold its integers and scales as they were, and
/// a cache of another dtype does not see them.
#[test]
fn an_8_bit_cache_comes_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let stored_tokens = tokens(1, BLOCK_TOKENS + 12);
    let stored = cache_in(KvDtype::Q8, &stored_tokens);
    let q8 = PromptCache::open(dir.path(), 1 << 30, MODEL, KvDtype::Q8).unwrap();
    q8.store(&stored).unwrap();

    let bytes = |cache: &KvCache| -> Vec<Vec<u8>> {
        let layers = cache.prefix_tensors(cache.len()).unwrap();
        let tensors = layers.into_iter().flat_map(|(k, v)| [k, v]);
        tensors
            .map(|t| t.flatten_all().unwrap().to_vec1::<u8>().unwrap())
            .collect()
    };
    let later = PromptCache::open(dir.path(), 1 << 30, MODEL, KvDtype::Q8).unwrap();
    let hit = later.longest_prefix(&stored_tokens).unwrap().unwrap();
    let mut back = empty_cache_of(KvDtype::Q8);
    assert_eq!(later.restore(&hit, &mut back).unwrap(), stored_tokens.len());
    assert_eq!(bytes(&back), bytes(&stored));
    let floats = open(dir.path(), 1 << 30);
    assert_eq!(floats.longest_prefix(&stored_tokens).unwrap(), None);
}

#[test]
fn the_longest_matching_chain_wins() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 20);
    cache.store(&cache_of(&[1, 2, 3, 4, 5, 6])).unwrap();
    cache.store(&cache_of(&[1, 2, 9, 9])).unwrap();
    let hit = cache.longest_prefix(&[1, 2, 3, 4, 8]).unwrap().unwrap();
    assert_eq!(hit.matched, 4);
    let hit = cache.longest_prefix(&[1, 2, 9, 9, 9]).unwrap().unwrap();
    assert_eq!(hit.matched, 4);
}

#[test]
fn a_longer_partial_block_replaces_its_prefix_and_a_prefix_adds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 20);
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    cache.store(&cache_of(&[1, 2, 3, 4, 5])).unwrap();
    assert_eq!(block_files(&cache).len(), 1);
    cache.store(&cache_of(&[1, 2])).unwrap();
    assert_eq!(block_files(&cache).len(), 1);
    let hit = cache.longest_prefix(&[1, 2, 3, 4, 5]).unwrap().unwrap();
    assert_eq!(hit.matched, 5);
}

/// Two sequences that share two blocks and then differ: the second writes
/// only its own last block, and both restore whole.
#[test]
fn chains_that_share_a_prefix_share_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let shared = tokens(2, 2 * BLOCK_TOKENS);
    let first = [shared.clone(), tokens(5, 40)].concat();
    let second = [shared.clone(), tokens(9, 100)].concat();
    cache.store(&cache_of(&first)).unwrap();
    let after_first = block_files(&cache);
    assert_eq!(after_first.len(), 3);
    cache.store(&cache_of(&second)).unwrap();
    let after_second = block_files(&cache);
    assert_eq!(after_second.len(), 4);
    let whole_block = std::fs::metadata(&after_first[0]).unwrap().len().max(
        std::fs::metadata(&after_first[1])
            .unwrap()
            .len()
            .max(std::fs::metadata(&after_first[2]).unwrap().len()),
    );
    // The second sequence added one block of 100 tokens, less than a whole one.
    let added = file_bytes(&after_second) - file_bytes(&after_first);
    assert!(added < whole_block, "{added} >= {whole_block}");
    for sequence in [&first, &second] {
        let back = restored(&cache, sequence);
        assert_eq!(back.tokens(), &sequence[..]);
        assert_eq!(contents(&back), contents(&cache_of(sequence)));
    }
}

#[cfg(unix)]
#[test]
fn an_extension_writes_only_its_new_blocks() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let long = tokens(4, 2 * BLOCK_TOKENS + 30);
    cache.store(&cache_of(&long[..BLOCK_TOKENS + 20])).unwrap();
    let first_block = path_of_block(&cache, &long, 0);
    let inode = std::fs::metadata(&first_block).unwrap().ino();
    assert_eq!(block_files(&cache).len(), 2);

    cache.store(&cache_of(&long)).unwrap();
    // The first block is the same file; the partial block of 20 tokens
    // gave way to the whole second block, and the last 30 are a new block.
    assert_eq!(std::fs::metadata(&first_block).unwrap().ino(), inode);
    assert_eq!(block_files(&cache).len(), 3);
    assert_eq!(restored(&cache, &long).tokens(), &long[..]);
}

#[test]
fn a_corrupt_block_is_refused_deleted_and_the_blocks_before_it_restored() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let stored = tokens(1, 2 * BLOCK_TOKENS + 5);
    cache.store(&cache_of(&stored)).unwrap();
    let second = path_of_block(&cache, &stored, 1);
    let mut bytes = std::fs::read(&second).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&second, bytes).unwrap();

    let hit = cache.longest_prefix(&stored).unwrap().unwrap();
    assert_eq!(hit.matched, stored.len());
    let mut back = empty_cache();
    assert_eq!(cache.restore(&hit, &mut back).unwrap(), BLOCK_TOKENS);
    assert_eq!(back.tokens(), &stored[..BLOCK_TOKENS]);
    assert_eq!(
        contents(&back),
        contents(&cache_of(&stored[..BLOCK_TOKENS]))
    );
    // The bad block went, and the block after it, which needs it.
    assert!(!second.exists());
    assert_eq!(block_files(&cache).len(), 1);
    let hit = cache.longest_prefix(&stored).unwrap().unwrap();
    assert_eq!(hit.matched, BLOCK_TOKENS);
    // Rebuilt on the next store.
    cache.store(&cache_of(&stored)).unwrap();
    assert_eq!(restored(&cache, &stored).tokens(), &stored[..]);
}

#[test]
fn a_block_that_does_not_beat_memory_leaves_the_cache_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let stored = tokens(1, BLOCK_TOKENS + 5);
    cache.store(&cache_of(&stored)).unwrap();
    let first = path_of_block(&cache, &stored, 0);
    std::fs::write(&first, b"not a block").unwrap();
    let hit = cache.longest_prefix(&stored).unwrap().unwrap();
    let mut held = cache_of(&[5, 5]);
    assert_eq!(cache.restore(&hit, &mut held).unwrap(), 0);
    assert_eq!(held.tokens(), [5, 5]);
    assert!(block_files(&cache).is_empty());
}

#[test]
fn a_truncated_block_is_refused_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let stored = tokens(1, 2 * BLOCK_TOKENS);
    cache.store(&cache_of(&stored)).unwrap();
    let second = path_of_block(&cache, &stored, 1);
    let bytes = std::fs::read(&second).unwrap();
    std::fs::write(&second, &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(restored(&cache, &stored).len(), BLOCK_TOKENS);
    assert!(!second.exists());
}

/// A block file of another model, or of this model's 16-bit cache, put in
/// place of one of this model's: refused, deleted, and only the blocks
/// before it restored.
#[test]
fn a_foreign_block_is_refused_even_under_this_models_key() {
    let dir = tempfile::tempdir().unwrap();
    let stored = tokens(1, 2 * BLOCK_TOKENS);
    let ours = open(dir.path(), 1 << 30);
    let other_model = PromptCache::open(dir.path(), 1 << 30, OTHER_MODEL, KvDtype::F32).unwrap();
    let half = PromptCache::open(dir.path(), 1 << 30, MODEL, KvDtype::F16).unwrap();
    other_model.store(&cache_of(&stored)).unwrap();
    half.store(&cache_in(KvDtype::F16, &stored)).unwrap();
    let mut half_back = empty_cache_of(KvDtype::F16);
    let hit = half.longest_prefix(&stored).unwrap().unwrap();
    assert_eq!(half.restore(&hit, &mut half_back).unwrap(), stored.len());

    for theirs in [&other_model, &half] {
        ours.store(&cache_of(&stored)).unwrap();
        let target = path_of_block(&ours, &stored, 1);
        std::fs::copy(path_of_block(theirs, &stored, 1), &target).unwrap();
        assert_eq!(restored(&ours, &stored).len(), BLOCK_TOKENS);
        assert!(!target.exists());
    }
}

#[test]
fn a_block_of_another_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 20);
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    let hit = cache.longest_prefix(&[1, 2, 3]).unwrap().unwrap();
    let mut wider = KvCache::new(2, 2, 4, 4096, KvDtype::F32, &Device::Cpu);
    assert_eq!(cache.restore(&hit, &mut wider).unwrap(), 0);
    assert!(wider.is_empty());
    let mut fewer_layers = KvCache::new(1, 2, 3, 4096, KvDtype::F32, &Device::Cpu);
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    let hit = cache.longest_prefix(&[1, 2, 3]).unwrap().unwrap();
    assert_eq!(cache.restore(&hit, &mut fewer_layers).unwrap(), 0);
    assert_eq!(cache.longest_prefix(&[1, 2, 3]).unwrap(), None);
}

/// Chains A and B share their first block; C shares nothing. With room for
/// four blocks of the five, the least recently used leaf goes, A's second
/// block: the shared first block stays, since B follows it, and A restores
/// as far as that.
#[test]
fn eviction_drops_least_recently_used_leaves_and_keeps_what_kept_chains_need() {
    let dir = tempfile::tempdir().unwrap();
    let shared = tokens(1, BLOCK_TOKENS);
    let a = [shared.clone(), tokens(2, BLOCK_TOKENS)].concat();
    let b = [shared.clone(), tokens(3, BLOCK_TOKENS)].concat();
    let c = tokens(4, 2 * BLOCK_TOKENS);
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = open(probe_dir.path(), 1 << 30);
    probe.store(&cache_of(&a)).unwrap();
    let block_bytes = file_bytes(&block_files(&probe)) / 2;

    let cache = open(dir.path(), 4 * block_bytes + block_bytes / 2);
    cache.store(&cache_of(&a)).unwrap();
    cache.store(&cache_of(&b)).unwrap();
    assert_eq!(restored(&cache, &b).len(), b.len());
    cache.store(&cache_of(&c)).unwrap();

    assert_eq!(block_files(&cache).len(), 4);
    assert_eq!(restored(&cache, &a).tokens(), &shared[..]);
    assert_eq!(restored(&cache, &b).tokens(), &b[..]);
    assert_eq!(restored(&cache, &c).tokens(), &c[..]);
}

/// The policy alone: an old block that a newer leaf follows is never
/// chosen, however old; its leaf goes first, then it.
#[test]
fn eviction_takes_leaves_first_whatever_their_parents_age() {
    let entry = |parent: Option<&str>, last_used| BlockEntry {
        parent: parent.map(str::to_string),
        tokens: vec![1],
        bytes: 10,
        last_used,
        used_at_unix: 0,
    };
    let mut index = Index::new(FORMAT, MODEL, "f32");
    index.blocks.insert("root".into(), entry(None, 1));
    index.blocks.insert("child".into(), entry(Some("root"), 5));
    index.blocks.insert("other".into(), entry(None, 3));
    assert_eq!(index.evictions(30), Vec::<String>::new());
    assert_eq!(index.evictions(20), ["other"]);
    assert_eq!(index.evictions(10), ["other", "child"]);
    assert_eq!(index.evictions(0), ["other", "child", "root"]);
}

#[test]
fn a_sequence_larger_than_the_budget_is_stored_as_far_as_it_fits() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 100);
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    assert!(block_files(&cache).is_empty());

    let long = tokens(1, 3 * BLOCK_TOKENS);
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = open(probe_dir.path(), 1 << 30);
    probe.store(&cache_of(&long)).unwrap();
    let first_two = [0, 1].map(|n| path_of_block(&probe, &long, n));
    let cache = open(dir.path(), file_bytes(&first_two) + 1);
    cache.store(&cache_of(&long)).unwrap();
    assert_eq!(restored(&cache, &long).len(), 2 * BLOCK_TOKENS);
}

#[test]
fn an_unreadable_index_starts_afresh_and_drops_the_blocks_it_named() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 20);
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    std::fs::write(cache.dir.join(index::INDEX), "{ not json").unwrap();
    assert_eq!(cache.longest_prefix(&[1, 2, 3]).unwrap(), None);
    assert!(block_files(&cache).is_empty());
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    let hit = cache.longest_prefix(&[1, 2, 3]).unwrap().unwrap();
    assert_eq!(hit.matched, 3);
}

/// A folder of the single-entry format that came before blocks: its index
/// is not read and its files are removed.
#[test]
fn an_old_single_entry_folder_is_ignored_and_emptied() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 20);
    let old_index = r#"{"format":"prism-kv-1","clock":1,"entries":[{"key":"00","tokens":[1,2,3],
        "bytes":4,"sha256":"00","last_used":1}]}"#;
    std::fs::write(cache.dir.join(index::INDEX), old_index).unwrap();
    std::fs::write(cache.dir.join("00.safetensors"), b"old").unwrap();
    assert_eq!(cache.longest_prefix(&[1, 2, 3]).unwrap(), None);
    assert!(block_files(&cache).is_empty());
}

/// Two threads, each with its own handle on one directory, store chains
/// that share a first block and chains that are all their own, at once.
/// Afterwards the index lists every block and every check passes.
#[test]
fn concurrent_writers_lose_none_of_each_others_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let shared = tokens(1, BLOCK_TOKENS);
    let sequences = |writer: u32| -> Vec<Vec<u32>> {
        (0..4u32)
            .map(|i| [shared.clone(), tokens(10 + 3 * i + writer, 40 + i as usize)].concat())
            .chain([tokens(50 + writer, BLOCK_TOKENS + 9)])
            .collect()
    };
    std::thread::scope(|scope| {
        for writer in 0..2 {
            let (root, sequences) = (dir.path(), sequences(writer));
            scope.spawn(move || {
                let cache = open(root, 1 << 30);
                for sequence in &sequences {
                    cache.store(&cache_of(sequence)).unwrap();
                }
            });
        }
    });
    let cache = open(dir.path(), 1 << 30);
    // One shared block, and per writer four tails and a chain of two.
    let folders = survey::list(dir.path()).unwrap();
    assert_eq!(folders.len(), 1);
    assert_eq!(folders[0].blocks, 1 + 2 * (4 + 2));
    assert_eq!(block_files(&cache).len(), folders[0].blocks);
    let verified = survey::verify(dir.path()).unwrap();
    assert!(verified.is_sound(), "{:?}", verified.bad);
    assert_eq!(verified.blocks_checked, folders[0].blocks);
    for sequence in sequences(0).iter().chain(&sequences(1)) {
        assert_eq!(restored(&cache, sequence).tokens(), &sequence[..]);
    }
}

#[test]
fn list_shows_each_chain_with_its_blocks_tokens_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let shared = tokens(1, BLOCK_TOKENS);
    cache
        .store(&cache_of(&[shared.clone(), vec![7; 10]].concat()))
        .unwrap();
    cache
        .store(&cache_of(&[shared.clone(), vec![8; 20]].concat()))
        .unwrap();
    let folders = survey::list(dir.path()).unwrap();
    let [folder] = &folders[..] else {
        panic!("{folders:?}")
    };
    assert_eq!(folder.model_sha256, MODEL);
    assert_eq!((folder.blocks, folder.tokens), (3, BLOCK_TOKENS + 30));
    assert_eq!(folder.bytes, file_bytes(&block_files(&cache)));
    let mut tokens: Vec<usize> = folder.chains.iter().map(|c| c.tokens).collect();
    tokens.sort();
    assert_eq!(tokens, [BLOCK_TOKENS + 10, BLOCK_TOKENS + 20]);
    assert!(folder.chains.iter().all(|c| c.blocks == 2));
}

#[test]
fn verify_removes_a_bad_block_and_those_after_it_then_finds_the_store_sound() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let stored = tokens(1, 3 * BLOCK_TOKENS);
    cache.store(&cache_of(&stored)).unwrap();
    let second = path_of_block(&cache, &stored, 1);
    let mut bytes = std::fs::read(&second).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(&second, bytes).unwrap();
    std::fs::write(cache.dir.join("stray.safetensors"), b"x").unwrap();

    let verified = survey::verify(dir.path()).unwrap();
    assert!(!verified.is_sound());
    assert_eq!(verified.blocks_checked, 3);
    assert_eq!(verified.bad.len(), 2, "{:?}", verified.bad);
    assert_eq!(verified.also_removed, 1);
    assert_eq!(block_files(&cache).len(), 1);
    let again = survey::verify(dir.path()).unwrap();
    assert!(again.is_sound(), "{:?}", again.bad);
    assert_eq!(restored(&cache, &stored).len(), BLOCK_TOKENS);
}

#[test]
fn clear_removes_every_block_and_index() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    cache
        .store(&cache_of(&tokens(1, BLOCK_TOKENS + 1)))
        .unwrap();
    let cleared = survey::clear(dir.path()).unwrap();
    assert_eq!((cleared.folders, cleared.files), (1, 3));
    assert!(block_files(&cache).is_empty());
    assert_eq!(cache.longest_prefix(&tokens(1, 10)).unwrap(), None);
}

#[test]
fn a_shared_prefix_is_stored_as_its_whole_blocks_only() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path(), 1 << 30);
    let sequence = tokens(5, 3 * BLOCK_TOKENS + 40);
    let shared = 2 * BLOCK_TOKENS + 100;
    cache.store_prefix(&cache_of(&sequence), shared).unwrap();
    assert_eq!(block_files(&cache).len(), 2);
    let back = restored(&cache, &sequence);
    assert_eq!(back.tokens(), &sequence[..2 * BLOCK_TOKENS]);
    assert_eq!(contents(&back), contents(&cache_of(back.tokens())));

    // The prefix grown by a few tokens, as a memory is by one more
    // revision, writes nothing new until it fills another block.
    let grown = [&sequence[..shared], &[60, 61, 62]].concat();
    cache.store_prefix(&cache_of(&grown), shared + 3).unwrap();
    assert_eq!(block_files(&cache).len(), 2);

    // Less than one block is not stored at all.
    let other_dir = tempfile::tempdir().unwrap();
    let other = open(other_dir.path(), 1 << 30);
    other
        .store_prefix(&cache_of(&sequence), BLOCK_TOKENS - 1)
        .unwrap();
    assert!(block_files(&other).is_empty());
}
