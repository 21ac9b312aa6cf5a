//! The flags several subcommands share besides the model's ([`super::EngineArgs`]
//! and [`super::BackendArgs`]): how a document is read, and sizes in bytes.

use anyhow::Result;
use clap::Args;

/// How large a document may be.
#[derive(Debug, Args)]
pub struct DocumentLimit {
    /// The largest document read, in MiB; a larger one is refused before it is read in full.
    #[arg(long, value_name = "MIB", default_value_t = prism::document::MAX_DOCUMENT_BYTES >> 20)]
    pub max_document_mib: u64,
}

/// How a document to summarize or question is read: within a size limit,
/// and of a Project Gutenberg ebook only the book unless asked otherwise.
#[derive(Debug, Args)]
pub struct DocumentArgs {
    #[command(flatten)]
    pub limit: DocumentLimit,
    /// Read a Project Gutenberg ebook whole, its header and licence included; by default
    /// only the text between its "*** START OF" and "*** END OF" lines is read.
    #[arg(long)]
    pub whole_file: bool,
}

impl DocumentArgs {
    /// Read the document at `path` within the limit, as prism summarizes it.
    pub fn read(&self, path: &std::path::Path) -> Result<String> {
        let file = self.limit.read(path)?;
        let file_bytes = file.len();
        let text = prism::document::book_text(file, self.whole_file);
        if text.len() < file_bytes {
            note!(
                "{}: reading the ebook between its Project Gutenberg START and END lines ({} of {} bytes; --whole-file reads it all)",
                path.display(),
                text.len(),
                file_bytes
            );
        }
        Ok(text)
    }

    /// Read `paths` as one document within the limit (`prism query`); one
    /// file is read as [`DocumentArgs::read`] reads it.
    pub fn read_sources(&self, paths: &[std::path::PathBuf]) -> Result<String> {
        match paths {
            [path] if !path.is_dir() => self.read(path),
            _ => self.limit.read_sources(paths),
        }
    }
}

impl DocumentLimit {
    /// The limit in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_document_mib.saturating_mul(1 << 20)
    }

    /// Read the document at `path` within this limit.
    pub fn read(&self, path: &std::path::Path) -> Result<String> {
        Ok(prism::document::read_document(path, self.max_bytes())?)
    }

    /// Read `paths` as one document within this limit (`prism query`).
    pub fn read_sources(&self, paths: &[std::path::PathBuf]) -> Result<String> {
        Ok(prism::document::read_sources(paths, self.max_bytes())?)
    }
}

/// A size in bytes: digits, then optionally `K`, `M` or `G` (binary units,
/// with or without a trailing `iB` or `B`).
pub(super) fn parse_size(s: &str) -> Result<usize, String> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[digits.len()..];
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("`{s}`: the unit must be K, M or G")),
    };
    let number: usize = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size such as 512M or 4G"))?;
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("2kb"), Ok(2048));
        assert!(parse_size("4T").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("-1M").is_err());
    }
}
