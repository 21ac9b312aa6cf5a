//! The remote client against servers that are not prism, faked in a few lines:
//! what it asks them first, the fields it then sends, and the models it refuses.

use crate::common::tiny_chat_model;
use axum::body::Bytes;
use axum::http::{Method, StatusCode, Uri};
use axum::{Json, Router};
use prism::engine::constraint::Grammar;
use prism::engine::prompt_format::PromptFormat;
use prism::engine::source::ModelSource;
use prism::engine::GenerateOptions;
use prism::llm::remote::{RemoteApi, RemoteConstraint, RemoteModel, RemoteOptions};
use prism::llm::{Backend, Completion, Prompt};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a fake server answers to `METHOD /path` with a JSON body (null if none).
type Answer = dyn Fn(&str, &Value) -> (u16, Value) + Send + Sync;

/// An HTTP server that answers with `answer` and records every request; dropping it stops it.
struct Fake {
    base: String,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fake {
    fn start(answer: Arc<Answer>) -> Fake {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&seen);
        let router = Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
            let request = format!("{method} {}", uri.path());
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (status, reply) = answer(&request, &body);
            recorded.lock().unwrap().push((request, body));
            async move { (StatusCode::from_u16(status).unwrap(), Json(reply)) }
        });
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Fake {
            base,
            seen,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// Every request so far, as `METHOD /path`, with its body.
    fn seen(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap().clone()
    }

    /// The bodies sent to `/v1/completions`.
    fn completions(&self) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|(request, _)| request == "POST /v1/completions")
            .map(|(_, body)| body)
            .collect()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A completion reply as every OpenAI-compatible server writes it.
fn reply(text: &str) -> (u16, Value) {
    let usage = json!({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4});
    let choice = json!({"index": 0, "text": text, "finish_reason": "stop"});
    (200, json!({"choices": [choice], "usage": usage}))
}

fn not_found() -> (u16, Value) {
    (404, json!({"detail": "Not Found"}))
}

/// The tiny chat model's prompt format, as the client and the fake servers read it.
fn tiny_format(dir: &std::path::Path) -> PromptFormat {
    tiny_chat_model(dir);
    let source = ModelSource::HfDir {
        dir: dir.to_path_buf(),
        name: "tiny-chat".into(),
    };
    PromptFormat::load(&source).unwrap()
}

/// llama-cpp-python's server as 0.3 answers: models owned by "me", tokens
/// from `/extras/tokenize` (with `shift` added to each id, for another
/// model's vocabulary), and a 500 listing validation errors for a prompt of
/// token ids.
fn llama_cpp_python(model: &'static str, tokens_of: PromptFormat, shift: u32) -> Arc<Answer> {
    Arc::new(move |request, body| match request {
        "GET /v1/models" => {
            let card = json!({"id": model, "object": "model", "owned_by": "me", "permissions": []});
            (200, json!({"object": "list", "data": [card]}))
        }
        "POST /extras/tokenize" => {
            let ids = tokens_of
                .tokenizer()
                .encode(body["input"].as_str().unwrap())
                .unwrap();
            let ids: Vec<u32> = ids.into_iter().map(|id| id + shift).collect();
            (200, json!({"tokens": ids}))
        }
        "POST /v1/completions" if body["prompt"].is_string() => reply("w3"),
        "POST /v1/completions" => {
            let message = "1773 validation errors for CreateCompletionRequest";
            (
                500,
                json!({"error": {"message": message, "type": "internal_server_error"}}),
            )
        }
        _ => not_found(),
    })
}

fn client(base: &str, format: PromptFormat, api: RemoteApi, allow_mismatch: bool) -> Backend {
    let options = RemoteOptions {
        base_url: base.to_string(),
        api_key: None,
        remote_model: None,
        api,
        constraint: RemoteConstraint::Auto,
        timeout: Duration::from_secs(60),
        retries: 3,
        allow_model_mismatch: allow_mismatch,
        allow_unconstrained: false,
    };
    Backend::Remote(Box::new(RemoteModel::new(format, options)))
}

/// One call with a grammar that has both dialects.
fn complete(backend: &mut Backend) -> prism::Result<Completion> {
    let prompt = Prompt {
        system: None,
        segments: vec!["w1 w2".to_string()],
        source: None,
        shared_segments: None,
    };
    let grammar = Grammar::Dialects {
        lark: "start: \"w3\"\n".into(),
        gbnf: "root ::= \"w3\"\n".into(),
    };
    let mut llm = backend.llm(GenerateOptions::default());
    llm.complete(&prompt, 8, Some(&grammar))
}

/// Issue 63: llama-cpp-python takes no token ids and ignores vLLM's
/// grammar field, so unasked the client sends it text and GBNF, having
/// asked the server once, for itself and its siblings.
#[test]
fn llama_cpp_python_gets_text_and_gbnf_without_flags() {
    let dir = tempfile::tempdir().unwrap();
    let server = llama_cpp_python(
        "SmolLM2-135M-Instruct-Q8_0.gguf",
        tiny_format(dir.path()),
        0,
    );
    let fake = Fake::start(server);
    let mut backend = client(&fake.base, tiny_format(dir.path()), RemoteApi::Auto, false);
    assert_eq!(complete(&mut backend).unwrap().text, "w3");
    let mut sibling = backend.sibling().unwrap();
    assert_eq!(complete(&mut sibling).unwrap().text, "w3");

    let requests: Vec<String> = fake.seen().into_iter().map(|(r, _)| r).collect();
    assert_eq!(
        requests,
        [
            "GET /v1/models",
            "POST /extras/tokenize",
            "POST /v1/completions",
            "POST /v1/completions"
        ]
    );
    for body in fake.completions() {
        assert!(body["prompt"].is_string(), "{body}");
        assert_eq!(body["grammar"], "root ::= \"w3\"\n", "{body}");
        assert!(body.get("guided_grammar").is_none(), "{body}");
    }
}

/// `--remote-prompt ids` stays an override: the ids go out, and the
/// server's validation error comes back at once, not after retries.
#[test]
fn an_explicit_prompt_choice_overrides_the_server_and_its_refusal_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let server = llama_cpp_python("tiny-chat", tiny_format(dir.path()), 0);
    let fake = Fake::start(server);
    let mut backend = client(&fake.base, tiny_format(dir.path()), RemoteApi::Ids, false);
    let refused = complete(&mut backend).unwrap_err().to_string();
    assert!(
        refused.contains("validation errors") && refused.contains("send it as text"),
        "{refused}"
    );
    let sent = fake.completions();
    assert_eq!(sent.len(), 1, "sent once: {sent:?}");
    assert!(sent[0]["prompt"].is_array(), "{}", sent[0]);
    assert!(sent[0].get("grammar").is_some(), "{}", sent[0]);
}

/// Issue 63: a server that tokenizes the probe text with another
/// vocabulary serves another model; the run ends before a prompt is sent,
/// naming both, unless the mismatch is allowed.
#[test]
fn a_server_with_another_model_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let served = "SmolLM2-135M-Instruct-Q8_0.gguf";
    let fake = Fake::start(llama_cpp_python(served, tiny_format(dir.path()), 7));
    let mut backend = client(&fake.base, tiny_format(dir.path()), RemoteApi::Auto, false);
    let refused = complete(&mut backend).unwrap_err().to_string();
    assert!(
        refused.contains(served) && refused.contains("tiny-chat") && refused.contains("tokenize"),
        "{refused}"
    );
    assert!(complete(&mut backend).is_err(), "refused on every call");
    assert!(fake.completions().is_empty());

    let mut allowed = client(&fake.base, tiny_format(dir.path()), RemoteApi::Auto, true);
    assert_eq!(complete(&mut allowed).unwrap().text, "w3");
}

/// Where the server tokenizes nothing, the model list decides: an id not
/// named like prism's model is refused, one that is passes.
#[test]
fn without_tokens_the_served_name_decides() {
    let dir = tempfile::tempdir().unwrap();
    let named = |id: &'static str| -> Arc<Answer> {
        Arc::new(move |request, _| match request {
            "GET /v1/models" => (200, json!({"data": [{"id": id, "owned_by": "vllm"}]})),
            "POST /v1/completions" => reply("w3"),
            _ => not_found(),
        })
    };
    let other = Fake::start(named("Qwen/Qwen2.5-Coder-1.5B-Instruct"));
    let mut backend = client(&other.base, tiny_format(dir.path()), RemoteApi::Auto, false);
    let refused = complete(&mut backend).unwrap_err().to_string();
    assert!(
        refused.contains("Qwen/Qwen2.5-Coder-1.5B-Instruct"),
        "{refused}"
    );

    let same = Fake::start(named("org/Tiny-Chat"));
    let mut backend = client(&same.base, tiny_format(dir.path()), RemoteApi::Auto, false);
    assert_eq!(complete(&mut backend).unwrap().text, "w3");
    let sent = same.completions();
    assert!(sent[0]["prompt"].is_array() && sent[0]["guided_grammar"].is_string());
}

/// A server that answers none of the probe's questions is used as before:
/// token ids, and the grammar as vLLM's `guided_grammar`.
#[test]
fn a_server_that_answers_no_probe_gets_ids_and_lark() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(Arc::new(|request, _| match request {
        "POST /v1/completions" => reply("w3"),
        _ => not_found(),
    }));
    let mut backend = client(&fake.base, tiny_format(dir.path()), RemoteApi::Auto, false);
    assert_eq!(complete(&mut backend).unwrap().text, "w3");
    let sent = fake.completions();
    assert_eq!(sent.len(), 1);
    assert!(sent[0]["prompt"].is_array(), "{}", sent[0]);
    assert_eq!(sent[0]["guided_grammar"], "start: \"w3\"\n");
    assert!(sent[0].get("grammar").is_none(), "{}", sent[0]);
}

/// A grammar the server cannot build fails the same way every time: its
/// 500 is not retried, nor is a 400.
#[test]
fn a_refused_grammar_or_a_4xx_is_sent_once() {
    let dir = tempfile::tempdir().unwrap();
    for (status, message) in [
        (
            500,
            "from_string: error parsing grammar file: parsed_grammar.rules is empty",
        ),
        (400, "max_tokens must be at least 1"),
    ] {
        let fake = Fake::start(Arc::new(move |request, _| match request {
            "POST /v1/completions" => (status, json!({"error": {"message": message}})),
            _ => not_found(),
        }));
        let mut backend = client(&fake.base, tiny_format(dir.path()), RemoteApi::Auto, false);
        let refused = complete(&mut backend).unwrap_err().to_string();
        assert!(refused.contains(message), "{refused}");
        assert_eq!(fake.completions().len(), 1, "HTTP {status} sent once");
    }
}

/// Without `--model`, the served model's name chooses the prompt format
/// when it names a model prism knows, with a directory or `.gguf` around it.
#[test]
fn the_served_id_names_a_known_model_or_none() {
    use prism::llm::probe::{served_model, ServedModel};
    let listing = |ids: &'static [&'static str]| -> Arc<Answer> {
        Arc::new(move |request, _| match request {
            "GET /v1/models" => (
                200,
                json!({"data": ids.iter().map(|id| json!({"id": id})).collect::<Vec<_>>()}),
            ),
            _ => not_found(),
        })
    };
    let timeout = Duration::from_secs(10);
    let gguf = Fake::start(listing(&[
        "qwen",
        "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    ]));
    assert_eq!(
        served_model(&gguf.base, None, timeout),
        ServedModel::Known {
            id: "/models/SmolLM2-135M-Instruct.Q4_1.gguf".to_string(),
            name: "smollm2-135m-instruct".to_string(),
        }
    );
    let hub = Fake::start(listing(&["Qwen/Qwen2.5-Coder-0.5B-Instruct"]));
    assert!(matches!(
        served_model(&hub.base, None, timeout),
        ServedModel::Known { name, .. } if name == "qwen2.5-coder-0.5b-instruct"
    ));
    let unknown = Fake::start(listing(&["my-finetune"]));
    assert_eq!(
        served_model(&unknown.base, None, timeout),
        ServedModel::Unknown {
            ids: vec!["my-finetune".to_string()]
        }
    );
    let silent = Fake::start(Arc::new(|_, _| not_found()));
    assert_eq!(
        served_model(&silent.base, None, timeout),
        ServedModel::Unknown { ids: vec![] }
    );
}

/// A server that ignores the grammar it is sent (as llama.cpp's ignores
/// vLLM's field) ends the run at its first reply, naming the way out, unless
/// the user allows it; a reply the grammar admits, or the start of one, passes.
#[test]
fn a_reply_outside_the_grammar_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    // A grammar is checked token by token, which needs the end token named.
    tiny_format(dir.path());
    let template = "{% for message in messages %}{{ message.content }} {% endfor %}";
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"chat_template": template, "eos_token": "</s>"}).to_string(),
    )
    .unwrap();
    let format = || {
        PromptFormat::load(&ModelSource::HfDir {
            dir: dir.path().to_path_buf(),
            name: "tiny-chat".into(),
        })
        .unwrap()
    };
    let answering = |text: &'static str| -> Arc<Answer> {
        Arc::new(move |request, _| match request {
            "POST /v1/completions" => reply(text),
            _ => not_found(),
        })
    };
    let ignoring = Fake::start(answering("w5 w6"));
    let mut backend = client(&ignoring.base, format(), RemoteApi::Ids, true);
    let refused = complete(&mut backend).unwrap_err().to_string();
    assert!(
        refused.contains("does not keep to the grammar")
            && refused.contains("pass allow_unconstrained"),
        "{refused}"
    );

    let options = RemoteOptions {
        base_url: ignoring.base.clone(),
        api_key: None,
        remote_model: None,
        api: RemoteApi::Ids,
        constraint: RemoteConstraint::Auto,
        timeout: Duration::from_secs(60),
        retries: 0,
        allow_model_mismatch: true,
        allow_unconstrained: true,
    };
    let mut allowed = Backend::Remote(Box::new(RemoteModel::new(format(), options)));
    assert_eq!(complete(&mut allowed).unwrap().text, "w5 w6");

    let keeping = Fake::start(answering("w3"));
    let mut backend = client(&keeping.base, format(), RemoteApi::Ids, true);
    assert_eq!(complete(&mut backend).unwrap().text, "w3");
    let cut_short = Fake::start(answering(""));
    let mut backend = client(&cut_short.base, format(), RemoteApi::Ids, true);
    assert_eq!(complete(&mut backend).unwrap().text, "");
}
