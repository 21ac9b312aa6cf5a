//! The flag groups several subcommands share: the document's size limit,
//! and the model and engine (local or remote).

use anyhow::{Context, Result};
use clap::Args;
use prism::engine::device::{self, DeviceChoice};
use prism::engine::kv_cache::KvDtype;
use prism::engine::model::PrefillWeights;
use prism::engine::prompt_cache::PromptCache;
use prism::engine::prompt_format::PromptFormat;
use prism::engine::{Engine, LoadOptions, DEFAULT_DRAFT_TOKENS};
use prism::llm::probe::{served_model, ServedModel};
use prism::llm::remote::{RemoteApi, RemoteConstraint, RemoteModel, RemoteOptions};
use prism::llm::Backend;
use std::time::Instant;

/// How large a document may be.
#[derive(Debug, Args)]
pub struct DocumentLimit {
    /// The largest document read, in MiB; a larger one is refused before it is read in full.
    #[arg(long, value_name = "MIB", default_value_t = prism::document::MAX_DOCUMENT_BYTES >> 20)]
    pub max_document_mib: u64,
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

/// Flags that choose and load the model.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// A known model name (see `prism models list`), a .gguf file, a model directory, a Hugging Face repo id, or owner/repo:QUANT for one GGUF file of a hub repo (e.g. Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M). Default: qwen2.5-coder-1.5b-instruct; with --backend openai, the known model the server lists, if it lists one.
    #[arg(long, short)]
    pub model: Option<String>,
    /// CPU threads (default: physical cores; at most 1024).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Where the model runs: `auto` (the GPU a `cuda` or `metal` build was made for, else the
    /// CPU), `cpu`, `cuda` or `metal`.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Recompute every prompt from scratch instead of reusing the cached prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Token sequences kept cached (1 to 64); a prompt continues the one it shares the longest
    /// prefix with. Each slot's KV cache grows with the tokens it holds, up to the model's context.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub cache_slots: u16,
    /// Bound the KV storage of all cached sequences together, in bytes or with a binary
    /// unit (`512M`, `4G`); past it the least recently used sequences are dropped, never
    /// the one in use. Default: no bound beyond --cache-slots.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub cache_bytes: Option<usize>,
    /// Also keep the KV of each generated sequence on disk in DIR, and start a prompt from
    /// the stored prefix that matches most of it: a resumed run, or a second process with the
    /// same instructions, does not encode that prefix again. Entries are checked before use.
    #[arg(long, value_name = "DIR")]
    pub prompt_cache: Option<std::path::PathBuf>,
    /// The most disk --prompt-cache may take (`512M`, `8G`); the least recently used entries go first.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "4G", requires = "prompt_cache")]
    pub prompt_cache_size: usize,
    /// Weights for multi-token prefill: `dense` (an f32 copy of each weight candle multiplies:
    /// faster, more memory) or `quantized`. Q4_1, Q8_0, Q4_K and Q6_K weights on AVX2 CPUs
    /// take prism's own kernel either way. Default: dense when the copy stays under 4 GiB.
    #[arg(long, value_parser = parse_prefill_weights)]
    pub prefill_weights: Option<PrefillWeights>,
    /// How the KV cache stores keys and values: f32; f16 or bf16 for half the memory; q8 (8-bit
    /// integers and a scale per row of a head, CPU only) for a quarter. Perplexity on Frankenstein
    /// moves by under 0.1% with f16 and bf16; with q8 by 0.07% for SmolLM2 but 3.6% for
    /// Qwen2.5-0.5B, whose keys have outlying channels: keep Qwen models on f16.
    #[arg(long, default_value = "f32", value_parser = parse_kv_dtype)]
    pub kv_dtype: KvDtype,
    /// Draft up to N next tokens from where the last few tokens occurred earlier in the prompt
    /// or output, and check them in one pass with the token before: the output is the same,
    /// and text that repeats its document (summaries, memory updates) decodes faster. Only
    /// on CPUs where prism's own kernels run every matmul; 0 turns it off.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DRAFT_TOKENS as u8, value_parser = clap::value_parser!(u8).range(0..=16))]
    pub draft_tokens: u8,
}

fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    s.parse().map_err(|e: prism::Error| e.to_string())
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse().map_err(|e: prism::Error| e.to_string())
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

fn parse_prefill_weights(s: &str) -> Result<PrefillWeights, String> {
    match s {
        "dense" => Ok(PrefillWeights::Dense),
        "quantized" => Ok(PrefillWeights::Quantized),
        other => Err(format!("`{other}` is not one of dense, quantized")),
    }
}

impl EngineArgs {
    /// `--model`, or the default model.
    pub fn model(&self) -> &str {
        self.model
            .as_deref()
            .unwrap_or(prism::models::DEFAULT_MODEL)
    }

    /// Size the thread pools, resolve `--model` and load it, reporting the time on stderr.
    pub fn load(&self) -> Result<Engine> {
        if let Some(threads) = self.threads {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            if usize::from(threads) > cores {
                eprintln!("warning: --threads {threads} is more than the {cores} this machine has; they will contend");
            }
        }
        device::configure_cpu_pools(self.threads.map(usize::from));
        let source = prism::models::resolve(self.model())?;
        let start = Instant::now();
        let options = LoadOptions {
            device: self.device,
            prefill_weights: self.prefill_weights,
            kv_dtype: self.kv_dtype,
        };
        let mut engine =
            Engine::load(&source, &options).with_context(|| format!("loading {}", self.model()))?;
        engine.set_prefix_cache(!self.no_prefix_cache);
        engine.set_cache_slots(usize::from(self.cache_slots));
        engine.set_cache_bytes(self.cache_bytes);
        engine.set_draft_tokens(usize::from(self.draft_tokens));
        if let Some(dir) = &self.prompt_cache {
            let cache = PromptCache::open(
                dir,
                self.prompt_cache_size as u64,
                &engine.identity().model_sha256,
                self.kv_dtype,
            )
            .with_context(|| format!("--prompt-cache {}", dir.display()))?;
            engine.set_prompt_cache(Some(cache));
        }
        note!(
            "loaded {} ({:?}, {} layers, context {}) in {:.1}s on {} thread(s)",
            engine.name(),
            engine.config().architecture,
            engine.config().layers,
            engine.context_tokens(),
            start.elapsed().as_secs_f64(),
            device::default_threads(),
        );
        Ok(engine)
    }
}

/// Flags that choose where a method's calls run: the model loaded here, or an
/// OpenAI-compatible server that serves the same model.
#[derive(Debug, Args)]
pub struct BackendArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// `local` runs --model here; `openai` sends every call to the server at --base-url,
    /// using --model only for its tokenizer and chat template.
    #[arg(long, value_enum, default_value = "local")]
    pub backend: BackendKind,
    /// The server's API root for --backend openai, e.g. `http://127.0.0.1:8080/v1`.
    #[arg(long, value_name = "URL", required_if_eq("backend", "openai"))]
    pub base_url: Option<String>,
    /// The environment variable that holds the server's API key, if it needs one.
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
    /// The model's name on the server (default: the name --model resolves to).
    #[arg(long, value_name = "NAME")]
    pub remote_model: Option<String>,
    /// `ids` sends token ids made with prism's template (exact prefix reuse); `text` sends
    /// that prompt as text, for servers that take no ids; `chat` sends messages, for servers
    /// that refuse raw prompts; `auto` asks the server: `text` for llama-cpp-python's, `ids`
    /// elsewhere.
    #[arg(long, value_enum, default_value = "auto")]
    pub remote_prompt: RemotePromptArg,
    /// How a grammar goes to the server: `lark` as vLLM's `guided_grammar` (prism serve
    /// reads it too), `gbnf` as the `grammar` of llama.cpp's server and llama-cpp-python's,
    /// `ebnf` as SGLang's `ebnf`, `structured-outputs` under vLLM 0.12's `structured_outputs`,
    /// `none` not at all; `auto` asks the server which it is, and sends `lark` to others.
    #[arg(long, value_enum, default_value = "auto")]
    pub remote_constraint: RemoteConstraintArg,
    /// Go on when the server's model is not --model (its tokens for a probe text differ, or
    /// no model it lists is named like it); by default that ends the run before its first call.
    #[arg(long)]
    pub allow_model_mismatch: bool,
    /// Go on when the server's replies do not keep to the grammar sent with them (it ignores
    /// the field); by default that ends the run at the first such reply.
    #[arg(long)]
    pub allow_unconstrained: bool,
    /// Seconds one remote call may take, retries included.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub remote_timeout: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Local,
    Openai,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RemotePromptArg {
    Auto,
    Ids,
    Text,
    Chat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RemoteConstraintArg {
    Auto,
    Lark,
    Gbnf,
    Ebnf,
    StructuredOutputs,
    None,
}

impl BackendArgs {
    /// The local engine, loaded, or the remote server with --model's prompt format.
    pub fn load(&self) -> Result<Backend> {
        let Some(base_url) = self
            .base_url
            .clone()
            .filter(|_| self.backend == BackendKind::Openai)
        else {
            return Ok(Backend::Local(Box::new(self.engine.load()?)));
        };
        let api_key = match &self.api_key_env {
            Some(name) => Some(
                std::env::var(name)
                    .with_context(|| format!("--api-key-env {name}: the variable is not set"))?,
            ),
            None => None,
        };
        // A judge may still run here, on the local engine.
        device::configure_cpu_pools(self.engine.threads.map(usize::from));
        let timeout = std::time::Duration::from_secs(self.remote_timeout);
        let (model, served_id) = match &self.engine.model {
            Some(model) => (model.clone(), None),
            None => served_or_default(&base_url, api_key.as_deref(), timeout),
        };
        let source = prism::models::resolve_prompt_format(&model)?;
        let format = PromptFormat::load(&source)
            .with_context(|| format!("reading the tokenizer of {model}"))?;
        let options = RemoteOptions {
            base_url,
            api_key,
            remote_model: self.remote_model.clone().or(served_id),
            api: match self.remote_prompt {
                RemotePromptArg::Auto => RemoteApi::Auto,
                RemotePromptArg::Ids => RemoteApi::Ids,
                RemotePromptArg::Text => RemoteApi::Text,
                RemotePromptArg::Chat => RemoteApi::Chat,
            },
            constraint: match self.remote_constraint {
                RemoteConstraintArg::Auto => RemoteConstraint::Auto,
                RemoteConstraintArg::Lark => RemoteConstraint::Lark,
                RemoteConstraintArg::Gbnf => RemoteConstraint::Gbnf,
                RemoteConstraintArg::Ebnf => RemoteConstraint::Ebnf,
                RemoteConstraintArg::StructuredOutputs => RemoteConstraint::StructuredOutputs,
                RemoteConstraintArg::None => RemoteConstraint::None,
            },
            timeout,
            retries: 4,
            allow_model_mismatch: self.allow_model_mismatch,
            allow_unconstrained: self.allow_unconstrained,
        };
        note!("{}: calls go to {}", format.name(), options.base_url);
        Ok(Backend::Remote(Box::new(RemoteModel::new(format, options))))
    }
}

/// Without `--model`, the known model the server at `base_url` lists, with
/// its id there, else the default model; either way the choice is said.
fn served_or_default(
    base_url: &str,
    api_key: Option<&str>,
    timeout: std::time::Duration,
) -> (String, Option<String>) {
    let default = prism::models::DEFAULT_MODEL;
    match served_model(base_url, api_key, timeout) {
        ServedModel::Known { id, name } => {
            note!("{base_url} serves {id}: prompts are formatted for {name} (--model chooses another)");
            (name, Some(id))
        }
        ServedModel::Unknown { ids } if ids.is_empty() => {
            note!("{base_url} lists no model: prompts are formatted for {default}, the default (--model chooses another)");
            (default.to_string(), None)
        }
        ServedModel::Unknown { ids } => {
            note!(
                "{base_url} serves {}, which prism does not know: prompts are formatted for {default}, the default (--model chooses another)",
                ids.join(", ")
            );
            (default.to_string(), None)
        }
    }
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
