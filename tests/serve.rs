//! `prism serve` and the remote backend: methods run over HTTP against prism's
//! own server account exactly as they do locally, and bad requests leave the
//! server answering the next one.

use crate::common::{fetched_model, run_prism, tiny_chat_model, words_document};
use prism::engine::source::ModelSource;
use prism::engine::{Engine, EngineConfig, GenerateOptions};
use prism::llm::remote::{RemoteApi, RemoteConstraint, RemoteModel, RemoteOptions};
use prism::llm::wire::{ErrorBody, ErrorDetail, Reply};
use prism::llm::{Backend, Prompt};
use prism::serve::{ServeOptions, Server};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::Duration;

fn load(source: &ModelSource) -> Engine {
    let config = EngineConfig {
        // As the CLI sets it, so local and served runs cache alike.
        cache_slots: 2,
        ..EngineConfig::new(source.clone())
    };
    Engine::open(&config).unwrap()
}

fn tiny_source(dir: &Path) -> ModelSource {
    tiny_chat_model(dir);
    ModelSource::HfDir {
        dir: dir.to_path_buf(),
        name: "tiny-chat".into(),
    }
}

/// A tiny chat model in `dir/model`: its directory and its source.
fn tiny_model_in(dir: &Path) -> (std::path::PathBuf, ModelSource) {
    let model = dir.join("model");
    std::fs::create_dir(&model).unwrap();
    let source = tiny_source(&model);
    (model, source)
}

fn serve(source: &ModelSource, options: ServeOptions) -> (Server, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(load(source), listener, options).unwrap();
    let base = format!("http://{}/v1", server.address());
    (server, base)
}

fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let sent = ureq::post(&format!("{base}/{path}")).send_json(body);
    match sent {
        Ok(response) => (response.status(), response.into_json().unwrap()),
        Err(ureq::Error::Status(code, response)) => (code, response.into_json().unwrap()),
        Err(other) => panic!("{other}"),
    }
}

fn post_raw(base: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let sent = ureq::post(&format!("{base}/{path}"))
        .set("Content-Type", "application/json")
        .send_bytes(body);
    match sent {
        Ok(response) => (response.status(), response.into_json().unwrap()),
        Err(ureq::Error::Status(code, response)) => (code, response.into_json().unwrap()),
        Err(other) => panic!("{other}"),
    }
}

/// A greedy text completion of token ids; its text.
fn complete_ids(base: &str, ids: &[u32], max_tokens: usize) -> String {
    let body = json!({"prompt": ids, "max_tokens": max_tokens, "temperature": 0});
    let (status, reply) = post(base, "completions", &body);
    assert_eq!(status, 200, "{reply}");
    reply["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Everything a stream delivers: the text pieces joined, and the usage chunk.
fn stream_ids(base: &str, ids: &[u32], max_tokens: usize) -> (String, Value) {
    let body = json!({"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}});
    let response = ureq::post(&format!("{base}/completions"))
        .send_json(&body)
        .unwrap();
    let mut text = String::new();
    let mut usage = Value::Null;
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(piece) = chunk["choices"][0]["text"].as_str() {
            text.push_str(piece);
        }
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
    }
    (text, usage)
}

fn summarize(model: &Path, doc: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "summarize",
        doc.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--chunk-tokens",
        "12",
        "--constrained",
        "off",
        "--revision-tokens",
        "24",
        "--answer-tokens",
        "16",
        "--threads",
        "1",
    ];
    args.extend(extra);
    let (success, _, stderr) = run_prism(&args);
    assert!(success, "{stderr}");
}

fn steps(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("steps.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn summarize_over_http_builds_the_same_memory_with_the_same_prompt_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (model, source) = tiny_model_in(dir.path());
    let doc = words_document(dir.path());
    let local = dir.path().join("local");
    summarize(&model, &doc, &local, &[]);

    let (_server, base) = serve(&source, ServeOptions::default());
    let remote = dir.path().join("remote");
    summarize(
        &model,
        &doc,
        &remote,
        &["--backend", "openai", "--base-url", &base],
    );

    let read = |run: &Path, file: &str| std::fs::read_to_string(run.join(file)).unwrap();
    assert_eq!(read(&local, "memory.json"), read(&remote, "memory.json"));
    assert_eq!(read(&local, "summary.txt"), read(&remote, "summary.txt"));
    let (local, remote) = (steps(&local), steps(&remote));
    assert_eq!(local.len(), remote.len());
    for (local, remote) in local.iter().zip(&remote) {
        for field in [
            "prompt_tokens",
            "reused_tokens",
            "net_tokens",
            "output_tokens",
        ] {
            assert_eq!(local[field], remote[field], "{field} of step {local}");
        }
    }
}

/// Hierarchical's chunks three at a time over HTTP, each a client of its own
/// of a server with three engines: the steps write what the local run in
/// turn wrote, and the merge reads them in order.
#[test]
fn summarize_sends_independent_chunks_side_by_side_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let (model, source) = tiny_model_in(dir.path());
    let doc = words_document(dir.path());
    let hierarchical = ["--method", "hierarchical", "--max-summary-tokens", "6"];
    let local = dir.path().join("local");
    summarize(&model, &doc, &local, &hierarchical);

    let options = ServeOptions {
        parallel: 3,
        ..ServeOptions::default()
    };
    let (_server, base) = serve(&source, options);
    let remote = dir.path().join("remote");
    let mut args = hierarchical.to_vec();
    args.extend([
        "--backend",
        "openai",
        "--base-url",
        &base,
        "--concurrency",
        "3",
    ]);
    summarize(&model, &doc, &remote, &args);

    let read = |run: &Path| std::fs::read_to_string(run.join("summary.txt")).unwrap();
    assert_eq!(read(&local), read(&remote));
    let written = |run: &Path| -> Vec<Value> {
        steps(run)
            .iter()
            .map(|step| json!([step["sources"], step["output"], step["prompt_tokens"]]))
            .collect()
    };
    let (local, remote) = (written(&local), written(&remote));
    assert!(local.len() > 3, "several chunks and a merge: {local:?}");
    assert_eq!(local, remote);
}

#[test]
fn the_servers_cached_tokens_are_the_engines_reused_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let (_server, base) = serve(&source, ServeOptions::default());
    let format = prism::engine::prompt_format::PromptFormat::load(&source).unwrap();
    let options = RemoteOptions {
        base_url: base,
        api_key: None,
        remote_model: None,
        api: RemoteApi::Ids,
        constraint: RemoteConstraint::Auto,
        timeout: Duration::from_secs(120),
        retries: 0,
        allow_model_mismatch: false,
        allow_unconstrained: false,
    };
    let mut remote = Backend::Remote(Box::new(RemoteModel::new(format, options)));
    let mut local = Backend::Local(Box::new(load(&source)));
    let prompts = [
        vec!["w2 w3 w4 ".to_string()],
        vec!["w2 w3 w4 ".to_string(), "w5 w6 ".to_string()],
        vec!["w9 w10 ".to_string()],
        vec!["w2 w3 w4 ".to_string(), "w5 w6 w7 ".to_string()],
    ];
    for segments in prompts {
        let prompt = Prompt {
            system: Some("w11 w12".into()),
            segments,
            source: None,
            shared_segments: None,
        };
        let local = local
            .llm(GenerateOptions::default())
            .complete(&prompt, 4, None)
            .unwrap();
        let remote = remote
            .llm(GenerateOptions::default())
            .complete(&prompt, 4, None)
            .unwrap();
        assert_eq!(local.text, remote.text);
        assert_eq!(local.usage.prompt_tokens, remote.usage.prompt_tokens);
        assert_eq!(local.usage.reused_tokens, remote.usage.reused_tokens);
        assert_eq!(local.usage.output_tokens, remote.usage.output_tokens);
    }
}

/// `/v1/cache/preview` says what a request would take from the caches
/// without running the model: after a completion, the same prompt
/// extended is held up to where it was, and a chat body is read as well.
#[test]
fn the_cache_preview_says_what_a_prompt_would_reuse_without_running_it() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let (_server, base) = serve(&source, ServeOptions::default());
    let first: Vec<u32> = (2..40).collect();
    complete_ids(&base, &first, 3);
    let extended: Vec<u32> = (2..60).collect();
    let (status, preview) = post(&base, "cache/preview", &json!({"prompt": extended}));
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["prompt_tokens"], 58);
    assert_eq!(preview["from_memory"], 38);
    assert_eq!(
        (preview["from_disk"].clone(), preview["by_segment"].clone()),
        (json!(0), json!(0))
    );
    assert_eq!(preview["computed"], 20);
    assert_eq!(preview["first_difference"], 38);
    // Previewing changed nothing: the real request reuses what it said.
    let body = json!({"prompt": extended, "max_tokens": 1, "temperature": 0});
    let (status, reply) = post(&base, "completions", &body);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["usage"]["prompt_tokens_details"]["cached_tokens"], 38);
    let chat = json!({"messages": [{"role": "user", "content": "w2 w3"}]});
    let (status, preview) = post(&base, "cache/preview", &chat);
    assert_eq!(status, 200, "{preview}");
    assert!(preview["prompt_tokens"].as_u64().unwrap() > 0, "{preview}");
    let (status, refused) = post(&base, "cache/preview", &json!({"messages": "no"}));
    assert_eq!(status, 400, "{refused}");
}

/// The remote constraint names the field a grammar goes in: prism serve
/// follows Lark sent as `guided_grammar`, and refuses llama.cpp's `grammar`
/// by name, at the first try.
#[test]
fn the_remote_constraint_names_the_field_the_grammar_goes_in() {
    use prism::engine::constraint::Grammar;
    use prism::engine::prompt_format::PromptFormat;
    let dir = tempfile::tempdir().unwrap();
    let engine = crate::constrained::char_model(dir.path());
    // A template for the client's prompt; the server is sent token ids.
    let config = json!({"bos_token": "<s>", "eos_token": "</s>",
        "chat_template": "{% for message in messages %}{{ message.content }}{% endfor %}"});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let source = ModelSource::HfDir {
        dir: dir.path().to_path_buf(),
        name: "tiny-chars".into(),
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(engine, listener, ServeOptions::default()).unwrap();
    let base = format!("http://{}/v1", server.address());
    let complete = |constraint: RemoteConstraint| {
        let options = RemoteOptions {
            base_url: base.clone(),
            api_key: None,
            remote_model: None,
            api: RemoteApi::Ids,
            constraint,
            timeout: Duration::from_secs(120),
            retries: 3,
            allow_model_mismatch: false,
            allow_unconstrained: false,
        };
        let format = PromptFormat::load(&source).unwrap();
        let mut remote = Backend::Remote(Box::new(RemoteModel::new(format, options)));
        let prompt = Prompt {
            system: None,
            segments: vec!["ab".to_string()],
            source: None,
            shared_segments: None,
        };
        let grammar = Grammar::Dialects {
            lark: "start: \"abc\"\n".into(),
            gbnf: "root ::= \"abc\"\n".into(),
        };
        let mut llm = remote.llm(GenerateOptions::default());
        llm.complete(&prompt, 8, Some(&grammar))
    };
    assert_eq!(complete(RemoteConstraint::Lark).unwrap().text, "abc");
    let refused = complete(RemoteConstraint::Gbnf).unwrap_err().to_string();
    assert!(
        refused.contains("HTTP 400") && refused.contains("GBNF") && !refused.contains("tries"),
        "{refused}"
    );
}

/// prism serve answers llama.cpp's `/tokenize` with its engine's tokens, so
/// that a client formatting prompts for another model is refused before it
/// sends one, naming both models.
#[test]
fn the_server_tokenizes_so_a_client_of_another_model_is_refused() {
    use prism::engine::prompt_format::PromptFormat;
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let (_server, base) = serve(&source, ServeOptions::default());
    let format = PromptFormat::load(&source).unwrap();
    let root = base.trim_end_matches("/v1");
    let (status, reply) = post(root, "tokenize", &json!({"content": "w1 w2 w3"}));
    assert_eq!(status, 200, "{reply}");
    let ids = format.tokenizer().encode("w1 w2 w3").unwrap();
    assert_eq!(reply["tokens"], json!(ids));

    let chars = dir.path().join("chars");
    std::fs::create_dir(&chars).unwrap();
    crate::constrained::char_model(&chars);
    let other = PromptFormat::load(&ModelSource::HfDir {
        dir: chars,
        name: "tiny-chars".into(),
    })
    .unwrap();
    let options = RemoteOptions {
        base_url: base.clone(),
        api_key: None,
        remote_model: None,
        api: RemoteApi::Auto,
        constraint: RemoteConstraint::Auto,
        timeout: Duration::from_secs(120),
        retries: 0,
        allow_model_mismatch: false,
        allow_unconstrained: false,
    };
    let mut remote = Backend::Remote(Box::new(RemoteModel::new(other, options)));
    let prompt = Prompt {
        system: None,
        segments: vec!["ab".to_string()],
        source: None,
        shared_segments: None,
    };
    let refused = remote
        .llm(GenerateOptions::default())
        .complete(&prompt, 4, None)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("serves tiny-chat, not tiny-chars"),
        "{refused}"
    );
}

#[test]
fn streaming_delivers_the_text_a_whole_reply_has() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let (_server, base) = serve(&source, ServeOptions::default());
    let ids = [3, 4, 5, 6, 7];
    let whole = complete_ids(&base, &ids, 20);
    let (streamed, usage) = stream_ids(&base, &ids, 20);
    assert_eq!(streamed, whole);
    assert_eq!(usage["completion_tokens"], 20);
    // The second call found the prompt cached, all but the last token,
    // whose logits the engine computes again to pick the first new one.
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        ids.len() - 1
    );
}

#[test]
fn eight_concurrent_clients_each_get_their_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let (_server, base) = serve(&source, ServeOptions::default());
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| vec![2 + i, 20 + i, 40 + i]).collect();
    let alone: Vec<String> = prompts
        .iter()
        .map(|ids| complete_ids(&base, ids, 6))
        .collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|ids| scope.spawn(|| complete_ids(&base, ids, 6)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    // Four engines at once, their decode steps batched, answer the same.
    let options = ServeOptions {
        parallel: 4,
        ..ServeOptions::default()
    };
    let (_parallel_server, parallel_base) = serve(&source, options);
    let batched: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|ids| scope.spawn(|| complete_ids(&parallel_base, ids, 6)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(batched, alone);
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_answers_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let options = ServeOptions {
        max_body_bytes: 1024,
        max_tokens: 32,
        ..ServeOptions::default()
    };
    let (_server, base) = serve(&source, options);
    let still_answers = || {
        complete_ids(&base, &[3, 4], 2);
    };

    let (status, reply) = post_raw(&base, "chat/completions", b"{\"messages\": [");
    assert_eq!(status, 400);
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("request body"));
    still_answers();

    let huge = json!({"prompt": "w2 ".repeat(1000)});
    let (status, reply) = post(&base, "completions", &huge);
    assert_eq!(status, 413, "{reply}");
    assert_eq!(reply["error"]["type"], "invalid_request_error");
    still_answers();

    let bad_schema = json!({"prompt": [3], "response_format":
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}});
    let (status, reply) = post(&base, "completions", &bad_schema);
    assert!(status == 400 || status == 500, "{status} {reply}");
    assert!(reply["error"]["message"].is_string());
    still_answers();

    let (status, reply) = post(
        &base,
        "completions",
        &json!({"prompt": [3], "max_tokens": 33}),
    );
    assert_eq!(status, 400);
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("limit of 32"));
    let (status, _) = post(&base, "completions", &json!({"prompt": [100000]}));
    assert_eq!(status, 400);

    // A client that leaves mid-stream: the server stops its generation and goes on.
    let body = json!({"prompt": [3, 4], "max_tokens": 32, "temperature": 0, "stream": true});
    let response = ureq::post(&format!("{base}/completions"))
        .send_json(&body)
        .unwrap();
    let mut first = String::new();
    BufReader::new(response.into_reader())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("data: "));
    still_answers();
}

/// Issue 63: what OpenAI and llama.cpp's server refuse in a chat, prism
/// serve refuses too, with a 400 naming the field; text parts are read as
/// the string they join to.
#[test]
fn a_chat_it_cannot_read_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let (_server, base) = serve(&source, ServeOptions::default());
    let chat = |content: Value| {
        json!({"messages": [{"role": "user", "content": content}],
            "max_tokens": 4, "temperature": 0})
    };
    let refusal = |body: &Value| -> ErrorDetail {
        let (status, reply) = post(&base, "chat/completions", body);
        assert_eq!(status, 400, "{reply}");
        serde_json::from_value::<ErrorBody>(reply).unwrap().error
    };

    let empty = refusal(&json!({"messages": []}));
    assert_eq!(empty.param.as_deref(), Some("messages"));
    assert_eq!(empty.kind, "invalid_request_error");
    let number = refusal(&chat(json!(42)));
    assert_eq!(number.param.as_deref(), Some("messages[0].content"));
    assert!(number.message.contains("messages[0].content is a number"));
    let image = refusal(&chat(json!([{"type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA=="}}])));
    assert_eq!(image.param.as_deref(), Some("messages[0].content[0].type"));
    assert!(image.message.contains("image_url"), "{}", image.message);

    let text_of = |body: &Value| {
        let (status, reply) = post(&base, "chat/completions", body);
        assert_eq!(status, 200, "{reply}");
        serde_json::from_value::<Reply>(reply)
            .unwrap()
            .text()
            .unwrap()
            .to_string()
    };
    let plain = text_of(&chat(json!("w3 w4 w5")));
    let parts = text_of(&chat(json!([{"type": "text", "text": "w3 w4"},
        {"type": "text", "text": " w5"}])));
    assert_eq!(parts, plain);
}

#[test]
fn an_api_key_is_required_when_set() {
    let dir = tempfile::tempdir().unwrap();
    let source = tiny_source(dir.path());
    let options = ServeOptions {
        api_key: Some("secret".into()),
        ..ServeOptions::default()
    };
    let (_server, base) = serve(&source, options);
    let (status, reply) = post(
        &base,
        "completions",
        &json!({"prompt": [3], "max_tokens": 1}),
    );
    assert_eq!(status, 401);
    assert_eq!(reply["error"]["type"], "authentication_error");
    let reply: Value = ureq::post(&format!("{base}/completions"))
        .set("Authorization", "Bearer secret")
        .send_json(json!({"prompt": [3], "max_tokens": 1}))
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(reply["usage"]["completion_tokens"], 1);
}

#[test]
fn a_json_schema_request_returns_json_that_validates() {
    let source = ModelSource::Gguf {
        path: fetched_model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        name: "smollm2-135m-instruct".into(),
    };
    let (_server, base) = serve(&source, ServeOptions::default());
    let text = json!({"type": "string", "maxLength": 40});
    let schema = json!({"type": "object", "properties": {"city": text, "country": text},
        "required": ["city", "country"], "additionalProperties": false});
    let body = json!({
        "messages": [{"role": "user", "content": "Name the capital of France and its country."}],
        "max_tokens": 120, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    });
    let (status, reply) = post(&base, "chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
    assert!(
        value["city"].is_string() && value["country"].is_string(),
        "{value}"
    );
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
}

#[test]
fn a_refused_line_closes_the_stream_where_the_local_engine_stops() {
    let source = ModelSource::Gguf {
        path: fetched_model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        name: "smollm2-135m-instruct".into(),
    };
    let (_server, base) = serve(&source, ServeOptions::default());
    let format = prism::engine::prompt_format::PromptFormat::load(&source).unwrap();
    let options = RemoteOptions {
        base_url: base,
        api_key: None,
        remote_model: None,
        api: RemoteApi::Ids,
        constraint: RemoteConstraint::Auto,
        timeout: Duration::from_secs(120),
        retries: 0,
        allow_model_mismatch: false,
        allow_unconstrained: false,
    };
    let mut remote = Backend::Remote(Box::new(RemoteModel::new(format, options)));
    let mut local = Backend::Local(Box::new(load(&source)));
    let prompt = Prompt {
        system: None,
        segments: vec!["List five colors, one per line.".into()],
        source: None,
        shared_segments: None,
    };
    let third_line = |kept: &str, _line: &str| {
        if kept.lines().count() >= 2 {
            prism::engine::LineVerdict::Stop
        } else {
            prism::engine::LineVerdict::Keep
        }
    };
    let options = GenerateOptions::default();
    let whole = local
        .llm(options.clone())
        .complete(&prompt, 80, None)
        .unwrap();
    let local = local
        .llm(options.clone())
        .complete_checking_lines(&prompt, 80, None, &third_line)
        .unwrap();
    assert_eq!(local.text.lines().count(), 2, "{}", whole.text);
    assert!(local.usage.output_tokens < whole.usage.output_tokens);
    let remote = remote
        .llm(options)
        .complete_checking_lines(&prompt, 80, None, &third_line)
        .unwrap();
    assert_eq!(local.text, remote.text);
    assert_eq!(local.usage.prompt_tokens, remote.usage.prompt_tokens);
    assert_eq!(local.usage.output_tokens, remote.usage.output_tokens);
}

/// The memory each run of a bench directory wrote, by run directory.
fn memories(bench: &Path) -> Vec<(String, String)> {
    let rows = std::fs::read_to_string(bench.join("results.jsonl")).unwrap();
    let mut memories: Vec<(String, String)> = rows
        .lines()
        .map(|line| {
            let row: Value = serde_json::from_str(line).unwrap();
            let run_dir = row["run_dir"].as_str().unwrap().to_string();
            let memory = std::fs::read_to_string(bench.join(&run_dir).join("memory.json"));
            (run_dir, memory.unwrap())
        })
        .collect();
    memories.sort();
    memories
}

#[test]
fn a_bench_of_two_documents_runs_side_by_side_over_http_with_the_local_results() {
    let dir = tempfile::tempdir().unwrap();
    let (model, source) = tiny_model_in(dir.path());
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    let first = words_document(&docs);
    let second = docs.join("second.txt");
    let text = std::fs::read_to_string(&first).unwrap();
    std::fs::write(&second, text.replace("w1", "w3")).unwrap();
    let bench = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "bench",
            docs.to_str().unwrap(),
            "--methods",
            "prism-amendments-unconstrained,prism-in-place-unconstrained",
            "--chunk-tokens",
            "12",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--revision-tokens",
            "12",
            "--answer-tokens",
            "8",
            "--threads",
            "1",
        ];
        args.extend(extra);
        run_prism(&args)
    };
    let local = dir.path().join("local");
    let (success, _, stderr) = bench(&local, &[]);
    assert!(success, "{stderr}");
    // Locally, runs side by side batch their decode steps and write the same memories.
    let batched = dir.path().join("batched");
    let (success, _, stderr) = bench(&batched, &["--parallel", "3"]);
    assert!(success, "{stderr}");
    assert_eq!(memories(&batched), memories(&local), "batched runs match");

    let (_server, base) = serve(&source, ServeOptions::default());
    let remote = dir.path().join("remote");
    let (success, stdout, stderr) = bench(
        &remote,
        &[
            "--backend",
            "openai",
            "--base-url",
            &base,
            "--concurrency",
            "3",
        ],
    );
    assert!(success, "{stderr}");
    let runs = memories(&remote);
    assert_eq!(runs.len(), 4, "two documents × two methods");
    assert!(runs
        .iter()
        .any(|(dir, _)| dir == "runs/second.txt/prism-in-place-unconstrained-12"));
    assert_eq!(runs, memories(&local), "each run's memory is the local one");
    assert!(
        stdout.contains("## doc.txt") && stdout.contains("## second.txt"),
        "{stdout}"
    );
}
