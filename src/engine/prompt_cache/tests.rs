use super::*;
use candle_core::{Device, Tensor};

const MODEL: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER_MODEL: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn empty_cache() -> KvCache {
    KvCache::new(2, 2, 3, 4096, KvDtype::F32, &Device::Cpu)
}

/// A cache holding `tokens`, each position's keys and values derived from
/// its token id and layer so that a wrong restore shows.
fn cache_of(tokens: &[u32]) -> KvCache {
    let mut cache = empty_cache();
    let layers: Vec<(Tensor, Tensor)> = (0..2)
        .map(|layer| {
            let values: Vec<f32> = (0..2)
                .flat_map(|head| {
                    tokens.iter().flat_map(move |&t| {
                        (0..3).map(move |d| (t * 100 + head * 10 + d + layer * 1000) as f32)
                    })
                })
                .collect();
            let keys = Tensor::from_vec(values.clone(), (1, 2, tokens.len(), 3), &Device::Cpu);
            let values = Tensor::from_vec(values, (1, 2, tokens.len(), 3), &Device::Cpu).unwrap();
            (keys.unwrap(), (values * -1.0).unwrap())
        })
        .collect();
    cache.load_prefix(tokens, &layers).unwrap();
    cache
}

fn contents(cache: &KvCache) -> Vec<Vec<f32>> {
    cache
        .prefix_tensors(cache.len())
        .unwrap()
        .into_iter()
        .flat_map(|(k, v)| [k, v])
        .map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

fn entry_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join(&MODEL[..16]))
        .unwrap()
        .filter(|f| {
            f.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|e| e == "safetensors")
        })
        .count()
}

#[test]
fn a_stored_prefix_comes_back_exactly_in_another_instance() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (1..=40).collect();
    PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32)
        .unwrap()
        .store(&cache_of(&tokens))
        .unwrap();

    let later = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    let mut prompt = tokens[..30].to_vec();
    prompt.extend([7, 7, 7]);
    let hit = later.longest_prefix(&prompt).unwrap().unwrap();
    assert_eq!(hit.matched, 30);
    let mut cache = empty_cache();
    assert!(later.restore(&hit, &mut cache).unwrap());
    assert_eq!(cache.tokens(), &tokens[..30]);
    assert_eq!(contents(&cache), contents(&cache_of(&tokens[..30])));
    assert_eq!(later.longest_prefix(&[99, 1]).unwrap(), None);
}

/// An 8-bit cache's entry holds its integers and scales as they were, and
/// a cache of another dtype does not see it.
#[test]
fn an_8_bit_cache_comes_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (1..=12).collect();
    let mut stored = KvCache::new(2, 2, 3, 4096, KvDtype::Q8, &Device::Cpu);
    stored.reserve(tokens.len()).unwrap();
    let floats = cache_of(&tokens).prefix_tensors(tokens.len()).unwrap();
    for (layer, (keys, values)) in floats.iter().enumerate() {
        stored.append(layer, keys, values).unwrap();
    }
    stored.commit(&tokens);
    PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::Q8)
        .unwrap()
        .store(&stored)
        .unwrap();

    let bytes = |cache: &KvCache| -> Vec<Vec<u8>> {
        let layers = cache.prefix_tensors(cache.len()).unwrap();
        let tensors = layers.into_iter().flat_map(|(k, v)| [k, v]);
        tensors
            .map(|t| t.flatten_all().unwrap().to_vec1::<u8>().unwrap())
            .collect()
    };
    let later = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::Q8).unwrap();
    let hit = later.longest_prefix(&tokens).unwrap().unwrap();
    let mut restored = KvCache::new(2, 2, 3, 4096, KvDtype::Q8, &Device::Cpu);
    assert!(later.restore(&hit, &mut restored).unwrap());
    assert_eq!(restored.tokens(), &tokens[..]);
    assert_eq!(bytes(&restored), bytes(&stored));
    let floats = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    assert_eq!(floats.longest_prefix(&tokens).unwrap(), None);
}

#[test]
fn the_longest_matching_entry_wins() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    cache.store(&cache_of(&[1, 2, 3, 4, 5, 6])).unwrap();
    cache.store(&cache_of(&[1, 2, 9, 9])).unwrap();
    let hit = cache.longest_prefix(&[1, 2, 3, 4, 8]).unwrap().unwrap();
    assert_eq!(hit.matched, 4);
    let hit = cache.longest_prefix(&[1, 2, 9, 9, 9]).unwrap().unwrap();
    assert_eq!(hit.matched, 4);
}

#[test]
fn a_longer_sequence_replaces_its_prefix_and_a_prefix_adds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    cache.store(&cache_of(&[1, 2, 3, 4, 5])).unwrap();
    assert_eq!(entry_files(dir.path()), 1);
    cache.store(&cache_of(&[1, 2])).unwrap();
    assert_eq!(entry_files(dir.path()), 1);
    assert_eq!(
        cache
            .longest_prefix(&[1, 2, 3, 4, 5])
            .unwrap()
            .unwrap()
            .matched,
        5
    );
}

#[test]
fn a_corrupt_file_is_refused_deleted_and_the_cache_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    let tokens: Vec<u32> = (1..=20).collect();
    cache.store(&cache_of(&tokens)).unwrap();
    let path = cache.path_of(&token_key(&tokens));
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    let hit = cache.longest_prefix(&tokens).unwrap().unwrap();
    let mut restored = cache_of(&[5, 5]);
    assert!(!cache.restore(&hit, &mut restored).unwrap());
    assert_eq!(restored.tokens(), [5, 5]);
    assert!(!path.exists());
    assert_eq!(cache.longest_prefix(&tokens).unwrap(), None);
    // Rebuilt on the next store.
    cache.store(&cache_of(&tokens)).unwrap();
    assert!(cache
        .restore(
            &cache.longest_prefix(&tokens).unwrap().unwrap(),
            &mut restored
        )
        .unwrap());
}

#[test]
fn another_models_file_is_refused_even_under_this_models_index() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = PromptCache::open(dir.path(), 1 << 20, OTHER_MODEL, KvDtype::F32).unwrap();
    theirs.store(&cache_of(&[1, 2, 3])).unwrap();
    let ours = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    for file in std::fs::read_dir(&theirs.dir).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), ours.dir.join(file.file_name())).unwrap();
    }
    let hit = ours.longest_prefix(&[1, 2, 3]).unwrap().unwrap();
    assert!(!ours.restore(&hit, &mut empty_cache()).unwrap());
    assert_eq!(ours.longest_prefix(&[1, 2, 3]).unwrap(), None);
}

#[test]
fn a_file_of_another_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    let hit = cache.longest_prefix(&[1, 2, 3]).unwrap().unwrap();
    let mut wider = KvCache::new(2, 2, 4, 4096, KvDtype::F32, &Device::Cpu);
    assert!(!cache.restore(&hit, &mut wider).unwrap());
    assert!(wider.is_empty());
    let mut fewer_layers = KvCache::new(1, 2, 3, 4096, KvDtype::F32, &Device::Cpu);
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    let hit = cache.longest_prefix(&[1, 2, 3]).unwrap().unwrap();
    assert!(!cache.restore(&hit, &mut fewer_layers).unwrap());
    assert_eq!(cache.longest_prefix(&[1, 2, 3]).unwrap(), None);
}

#[test]
fn the_least_recently_used_entries_go_first_when_over_budget() {
    let dir = tempfile::tempdir().unwrap();
    let probe = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    let one_entry = probe.encode(&cache_of(&[1, 2, 3, 4])).unwrap().len() as u64;
    let cache = PromptCache::open(
        dir.path(),
        2 * one_entry + one_entry / 2,
        MODEL,
        KvDtype::F32,
    )
    .unwrap();
    cache.store(&cache_of(&[1, 1, 1, 1])).unwrap();
    cache.store(&cache_of(&[2, 2, 2, 2])).unwrap();
    // Using the first makes the second the least recently used.
    let hit = cache.longest_prefix(&[1, 1, 1, 1]).unwrap().unwrap();
    assert!(cache.restore(&hit, &mut empty_cache()).unwrap());
    cache.store(&cache_of(&[3, 3, 3, 3])).unwrap();
    assert_eq!(entry_files(dir.path()), 2);
    assert!(cache.longest_prefix(&[1, 1, 1, 1]).unwrap().is_some());
    assert_eq!(cache.longest_prefix(&[2, 2, 2, 2]).unwrap(), None);
    assert!(cache.longest_prefix(&[3, 3, 3, 3]).unwrap().is_some());
}

#[test]
fn a_sequence_larger_than_the_budget_is_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PromptCache::open(dir.path(), 100, MODEL, KvDtype::F32).unwrap();
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    assert_eq!(entry_files(dir.path()), 0);
}

#[test]
fn an_unreadable_index_starts_afresh_and_drops_the_files_it_named() {
    let dir = tempfile::tempdir().unwrap();
    let cache = PromptCache::open(dir.path(), 1 << 20, MODEL, KvDtype::F32).unwrap();
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    std::fs::write(cache.dir.join(INDEX), "{ not json").unwrap();
    assert_eq!(cache.longest_prefix(&[1, 2, 3]).unwrap(), None);
    assert_eq!(entry_files(dir.path()), 0);
    cache.store(&cache_of(&[1, 2, 3])).unwrap();
    assert_eq!(
        cache.longest_prefix(&[1, 2, 3]).unwrap().unwrap().matched,
        3
    );
}
