//! The OpenAI wire format, and the tokenize endpoints engines add to it, as
//! `prism serve` reads and writes them and the remote client writes and reads them.

use crate::engine::Usage;
use crate::metrics::Figures;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stop`: one string or several.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM's extension: the usage so far in every chunk, so a client that
    /// stops reading early still knows what its tokens cost.
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// `response_format`: free text, any JSON object, or JSON valid against a schema.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    /// OpenAI requires a name; other servers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub schema: Value,
}

/// The fields the chat and text endpoints share: length, stopping, sampling
/// (OpenAI's and prism's repetition controls) and constraints.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GenerationFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_last_n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_multiplier: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_base: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_allowed_length: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_penalty_last_n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_prompt: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_repeat_ngram: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loop_guard: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// A grammar in llguidance's Lark dialect, under vLLM's name for the
    /// field; prism serve also reads it as `lark`.
    #[serde(
        rename = "guided_grammar",
        alias = "lark",
        skip_serializing_if = "Option::is_none"
    )]
    pub lark: Option<String>,
    #[serde(
        rename = "guided_regex",
        alias = "regex",
        skip_serializing_if = "Option::is_none"
    )]
    pub regex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<Value>,
    /// A grammar in llama.cpp's GBNF, under the name llama.cpp's server and
    /// llama-cpp-python's read; prism serve does not.
    #[serde(
        rename = "grammar",
        alias = "gbnf",
        skip_serializing_if = "Option::is_none"
    )]
    pub gbnf: Option<String>,
    /// A GBNF grammar under SGLang's name for it; prism serve does not read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ebnf: Option<String>,
    /// vLLM's constraints since 0.12, which replace its `guided_*` fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<StructuredOutputs>,
    // Fields of the OpenAI API this server does not implement: refused when
    // they ask for something, rather than silently ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
}

/// The constraint of a request in vLLM's `structured_outputs`: one of a
/// grammar (GBNF or Lark, which vLLM tells apart), a regex or a JSON schema.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StructuredOutputs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
}

/// A chat message's content: a string, or parts of which only text is understood.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
    /// Anything else (a number, an object, null, a malformed part), kept
    /// so that the server can refuse it naming `messages[i].content`
    /// rather than failing the whole body with serde's "did not match any
    /// variant".
    Unreadable(Value),
}

/// A message without `content` reads as `null`, which is refused the same way.
impl Default for Content {
    fn default() -> Self {
        Content::Unreadable(Value::Null)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestMessage {
    pub role: String,
    #[serde(default)]
    pub content: Content,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<RequestMessage>,
    #[serde(flatten)]
    pub fields: GenerationFields,
}

/// `prompt` of a text completion: text, or token ids (one prompt only).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(flatten)]
    pub fields: GenerationFields,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: Option<usize>,
}

/// `usage` as OpenAI writes it, plus prism's own figures under `prism`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiUsage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    #[serde(default)]
    pub total_tokens: usize,
    /// Not every server says how much of the prompt it had cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prism: Option<PrismUsage>,
}

impl ApiUsage {
    /// Cached tokens are those not computed again: reused from memory,
    /// restored from disk or taken from a cached segment.
    pub fn of(usage: &Usage) -> Self {
        ApiUsage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.output_tokens,
            total_tokens: usage.prompt_tokens + usage.output_tokens,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: Some(
                    usage.reused_tokens + usage.restored_tokens + usage.segment_tokens,
                ),
            }),
            prism: Some(PrismUsage::of(usage)),
        }
    }
}

/// `GET /v1/models`: the models a server serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelList {
    #[serde(default)]
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub owned_by: String,
    /// A llama.cpp and prism extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<usize>,
}

/// `POST /tokenize` of llama.cpp's server, which prism serve answers too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    /// Whether BOS and the like go first; llama.cpp's default is no.
    #[serde(default)]
    pub add_special: bool,
}

/// `POST /extras/tokenize` of llama-cpp-python's server, which adds BOS
/// when the model does and has no field to say otherwise.
#[derive(Debug, Clone, Serialize)]
pub struct ExtrasTokenizeRequest {
    pub input: String,
}

/// `POST /tokenize` of vLLM, for one of the models it serves.
#[derive(Debug, Clone, Serialize)]
pub struct VllmTokenizeRequest {
    pub model: String,
    pub prompt: String,
    pub add_special_tokens: bool,
}

/// What all three tokenize endpoints answer, among other fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenizeReply {
    pub tokens: Vec<u32>,
}

/// `GET /version` on vLLM: the release it runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionReply {
    pub version: String,
}

/// A reply of either endpoint, whole or one stream chunk: `object` says
/// which. Servers other than prism may leave out everything but `choices`
/// and `usage`, and a stream may carry an `error` instead.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ApiUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

impl Reply {
    /// The text of the first choice: `text` from `/v1/completions`,
    /// `message.content` from a whole chat reply, `delta.content` from a
    /// chat stream chunk.
    pub fn text(&self) -> Option<&str> {
        let choice = self.choices.first()?;
        choice
            .text
            .as_deref()
            .or_else(|| choice.message.as_ref()?.content.as_deref())
            .or_else(|| choice.delta.as_ref()?.content.as_deref())
    }
}

/// One choice; which of `text`, `message` and `delta` it has depends on
/// the endpoint and on whether the reply streams.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<ReplyMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<ReplyMessage>,
    /// `null` until the last chunk of a stream.
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// The assistant's turn in a chat reply, or a piece of it in a stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplyMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default)]
    pub content: Option<String>,
}

/// The body of an error reply, or an error event in a stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(default)]
    pub message: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
}

/// What `prism serve` adds to `usage`: its figures and the times behind them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct PrismUsage {
    #[serde(flatten)]
    pub figures: Figures,
    pub prefill_seconds: f64,
    pub decode_steps: usize,
    pub decode_seconds: f64,
    pub mask_seconds: f64,
}

impl PrismUsage {
    pub fn of(usage: &Usage) -> Self {
        PrismUsage {
            figures: Figures::of(usage),
            prefill_seconds: usage.prefill_seconds,
            decode_steps: usage.decode_steps,
            decode_seconds: usage.decode_seconds,
            mask_seconds: usage.mask_seconds,
        }
    }

    /// The engine's usage, exactly as the server counted it.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.figures.prompt_tokens,
            reused_tokens: self.figures.reused_tokens,
            restored_tokens: self.figures.restored_tokens,
            segment_tokens: self.figures.segment_tokens,
            recomputed_tokens: self.figures.recomputed_tokens,
            output_tokens: self.figures.output_tokens,
            prefill_seconds: self.prefill_seconds,
            decode_steps: self.decode_steps,
            accepted_drafts: self.figures.accepted_drafts,
            accepted_lookup_drafts: self.figures.accepted_lookup_drafts,
            accepted_model_drafts: self.figures.accepted_model_drafts,
            decode_seconds: self.decode_seconds,
            mask_seconds: self.mask_seconds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_servers_usage_carries_accepted_drafts_by_source() {
        let usage = Usage {
            prompt_tokens: 5,
            output_tokens: 7,
            decode_steps: 6,
            accepted_drafts: 4,
            accepted_lookup_drafts: 1,
            accepted_model_drafts: 3,
            ..Usage::default()
        };
        let sent = serde_json::to_value(PrismUsage::of(&usage)).unwrap();
        assert_eq!(sent["accepted_model_drafts"], 3);
        assert_eq!(sent["accepted_lookup_drafts"], 1);
        let read: PrismUsage = serde_json::from_value(sent).unwrap();
        assert_eq!(read.usage(), usage);
    }

    #[test]
    fn a_grammar_goes_out_under_vllms_name_and_comes_in_under_either() {
        let fields = GenerationFields {
            model: Some("m".into()),
            lark: Some("start: \"a\"".into()),
            ..GenerationFields::default()
        };
        let sent = serde_json::to_value(&fields).unwrap();
        assert_eq!(
            sent,
            json!({"model": "m", "stream": false, "guided_grammar": "start: \"a\""})
        );
        for name in ["lark", "guided_grammar"] {
            let read: GenerationFields = serde_json::from_value(json!({ name: "g" })).unwrap();
            assert_eq!(read.lark.as_deref(), Some("g"));
        }
    }

    #[test]
    fn a_gbnf_grammar_goes_out_under_llama_cpps_name() {
        let fields = GenerationFields {
            gbnf: Some("root ::= \"a\"".into()),
            ..GenerationFields::default()
        };
        let sent = serde_json::to_value(&fields).unwrap();
        assert_eq!(sent, json!({"stream": false, "grammar": "root ::= \"a\""}));
    }

    #[test]
    fn a_foreign_reply_needs_only_choices_and_usage() {
        let whole: Reply = serde_json::from_value(json!({
            "choices": [{"message": {"content": "Hi"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }))
        .unwrap();
        assert_eq!(whole.text(), Some("Hi"));
        let usage = whole.usage.unwrap();
        assert_eq!(
            (usage.prompt_tokens, usage.prompt_tokens_details),
            (3, None)
        );
        let chunk: Reply =
            serde_json::from_value(json!({"choices": [{"delta": {"content": "H"}}]})).unwrap();
        assert_eq!(chunk.text(), Some("H"));
        let error: Reply = serde_json::from_value(json!({"error": {"message": "no"}})).unwrap();
        assert_eq!(
            error.error.map(|error| error.message).as_deref(),
            Some("no")
        );
    }

    #[test]
    fn a_stream_chunk_says_null_until_it_finishes() {
        let chunk = Reply {
            object: "text_completion".into(),
            choices: vec![Choice {
                text: Some("a".into()),
                ..Choice::default()
            }],
            ..Reply::default()
        };
        let written = serde_json::to_value(&chunk).unwrap();
        assert_eq!(
            written["choices"][0],
            json!({"index": 0, "text": "a", "finish_reason": null})
        );
        assert!(written.get("usage").is_none() && written.get("error").is_none());
    }
}
