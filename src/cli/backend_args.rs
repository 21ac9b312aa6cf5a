//! The flags that choose where a method's calls run: the model loaded here,
//! or an OpenAI-compatible server.

use super::EngineArgs;
use anyhow::{Context, Result};
use clap::Args;
use prism::engine::device;
use prism::engine::prompt_format::PromptFormat;
use prism::llm::probe::{served_model, ServedModel};
use prism::llm::remote::{RemoteApi, RemoteConstraint, RemoteModel, RemoteOptions};
use prism::llm::Backend;

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
            return Ok(Backend::Local(Box::new(self.engine.open()?)));
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
