//! One summarization job: a document split for one chunk size, a method with its
//! settings, the sampling, and the run directory it writes.

use crate::chunk::Chunk;
use crate::engine::prompt_format::PromptFormat;
use crate::engine::sampling::SamplingConfig;
use crate::engine::GenerateOptions;
use crate::error::{Error, Result};
use crate::llm::{Backend, BackendIdentity};
use crate::methods::{MethodFigures, MethodSpec};
use crate::run::dir::{fingerprint, RunDir};
use crate::run::{Outcome, Progress, RunFiles};
use sha2::{Digest, Sha256};
use std::path::Path;

/// A document split into chunks for one chunk size.
pub struct Document {
    pub sha256: String,
    /// Tokens of the whole text.
    pub tokens: usize,
    /// Tokens of the part the chunks hold: `tokens` unless `first_tokens`
    /// left chunks out. (The chunks' own counts can add up to a token more
    /// or less than the whole, where a word is split at a chunk's edge.)
    pub read_tokens: usize,
    pub chunk_tokens: usize,
    pub chunks: Vec<Chunk>,
}

/// How a job reads its document: chunks of about `chunk_tokens` tokens
/// (a method may choose its own size from it), and only the first chunks up
/// to `first_tokens` tokens in all when given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    pub chunk_tokens: usize,
    pub first_tokens: Option<usize>,
}

impl Chunking {
    /// The chunk size `spec` reads a document of `tokens` tokens with: the
    /// asked size, or the one the method picks for the part it reads.
    pub fn size_for(&self, spec: &MethodSpec, tokens: usize) -> Result<usize> {
        let read_tokens = self.first_tokens.map_or(tokens, |limit| limit.min(tokens));
        spec.chunk_tokens(self.chunk_tokens, read_tokens)
    }
}

impl Document {
    /// Count `text` (read from `source`) and split it as `chunking` asks,
    /// at the size `spec` picks from it when a method is given.
    pub fn prepare(
        format: &PromptFormat,
        source: &Path,
        text: &str,
        chunking: Chunking,
        spec: Option<&MethodSpec>,
    ) -> Result<Self> {
        let tokens = Document::count(format, source, text)?;
        let chunk_tokens = match spec {
            Some(spec) => chunking.size_for(spec, tokens)?,
            None => chunking.chunk_tokens,
        };
        Document::split(format, text, tokens, chunk_tokens, chunking.first_tokens)
    }

    /// Tokens of the whole of `text` (read from `path`) by the model's tokenizer.
    pub fn count(format: &PromptFormat, path: &Path, text: &str) -> Result<usize> {
        let ids = format.tokenizer().encode(text).map_err(|err| {
            Error::invalid(format!("tokenizing {}", path.display()), err.to_string())
        })?;
        Ok(ids.len())
    }

    /// Split `text`, of `tokens` tokens as [`Document::count`] gave them, into
    /// chunks of at most `chunk_tokens` tokens by the model's tokenizer, keeping
    /// only the first `first_tokens` tokens' worth when given.
    pub fn split(
        format: &PromptFormat,
        text: &str,
        tokens: usize,
        chunk_tokens: usize,
        first_tokens: Option<usize>,
    ) -> Result<Self> {
        if chunk_tokens == 0 {
            return Err(Error::invalid("--chunk-tokens", "must be at least 1"));
        }
        let context = format.context_tokens();
        if chunk_tokens >= context {
            return Err(Error::invalid(
                format!("--chunk-tokens {chunk_tokens}"),
                format!("does not fit the model's context of {context} tokens"),
            ));
        }
        let tokenizer = format.tokenizer();
        // Counting the whole text first surfaced any tokenizer error, so the
        // chunker's counter (which cannot fail) never meets one.
        let count = |piece: &str| tokenizer.encode(piece).map_or(usize::MAX, |ids| ids.len());
        let mut chunks = crate::chunk::split(text, chunk_tokens, &count)?;
        let all = chunks.len();
        if let Some(limit) = first_tokens {
            let mut covered = 0;
            chunks.retain(|chunk| {
                covered += chunk.tokens;
                covered <= limit
            });
            if chunks.is_empty() {
                return Err(Error::invalid(
                    format!("--first-tokens {limit}"),
                    "less than the first chunk",
                ));
            }
        }
        let read_tokens = if chunks.len() == all {
            tokens
        } else {
            chunks.iter().map(|chunk| chunk.tokens).sum()
        };
        Ok(Document {
            sha256: format!("{:x}", Sha256::digest(text.as_bytes())),
            tokens,
            read_tokens,
            chunk_tokens,
            chunks,
        })
    }
}

/// Everything that decides a run's result; its fingerprint guards `--resume`.
#[derive(serde::Serialize)]
struct RunIdentity<'a> {
    document_sha256: &'a str,
    engine: &'a BackendIdentity,
    chunk_tokens: usize,
    chunks: usize,
    spec: &'a MethodSpec,
    sampling: &'a SamplingConfig,
}

/// One method over one split document into one run directory.
pub struct Job<'a> {
    pub spec: &'a MethodSpec,
    pub document: &'a Document,
    pub sampling: &'a SamplingConfig,
    pub out: &'a Path,
    pub resume: bool,
    pub stop_after: Option<usize>,
    /// Independent calls in flight at once (hierarchical and detail chunks),
    /// each on a sibling of the backend. The prompts are those of one at a
    /// time, so it is not part of the fingerprint.
    pub concurrency: usize,
}

impl Job<'_> {
    /// Refuse to resume in `out` when it holds no checkpoint to resume from;
    /// cheap, so a caller can check before it loads a model.
    pub fn check_resumable(out: &Path) -> Result<()> {
        let has_checkpoint = [RunDir::CHECKPOINT, RunDir::PREVIOUS_CHECKPOINT]
            .iter()
            .any(|name| out.join(name).is_file());
        if has_checkpoint {
            return Ok(());
        }
        Err(Error::invalid(
            out.display().to_string(),
            "nothing to resume, there is no checkpoint; run without --resume to start",
        ))
    }

    /// The fingerprint of everything that decides the run's result on `engine`
    /// (document, engine, chunking, method, sampling), so `--resume` continues
    /// a run only with the settings that began it.
    pub fn fingerprint(&self, engine: &BackendIdentity) -> String {
        fingerprint(&RunIdentity {
            document_sha256: &self.document.sha256,
            engine,
            chunk_tokens: self.document.chunk_tokens,
            chunks: self.document.chunks.len(),
            spec: self.spec,
            sampling: self.sampling,
        })
    }

    pub fn run(
        &self,
        backend: &mut Backend,
        progress: &mut dyn Progress,
    ) -> Result<Outcome<MethodFigures>> {
        let fingerprint = self.fingerprint(&backend.identity());
        let options = GenerateOptions {
            sampling: self.sampling.clone(),
            ..GenerateOptions::default()
        };
        let mut llm = backend.llm_side_by_side(options, self.concurrency)?;
        let dir = RunDir::create(self.out)?;
        let files = RunFiles {
            dir: &dir,
            fingerprint,
            resume: self.resume,
            stop_after: self.stop_after,
            sampling: self.sampling.clone(),
        };
        self.spec
            .run(&mut *llm, &self.document.chunks, &files, progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::detail::DetailConfig;

    #[test]
    fn a_method_picks_its_chunk_size_from_the_part_it_reads() {
        let detail = MethodSpec::Detail {
            config: DetailConfig {
                query: String::new(),
                detail: 0.5,
                min_chunk_tokens: 500,
                recursive: false,
                max_summary_tokens: 100,
            },
        };
        let whole = Chunking {
            chunk_tokens: 2000,
            first_tokens: None,
        };
        let first = Chunking {
            first_tokens: Some(3000),
            ..whole
        };
        // Halfway between 50 and 200 chunks of the whole document, and
        // between 2 and 6 of the 3,000 tokens read.
        assert_eq!(whole.size_for(&detail, 100_000).unwrap(), 800);
        assert_eq!(first.size_for(&detail, 100_000).unwrap(), 750);
    }

    #[test]
    fn resuming_needs_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let err = Job::check_resumable(dir.path()).unwrap_err();
        assert!(err.to_string().contains("nothing to resume"), "{err}");
        std::fs::write(dir.path().join(RunDir::CHECKPOINT), "{}").unwrap();
        assert!(Job::check_resumable(dir.path()).is_ok());
    }
}
