//! Reads the text file to be summarized into one normalized `String`, refusing
//! anything that is not readable UTF-8 prose with a one-line error naming the path.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::{Error, Result, Setting};

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The default bound on a document's size. 16 MiB of text is some four
/// million tokens, thirty long novels, and days of work on a CPU; reading
/// and tokenizing it takes about 1.6 GB (100 bytes a byte of text, measured
/// on 13 MB of Frankenstein repeated).
pub const MAX_DOCUMENT_BYTES: u64 = 16 << 20;

/// A file where more than this share of bytes are control characters (other than
/// tab, line feed, carriage return and form feed) is treated as binary.
const MAX_CONTROL_SHARE: f64 = 0.05;

/// The documents `paths` name, in order: a file stands for itself, a
/// directory for the files directly in it, by name (hidden ones skipped).
/// A directory with no such file is an error, so a mistyped folder is not
/// an empty sweep.
pub fn expand_directories(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut documents = Vec::new();
    for path in paths {
        if !path.is_dir() {
            documents.push(path.clone());
            continue;
        }
        let files: Vec<PathBuf> = visible_entries(path)?
            .into_iter()
            .filter(|entry| entry.is_file())
            .collect();
        if files.is_empty() {
            return Err(Error::invalid(
                path.display().to_string(),
                "is a directory with no documents in it",
            ));
        }
        documents.extend(files);
    }
    Ok(documents)
}

/// What opens each file when several are read as one document, followed by
/// the file's path and ` ===`. The chunker cuts before it first, so a chunk
/// holds whole files wherever they fit.
pub const FILE_HEADER: &str = "=== File: ";

/// Read `paths` as one document, in order: a single file is read as it is;
/// otherwise each file comes under a [`FILE_HEADER`] line with its path, and
/// a directory stands for every text file below it, by path (hidden entries
/// and files that are not UTF-8 text are left out). `max_bytes` bounds the
/// whole.
pub fn read_sources(paths: &[PathBuf], max_bytes: u64) -> Result<String> {
    if let [path] = paths {
        if !path.is_dir() {
            return read_document(path, max_bytes);
        }
    }
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let start = files.len();
            collect_tree(path, path, &mut files)?;
            if files.len() == start {
                return Err(Error::invalid(
                    path.display().to_string(),
                    "is a directory with no files in it",
                ));
            }
        } else {
            files.push((path.clone(), path.display().to_string(), true));
        }
    }
    let too_large = || {
        Error::invalid(
            "the documents",
            format!(
                "are larger than {} MiB together; raise {}",
                max_bytes as f64 / f64::from(1 << 20),
                Setting::MaxDocumentBytes
            ),
        )
    };
    let mut document = String::new();
    for (path, name, given) in files {
        let size = fs::metadata(&path)
            .map_err(|err| Error::io(&path, err))?
            .len();
        if document.len() as u64 + size > max_bytes {
            return Err(too_large());
        }
        let text = match read_document(&path, max_bytes) {
            Ok(text) => text,
            // A file of a directory that is not text (an image, a compiled
            // file) is skipped, as `git grep` skips binaries.
            Err(Error::InvalidInput { .. }) if !given => continue,
            Err(err) => return Err(err),
        };
        if !document.is_empty() {
            document.push('\n');
        }
        document.push_str(&format!("{FILE_HEADER}{name} ===\n{}\n", text.trim_end()));
    }
    if document.len() as u64 > max_bytes {
        return Err(too_large());
    }
    if document.is_empty() {
        return Err(Error::invalid(
            "the documents",
            "hold no text file (binary and empty files are left out)",
        ));
    }
    Ok(document)
}

/// The entries of `dir` whose names do not start with a dot, sorted.
fn visible_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(|err| Error::io(dir, err))? {
        let entry = entry.map_err(|err| Error::io(dir, err))?;
        if !entry.file_name().to_string_lossy().starts_with('.') {
            entries.push(entry.path());
        }
    }
    entries.sort();
    Ok(entries)
}

/// Every visible file below `dir`, sorted by its path relative to `root`,
/// as (path, that relative name, named by the user: false). A link to a
/// directory is not followed: one that points back up the tree would
/// make the walk endless.
fn collect_tree(root: &Path, dir: &Path, files: &mut Vec<(PathBuf, String, bool)>) -> Result<()> {
    for path in visible_entries(dir)? {
        let linked = fs::symlink_metadata(&path).is_ok_and(|meta| meta.file_type().is_symlink());
        if path.is_dir() {
            if !linked {
                collect_tree(root, &path, files)?;
            }
        } else if path.is_file() {
            let name = path.strip_prefix(root).unwrap_or(&path);
            let name = name.to_string_lossy().replace('\\', "/");
            files.push((path, name, false));
        }
    }
    Ok(())
}

/// Read the document at `path` as UTF-8 text, without a BOM and with LF line ends.
///
/// That is all the normalization: everything else, including lone `\r`, tabs and
/// leading or trailing blank lines, is kept byte for byte, so chunk offsets map back
/// onto the file as the user sees it (shifted only by the BOM and the removed `\r`s).
///
/// Fails, naming the path, when the file is missing, is a directory or not a
/// regular file, is larger than `max_bytes`, is empty or
/// whitespace only, is UTF-16, looks binary (a NUL byte, or many control
/// characters), or is not valid UTF-8 (the error gives the byte offset of the
/// first bad byte in the file).
pub fn read_document(path: &Path, max_bytes: u64) -> Result<String> {
    let refuse = |reason: String| Error::invalid(path.display().to_string(), reason);

    // fs::read on a directory fails with an unhelpful OS message on some platforms
    // ("Is a directory" on Linux, "Access is denied" on Windows), so ask first.
    let metadata = fs::metadata(path).map_err(|err| Error::io(path, err))?;
    if metadata.is_dir() {
        return Err(refuse("is a directory, not a text file".into()));
    }
    if !metadata.is_file() {
        return Err(refuse(
            "is not a regular file (a device, pipe or socket); save the text to a file first"
                .into(),
        ));
    }
    // Read through the bound rather than trusting the size: the file may
    // grow while it is read.
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|file| {
            file.take(max_bytes.saturating_add(1))
                .read_to_end(&mut bytes)
        })
        .map_err(|err| Error::io(path, err))?;
    if bytes.len() as u64 > max_bytes {
        return Err(refuse(format!(
            "is larger than {} MiB; split it, or raise {}",
            max_bytes as f64 / f64::from(1 << 20),
            Setting::MaxDocumentBytes
        )));
    }

    if bytes.starts_with(b"\xFF\xFE") || bytes.starts_with(b"\xFE\xFF") {
        return Err(refuse("is UTF-16 text; convert it to UTF-8 first".into()));
    }
    let (bom_len, body) = match bytes.strip_prefix(UTF8_BOM) {
        Some(rest) => (UTF8_BOM.len(), rest),
        None => (0, &bytes[..]),
    };
    if body.is_empty() {
        return Err(refuse("is empty".into()));
    }
    if let Some(offset) = body.iter().position(|&b| b == 0) {
        return Err(refuse(format!(
            "looks like a binary file, not text (NUL byte at offset {})",
            bom_len + offset
        )));
    }
    let control = body.iter().filter(|&&b| is_suspect_control(b)).count();
    if control as f64 > MAX_CONTROL_SHARE * body.len() as f64 {
        return Err(refuse(format!(
            "looks like a binary file, not text ({control} of {} bytes are control characters)",
            body.len()
        )));
    }
    let text = std::str::from_utf8(body).map_err(|err| {
        refuse(format!(
            "is not valid UTF-8 (bad byte at offset {}); convert it to UTF-8 first",
            bom_len + err.valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(refuse("is empty (whitespace only)".into()));
    }
    Ok(text.replace("\r\n", "\n"))
}

/// The ebook's own text when `text` is a Project Gutenberg file: what lies
/// between its "*** START OF THE PROJECT GUTENBERG EBOOK … ***" and "*** END
/// OF …" lines. None when it has no such pair of lines, or nothing between.
///
/// The archive's header and licence are not the book's. The licence is a
/// sixth of the Sabotage manual's words: summaries retold it in their last
/// paragraphs, and five of the twenty questions `qa generate` wrote from the
/// whole file asked about it.
pub fn gutenberg_body(text: &str) -> Option<&str> {
    let marker = |line: &str, word: &str| {
        let line = line.trim().to_ascii_uppercase();
        line.starts_with("***") && line.contains(word) && line.contains("PROJECT GUTENBERG")
    };
    let mut start = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let line_start = offset;
        offset += line.len();
        match start {
            None if marker(line, "START OF") => start = Some(offset),
            Some(body_start) if marker(line, "END OF") => {
                let body = &text[body_start..line_start];
                return (!body.trim().is_empty()).then_some(body);
            }
            _ => {}
        }
    }
    None
}

/// `text` as prism summarizes it: of a Project Gutenberg ebook only the
/// book ([`gutenberg_body`]) unless `whole_file`, else all of it.
pub fn book_text(text: String, whole_file: bool) -> String {
    match gutenberg_body(&text) {
        Some(body) if !whole_file => body.to_string(),
        _ => text,
    }
}

/// ASCII control bytes that do not occur in ordinary text files.
fn is_suspect_control(byte: u8) -> bool {
    matches!(byte, 0x00..=0x08 | 0x0B | 0x0E..=0x1F | 0x7F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_stand_for_their_visible_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let books = dir.path().join("books");
        fs::create_dir(&books).unwrap();
        for name in ["b.txt", "a.txt", ".hidden"] {
            fs::write(books.join(name), "text").unwrap();
        }
        fs::create_dir(books.join("nested")).unwrap();
        let single = dir.path().join("single.txt");
        fs::write(&single, "text").unwrap();
        let expanded = expand_directories(&[single.clone(), books.clone()]).unwrap();
        assert_eq!(expanded, [single, books.join("a.txt"), books.join("b.txt")]);
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        let err = expand_directories(&[empty]).unwrap_err().to_string();
        assert!(
            err.ends_with("is a directory with no documents in it"),
            "{err}"
        );
    }

    #[test]
    fn a_tree_is_read_as_one_document_with_a_header_per_text_file() {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("pkg");
        fs::create_dir_all(package.join("sub")).unwrap();
        fs::write(package.join("b.py"), "def b():\n    return 2\n\n\n").unwrap();
        fs::write(package.join("a.py"), "def a():\n    return 1\n").unwrap();
        fs::write(package.join("sub/c.py"), "C = 3").unwrap();
        fs::write(package.join("logo.png"), b"\x89PNG\x00\x00").unwrap();
        fs::write(package.join(".hidden.py"), "secret").unwrap();
        // A link back up the tree is not followed, so the walk ends.
        #[cfg(unix)]
        std::os::unix::fs::symlink(&package, package.join("sub/loop")).unwrap();
        let text = read_sources(std::slice::from_ref(&package), MAX_DOCUMENT_BYTES).unwrap();
        assert_eq!(
            text,
            "=== File: a.py ===\ndef a():\n    return 1\n\n\
             === File: b.py ===\ndef b():\n    return 2\n\n\
             === File: sub/c.py ===\nC = 3\n"
        );
        // One file alone is read as it is, headerless, as `summarize` reads it.
        let alone = read_sources(&[package.join("a.py")], MAX_DOCUMENT_BYTES).unwrap();
        assert_eq!(alone, "def a():\n    return 1\n");
        // A binary file the user names is refused, not skipped.
        let named = [package.join("a.py"), package.join("logo.png")];
        let err = read_sources(&named, MAX_DOCUMENT_BYTES).unwrap_err();
        assert!(err.to_string().contains("logo.png"), "{err}");
        let err = read_sources(&[package], 40).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        fs::write(&path, bytes).expect("write fixture");
        path
    }

    /// The error as the user sees it: one line that names the file.
    fn message(path: &Path) -> String {
        let err = read_document(path, MAX_DOCUMENT_BYTES).expect_err("should be refused");
        let text = err.to_string();
        assert!(!text.contains('\n'), "one line: {text}");
        assert!(
            text.contains(&path.display().to_string()),
            "names path: {text}"
        );
        text
    }

    #[test]
    fn a_gutenberg_file_is_read_between_its_start_and_end_lines() {
        let ebook = "The Project Gutenberg eBook of A Manual\n\
            *** START OF THE PROJECT GUTENBERG EBOOK A MANUAL ***\n\
            \n\
            Chapter 1. Slow the work.\n\
            *** END OF THE PROJECT GUTENBERG EBOOK A MANUAL ***\n\
            Section 1. The licence.\n";
        assert_eq!(gutenberg_body(ebook), Some("\nChapter 1. Slow the work.\n"));
        // Older files say "this", and some write the markers in lower case.
        let older = "*** Start of this Project Gutenberg EBook X ***\nText.\n*** End of this Project Gutenberg EBook X ***";
        assert_eq!(gutenberg_body(older), Some("Text.\n"));
        assert_eq!(gutenberg_body("A plain log.\n"), None);
        let unended = "*** START OF THE PROJECT GUTENBERG EBOOK X ***\nText.\n";
        assert_eq!(gutenberg_body(unended), None);
        let empty = "*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n";
        assert_eq!(gutenberg_body(empty), None);
    }

    #[test]
    fn reads_plain_text_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let text = "Chapter 1\n\nIt was a dark night.\tTabs stay.\n";
        let path = write(&dir, "a.txt", text.as_bytes());
        assert_eq!(read_document(&path, MAX_DOCUMENT_BYTES).unwrap(), text);
    }

    #[test]
    fn strips_bom_and_crlf() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "a.txt", b"\xEF\xBB\xBFone\r\ntwo\r\n\r\nthree\rfour");
        // A lone CR is not a line end we rewrite; only CRLF pairs become LF.
        assert_eq!(
            read_document(&path, MAX_DOCUMENT_BYTES).unwrap(),
            "one\ntwo\n\nthree\rfour"
        );
    }

    #[test]
    fn keeps_multibyte_text() {
        let dir = tempfile::tempdir().unwrap();
        let text = "Übermensch — 東京 🙂\n";
        let path = write(&dir, "a.txt", text.as_bytes());
        assert_eq!(read_document(&path, MAX_DOCUMENT_BYTES).unwrap(), text);
    }

    #[test]
    fn missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.txt");
        message(&path);
        let err = read_document(&path, MAX_DOCUMENT_BYTES).unwrap_err();
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{err:?}"
        );
    }

    #[test]
    fn directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(message(dir.path()).contains("is a directory"));
    }

    #[test]
    fn empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "empty.txt", b"");
        assert!(message(&path).contains("is empty"));
        let path = write(&dir, "bom-only.txt", UTF8_BOM);
        assert!(message(&path).contains("is empty"));
    }

    #[test]
    fn whitespace_only_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "blank.txt", b" \n\r\n\t \n");
        assert!(message(&path).contains("is empty"));
    }

    #[test]
    fn nul_byte_is_binary() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "a.bin", b"PK\x03\x04 text then\x00more");
        let text = message(&path);
        assert!(text.contains("binary"), "{text}");
        assert!(text.contains("offset 14"), "{text}");
    }

    #[test]
    fn many_control_bytes_is_binary() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = b"header".repeat(10);
        bytes.extend(std::iter::repeat_n(0x01u8, 20));
        let path = write(&dir, "a.bin", &bytes);
        assert!(message(&path).contains("binary"));
    }

    #[test]
    fn a_few_control_bytes_are_tolerated() {
        let dir = tempfile::tempdir().unwrap();
        // Form feeds (page breaks) and an escape or two turn up in real text dumps.
        let mut text = "word ".repeat(100);
        text.push('\x0C');
        text.push('\x1B');
        let path = write(&dir, "a.txt", text.as_bytes());
        assert_eq!(read_document(&path, MAX_DOCUMENT_BYTES).unwrap(), text);
    }

    #[test]
    fn utf16_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "wide.txt", b"\xFF\xFEh\x00i\x00");
        assert!(message(&path).contains("UTF-16"));
    }

    #[test]
    fn invalid_utf8_reports_offset() {
        let dir = tempfile::tempdir().unwrap();
        // Latin-1 "café": the é is the single byte 0xE9 at offset 3.
        let path = write(&dir, "latin1.txt", b"caf\xE9 au lait");
        let text = message(&path);
        assert!(text.contains("not valid UTF-8"), "{text}");
        assert!(text.contains("offset 3"), "{text}");
    }

    #[test]
    fn utf8_offset_counts_the_bom() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "a.txt", b"\xEF\xBB\xBFab\xFF");
        assert!(message(&path).contains("offset 5"));
    }

    #[cfg(unix)]
    #[test]
    fn a_device_is_refused() {
        let err = read_document(Path::new("/dev/zero"), MAX_DOCUMENT_BYTES).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_file_over_the_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "long.txt", &b"word ".repeat(1000));
        let err = read_document(&path, 4096).unwrap_err();
        assert!(err.to_string().contains("raise max_bytes"), "{err}");
        assert!(read_document(&path, 5000).is_ok());
    }
}
