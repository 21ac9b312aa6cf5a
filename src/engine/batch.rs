//! Forward passes of several engines on one model, with their decode steps
//! batched.
//!
//! A decode step reads every weight of the model to produce one token; on a
//! CPU that read is the cost. Engines made by [`Engine::sibling`] share one
//! model and hand each forward pass to a single worker thread, which runs
//! every decode step waiting at that moment as one batched pass
//! ([`Transformer::forward_together`]). A prompt is encoded a batch of
//! tokens at a time, and the decode steps waiting at each batch share its
//! pass, so that the other sequences keep generating while a long prompt is
//! encoded instead of stalling until it ends. A decode step may carry
//! drafted tokens ([`super::Engine::set_draft_tokens`]), whose rows come
//! back with its own. Each engine keeps its own caches, sampling,
//! constraints and accounting; only the weights' read is shared.
//!
//! [`Engine::sibling`]: super::Engine::sibling

use super::device;
use super::kv_cache::KvCache;
use super::model::{Config, Pass, Rows, Transformer, PREFILL_BATCH};
use crate::error::{CandleContext, Error, Result};
use candle_core::Tensor;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How long the worker waits for the decoding sequences that have not sent
/// their next step yet. Between two steps a sequence only samples a token
/// (well under a millisecond, a few with a grammar), so a wait this short
/// gathers them all without holding the others back when one is busy
/// elsewhere.
const GATHER_WAIT: Duration = Duration::from_millis(3);

/// The model an engine runs, alone or shared with its siblings.
pub(crate) struct ModelRunner {
    model: Arc<Transformer>,
    /// Set once the model is shared: every forward pass goes through it.
    batcher: Option<Batcher>,
}

impl ModelRunner {
    pub(crate) fn new(model: Transformer) -> Self {
        ModelRunner {
            model: Arc::new(model),
            batcher: None,
        }
    }

    pub(crate) fn model(&self) -> &Transformer {
        &self.model
    }

    pub(crate) fn config(&self) -> &Config {
        self.model.config()
    }

    pub(crate) fn new_cache(&self) -> KvCache {
        self.model.new_cache()
    }

    /// A runner on the same model whose decode steps batch with this one's.
    /// The first call starts the worker thread.
    pub(crate) fn share(&mut self) -> Result<ModelRunner> {
        if self.batcher.is_none() {
            self.batcher = Some(Batcher::start(Arc::clone(&self.model))?);
        }
        Ok(ModelRunner {
            model: Arc::clone(&self.model),
            batcher: self.batcher.clone(),
        })
    }

    /// [`Transformer::forward`], on the worker thread when the model is shared.
    pub(crate) fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        pass: Pass,
    ) -> Result<Tensor> {
        self.bind_to_this_thread()?;
        match &self.batcher {
            None => self.model.forward(tokens, cache, pass),
            Some(batcher) => match pass {
                Pass::Decode if tokens.len() == 1 => batcher
                    .run(Work::Decode(tokens.to_vec()), cache, &self.model)?
                    .squeeze(0)
                    .context("batched forward pass"),
                _ => batcher.run(Work::Tokens(tokens.to_vec(), pass), cache, &self.model),
            },
        }
    }

    /// Make the model's device current on the calling thread, which will
    /// drop the tensors it is given, wherever they were computed (see
    /// [`device::bind_to_this_thread`]).
    pub(crate) fn bind_to_this_thread(&self) -> Result<()> {
        device::bind_to_this_thread(self.model.device())
    }

    /// Whether [`ModelRunner::forward_rows`] gives each row the bits a
    /// decode step of its token would, alone or beside other sequences.
    pub(crate) fn checks_drafts(&self) -> bool {
        self.model.decodes_rows_alone()
    }

    /// [`Transformer::forward_rows`], for drafted tokens; on the worker
    /// thread, among the other sequences' steps, when the model is shared.
    pub(crate) fn forward_rows(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.bind_to_this_thread()?;
        match &self.batcher {
            // No tokens is an error of this call alone, not of the shared pass.
            Some(batcher) if !tokens.is_empty() => {
                batcher.run(Work::Decode(tokens.to_vec()), cache, &self.model)
            }
            _ => self.model.forward_rows(tokens, cache),
        }
    }

    /// Marks this engine's sequence as decoding until the guard is dropped,
    /// so the worker waits for its steps before running a batch without it.
    pub(crate) fn decoding(&self) -> DecodingGuard {
        DecodingGuard::new(
            self.batcher
                .as_ref()
                .map(|batcher| Arc::clone(&batcher.decoding)),
        )
    }
}

pub(crate) struct DecodingGuard {
    decoding: Option<Arc<AtomicUsize>>,
}

impl DecodingGuard {
    fn new(decoding: Option<Arc<AtomicUsize>>) -> Self {
        if let Some(count) = &decoding {
            count.fetch_add(1, Ordering::SeqCst);
        }
        DecodingGuard { decoding }
    }
}

impl Drop for DecodingGuard {
    fn drop(&mut self) {
        if let Some(count) = &self.decoding {
            count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What one engine asks of the worker.
enum Work {
    /// A generated token, and any drafts checked after it: a decode step,
    /// batched with the other sequences' steps. Its answer is the logits
    /// after each token.
    Decode(Vec<u32>),
    /// Several tokens, or a prompt's: encoded a batch at a time, each batch
    /// with the decode steps waiting then.
    Tokens(Vec<u32>, Pass),
}

/// The cache travels to the worker with the work and comes back with the logits.
struct Request {
    work: Work,
    cache: KvCache,
    reply: Reply,
}

/// The sending side of the worker's queue, one per engine.
#[derive(Clone)]
struct Batcher {
    queue: mpsc::Sender<Request>,
    /// Sequences between the start and the end of their decoding loop.
    decoding: Arc<AtomicUsize>,
}

impl Batcher {
    /// Start the worker; it ends when every engine sharing it is gone.
    fn start(model: Arc<Transformer>) -> Result<Self> {
        let (queue, requests) = mpsc::channel();
        let decoding = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&decoding);
        std::thread::Builder::new()
            .name("prism-batch".into())
            .spawn(move || {
                // A failure here resurfaces, with its reason, as the first pass's error.
                if let Err(err) = device::bind_to_this_thread(model.device()) {
                    tracing::warn!("batched decoding: {err}");
                }
                serve(&model, &requests, &counted)
            })
            .map_err(|e| Error::Batch {
                reason: format!("cannot start its thread: {e}"),
            })?;
        Ok(Batcher { queue, decoding })
    }

    fn run(&self, work: Work, cache: &mut KvCache, model: &Transformer) -> Result<Tensor> {
        let (reply, answer) = mpsc::channel();
        // The engine's cache is lent to the worker; an empty one stands in until it is back.
        let lent = std::mem::replace(cache, model.new_cache());
        let gone = || Error::Batch {
            reason: "its worker thread has stopped".to_string(),
        };
        self.queue
            .send(Request {
                work,
                cache: lent,
                reply,
            })
            .map_err(|_| gone())?;
        let (returned, logits) = answer.recv().map_err(|_| gone())?;
        *cache = returned;
        logits
    }
}

/// A prompt the worker is encoding, a batch of tokens per pass.
struct Encoding {
    tokens: Vec<u32>,
    pass: Pass,
    /// Tokens encoded so far.
    done: usize,
    cache: KvCache,
    reply: Reply,
}

/// The worker's loop: take what is waiting, wait briefly for the decoding
/// sequences still missing, and run one pass: the next batch of the oldest
/// prompt being encoded, if any, with every waiting decode step.
fn serve(model: &Transformer, requests: &mpsc::Receiver<Request>, decoding: &AtomicUsize) {
    let mut prompts: VecDeque<Encoding> = VecDeque::new();
    loop {
        let mut waiting = Vec::new();
        if prompts.is_empty() {
            match requests.recv() {
                Ok(first) => waiting.push(first),
                Err(_) => return,
            }
        }
        gather(&mut waiting, requests, decoding);
        let mut steps = Vec::new();
        for request in waiting {
            match request.work {
                Work::Decode(tokens) => steps.push((tokens, request.cache, request.reply)),
                Work::Tokens(tokens, pass) if tokens.is_empty() => {
                    let mut cache = request.cache;
                    let logits = model.forward(&tokens, &mut cache, pass);
                    let _ = request.reply.send((cache, logits));
                }
                Work::Tokens(tokens, pass) => prompts.push_back(Encoding {
                    tokens,
                    pass,
                    done: 0,
                    cache: request.cache,
                    reply: request.reply,
                }),
            }
        }
        if let Some(finished) = run_pass(model, prompts.front_mut(), steps) {
            if let Some(prompt) = prompts.pop_front() {
                let _ = prompt.reply.send((prompt.cache, finished));
            }
        }
    }
}

/// Add to `waiting` what has arrived, waiting up to [`GATHER_WAIT`] for the
/// decoding sequences whose steps are not in yet.
fn gather(waiting: &mut Vec<Request>, requests: &mpsc::Receiver<Request>, decoding: &AtomicUsize) {
    let deadline = Instant::now() + GATHER_WAIT;
    loop {
        let steps = waiting
            .iter()
            .filter(|request| matches!(request.work, Work::Decode(_)))
            .count();
        let now = Instant::now();
        if steps >= decoding.load(Ordering::SeqCst) || now >= deadline {
            break;
        }
        match requests.recv_timeout(deadline - now) {
            Ok(request) => waiting.push(request),
            Err(_) => break,
        }
    }
    waiting.extend(requests.try_iter());
}

type Reply = mpsc::Sender<(KvCache, Result<Tensor>)>;

/// One pass for the next batch of `prompt` and every waiting decode step;
/// each step's engine gets its own rows of the logits, or the error.
/// Returns the prompt's answer once its last batch has run or it failed.
fn run_pass(
    model: &Transformer,
    mut prompt: Option<&mut Encoding>,
    steps: Vec<(Vec<u32>, KvCache, Reply)>,
) -> Option<Result<Tensor>> {
    let mut runs: Vec<(&[u32], Rows)> = Vec::with_capacity(steps.len() + 1);
    let mut caches: Vec<&mut KvCache> = Vec::with_capacity(steps.len() + 1);
    let mut step_caches = Vec::with_capacity(steps.len());
    let mut replies = Vec::with_capacity(steps.len());
    for (tokens, cache, reply) in steps {
        step_caches.push((tokens, cache));
        replies.push(reply);
    }
    let pass = match prompt.as_deref_mut() {
        Some(prompt) => {
            let end = prompt.tokens.len().min(prompt.done + PREFILL_BATCH);
            runs.push((&prompt.tokens[prompt.done..end], Rows::Last));
            caches.push(&mut prompt.cache);
            prompt.pass
        }
        None => Pass::Decode,
    };
    let first_step = runs.len();
    for (tokens, cache) in step_caches.iter_mut() {
        runs.push((tokens, Rows::Every));
        caches.push(cache);
    }
    if runs.is_empty() {
        return None;
    }
    let encoded = runs[0].0.len();
    let logits = model.forward_together(&runs, &mut caches, pass);
    drop(caches);
    let rows = |start: usize, count: usize| match &logits {
        Ok(logits) => logits
            .narrow(0, start, count)
            .context("batched forward pass"),
        // The error is the whole pass's; each engine gets its message.
        Err(err) => Err(Error::Batch {
            reason: err.to_string(),
        }),
    };
    let mut start = first_step;
    for ((tokens, cache), reply) in step_caches.into_iter().zip(replies) {
        let _ = reply.send((cache, rows(start, tokens.len())));
        start += tokens.len();
    }
    let prompt = prompt?;
    prompt.done += encoded;
    match logits {
        Err(err) => Some(Err(err)),
        Ok(_) if prompt.done == prompt.tokens.len() => {
            Some(rows(0, 1).and_then(|row| row.squeeze(0).context("batched forward pass")))
        }
        Ok(_) => None,
    }
}
