//! A remote OpenAI-compatible server (prism serve, vLLM, SGLang, llama.cpp's
//! server) as an [`Llm`], its accounting taken from the server's `usage`.

use super::dialect::{constrain, generation_fields};
pub use super::dialect::{RemoteApi, RemoteConstraint};
use super::grammar_check::GrammarCheck;
use super::probe::{ModelMatch, ServerFacts};
use super::wire::{
    ApiUsage, ChatRequest, CompletionRequest, Content, ErrorBody, GenerationFields, PromptField,
    Reply, RequestMessage, StreamOptions,
};
use super::{complete_in_turn, Completion, Llm, ModelInfo, Prompt, Request};
use crate::engine::chat::ChatMessage;
use crate::engine::constraint::Grammar;
use crate::engine::kv_cache::common_prefix;
use crate::engine::prompt_format::PromptFormat;
use crate::engine::{first_refused_line, GenerateOptions, LineCheck, LineVerdict, Usage};
use crate::error::{Error, Result, Setting};
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Where the server is and how to talk to it.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Up to and including `/v1`, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    pub api_key: Option<String>,
    /// The name the server knows the model by; default: the local model's name.
    pub remote_model: Option<String>,
    pub api: RemoteApi,
    pub constraint: RemoteConstraint,
    /// For one request, retries included.
    pub timeout: Duration,
    /// Further tries after a 429, a 5xx or a broken connection.
    pub retries: u32,
    /// Go on, with a warning, when the server's model is not the one whose
    /// prompt format prism uses.
    pub allow_model_mismatch: bool,
    /// Go on, with a warning, when the server's replies do not keep to the
    /// grammar they were asked for.
    pub allow_unconstrained: bool,
}

/// Where the figures of cache reuse come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheFigures {
    /// Counted by the engine that computed them (local, or a server that reports `cached_tokens`).
    #[default]
    Measured,
    /// The server did not report cached tokens; reuse is estimated from the
    /// common token prefix with the sequence sent before.
    Estimated,
}

impl CacheFigures {
    pub fn is_measured(&self) -> bool {
        *self == CacheFigures::Measured
    }
}

/// What decides the results of a remote backend, for run fingerprints.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RemoteIdentity {
    pub model: String,
    pub base_url: String,
    pub remote_model: String,
    pub api: RemoteApi,
    /// Left out when `auto`, so that runs from before the choice existed keep their fingerprints.
    #[serde(skip_serializing_if = "RemoteConstraint::is_auto")]
    pub constraint: RemoteConstraint,
}

/// A model served elsewhere, with its prompt format here. prism keeps the
/// model's tokenizer and chat template and sends each prompt as token ids to
/// `/v1/completions`, so the token prefix the server caches is the one prism
/// would have cached itself; servers that take no ids get the prompt's text,
/// and those that take only chats get `/v1/chat/completions`.
pub struct RemoteModel {
    /// Shared with the model's siblings, which only read it.
    format: Arc<PromptFormat>,
    options: RemoteOptions,
    agent: ureq::Agent,
    /// The last sequence sent and generated, for estimating reuse when the server does not say.
    last_sequence: Vec<u32>,
    cache_figures: CacheFigures,
    /// Learnt from the server at the first call of this model or a sibling.
    discovery: Arc<OnceLock<Discovery>>,
    grammar_check: GrammarCheck,
    /// Whether the warning that the server ignores grammars was given, to this model or a sibling.
    warned_unkept: Arc<AtomicBool>,
}

/// What the first call learns from the server and keeps for the others.
#[derive(Debug, Clone)]
struct Discovery {
    /// Never `auto`.
    api: RemoteApi,
    /// `auto` only where it means Lark, as before servers were asked.
    constraint: RemoteConstraint,
    /// Set unless the mismatch is allowed.
    mismatch: Option<Mismatch>,
}

/// Why the server's model is not the one prism formats prompts for.
#[derive(Debug, Clone)]
struct Mismatch {
    /// The ids the server lists.
    served: String,
    evidence: String,
}

impl RemoteModel {
    pub fn new(format: PromptFormat, options: RemoteOptions) -> Self {
        let agent = ureq::AgentBuilder::new().timeout(options.timeout).build();
        RemoteModel {
            format: Arc::new(format),
            options,
            agent,
            last_sequence: Vec::new(),
            cache_figures: CacheFigures::Measured,
            discovery: Arc::new(OnceLock::new()),
            grammar_check: GrammarCheck::default(),
            warned_unkept: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Another client of the same server, with its own bookkeeping, for
    /// calls that run side by side with this one's.
    pub fn sibling(&self) -> Self {
        RemoteModel {
            format: Arc::clone(&self.format),
            options: self.options.clone(),
            agent: self.agent.clone(),
            last_sequence: Vec::new(),
            cache_figures: CacheFigures::Measured,
            discovery: Arc::clone(&self.discovery),
            grammar_check: GrammarCheck::default(),
            warned_unkept: Arc::clone(&self.warned_unkept),
        }
    }

    pub fn format(&self) -> &PromptFormat {
        &self.format
    }

    pub fn identity(&self) -> RemoteIdentity {
        RemoteIdentity {
            model: self.format.name().to_string(),
            base_url: self.options.base_url.clone(),
            remote_model: self.remote_model().to_string(),
            // `auto` is written as `ids`, which it sends to every server that
            // takes them, so that runs from before `auto` keep their fingerprints.
            api: match self.options.api {
                RemoteApi::Auto => RemoteApi::Ids,
                api => api,
            },
            constraint: self.options.constraint,
        }
    }

    /// Forget the sequence sent last. The server's own cache is not ours to clear.
    pub fn forget(&mut self) {
        self.last_sequence.clear();
    }

    fn remote_model(&self) -> &str {
        self.options
            .remote_model
            .as_deref()
            .unwrap_or(self.format.name())
    }

    /// What the server takes and serves, asked once for this model and its
    /// siblings; a model that does not match is an error on every call.
    fn discovered(&self) -> Result<&Discovery> {
        let discovery = self.discovery.get_or_init(|| self.discover());
        match &discovery.mismatch {
            Some(mismatch) => Err(Error::ModelMismatch {
                url: self.options.base_url.clone(),
                served: mismatch.served.clone(),
                model: self.format.name().to_string(),
                evidence: mismatch.evidence.clone(),
            }),
            None => Ok(discovery),
        }
    }

    /// Probe the server unless flags made every choice, and resolve the
    /// `auto` ones by what it answers, logging them.
    fn discover(&self) -> Discovery {
        let options = &self.options;
        let mut discovery = Discovery {
            api: match options.api {
                RemoteApi::Auto => RemoteApi::Ids,
                api => api,
            },
            constraint: options.constraint,
            mismatch: None,
        };
        let asks = options.api == RemoteApi::Auto || options.constraint.is_auto();
        if !asks && options.allow_model_mismatch {
            return discovery;
        }
        let facts = ServerFacts::probe(&self.agent, &options.base_url, options.api_key.as_deref());
        if options.api == RemoteApi::Auto {
            discovery.api = facts.api();
        }
        if options.constraint.is_auto() && facts.constraint() != RemoteConstraint::Lark {
            discovery.constraint = facts.constraint();
        }
        if asks {
            tracing::info!(
                "{}: {} serving [{}]: prompts as {}, grammars as {}",
                options.base_url,
                facts.kind,
                facts.models.join(", "),
                discovery.api.name(),
                match discovery.constraint {
                    RemoteConstraint::Auto => RemoteConstraint::Lark,
                    chosen => chosen,
                }
                .name(),
            );
        }
        discovery.mismatch = self.mismatch(&facts);
        discovery
    }

    /// How the server's model differs from the one prism formats prompts
    /// for; `None` when it does not, when nothing tells, or when the
    /// mismatch is allowed (with a warning).
    fn mismatch(&self, facts: &ServerFacts) -> Option<Mismatch> {
        let (url, name) = (&self.options.base_url, self.format.name());
        let matched = facts.model_match(self.format.tokenizer(), name, self.remote_model());
        let evidence = match matched {
            Ok(ModelMatch::Same) => return None,
            Ok(ModelMatch::Unknown) => {
                tracing::debug!("{url}: the server told nothing to compare its model with {name}");
                return None;
            }
            // Our own tokenizer failing on the probe text says nothing of the server.
            Err(error) => {
                tracing::debug!("{url}: model check skipped: {error}");
                return None;
            }
            Ok(ModelMatch::Different { evidence }) => evidence,
        };
        let served = match facts.models.as_slice() {
            [] => "an unnamed model".to_string(),
            ids => ids.join(", "),
        };
        if self.options.allow_model_mismatch {
            tracing::warn!(
                "{url} serves {served}, not {name}: {evidence}; going on as {} says",
                Setting::AllowModelMismatch
            );
            return None;
        }
        Some(Mismatch { served, evidence })
    }

    /// One call: the request for `prompt`, sent with retries, and its usage.
    /// With `refuse_line` the reply is streamed and the connection closed at
    /// the first line it refuses, so the server stops generating there, as
    /// the local engine would.
    fn complete(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        refuse_line: Option<&LineCheck>,
    ) -> Result<Completion> {
        let Discovery {
            api, constraint, ..
        } = self.discovered()?.clone();
        let ids = self
            .format
            .segmented_chat_prompt(prompt.system.as_deref(), &prompt.segments)?;
        let mut messages = Vec::new();
        messages.extend(prompt.system.as_deref().map(ChatMessage::system));
        messages.push(ChatMessage::user(prompt.segments.concat()));
        let mut fields = generation_fields(self.remote_model(), options);
        if let Some(grammar) = &options.grammar {
            constrain(&mut fields, grammar, constraint).map_err(|reason| self.error(reason))?;
        }
        if refuse_line.is_some() {
            fields.stream = true;
            fields.stream_options = Some(StreamOptions {
                include_usage: true,
                continuous_usage_stats: true,
            });
        }
        let (path, body) = self.request(api, &ids, messages, fields)?;
        let start = Instant::now();
        let (text, reported) = match refuse_line {
            None => {
                let reply: Reply = self
                    .send(path, &body)?
                    .into_json()
                    .map_err(|e| self.error(format!("unreadable reply: {e}")))?;
                let text = reply
                    .text()
                    .ok_or_else(|| self.error("the reply has no choices"))?
                    .to_string();
                let usage = reply.usage.ok_or_else(|| {
                    self.error("the reply has no usage; prism cannot account for the call")
                })?;
                (text, Some(usage))
            }
            Some(refuse_line) => {
                let response = self.send(path, &body)?;
                self.read_stream(response, refuse_line)?
            }
        };
        let seconds = start.elapsed().as_secs_f64();
        if let Some(grammar) = &options.grammar {
            self.check_kept(grammar, constraint, &text)?;
        }
        let usage = self.usage(reported, &ids, &text, seconds)?;
        Ok(Completion { text, usage })
    }

    /// The path and body of a request for `api`: the prompt as token `ids`,
    /// as `messages` rendered through the chat template, or as the messages.
    fn request(
        &self,
        api: RemoteApi,
        ids: &[u32],
        messages: Vec<ChatMessage>,
        fields: GenerationFields,
    ) -> Result<(&'static str, Body)> {
        Ok(match api {
            // Discovery has resolved `auto`; were it left, ids are its default.
            RemoteApi::Auto | RemoteApi::Ids => (
                "completions",
                Body::Completion(CompletionRequest {
                    prompt: PromptField::Ids(ids.to_vec()),
                    fields,
                }),
            ),
            RemoteApi::Text => (
                "completions",
                Body::Completion(CompletionRequest {
                    prompt: PromptField::Text(self.format.render_chat(&messages)?),
                    fields,
                }),
            ),
            RemoteApi::Chat => (
                "chat/completions",
                Body::Chat(ChatRequest {
                    messages: messages
                        .into_iter()
                        .map(|message| RequestMessage {
                            role: message.role,
                            content: Content::Text(message.content),
                        })
                        .collect(),
                    fields,
                }),
            ),
        })
    }

    /// Refuse a reply that `grammar`, sent as `constraint`, does not admit:
    /// the server ignored the field (llama.cpp's servers ignore vLLM's, and
    /// some engines read none), and a PRISM run would refuse every revision
    /// and end with an empty memory. With `allow_unconstrained` the run goes
    /// on, warned once, and what does not parse is refused as it comes.
    fn check_kept(
        &self,
        grammar: &Grammar,
        constraint: RemoteConstraint,
        text: &str,
    ) -> Result<()> {
        if constraint == RemoteConstraint::None {
            return Ok(());
        }
        let admitted =
            self.grammar_check
                .admits(self.format.tokenizer(), self.format.name(), grammar, text);
        if admitted != Some(false) {
            return Ok(());
        }
        let dialect = match constraint {
            RemoteConstraint::Gbnf => "GBNF (`grammar`)",
            _ => "Lark (`guided_grammar`)",
        };
        if !self.options.allow_unconstrained {
            return Err(Error::GrammarNotKept {
                url: self.options.base_url.clone(),
                dialect: dialect.to_string(),
            });
        }
        if !self.warned_unkept.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{} does not keep to the grammar sent as {dialect}; going on as {} says, refusing what does not parse",
                self.options.base_url,
                Setting::AllowUnconstrained
            );
        }
        Ok(())
    }

    /// The text of a streamed reply up to the first line `refuse_line`
    /// stops at, less the lines it skips (the server cannot be steered away
    /// from them, so they are only dropped), and the last usage the server reported on the way (none from
    /// a server that reports usage only at the end of a stream cut short).
    /// Returning drops the response, which closes the connection.
    fn read_stream(
        &self,
        response: ureq::Response,
        refuse_line: &LineCheck,
    ) -> Result<(String, Option<ApiUsage>)> {
        let mut text = String::new();
        let mut checked = 0;
        let mut usage = None;
        for line in BufReader::new(response.into_reader()).lines() {
            let line = line.map_err(|e| self.error(format!("reading the stream: {e}")))?;
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                break;
            }
            let chunk: Reply = serde_json::from_str(data)
                .map_err(|e| self.error(format!("unreadable stream chunk: {e}")))?;
            if let Some(error) = chunk.error {
                return Err(self.error(error.message));
            }
            if let Some(piece) = chunk.text() {
                text.push_str(piece);
            }
            usage = chunk.usage.or(usage);
            match first_refused_line(&text, &mut checked, refuse_line) {
                None | Some((_, LineVerdict::Keep)) => {}
                Some((start, LineVerdict::Skip { .. })) => {
                    let end = text[start..]
                        .find('\n')
                        .map_or(text.len(), |at| start + at + 1);
                    text.replace_range(start..end, "");
                }
                Some((cut, LineVerdict::Stop)) => {
                    text.truncate(cut);
                    break;
                }
            }
        }
        Ok((text, usage))
    }

    /// The call's [`Usage`]: prism's own figures when the server is prism;
    /// otherwise the server's counts, with the request's time as decoding
    /// time, and reuse estimated when the server does not report it.
    fn usage(
        &mut self,
        reported: Option<ApiUsage>,
        ids: &[u32],
        text: &str,
        seconds: f64,
    ) -> Result<Usage> {
        let output = self.format.tokenizer().encode(text)?;
        let shared = common_prefix(&self.last_sequence, ids);
        // A stream cut short before the server said what it cost: count
        // what was sent and received, and estimate the reuse.
        let reported = reported.unwrap_or(ApiUsage {
            prompt_tokens: ids.len(),
            completion_tokens: output.len(),
            total_tokens: ids.len() + output.len(),
            prompt_tokens_details: None,
            prism: None,
        });
        self.last_sequence = [ids, &output].concat();
        if let Some(prism) = reported.prism {
            return Ok(prism.usage());
        }
        let reused_tokens = match reported.prompt_tokens_details.and_then(|d| d.cached_tokens) {
            Some(cached) => cached,
            None => {
                self.cache_figures = CacheFigures::Estimated;
                shared.min(reported.prompt_tokens)
            }
        };
        Ok(Usage {
            prompt_tokens: reported.prompt_tokens,
            reused_tokens,
            output_tokens: reported.completion_tokens,
            decode_steps: reported.completion_tokens,
            decode_seconds: seconds,
            ..Usage::default()
        })
    }

    /// POST `body` to `path`, retrying 429s, 5xx replies and broken
    /// connections with growing waits; the successful response, unread.
    fn send(&self, path: &str, body: &Body) -> Result<ureq::Response> {
        let url = format!("{}/{path}", self.options.base_url.trim_end_matches('/'));
        let mut wait = Duration::from_millis(500);
        let mut tries = 0;
        loop {
            let mut request = self.agent.post(&url);
            if let Some(key) = &self.options.api_key {
                request = request.set("Authorization", &format!("Bearer {key}"));
            }
            let retry = match request.send_json(body) {
                Ok(response) => return Ok(response),
                Err(ureq::Error::Status(code, response)) => {
                    let detail = error_message(&response.into_string().unwrap_or_default());
                    let message = format!("HTTP {code}: {detail}");
                    if !is_transient(code, &detail) {
                        return Err(self.error(self.explained(message)));
                    }
                    message
                }
                Err(ureq::Error::Transport(transport)) => transport.to_string(),
            };
            if tries == self.options.retries {
                return Err(self.error(format!("{retry} (after {} tries)", tries + 1)));
            }
            tracing::warn!("{url}: {retry}; trying again in {wait:?}");
            std::thread::sleep(wait);
            wait *= 2;
            tries += 1;
        }
    }

    /// `message` with what a refused prompt of token ids usually means.
    fn explained(&self, message: String) -> String {
        let api = self.discovery.get().map_or(self.options.api, |d| d.api);
        if api == RemoteApi::Ids && message.contains("validation error") {
            return format!(
                "{message}; this server may not take token ids as a prompt: send it as text instead (remote prompt `text`)"
            );
        }
        message
    }

    fn error(&self, reason: impl Into<String>) -> Error {
        Error::Remote {
            url: self.options.base_url.clone(),
            reason: reason.into(),
        }
    }
}

/// Whether a refused request may pass when sent again: a 429 or a server
/// error, unless the server says the request itself is invalid, which no
/// retry changes: llama-cpp-python answers a body it cannot read with a 500
/// listing "validation errors", and a grammar it cannot build with a 500
/// that names the grammar.
fn is_transient(code: u16, detail: &str) -> bool {
    let invalid = detail.contains("validation error") || detail.to_lowercase().contains("grammar");
    (code == 429 || code >= 500) && !invalid
}

/// The error message of an OpenAI-style error body, or the body itself.
fn error_message(body: &str) -> String {
    serde_json::from_str::<ErrorBody>(body).map_or_else(
        |_| body.chars().take(300).collect(),
        |error| error.error.message,
    )
}

/// A request body of either endpoint.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Body {
    Completion(CompletionRequest),
    Chat(ChatRequest),
}

/// A [`RemoteModel`] with fixed generation settings, as an [`Llm`].
pub struct RemoteLlm<'a> {
    model: &'a mut RemoteModel,
    options: GenerateOptions,
}

impl<'a> RemoteLlm<'a> {
    /// `options.max_tokens` and `options.grammar` are replaced by each call's own.
    pub fn new(model: &'a mut RemoteModel, options: GenerateOptions) -> Self {
        RemoteLlm { model, options }
    }
}

impl Llm for RemoteLlm<'_> {
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Completion>> {
        complete_in_turn(requests, done, |request| {
            let options = GenerateOptions {
                max_tokens: request.max_tokens,
                grammar: request.grammar.cloned(),
                ..self.options.clone()
            };
            self.model
                .complete(request.prompt, &options, request.line_check)
        })
    }

    fn info(&self) -> ModelInfo<'_> {
        ModelInfo {
            context_tokens: self.model.format.context_tokens(),
            concurrency: 1,
            cache_figures: self.model.cache_figures,
            counter: self.model.format.as_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_request_is_not_sent_again() {
        assert!(is_transient(429, "slow down"));
        assert!(is_transient(503, "loading the model"));
        assert!(!is_transient(400, "bad request"));
        assert!(!is_transient(
            500,
            "1773 validation errors for CreateCompletionRequest"
        ));
        assert!(!is_transient(500, "1 validation error: prompt"));
        assert!(!is_transient(
            500,
            "from_string: error parsing grammar file: parsed_grammar.rules is empty"
        ));
    }
}
