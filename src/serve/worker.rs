//! The threads that own the engines. Requests wait in one queue and start in
//! the order they came, as many at a time as there are engines (`--parallel`),
//! each continuing whichever cached sequence of its engine shares the most of
//! its prompt. The engines are siblings, so their decode steps batch.

use super::api::{ApiError, PromptInput};
use crate::engine::{Engine, GenerateOptions, StopReason, Usage};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// One request for the engine.
pub struct Job {
    pub prompt: PromptInput,
    pub options: GenerateOptions,
    /// Send text as it is generated, not only at the end.
    pub stream: bool,
    /// Past this the job stops (or never starts) and reports a timeout.
    pub deadline: Instant,
    /// Where the job's events go; when the receiver is gone (the client
    /// left) the job stops at the next token.
    pub events: UnboundedSender<Event>,
}

/// What a job reports, in order: text pieces when streaming, each with the
/// usage up to it, then one `Done`.
#[derive(Debug)]
pub enum Event {
    Text(String, Usage),
    Done(Result<Finished, ApiError>),
}

#[derive(Debug)]
pub struct Finished {
    pub text: String,
    pub stop_reason: StopReason,
    pub usage: Usage,
}

/// Start `parallel` engine threads, `engine` and siblings of it (see
/// [`Engine::sibling`]), taking jobs from one queue in the order they came;
/// they end when every sender of the queue is gone.
pub fn spawn(mut engine: Engine, parallel: usize) -> std::io::Result<mpsc::Sender<Job>> {
    let (queue, jobs) = mpsc::channel::<Job>();
    let jobs = Arc::new(Mutex::new(jobs));
    let mut engines = Vec::with_capacity(parallel.max(1));
    for _ in 1..parallel.max(1) {
        engines.push(engine.sibling().map_err(std::io::Error::other)?);
    }
    engines.push(engine);
    for (number, engine) in engines.into_iter().enumerate() {
        let jobs = Arc::clone(&jobs);
        std::thread::Builder::new()
            .name(format!("prism-engine-{number}"))
            .spawn(move || serve(engine, &jobs))?;
    }
    Ok(queue)
}

/// One engine thread: the next job in the queue, until the queue closes.
fn serve(mut engine: Engine, jobs: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        // The lock is held only while waiting for the next job, so each job
        // goes to the first engine that is free.
        let next = match jobs.lock() {
            Ok(jobs) => jobs.recv(),
            Err(_) => return,
        };
        let Ok(job) = next else {
            return;
        };
        if job.events.is_closed() {
            continue;
        }
        let result = if Instant::now() >= job.deadline {
            Err(ApiError::timeout())
        } else {
            run(&mut engine, &job)
        };
        // The client may have gone meanwhile; nobody is left to tell.
        let _ = job.events.send(Event::Done(result));
    }
}

fn run(engine: &mut Engine, job: &Job) -> Result<Finished, ApiError> {
    let prompt = match &job.prompt {
        PromptInput::Chat(messages) => engine.chat_prompt(messages)?,
        PromptInput::Text(text) => engine.text_prompt(text)?,
        PromptInput::Ids(ids) => {
            let vocab = engine.config().vocab_size;
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(format!(
                    "token id {bad} is outside the model's vocabulary of {vocab}"
                )));
            }
            ids.clone()
        }
    };
    let tokenizer = engine.tokenizer().clone();
    let mut stream = TextStream::new(&job.options.stop, job.options.sampling.loop_guard);
    let mut on_tokens = |tokens: &[u32], usage: &Usage| {
        if job.stream {
            if let Ok(text) = tokenizer.decode(tokens, true) {
                if let Some(piece) = stream.advance(&text) {
                    let _ = job.events.send(Event::Text(piece, usage.clone()));
                }
            }
        }
        !job.events.is_closed() && Instant::now() < job.deadline
    };
    let generation = engine.generate_streaming(&prompt, &job.options, &mut on_tokens)?;
    if generation.stop_reason == StopReason::Cancelled && Instant::now() >= job.deadline {
        return Err(ApiError::timeout());
    }
    if job.stream {
        if let Some(rest) = stream.finish(&generation.text) {
            let _ = job.events.send(Event::Text(rest, generation.usage.clone()));
        }
    }
    Ok(Finished {
        text: generation.text,
        stop_reason: generation.stop_reason,
        usage: generation.usage,
    })
}

/// Decides how much of the text so far may be sent, so that the pieces
/// streamed always add up to the final text: it holds back an unfinished
/// UTF-8 character, a tail that may begin a stop string (the final text is
/// cut before it), and, under the loop guard, the line or sentence being
/// written (the guard cuts before a repeated one).
pub struct TextStream {
    sent: String,
    hold_bytes: usize,
    loop_guard: bool,
}

impl TextStream {
    pub fn new(stops: &[String], loop_guard: bool) -> Self {
        let longest_stop = stops.iter().map(String::len).max().unwrap_or(0);
        TextStream {
            sent: String::new(),
            hold_bytes: longest_stop.saturating_sub(1),
            loop_guard,
        }
    }

    /// The new piece that may be sent now, given all the text so far.
    pub fn advance(&mut self, text: &str) -> Option<String> {
        let text = text.trim_end_matches('\u{FFFD}');
        let mut end = text.len().saturating_sub(self.hold_bytes);
        if self.loop_guard {
            end = end.min(last_unit_end(text));
        }
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.take(&text[..end])
    }

    /// What is left to send of the final text.
    pub fn finish(&mut self, text: &str) -> Option<String> {
        self.take(text)
    }

    fn take(&mut self, ready: &str) -> Option<String> {
        let piece = ready.strip_prefix(self.sent.as_str())?;
        if piece.is_empty() {
            return None;
        }
        let piece = piece.to_string();
        self.sent.push_str(&piece);
        Some(piece)
    }
}

/// Where the last finished line or sentence of `text` ends (as the loop
/// guard sees them: at `\n`, or at `.`, `!` or `?` before whitespace).
fn last_unit_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    (0..bytes.len())
        .rev()
        .find(|&at| match bytes[at] {
            b'\n' => true,
            b'.' | b'!' | b'?' => bytes.get(at + 1).is_some_and(u8::is_ascii_whitespace),
            _ => false,
        })
        .map_or(0, |at| at + 1)
}
