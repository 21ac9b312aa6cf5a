//! One summarization job: a document split for one chunk size, a method with its
//! settings, the sampling, and the run directory it writes.

use crate::chunk::Chunk;
use crate::engine::prompt_format::PromptFormat;
use crate::engine::sampling::SamplingConfig;
use crate::engine::GenerateOptions;
use crate::error::{Error, Result, Setting};
use crate::llm::{Backend, BackendIdentity};
use crate::methods::{MethodFigures, MethodSpec};
use crate::run::dir::{fingerprint, RunDir};
use crate::run::{Outcome, Progress, RunFiles};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

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
    /// Count `text` (read from `source`) and split it as `chunking` asks.
    pub fn prepare(
        format: &PromptFormat,
        source: &Path,
        text: &str,
        chunking: Chunking,
    ) -> Result<Self> {
        let tokens = Document::count(format, source, text)?;
        Document::split(
            format,
            text,
            tokens,
            chunking.chunk_tokens,
            chunking.first_tokens,
        )
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
            return Err(Error::invalid_setting(
                Setting::ChunkTokens,
                "must be at least 1",
            ));
        }
        let context = format.context_tokens();
        if chunk_tokens >= context {
            return Err(Error::invalid_setting(
                Setting::ChunkTokens,
                format!("{chunk_tokens} does not fit the model's context of {context} tokens"),
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
                return Err(Error::invalid_setting(
                    Setting::FirstTokens,
                    format!("{limit} is less than the first chunk"),
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

/// Documents split for jobs: each text counted once and split once per
/// chunk size, so that the jobs of a sweep share their splits.
#[derive(Default)]
pub struct Documents {
    documents: Vec<Document>,
    /// What each split was made from: its file and `--first-tokens`.
    made_from: Vec<(PathBuf, Option<usize>)>,
}

impl std::ops::Deref for Documents {
    type Target = [Document];

    fn deref(&self) -> &[Document] {
        &self.documents
    }
}

/// One job as its caller asks for it, before its document is split.
pub struct Request<'a> {
    /// Where `text` was read from, as messages name it.
    pub source: &'a Path,
    pub text: &'a str,
    pub spec: &'a MethodSpec,
    pub chunking: Chunking,
    pub sampling: &'a SamplingConfig,
    /// The run directory.
    pub out: &'a Path,
    /// `--resume`: `out` must hold a checkpoint made with these settings.
    pub resume: bool,
}

/// Count the request's text, choose the chunk size its method reads it
/// with, and split it into `documents`, unless a split of the same text at
/// that size is there already; returns the split's index. A job that resumes
/// is refused here, before any call, when `out` holds no checkpoint or one
/// made with other settings on `engine`.
pub fn prepare(
    format: &PromptFormat,
    engine: &BackendIdentity,
    documents: &mut Documents,
    request: &Request,
) -> Result<usize> {
    if request.resume {
        Job::check_resumable(request.out)?;
    }
    let key = (request.source.to_path_buf(), request.chunking.first_tokens);
    let counted = documents
        .made_from
        .iter()
        .position(|(source, _)| *source == key.0);
    let tokens = match counted {
        Some(index) => documents.documents[index].tokens,
        None => Document::count(format, request.source, request.text)?,
    };
    let size = request.chunking.size_for(request.spec, tokens)?;
    let split = (0..documents.len()).find(|&index| {
        documents.made_from[index] == key && documents.documents[index].chunk_tokens == size
    });
    let index = match split {
        Some(index) => index,
        None => {
            documents.documents.push(Document::split(
                format,
                request.text,
                tokens,
                size,
                request.chunking.first_tokens,
            )?);
            documents.made_from.push(key);
            documents.len() - 1
        }
    };
    if request.resume {
        let identity = RunIdentity::new(&documents[index], engine, request.spec, request.sampling);
        RunDir::create(request.out)?.check_checkpoint(&fingerprint(&identity))?;
    }
    Ok(index)
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

impl<'a> RunIdentity<'a> {
    fn new(
        document: &'a Document,
        engine: &'a BackendIdentity,
        spec: &'a MethodSpec,
        sampling: &'a SamplingConfig,
    ) -> Self {
        RunIdentity {
            document_sha256: &document.sha256,
            engine,
            chunk_tokens: document.chunk_tokens,
            chunks: document.chunks.len(),
            spec,
            sampling,
        }
    }
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
            format!(
                "nothing to resume, there is no checkpoint; run without {} to start",
                Setting::Resume
            ),
        ))
    }

    /// The fingerprint of everything that decides the run's result on `engine`
    /// (document, engine, chunking, method, sampling), so `--resume` continues
    /// a run only with the settings that began it.
    pub fn fingerprint(&self, engine: &BackendIdentity) -> String {
        fingerprint(&RunIdentity::new(
            self.document,
            engine,
            self.spec,
            self.sampling,
        ))
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
    use crate::engine::source::ModelSource;
    use crate::llm::remote::{RemoteApi, RemoteConstraint, RemoteIdentity};
    use crate::methods::detail::DetailConfig;
    use crate::methods::incremental::IncrementalConfig;
    use crate::run::dir::Checkpoint;

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

    /// What prompts need of a model, and no more: a word-level tokenizer
    /// (every word and stop a token) and a config.
    fn word_format(dir: &Path) -> PromptFormat {
        let tokenizer = serde_json::json!({
            "version": "1.0",
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "word": 1}, "unk_token": "<unk>"}
        });
        let config = serde_json::json!({
            "model_type": "llama",
            "vocab_size": 2,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 256
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        PromptFormat::load(&ModelSource::HfDir {
            dir: dir.to_path_buf(),
            name: "words".into(),
        })
        .unwrap()
    }

    #[test]
    fn prepare_splits_a_fresh_run_and_refuses_a_resume_with_other_settings() {
        let model = tempfile::tempdir().unwrap();
        let format = word_format(model.path());
        let text = "one two three. four five six.\n\nseven eight nine. ten eleven twelve.";
        let spec = MethodSpec::Incremental {
            config: IncrementalConfig {
                query: String::new(),
                max_summary_tokens: 50,
                summary_words: None,
            },
        };
        let sampling = SamplingConfig::default();
        let engine = BackendIdentity::Remote(RemoteIdentity {
            model: "words".into(),
            base_url: "http://localhost:8080".into(),
            remote_model: "words".into(),
            api: RemoteApi::Auto,
            constraint: RemoteConstraint::Auto,
        });
        let runs = tempfile::tempdir().unwrap();
        let out = runs.path().join("run");
        let mut request = Request {
            source: Path::new("doc.txt"),
            text,
            spec: &spec,
            chunking: Chunking {
                chunk_tokens: 8,
                first_tokens: None,
            },
            sampling: &sampling,
            out: &out,
            resume: false,
        };
        let mut documents = Documents::default();
        let index = prepare(&format, &engine, &mut documents, &request).unwrap();
        let document = &documents[index];
        assert_eq!(document.tokens, 16);
        assert_eq!(document.chunk_tokens, 8);
        assert!(
            document.chunks.len() > 1,
            "{} chunks",
            document.chunks.len()
        );
        assert!(
            !out.exists(),
            "a fresh run's directory is the run's to make"
        );
        let again = prepare(&format, &engine, &mut documents, &request).unwrap();
        assert_eq!((again, documents.len()), (index, 1), "one split per size");

        request.resume = true;
        let err = prepare(&format, &engine, &mut documents, &request).unwrap_err();
        assert!(err.to_string().contains("nothing to resume"), "{err}");

        let job = Job {
            spec: &spec,
            document: &documents[index],
            sampling: &sampling,
            out: &out,
            resume: true,
            stop_after: None,
            concurrency: 1,
        };
        let checkpoint = Checkpoint::new(job.fingerprint(&engine), 1, serde_json::json!({}));
        RunDir::create(&out)
            .unwrap()
            .save_checkpoint(&checkpoint)
            .unwrap();
        assert_eq!(
            prepare(&format, &engine, &mut documents, &request).unwrap(),
            index
        );

        request.chunking.chunk_tokens = 12;
        let err = prepare(&format, &engine, &mut documents, &request).unwrap_err();
        assert!(
            err.to_string()
                .contains("this run directory was started with different settings"),
            "{err}"
        );
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
