//! What a remote server tells about itself when asked once, before the first call:
//! the engine behind it, the models it serves, and its tokens for a probe text.

use super::remote::{RemoteApi, RemoteConstraint};
use super::wire::{
    ExtrasTokenizeRequest, ModelList, TokenizeReply, TokenizeRequest, VersionReply,
    VllmTokenizeRequest,
};
use crate::engine::tokenizer::Tokenizer;
use crate::error::Result;
use crate::models::manifest::manifests;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// A text that two different vocabularies split or number differently.
pub const PROBE_TEXT: &str = "Who wrote the letters, and where? Naïve readers, 1984.";

/// The software behind an OpenAI-compatible API, as far as its answers tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    LlamaCpp,
    LlamaCppPython,
    Vllm,
    Sglang,
    Prism,
    Unknown,
}

impl std::fmt::Display for ServerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServerKind::LlamaCpp => "llama.cpp's server",
            ServerKind::LlamaCppPython => "llama-cpp-python's server",
            ServerKind::Vllm => "vLLM",
            ServerKind::Sglang => "SGLang",
            ServerKind::Prism => "prism serve",
            ServerKind::Unknown => "a server prism does not recognise",
        })
    }
}

/// What the probe learnt; a part the server did not answer is left empty.
#[derive(Debug)]
pub struct ServerFacts {
    pub kind: ServerKind,
    /// The ids `/v1/models` lists.
    pub models: Vec<String>,
    /// The server's tokens for [`PROBE_TEXT`], with whatever BOS it adds.
    pub probe_tokens: Option<Vec<u32>>,
    /// The release vLLM reports, as (major, minor).
    pub vllm_version: Option<(u32, u32)>,
}

/// How the server's model compares with the one prism formats prompts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelMatch {
    Same,
    /// The server told nothing to compare.
    Unknown,
    /// What tells them apart, in words.
    Different {
        evidence: String,
    },
}

impl ServerFacts {
    /// Ask the server at `base_url` (its API root, `…/v1`) what it is: its
    /// model list, then the tokenize endpoint its kind has. Each question
    /// that fails is left unanswered and said so at debug level, so a server
    /// with none of these endpoints is used as before.
    pub fn probe(agent: &ureq::Agent, base_url: &str, api_key: Option<&str>) -> ServerFacts {
        let base = base_url.trim_end_matches('/');
        // llama.cpp's and vLLM's own endpoints sit beside `/v1`, not under it.
        let root = base.strip_suffix("/v1").unwrap_or(base);
        let http = Http { agent, api_key };
        let listed = http.models(base);
        let owner = listed
            .as_ref()
            .and_then(|list| list.data.first())
            .map(|card| card.owned_by.as_str());
        let kind = match owner {
            Some("llamacpp") => ServerKind::LlamaCpp,
            Some("vllm") => ServerKind::Vllm,
            Some("sglang") => ServerKind::Sglang,
            Some("prism") => ServerKind::Prism,
            _ => ServerKind::Unknown,
        };
        let models: Vec<String> = listed
            .into_iter()
            .flat_map(|list| list.data)
            .map(|card| card.id)
            .collect();
        let (kind, tokens) = http.tokenize(root, kind, models.first());
        let probe_tokens = tokens
            .map_err(|e| tracing::debug!("{root}: no tokenize endpoint answered ({e})"))
            .ok();
        let vllm_version = (kind == ServerKind::Vllm)
            .then(|| http.get::<VersionReply>(&format!("{root}/version")))
            .and_then(|reply| {
                reply
                    .map_err(|e| tracing::debug!("{root}/version: {e}"))
                    .ok()
            })
            .and_then(|reply| major_minor(&reply.version));
        ServerFacts {
            kind,
            models,
            probe_tokens,
            vllm_version,
        }
    }

    /// The dialect `auto` means here: GBNF in the field each engine family
    /// reads it from (llama.cpp's `grammar`, SGLang's `ebnf`, the
    /// `structured_outputs` of a vLLM that no longer reads `guided_*`), and
    /// Lark elsewhere, as before servers were asked.
    pub fn constraint(&self) -> RemoteConstraint {
        match self.kind {
            ServerKind::LlamaCpp | ServerKind::LlamaCppPython => RemoteConstraint::Gbnf,
            ServerKind::Sglang => RemoteConstraint::Ebnf,
            ServerKind::Vllm if self.vllm_version >= Some(FIRST_VLLM_WITHOUT_GUIDED) => {
                RemoteConstraint::StructuredOutputs
            }
            ServerKind::Vllm | ServerKind::Prism | ServerKind::Unknown => RemoteConstraint::Lark,
        }
    }

    /// How `auto` sends prompts here: as text to llama-cpp-python, which
    /// refuses token ids with a 500, and as token ids elsewhere.
    pub fn api(&self) -> RemoteApi {
        match self.kind {
            ServerKind::LlamaCppPython => RemoteApi::Text,
            _ => RemoteApi::Ids,
        }
    }

    /// Whether the server runs the model `name` whose `tokenizer` prism
    /// formats prompts with. Its tokens for the probe text decide where the
    /// server gave them (a leading BOS aside, which llama-cpp-python adds);
    /// otherwise the served ids must name `remote_model` or resemble `name`.
    pub fn model_match(
        &self,
        tokenizer: &Tokenizer,
        name: &str,
        remote_model: &str,
    ) -> Result<ModelMatch> {
        if let Some(theirs) = &self.probe_tokens {
            let ours = tokenizer.encode(PROBE_TEXT)?;
            let after_bos = match (theirs.split_first(), tokenizer.bos_token_id()) {
                (Some((first, rest)), Some(bos)) if *first == bos => rest,
                _ => theirs.as_slice(),
            };
            return Ok(if *theirs == ours || after_bos == ours {
                ModelMatch::Same
            } else {
                ModelMatch::Different {
                    evidence: format!("the two tokenize {PROBE_TEXT:?} differently"),
                }
            });
        }
        if self.models.is_empty() {
            return Ok(ModelMatch::Unknown);
        }
        let named = |id: &String| id == remote_model || resembles(id, name);
        Ok(if self.models.iter().any(named) {
            ModelMatch::Same
        } else {
            ModelMatch::Different {
                evidence: "no served model is named like it".to_string(),
            }
        })
    }
}

/// The vLLM release that removed the `guided_*` request fields.
const FIRST_VLLM_WITHOUT_GUIDED: (u32, u32) = (0, 12);

/// "0.12.1" or "0.13.0rc2" as (0, 12) or (0, 13).
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// Whether a served id names the model prism calls `name`: ignoring case,
/// punctuation, the directory and a `.gguf` ending, one holds the other
/// (`Qwen/Qwen2.5-0.5B-Instruct`, `qwen2.5-0.5b-instruct-q8_0.gguf` and
/// `qwen2.5-0.5b-instruct` all do).
fn resembles(id: &str, name: &str) -> bool {
    let (id, name) = (name_key(id), name_key(name));
    !id.is_empty() && !name.is_empty() && (id.contains(&name) || name.contains(&id))
}

/// A model's name or file as [`resembles`] compares them: lowercase letters
/// and digits of its file name, without a `.gguf` ending.
fn name_key(text: &str) -> String {
    let file = text.rsplit(['/', '\\']).next().unwrap_or(text);
    let file = file.to_lowercase();
    let stem = file.strip_suffix(".gguf").unwrap_or(&file);
    stem.chars().filter(char::is_ascii_alphanumeric).collect()
}

/// Which model a server says it serves, among those prism knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServedModel {
    /// The served `id` names the known model `name`.
    Known { id: String, name: String },
    /// The server lists `ids` (perhaps none), and none names a known model.
    Unknown { ids: Vec<String> },
}

/// Ask the server at `base_url` (its API root, `…/v1`) which models it
/// serves, and find the first listed that names a model prism knows: the
/// served id must hold the known name, so that a bare "qwen" is not taken
/// for one Qwen model rather than another.
pub fn served_model(base_url: &str, api_key: Option<&str>, timeout: Duration) -> ServedModel {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let http = Http {
        agent: &agent,
        api_key,
    };
    let ids: Vec<String> = http
        .models(base_url.trim_end_matches('/'))
        .into_iter()
        .flat_map(|list| list.data)
        .map(|card| card.id)
        .collect();
    let known = manifests();
    for id in &ids {
        let served = name_key(id);
        if let Some(manifest) = known
            .iter()
            .find(|manifest| served.contains(&name_key(&manifest.name)))
        {
            return ServedModel::Known {
                id: id.clone(),
                name: manifest.name.clone(),
            };
        }
    }
    ServedModel::Unknown { ids }
}

/// JSON over the client's agent, with its timeouts and key.
struct Http<'a> {
    agent: &'a ureq::Agent,
    api_key: Option<&'a str>,
}

impl Http<'_> {
    /// What `{base}/models` lists, if the server answers it.
    fn models(&self, base: &str) -> Option<ModelList> {
        self.get::<ModelList>(&format!("{base}/models"))
            .map_err(|e| tracing::debug!("{base}/models: {e}; the served model stays unknown"))
            .ok()
    }

    fn get<T: DeserializeOwned>(&self, url: &str) -> std::result::Result<T, String> {
        self.read(self.authorized(self.agent.get(url)).call())
    }

    fn post<T: DeserializeOwned>(
        &self,
        url: &str,
        body: &impl serde::Serialize,
    ) -> std::result::Result<T, String> {
        self.read(self.authorized(self.agent.post(url)).send_json(body))
    }

    /// The tokens of [`PROBE_TEXT`] from the tokenize endpoint a server of
    /// `kind` has (serving `model` first), and the kind, which the endpoint
    /// that answers may tell where the model list did not.
    fn tokenize(
        &self,
        root: &str,
        kind: ServerKind,
        model: Option<&String>,
    ) -> (ServerKind, std::result::Result<Vec<u32>, String>) {
        let llama_cpp = TokenizeRequest {
            content: PROBE_TEXT.to_string(),
            add_special: false,
        };
        let reply = match kind {
            ServerKind::LlamaCpp | ServerKind::Prism => {
                self.post(&format!("{root}/tokenize"), &llama_cpp)
            }
            ServerKind::Vllm => {
                let vllm = VllmTokenizeRequest {
                    model: model.cloned().unwrap_or_default(),
                    prompt: PROBE_TEXT.to_string(),
                    add_special_tokens: false,
                };
                self.post(&format!("{root}/tokenize"), &vllm)
            }
            ServerKind::Sglang => Err("SGLang's tokenizer is not asked".to_string()),
            // llama-cpp-python lists its models as owned by "me"; its
            // tokenize endpoint is what tells it apart, then llama.cpp's.
            ServerKind::LlamaCppPython | ServerKind::Unknown => {
                let extras = ExtrasTokenizeRequest {
                    input: PROBE_TEXT.to_string(),
                };
                let extras =
                    match self.post::<TokenizeReply>(&format!("{root}/extras/tokenize"), &extras) {
                        Ok(reply) => return (ServerKind::LlamaCppPython, Ok(reply.tokens)),
                        Err(e) => e,
                    };
                return match self.post::<TokenizeReply>(&format!("{root}/tokenize"), &llama_cpp) {
                    Ok(reply) => (ServerKind::LlamaCpp, Ok(reply.tokens)),
                    Err(e) => (
                        kind,
                        Err(format!("/extras/tokenize: {extras}; /tokenize: {e}")),
                    ),
                };
            }
        };
        (kind, reply.map(|reply: TokenizeReply| reply.tokens))
    }

    fn authorized(&self, request: ureq::Request) -> ureq::Request {
        match self.api_key {
            Some(key) => request.set("Authorization", &format!("Bearer {key}")),
            None => request,
        }
    }

    fn read<T: DeserializeOwned>(
        &self,
        sent: std::result::Result<ureq::Response, ureq::Error>,
    ) -> std::result::Result<T, String> {
        sent.map_err(|e| e.to_string())?
            .into_json()
            .map_err(|e| format!("unreadable reply: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kind: ServerKind) -> ServerFacts {
        ServerFacts {
            kind,
            models: Vec::new(),
            probe_tokens: None,
            vllm_version: None,
        }
    }

    #[test]
    fn sglang_and_a_recent_vllm_get_gbnf_in_their_own_fields() {
        assert_eq!(
            facts(ServerKind::Sglang).constraint(),
            RemoteConstraint::Ebnf
        );
        let vllm = |version: &str| ServerFacts {
            vllm_version: major_minor(version),
            ..facts(ServerKind::Vllm)
        };
        assert_eq!(
            vllm("0.12.0").constraint(),
            RemoteConstraint::StructuredOutputs
        );
        assert_eq!(
            vllm("1.0.0rc1").constraint(),
            RemoteConstraint::StructuredOutputs
        );
        assert_eq!(vllm("0.11.2").constraint(), RemoteConstraint::Lark);
        assert_eq!(vllm("0.9.1").constraint(), RemoteConstraint::Lark);
        assert_eq!(major_minor("0.13.0rc2"), Some((0, 13)));
        assert_eq!(major_minor("dev"), None);
    }

    #[test]
    fn the_llama_cpp_family_gets_gbnf_and_llama_cpp_python_gets_text() {
        let chosen = |kind| (facts(kind).constraint(), facts(kind).api());
        assert_eq!(
            chosen(ServerKind::LlamaCpp),
            (RemoteConstraint::Gbnf, RemoteApi::Ids)
        );
        assert_eq!(
            chosen(ServerKind::LlamaCppPython),
            (RemoteConstraint::Gbnf, RemoteApi::Text)
        );
        for kind in [ServerKind::Vllm, ServerKind::Prism, ServerKind::Unknown] {
            assert_eq!(chosen(kind), (RemoteConstraint::Lark, RemoteApi::Ids));
        }
    }

    #[test]
    fn served_ids_resemble_prisms_names_across_spellings() {
        assert!(resembles(
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "smollm2-135m-instruct"
        ));
        assert!(resembles(
            "/models/SmolLM2-135M-Instruct-Q8_0.gguf",
            "smollm2-135m-instruct"
        ));
        assert!(resembles(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct"
        ));
        assert!(!resembles(
            "SmolLM2-135M-Instruct-Q8_0.gguf",
            "qwen2.5-coder-1.5b-instruct"
        ));
        assert!(!resembles("", "smollm2"));
        assert!(!resembles("/", "smollm2"));
    }
}
