//! What a model is loaded from: one GGUF file, or a Hugging Face style directory
//! (which file a model name means is the job of `models`, above the engine).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// What `--model` resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// One GGUF file: weights, tokenizer and chat template together.
    Gguf { path: PathBuf, name: String },
    /// A Hugging Face style directory: config.json, tokenizer.json, *.safetensors.
    HfDir { dir: PathBuf, name: String },
}

impl ModelSource {
    /// A short name for reports: the manifest name, repo id, or file/directory name.
    pub fn name(&self) -> &str {
        match self {
            ModelSource::Gguf { name, .. } | ModelSource::HfDir { name, .. } => name,
        }
    }

    /// The GGUF file or the model directory.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Gguf { path, .. } => path,
            ModelSource::HfDir { dir, .. } => dir,
        }
    }
}

/// sha256 of everything `reader` yields, copied on into `writer` as it is
/// read, so a download can be saved and hashed in one pass.
pub fn sha256_copy(mut reader: impl Read, mut writer: impl Write) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        hasher.update(&buffer[..read]);
        writer.write_all(&buffer[..read])?;
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let file = File::open(path).map_err(|err| Error::io(path, err))?;
    sha256_copy(file, io::sink()).map_err(|err| Error::io(path, err))
}
