//! What `prism serve` makes of the wire format ([`crate::llm::wire`]): requests
//! checked and turned into engine settings, and errors as OpenAI clients expect.

use crate::engine::chat::ChatMessage;
use crate::engine::constraint::Grammar;
use crate::engine::sampling::SamplingConfig;
use crate::engine::{GenerateOptions, StopReason};
use crate::llm::wire::{
    ChatRequest, CompletionRequest, Content, ErrorBody, ErrorDetail, GenerationFields, PromptField,
    ResponseFormat, Stop,
};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// An error as OpenAI clients expect it: a status and an `error` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// The request field at fault, as OpenAI's `param` names it
    /// (`messages`, `messages[1].content`).
    pub param: Option<String>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
        }
    }

    /// A 400 for one field of the request: the message starts with the
    /// field's name, which `param` carries too.
    pub fn invalid_field(field: impl Into<String>, problem: impl std::fmt::Display) -> Self {
        let field = field.into();
        ApiError {
            message: format!("{field} {problem}"),
            param: Some(field),
            ..ApiError::invalid("")
        }
    }

    pub fn server(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
        }
    }

    pub fn timeout() -> Self {
        ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            kind: "timeout",
            message: format!(
                "the request did not finish within the server's {}",
                crate::Setting::RequestTimeout
            ),
            param: None,
        }
    }

    /// The `error` object, as a response body or a stream event.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.clone(),
                code: None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<crate::Error> for ApiError {
    fn from(error: crate::Error) -> Self {
        match error {
            crate::Error::InvalidInput { .. }
            | crate::Error::InvalidSetting { .. }
            | crate::Error::PromptTooLong { .. }
            | crate::Error::ChatTemplate { .. } => ApiError::invalid(error.to_string()),
            other => ApiError::server(other.to_string()),
        }
    }
}

/// What a request asks the engine for, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub options: GenerateOptions,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
}

impl GenerationFields {
    /// Check the request and turn it into generation settings; `max_tokens_limit`
    /// is the most a request may ask for and the default when it names none.
    pub fn settings(&self, max_tokens_limit: usize) -> Result<Settings, ApiError> {
        self.refuse_unsupported()?;
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or(max_tokens_limit);
        if max_tokens > max_tokens_limit {
            return Err(ApiError::invalid(format!(
                "max_tokens {max_tokens} is over this server's limit of {max_tokens_limit}"
            )));
        }
        let sampling = self.sampling();
        sampling
            .validate()
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(stop)) => vec![stop.clone()],
            Some(Stop::Many(stops)) => stops.clone(),
        };
        Ok(Settings {
            options: GenerateOptions {
                max_tokens,
                sampling,
                stop,
                grammar: self.grammar()?,
                copy_source: Vec::new(),
                shared_prefix_tokens: None,
            },
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|options| options.include_usage),
            continuous_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|options| options.continuous_usage_stats),
        })
    }

    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let unsupported = |field: &str| {
            Err(ApiError::invalid(format!(
                "`{field}` is not supported by prism serve"
            )))
        };
        if self.n.is_some_and(|n| n != 1) {
            return unsupported("n");
        }
        if self.presence_penalty.is_some_and(|p| p != 0.0) {
            return unsupported("presence_penalty (use repeat_penalty or dry_multiplier)");
        }
        if self.frequency_penalty.is_some_and(|p| p != 0.0) {
            return unsupported("frequency_penalty (use repeat_penalty or dry_multiplier)");
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        {
            return unsupported("logprobs");
        }
        if self.tools.as_ref().is_some_and(|v| !v.is_null()) {
            return unsupported("tools");
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return unsupported("suffix");
        }
        if self.echo == Some(true) {
            return unsupported("echo");
        }
        if self.gbnf.is_some() {
            return unsupported("grammar (GBNF; send the grammar in Lark as guided_grammar)");
        }
        if self.ebnf.is_some() {
            return unsupported("ebnf (GBNF; send the grammar in Lark as guided_grammar)");
        }
        Ok(())
    }

    /// OpenAI's defaults (temperature 1, no top-p cut) for what the request
    /// leaves out, and prism's repetition controls off unless asked for.
    fn sampling(&self) -> SamplingConfig {
        let base = SamplingConfig::default();
        SamplingConfig {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k,
            top_p: self.top_p.filter(|&p| p < 1.0),
            repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(base.repeat_last_n),
            seed: self.seed.unwrap_or(base.seed),
            dry_multiplier: self.dry_multiplier.unwrap_or(base.dry_multiplier),
            dry_base: self.dry_base.unwrap_or(base.dry_base),
            dry_allowed_length: self.dry_allowed_length.unwrap_or(base.dry_allowed_length),
            dry_penalty_last_n: self.dry_penalty_last_n.unwrap_or(base.dry_penalty_last_n),
            dry_prompt: self.dry_prompt.unwrap_or(base.dry_prompt),
            no_repeat_ngram: self.no_repeat_ngram.unwrap_or(base.no_repeat_ngram),
            no_copy_ngram: base.no_copy_ngram,
            loop_guard: self.loop_guard.unwrap_or(base.loop_guard),
        }
    }

    /// The one constraint the request names, if any.
    fn grammar(&self) -> Result<Option<Grammar>, ApiError> {
        let from_format = match &self.response_format {
            None | Some(ResponseFormat::Text) => None,
            Some(ResponseFormat::JsonObject) => {
                Some(Grammar::JsonSchema(serde_json::json!({"type": "object"})))
            }
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                if !json_schema.schema.is_object() && !json_schema.schema.is_boolean() {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema must be a JSON Schema object",
                    ));
                }
                Some(Grammar::JsonSchema(json_schema.schema.clone()))
            }
        };
        // vLLM's newer fields name the same constraints; a grammar there is
        // read as Lark, the one grammar dialect prism serve parses.
        let structured = self.structured_outputs.clone().unwrap_or_default();
        let named = [
            from_format,
            self.guided_json.clone().map(Grammar::JsonSchema),
            self.lark.clone().map(Grammar::Lark),
            self.regex.clone().map(Grammar::Regex),
            structured.json.map(Grammar::JsonSchema),
            structured.grammar.map(Grammar::Lark),
            structured.regex.map(Grammar::Regex),
        ];
        let mut named = named.into_iter().flatten();
        let grammar = named.next();
        if named.next().is_some() {
            return Err(ApiError::invalid(
                "give at most one of response_format, guided_json, lark (guided_grammar), regex (guided_regex) and a field of structured_outputs",
            ));
        }
        Ok(grammar)
    }
}

/// The roles a chat template knows; tools are not served, so neither is
/// their role.
const CHAT_ROLES: [&str; 3] = ["system", "user", "assistant"];

impl ChatRequest {
    /// The messages as the chat template takes them; what OpenAI and
    /// llama.cpp's server refuse (no messages, an unknown role, content that
    /// is not text) is refused naming the field.
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_field(
                "messages",
                "is empty; a chat needs at least one message",
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(index, message)| {
                if !CHAT_ROLES.contains(&message.role.as_str()) {
                    return Err(ApiError::invalid_field(
                        format!("messages[{index}].role"),
                        format!("`{}` is not one of {}", message.role, CHAT_ROLES.join(", ")),
                    ));
                }
                Ok(ChatMessage {
                    role: message.role.clone(),
                    content: message
                        .content
                        .text(&format!("messages[{index}].content"))?,
                })
            })
            .collect()
    }
}

impl Content {
    /// The text of `field`: the string, or its text parts joined. Null is
    /// refused for every role: it is how an assistant turn carries tool
    /// calls, and tools are not served.
    fn text(&self, field: &str) -> Result<String, ApiError> {
        match self {
            Content::Text(text) => Ok(text.clone()),
            Content::Parts(parts) => parts
                .iter()
                .enumerate()
                .map(|(index, part)| match (part.kind.as_str(), &part.text) {
                    ("text", Some(text)) => Ok(text.as_str()),
                    ("text", None) => Err(ApiError::invalid_field(
                        format!("{field}[{index}].text"),
                        "is missing from a text part",
                    )),
                    (kind, _) => Err(ApiError::invalid_field(
                        format!("{field}[{index}].type"),
                        format!("`{kind}` is not supported by prism serve; only text parts are"),
                    )),
                })
                .collect(),
            Content::Unreadable(value) => Err(ApiError::invalid_field(
                field,
                format!(
                    "is {}; it must be a string or an array of parts like \
                     {{\"type\": \"text\", \"text\": \"…\"}}",
                    json_kind(value)
                ),
            )),
        }
    }
}

/// What a JSON value is, for an error message.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null or missing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array holding something other than content parts",
        Value::Object(_) => "an object",
    }
}

/// What the engine is asked to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Chat(Vec<ChatMessage>),
    Text(String),
    Ids(Vec<u32>),
}

impl CompletionRequest {
    pub fn prompt(&self) -> Result<PromptInput, ApiError> {
        let one = |count: usize| {
            Err(ApiError::invalid(format!(
                "prompt holds {count} prompts; prism serve takes one per request"
            )))
        };
        match &self.prompt {
            PromptField::Text(text) => Ok(PromptInput::Text(text.clone())),
            PromptField::Ids(ids) => Ok(PromptInput::Ids(ids.clone())),
            PromptField::Texts(texts) if texts.len() == 1 => {
                Ok(PromptInput::Text(texts[0].clone()))
            }
            PromptField::IdLists(lists) if lists.len() == 1 => {
                Ok(PromptInput::Ids(lists[0].clone()))
            }
            PromptField::Texts(texts) => one(texts.len()),
            PromptField::IdLists(lists) => one(lists.len()),
        }
    }
}

/// OpenAI's `finish_reason` for how generation ended.
pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::MaxTokens | StopReason::ContextFull => "length",
        StopReason::EndOfTurn
        | StopReason::StopString
        | StopReason::Repetition
        | StopReason::LineRefused
        | StopReason::Cancelled => "stop",
    }
}
