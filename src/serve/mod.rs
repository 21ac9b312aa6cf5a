//! `prism serve`: an OpenAI-compatible HTTP server on the prism engine.

pub mod api;
mod worker;

use crate::engine::tokenizer::Tokenizer;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::llm::wire::{
    ApiUsage, ChatRequest, Choice, CompletionRequest, GenerationFields, ModelCard, ModelList,
    Reply, ReplyMessage, TokenizeReply, TokenizeRequest,
};
use api::{ApiError, PromptInput};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use worker::{Event, Finished, Job, Task};

/// Limits and access for a server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// When set, requests must carry `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// The most tokens a request may ask for, and what it gets when it names none.
    pub max_tokens: usize,
    /// From arrival, queueing included; past it a request gets 504.
    pub request_timeout: Duration,
    /// Requests generating at once; their decode steps share forward passes.
    pub parallel: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            api_key: None,
            max_body_bytes: 4 << 20,
            max_tokens: 2048,
            request_timeout: Duration::from_secs(600),
            parallel: 1,
        }
    }
}

/// A running server; dropping it stops it.
///
/// Requests queue for the engine threads (one unless `--parallel` says more;
/// see `worker.rs`), so a prompt that extends an earlier one reuses its cached
/// prefix, as within one process. The HTTP side runs on a single-threaded
/// tokio runtime of its own: it only parses, waits and writes, while the
/// engine's threads do the work.
pub struct Server {
    address: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serve `engine` on `listener` (already bound) until stopped.
    pub fn start(
        engine: Engine,
        listener: std::net::TcpListener,
        options: ServeOptions,
    ) -> Result<Self> {
        let address = listener
            .local_addr()
            .map_err(|e| Error::invalid("listening socket", e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::invalid("listening socket", e.to_string()))?;
        let app = App {
            model: engine.name().to_string(),
            context_tokens: engine.context_tokens(),
            tokenizer: engine.format().tokenizer().clone(),
            queue: worker::spawn(engine, options.parallel)
                .map_err(|e| Error::invalid("engine thread", e.to_string()))?,
            options,
            next_id: AtomicU64::new(1),
        };
        let router = router(Arc::new(app));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::invalid("server runtime", e.to_string()))?;
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("prism-http".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let served = axum::serve(listener, router).with_graceful_shutdown(async {
                        let _ = stopped.await;
                    });
                    if let Err(error) = served.await {
                        tracing::error!("server stopped: {error}");
                    }
                });
            })
            .map_err(|e| Error::invalid("server thread", e.to_string()))?;
        Ok(Server {
            address,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serve until the process gets Ctrl-C, then stop.
    pub fn run_until_interrupted(self) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::invalid("signal handler", e.to_string()))?;
        runtime
            .block_on(tokio::signal::ctrl_c())
            .map_err(|e| Error::invalid("signal handler", e.to_string()))?;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct App {
    model: String,
    context_tokens: usize,
    /// For `/tokenize`, which needs no engine thread.
    tokenizer: Tokenizer,
    queue: mpsc::Sender<Job>,
    options: ServeOptions,
    next_id: AtomicU64,
}

fn router(app: Arc<App>) -> Router {
    let body_limit = app.options.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/v1/cache/preview", post(cache_preview))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(app)
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        message: "no such endpoint".into(),
        param: None,
    }
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(error) = app.authorize(&headers) {
        return error.into_response();
    }
    Json(ModelList {
        object: "list".to_string(),
        data: vec![ModelCard {
            id: app.model.clone(),
            object: "model".to_string(),
            created: 0,
            owned_by: "prism".to_string(),
            context_length: Some(app.context_tokens),
        }],
    })
    .into_response()
}

/// llama.cpp's `/tokenize`, so that a client can check which model it talks to.
async fn tokenize(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let request = match app.read::<TokenizeRequest>(&headers, body) {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let bos = app
        .tokenizer
        .bos_token_id()
        .filter(|_| request.add_special && app.tokenizer.add_bos());
    match app.tokenizer.encode(&request.content) {
        Ok(ids) => Json(TokenizeReply {
            tokens: bos.into_iter().chain(ids).collect(),
        })
        .into_response(),
        Err(error) => ApiError::invalid(error.to_string()).into_response(),
    }
}

/// prism's `/v1/cache/preview`: for the body of a chat or text completion
/// request, how many of its prompt's tokens the engine it would go to holds
/// in memory, on disk and in reusable segments, and where the prompt first
/// differs from them, without running the model.
async fn cache_preview(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let prompt = app.read::<Value>(&headers, body).and_then(|request| {
        let invalid = |e: serde_json::Error| ApiError::invalid(format!("request body: {e}"));
        match request.get("messages") {
            Some(_) => {
                let request: ChatRequest = serde_json::from_value(request).map_err(invalid)?;
                Ok(PromptInput::Chat(request.messages()?))
            }
            None => serde_json::from_value::<CompletionRequest>(request)
                .map_err(invalid)?
                .prompt(),
        }
    });
    let prompt = match prompt {
        Ok(prompt) => prompt,
        Err(error) => return error.into_response(),
    };
    let (events, mut received) = unbounded_channel();
    let job = Job {
        prompt,
        task: Task::Preview,
        deadline: Instant::now() + app.options.request_timeout,
        events,
    };
    if app.queue.send(job).is_err() {
        return ApiError::server("the engine thread has stopped").into_response();
    }
    let previewed = async {
        while let Some(event) = received.recv().await {
            match event {
                Event::Previewed(preview) => return preview,
                Event::Done(Err(error)) => return Err(error),
                Event::Text(..) | Event::Done(Ok(_)) => {}
            }
        }
        Err(ApiError::server(
            "the engine thread stopped during the request",
        ))
    };
    match tokio::time::timeout(app.options.request_timeout, previewed).await {
        Ok(Ok(preview)) => Json(preview).into_response(),
        Ok(Err(error)) => error.into_response(),
        Err(_) => ApiError::timeout().into_response(),
    }
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let request = app
        .read::<ChatRequest>(&headers, body)
        .and_then(|request| Ok((request.messages()?, request.fields)));
    match request {
        Ok((messages, fields)) => {
            app.respond(Kind::Chat, PromptInput::Chat(messages), &fields)
                .await
        }
        Err(error) => error.into_response(),
    }
}

async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let request = app
        .read::<CompletionRequest>(&headers, body)
        .and_then(|request| Ok((request.prompt()?, request.fields)));
    match request {
        Ok((prompt, fields)) => app.respond(Kind::Text, prompt, &fields).await,
        Err(error) => error.into_response(),
    }
}

/// The body as JSON of type `T`, or the error a client can act on.
fn parse<T: serde::de::DeserializeOwned>(
    body: std::result::Result<Bytes, BytesRejection>,
) -> std::result::Result<T, ApiError> {
    let body = body.map_err(|rejection| ApiError {
        status: rejection.status(),
        kind: "invalid_request_error",
        message: rejection.body_text(),
        param: None,
    })?;
    serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("request body: {e}")))
}

/// Which endpoint answers: the two differ only in the shape of their JSON.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Text,
}

impl App {
    /// The request in `body`, once `headers` show it may be made.
    fn read<T: serde::de::DeserializeOwned>(
        &self,
        headers: &HeaderMap,
        body: std::result::Result<Bytes, BytesRejection>,
    ) -> std::result::Result<T, ApiError> {
        self.authorize(headers)?;
        parse(body)
    }

    fn authorize(&self, headers: &HeaderMap) -> std::result::Result<(), ApiError> {
        let Some(key) = &self.options.api_key else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if given == Some(key.as_str()) {
            Ok(())
        } else {
            Err(ApiError {
                status: StatusCode::UNAUTHORIZED,
                kind: "authentication_error",
                message: "missing or wrong API key (Authorization: Bearer …)".into(),
                param: None,
            })
        }
    }

    async fn respond(
        &self,
        kind: Kind,
        prompt: PromptInput,
        fields: &GenerationFields,
    ) -> Response {
        let settings = match fields.settings(self.options.max_tokens) {
            Ok(settings) => settings,
            Err(error) => return error.into_response(),
        };
        let (events, received) = unbounded_channel();
        let job = Job {
            prompt,
            task: Task::Generate {
                options: Box::new(settings.options),
                stream: settings.stream,
            },
            deadline: Instant::now() + self.options.request_timeout,
            events,
        };
        if self.queue.send(job).is_err() {
            return ApiError::server("the engine thread has stopped").into_response();
        }
        let reply = Responder {
            kind,
            id: self.next_id(kind),
            created: unix_seconds(),
            model: self.model.clone(),
        };
        if settings.stream {
            reply
                .stream(received, settings.include_usage, settings.continuous_usage)
                .into_response()
        } else {
            match tokio::time::timeout(self.options.request_timeout, finished(received)).await {
                Ok(Ok(finished)) => Json(reply.whole(&finished)).into_response(),
                Ok(Err(error)) => error.into_response(),
                Err(_) => ApiError::timeout().into_response(),
            }
        }
    }

    fn next_id(&self, kind: Kind) -> String {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        };
        format!(
            "{prefix}-prism-{}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// The job's final event, skipping streamed text.
async fn finished(
    mut received: UnboundedReceiver<Event>,
) -> std::result::Result<Finished, ApiError> {
    while let Some(event) = received.recv().await {
        if let Event::Done(result) = event {
            return result;
        }
    }
    Err(ApiError::server(
        "the engine thread stopped during the request",
    ))
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// The parts every response object of one request shares.
struct Responder {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

impl Responder {
    fn envelope(&self, object: &str, choices: Vec<Choice>) -> Reply {
        Reply {
            id: self.id.clone(),
            object: object.to_string(),
            created: self.created,
            model: self.model.clone(),
            choices,
            ..Reply::default()
        }
    }

    fn whole(&self, finished: &Finished) -> Reply {
        let finish_reason = Some(api::finish_reason(finished.stop_reason).to_string());
        let (object, choice) = match self.kind {
            Kind::Chat => (
                "chat.completion",
                Choice {
                    message: Some(assistant(&finished.text)),
                    finish_reason,
                    ..Choice::default()
                },
            ),
            Kind::Text => (
                "text_completion",
                Choice {
                    text: Some(finished.text.clone()),
                    finish_reason,
                    ..Choice::default()
                },
            ),
        };
        Reply {
            usage: Some(ApiUsage::of(&finished.usage)),
            ..self.envelope(object, vec![choice])
        }
    }

    /// One stream chunk carrying `text` and, on the last, why generation ended.
    fn chunk(&self, text: &str, finish_reason: Option<&str>) -> Reply {
        let finish_reason = finish_reason.map(str::to_string);
        let choice = match self.kind {
            Kind::Chat => Choice {
                delta: Some(assistant(text)),
                finish_reason,
                ..Choice::default()
            },
            Kind::Text => Choice {
                text: Some(text.to_string()),
                finish_reason,
                ..Choice::default()
            },
        };
        self.envelope(self.chunk_object(), vec![choice])
    }

    /// Server-sent events: a chunk per piece of text (with the usage so far
    /// when `continuous_usage`), a last chunk with the finish reason, the
    /// usage when asked for, then `[DONE]`. Dropping the stream (the client
    /// left) drops the receiver, which stops the job.
    fn stream(
        self,
        received: UnboundedReceiver<Event>,
        include_usage: bool,
        continuous_usage: bool,
    ) -> Sse<impl futures_util::Stream<Item = std::result::Result<SseEvent, Infallible>>> {
        fn data(value: &impl serde::Serialize) -> SseEvent {
            let json = serde_json::to_string(value).expect("wire types serialize to JSON");
            SseEvent::default().data(json)
        }
        let received = stream::unfold(received, |mut received| async move {
            received.recv().await.map(|event| (event, received))
        });
        let events = received.flat_map(move |event| {
            let events = match event {
                Event::Text(text, usage) => {
                    let mut chunk = self.chunk(&text, None);
                    if continuous_usage {
                        chunk.usage = Some(ApiUsage::of(&usage));
                    }
                    vec![data(&chunk)]
                }
                Event::Done(Ok(finished)) => {
                    let reason = api::finish_reason(finished.stop_reason);
                    let mut events = vec![data(&self.chunk("", Some(reason)))];
                    if include_usage {
                        let last = Reply {
                            usage: Some(ApiUsage::of(&finished.usage)),
                            ..self.envelope(self.chunk_object(), Vec::new())
                        };
                        events.push(data(&last));
                    }
                    events.push(SseEvent::default().data("[DONE]"));
                    events
                }
                Event::Done(Err(error)) => {
                    vec![data(&error.body()), SseEvent::default().data("[DONE]")]
                }
                // A generation job never previews.
                Event::Previewed(_) => Vec::new(),
            };
            stream::iter(events.into_iter().map(Ok))
        });
        Sse::new(events)
    }

    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        }
    }
}

/// The assistant's turn, or a piece of it, as a chat reply carries it.
fn assistant(text: &str) -> ReplyMessage {
    ReplyMessage {
        role: Some("assistant".to_string()),
        content: Some(text.to_string()),
    }
}

#[cfg(test)]
mod tests;
