//! The threads that own the engines, and the one queue that hands each request
//! to the free engine whose cache shares the most of its prompt.

use super::api::{ApiError, PromptInput};
use crate::engine::kv_cache::common_prefix;
use crate::engine::prompt_format::PromptFormat;
use crate::engine::{CachePreview, Engine, GenerateOptions, StopReason, Usage};
use std::cmp::Reverse;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// One request for the engine.
pub struct Job {
    pub prompt: PromptInput,
    pub task: Task,
    /// Past this the job stops (or never starts) and reports a timeout.
    pub deadline: Instant,
    /// Where the job's events go; when the receiver is gone (the client
    /// left) the job stops at the next token.
    pub events: UnboundedSender<Event>,
}

/// What a job asks of the engine.
pub enum Task {
    Generate {
        options: Box<GenerateOptions>,
        /// Send text as it is generated, not only at the end.
        stream: bool,
    },
    /// Say what the caches hold of the prompt, without running the model.
    Preview,
}

/// What a job reports, in order: text pieces when streaming, each with the
/// usage up to it, then one `Done`; a preview reports `Previewed` alone.
#[derive(Debug)]
pub enum Event {
    Text(String, Usage),
    Done(Result<Finished, ApiError>),
    Previewed(Result<CachePreview, ApiError>),
}

#[derive(Debug)]
pub struct Finished {
    pub text: String,
    pub stop_reason: StopReason,
    pub usage: Usage,
}

/// Start `parallel` engine threads, `engine` and siblings of it (see
/// [`Engine::sibling`]), and the thread that hands them the jobs of the
/// returned queue; all end when every sender of the queue is gone.
///
/// Requests wait in one queue and start in the order they came, as many at a
/// time as there are engines (`--parallel`), each on the free engine whose
/// cache shares the most of its prompt, where it continues whichever cached
/// sequence shares the most. The engines are siblings, so their decode steps
/// batch.
pub fn spawn(mut engine: Engine, parallel: usize) -> std::io::Result<mpsc::Sender<Job>> {
    let (queue, jobs) = mpsc::channel::<Job>();
    let format = engine.shared_format();
    let vocab = engine.config().vocab_size;
    let mut engines = Vec::with_capacity(parallel.max(1));
    for _ in 1..parallel.max(1) {
        engines.push(engine.sibling().map_err(std::io::Error::other)?);
    }
    engines.push(engine);
    let idle = Arc::new(Idle {
        cached: Mutex::new(vec![Some(Vec::new()); engines.len()]),
        freed: Condvar::new(),
    });
    let mut assign = Vec::with_capacity(engines.len());
    for (number, engine) in engines.into_iter().enumerate() {
        let (send, receive) = mpsc::channel();
        assign.push(send);
        let idle = Arc::clone(&idle);
        std::thread::Builder::new()
            .name(format!("prism-engine-{number}"))
            .spawn(move || serve(engine, number, receive, &idle))?;
    }
    std::thread::Builder::new()
        .name("prism-dispatch".into())
        .spawn(move || dispatch(jobs, &format, vocab, &assign, &idle))?;
    Ok(queue)
}

/// A job with its prompt as token ids, handed to one engine.
struct Assigned {
    job: Job,
    prompt: Vec<u32>,
}

/// Which engines are free, each with the tokens its cache holds.
struct Idle {
    /// `None` while the engine runs a job.
    cached: Mutex<Vec<Option<Vec<u32>>>>,
    freed: Condvar,
}

impl Idle {
    /// Wait for a free engine and take the one whose cache shares the most
    /// of `prompt` (the lowest-numbered on a tie); `None` if an engine thread
    /// panicked while holding the lock.
    fn take_best(&self, prompt: &[u32]) -> Option<usize> {
        let mut cached = self.cached.lock().ok()?;
        loop {
            let best = cached
                .iter()
                .enumerate()
                .filter_map(|(number, tokens)| {
                    let shared = common_prefix(tokens.as_ref()?, prompt);
                    Some((shared, Reverse(number)))
                })
                .max();
            if let Some((_, Reverse(number))) = best {
                cached[number] = None;
                return Some(number);
            }
            cached = self.freed.wait(cached).ok()?;
        }
    }

    fn release(&self, number: usize, tokens: Vec<u32>) {
        if let Ok(mut cached) = self.cached.lock() {
            cached[number] = Some(tokens);
            self.freed.notify_one();
        }
    }
}

/// Jobs start in the order they came, each on the free engine whose cache
/// shares the most of its prompt: a client's next request, which extends
/// its last, goes back to the engine that holds it.
fn dispatch(
    jobs: mpsc::Receiver<Job>,
    format: &PromptFormat,
    vocab: usize,
    engines: &[mpsc::Sender<Assigned>],
    idle: &Idle,
) {
    for job in jobs {
        if job.events.is_closed() {
            continue;
        }
        let prompt = match prompt_ids(format, vocab, &job.prompt) {
            Ok(prompt) => prompt,
            Err(err) => {
                let _ = job.events.send(Event::Done(Err(err)));
                continue;
            }
        };
        let Some(number) = idle.take_best(&prompt) else {
            return;
        };
        if engines[number].send(Assigned { job, prompt }).is_err() {
            return;
        }
    }
}

/// One engine thread: the jobs handed to it, until the dispatcher is gone.
fn serve(mut engine: Engine, number: usize, jobs: mpsc::Receiver<Assigned>, idle: &Idle) {
    for Assigned { job, prompt } in jobs {
        if !job.events.is_closed() {
            let timed_out = Instant::now() >= job.deadline;
            let event = match &job.task {
                _ if timed_out => Event::Done(Err(ApiError::timeout())),
                Task::Generate { options, stream } => {
                    Event::Done(run(&mut engine, &job, &prompt, options, *stream))
                }
                Task::Preview => Event::Previewed(engine.preview(&prompt).map_err(ApiError::from)),
            };
            // The client may have gone meanwhile; nobody is left to tell.
            let _ = job.events.send(event);
        }
        idle.release(number, engine.cached_tokens().to_vec());
    }
}

fn prompt_ids(
    format: &PromptFormat,
    vocab: usize,
    prompt: &PromptInput,
) -> Result<Vec<u32>, ApiError> {
    Ok(match prompt {
        PromptInput::Chat(messages) => format.chat_prompt(messages)?,
        PromptInput::Text(text) => format.text_prompt(text)?,
        PromptInput::Ids(ids) => {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(format!(
                    "token id {bad} is outside the model's vocabulary of {vocab}"
                )));
            }
            ids.clone()
        }
    })
}

fn run(
    engine: &mut Engine,
    job: &Job,
    prompt: &[u32],
    options: &GenerateOptions,
    streaming: bool,
) -> Result<Finished, ApiError> {
    let tokenizer = engine.tokenizer().clone();
    let mut stream = TextStream::new(&options.stop, options.sampling.loop_guard);
    let mut on_tokens = |tokens: &[u32], usage: &Usage| {
        if streaming {
            if let Ok(text) = tokenizer.decode(tokens, true) {
                if let Some(piece) = stream.advance(&text) {
                    let _ = job.events.send(Event::Text(piece, usage.clone()));
                }
            }
        }
        !job.events.is_closed() && Instant::now() < job.deadline
    };
    let generation = engine.generate_streaming(prompt, options, &mut on_tokens)?;
    if generation.stop_reason == StopReason::Cancelled && Instant::now() >= job.deadline {
        return Err(ApiError::timeout());
    }
    if streaming {
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

#[cfg(test)]
mod dispatch_tests {
    use super::Idle;
    use std::sync::{Condvar, Mutex};

    fn idle(cached: Vec<Option<Vec<u32>>>) -> Idle {
        Idle {
            cached: Mutex::new(cached),
            freed: Condvar::new(),
        }
    }

    #[test]
    fn a_job_goes_to_the_free_engine_that_holds_most_of_its_prompt() {
        let engines = idle(vec![Some(vec![1, 2, 3]), Some(vec![4, 5]), Some(vec![])]);
        assert_eq!(engines.take_best(&[4, 5, 6]), Some(1));
        assert_eq!(engines.take_best(&[4, 5, 7]), Some(0), "engine 1 is busy");
        assert_eq!(engines.take_best(&[9]), Some(2));
    }

    #[test]
    fn a_tie_goes_to_the_lowest_numbered_engine() {
        let engines = idle(vec![Some(vec![1]), Some(vec![1])]);
        assert_eq!(engines.take_best(&[1, 2]), Some(0));
    }

    #[test]
    fn with_every_engine_busy_the_job_waits_for_the_next_one_freed() {
        let engines = idle(vec![None, None]);
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| engines.take_best(&[7, 8]));
            std::thread::sleep(std::time::Duration::from_millis(20));
            engines.release(1, vec![7]);
            assert_eq!(waiting.join().unwrap(), Some(1));
        });
    }
}
