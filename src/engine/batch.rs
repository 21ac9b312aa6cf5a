//! Forward passes of sibling engines ([`Engine::sibling`](super::Engine::sibling))
//! on one model, the decode steps waiting at a moment run as one batched pass.

use super::device;
use super::kv_cache::KvCache;
use super::model::{Config, Pass, Rows, Transformer, PREFILL_BATCH};
use super::pool;
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
                serve(model, &requests, &counted)
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
/// prompt being encoded, if any, with every waiting decode step. With no
/// prompt, and enough decode steps of a small model on a CPU of several
/// threads, the pass is shared out by thread instead ([`Shares`]).
fn serve(model: Arc<Transformer>, requests: &mpsc::Receiver<Request>, decoding: &AtomicUsize) {
    let mut prompts: VecDeque<Encoding> = VecDeque::new();
    let mut shares = Shares::new(&model);
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
        if prompts.is_empty() && shares.take(&steps) {
            shares.run(&model, steps);
            continue;
        }
        if let Some(finished) = run_pass(&model, prompts.front_mut(), steps) {
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

/// A waiting decode step: its tokens, the sequence's cache and where its logits go.
type Step = (Vec<u32>, KvCache, Reply);

/// The rows a step adds to a pass: its token and any drafts.
fn step_rows((tokens, _, _): &Step) -> usize {
    tokens.len()
}

/// Rows each thread's share of a decode pass must reach for the pass to
/// be shared out. On candle's pool the threads split every matmul's
/// columns and meet about ten times a layer, each reading rows the other
/// wrote: on an AMD EPYC host whose two vCPUs answered each other in 50-95
/// ns, or for minutes at a time in 320-380, sixteen SmolLM2 sequences
/// decoded at 1,120-1,290 tok/s or 840-990. Shared out, eight a thread,
/// they kept 1,110-1,380 either way. With four a thread the column split
/// was faster while the vCPUs sat close (eight sequences 1,137-1,203
/// tok/s against 998-1,134), and with one or two a thread always.
const SHARE_ROWS: usize = 8;

/// The largest model, in parameters of its matmuls, whose decode passes
/// are shared out. Sharing out, each thread reads every weight itself and
/// multiplies each weight block by half the rows, which a larger model's
/// longer matmuls pay for: sixteen sequences of Qwen2.5-Coder-0.5B (493
/// million) decoded at 452-467 tok/s shared out against 393-475 on the
/// pool, and of Qwen2.5-Coder-1.5B (1.5 billion) at 125-130 against
/// 130-141, where SmolLM2 (135 million) gained.
const SHARED_MODEL_PARAMETERS: usize = 256_000_000;

/// Decode passes shared out by thread: each thread runs the steps of its
/// own sequences through the whole model, its pool helpers
/// ([`pool::alone_on_this_thread`]) doing all their work on it. The batch
/// worker runs the first share and a helper thread each other one; every
/// sequence's rows are the bits it gets in a pass of its own.
struct Shares {
    /// One share per thread: the CPU pool's threads, or one where passes
    /// are not shared out (other devices, larger models).
    threads: usize,
    /// The helper threads, started with the first shared pass.
    helpers: Vec<Helper>,
}

/// A thread that runs the shares it is sent and says when each is done.
struct Helper {
    work: mpsc::Sender<Vec<Step>>,
    done: mpsc::Receiver<()>,
}

impl Shares {
    fn new(model: &Transformer) -> Self {
        let shared =
            model.device().is_cpu() && matmul_parameters(model.config()) <= SHARED_MODEL_PARAMETERS;
        let threads = if shared { device::default_threads() } else { 1 };
        Shares {
            threads,
            helpers: Vec::new(),
        }
    }

    /// Whether a pass of `steps` is shared out.
    fn take(&self, steps: &[Step]) -> bool {
        let rows: usize = steps.iter().map(step_rows).sum();
        self.threads > 1 && steps.len() >= self.threads && rows >= self.threads * SHARE_ROWS
    }

    /// Run `steps` as one share per thread, every share's steps replied to
    /// as it ends; returns once all have.
    fn run(&mut self, model: &Arc<Transformer>, steps: Vec<Step>) {
        let mut shares = split_by_rows(steps, step_rows, self.threads).into_iter();
        let own = shares.next().unwrap_or_default();
        let mut sent = 0;
        for share in shares {
            // A helper that cannot be started, or has stopped, leaves its
            // share to this thread.
            let unsent = match self.helper(model, sent) {
                Some(helper) => match helper.work.send(share) {
                    Ok(()) => {
                        sent += 1;
                        continue;
                    }
                    Err(mpsc::SendError(share)) => share,
                },
                None => share,
            };
            pool::alone_on_this_thread(|| run_pass(model, None, unsent));
        }
        pool::alone_on_this_thread(|| run_pass(model, None, own));
        for helper in &self.helpers[..sent] {
            // A helper that stopped mid-share dropped its steps' replies,
            // and their engines see the worker gone.
            let _ = helper.done.recv();
        }
    }

    /// The `index`th helper, started if it is the next one. Where a thread
    /// cannot be started, passes are no longer shared out.
    fn helper(&mut self, model: &Arc<Transformer>, index: usize) -> Option<&Helper> {
        if index == self.helpers.len() {
            match Helper::start(Arc::clone(model)) {
                Ok(helper) => self.helpers.push(helper),
                Err(err) => {
                    tracing::warn!("batched decoding: cannot start a helper thread: {err}");
                    self.threads = 1;
                    return None;
                }
            }
        }
        self.helpers.get(index)
    }
}

impl Helper {
    fn start(model: Arc<Transformer>) -> std::io::Result<Self> {
        let (work, shares) = mpsc::channel::<Vec<Step>>();
        let (finished, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("prism-share".into())
            .spawn(move || {
                for share in shares {
                    pool::alone_on_this_thread(|| run_pass(&model, None, share));
                    if finished.send(()).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Helper { work, done })
    }
}

/// The weights a decode step multiplies by: every layer's projections and
/// the output head.
fn matmul_parameters(config: &Config) -> usize {
    let hidden = config.hidden_size;
    let attention = hidden * (2 * config.heads + 2 * config.kv_heads) * config.head_dim;
    config.layers * (attention + 3 * hidden * config.intermediate_size) + config.vocab_size * hidden
}

/// `items` in `count` runs of consecutive items with about as many
/// `rows` each; none is empty unless there are fewer items than runs.
fn split_by_rows<T>(items: Vec<T>, rows: impl Fn(&T) -> usize, count: usize) -> Vec<Vec<T>> {
    let count = count.max(1);
    let mut rows_left: usize = items.iter().map(&rows).sum();
    let mut items_left = items.len();
    let mut items = items.into_iter();
    let mut shares = Vec::with_capacity(count);
    for shares_after in (0..count).rev() {
        let target = rows_left.div_ceil(shares_after + 1);
        let (mut share, mut taken) = (Vec::new(), 0);
        // At least one item, and while there are enough, one left for
        // each share after this one.
        while items_left > 0 && (share.is_empty() || taken < target && items_left > shares_after) {
            let Some(item) = items.next() else { break };
            taken += rows(&item);
            items_left -= 1;
            share.push(item);
        }
        rows_left -= taken;
        shares.push(share);
    }
    shares
}

/// One pass for the next batch of `prompt` and every waiting decode step;
/// each step's engine gets its own rows of the logits, or the error.
/// Returns the prompt's answer once its last batch has run or it failed.
fn run_pass(
    model: &Transformer,
    mut prompt: Option<&mut Encoding>,
    steps: Vec<Step>,
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

#[cfg(test)]
mod tests {
    use super::{matmul_parameters, split_by_rows, SHARED_MODEL_PARAMETERS};
    use crate::engine::model::{Architecture, Config};

    /// A configuration of the given shape: vocabulary, hidden and MLP
    /// widths, layers, query heads and key/value heads.
    fn shaped([vocab, hidden, intermediate, layers, heads, kv_heads]: [usize; 6]) -> Config {
        Config {
            architecture: Architecture::Llama,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: intermediate,
            layers,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            rope_interleaved: false,
            attention_bias: false,
            context_tokens: 8192,
        }
    }

    #[test]
    fn only_a_small_models_passes_are_shared_out() {
        let smollm2 = matmul_parameters(&shaped([49152, 576, 1536, 30, 9, 3]));
        let qwen_half = matmul_parameters(&shaped([151936, 896, 4864, 24, 14, 2]));
        let qwen_1_5 = matmul_parameters(&shaped([151936, 1536, 8960, 28, 12, 2]));
        assert_eq!(smollm2, 134_479_872);
        assert_eq!(qwen_half / 1_000_000, 493);
        assert_eq!(qwen_1_5 / 1_000_000, 1_543);
        assert!(smollm2 <= SHARED_MODEL_PARAMETERS);
        assert!(qwen_half > SHARED_MODEL_PARAMETERS);
    }

    /// The shares' row counts, for items given as their row counts.
    fn shares(rows: &[usize], count: usize) -> Vec<Vec<usize>> {
        split_by_rows(rows.to_vec(), |&rows| rows, count)
    }

    #[test]
    fn steps_are_split_into_consecutive_shares_of_about_as_many_rows() {
        assert_eq!(shares(&[1; 16], 2), vec![vec![1; 8], vec![1; 8]]);
        assert_eq!(shares(&[1; 17], 2), vec![vec![1; 9], vec![1; 8]]);
        assert_eq!(
            shares(&[1; 16], 3),
            vec![vec![1; 6], vec![1; 5], vec![1; 5]]
        );
        // A step with drafts counts each of its rows.
        assert_eq!(shares(&[4, 1, 1, 1, 1], 2), vec![vec![4], vec![1, 1, 1, 1]]);
        assert_eq!(shares(&[1, 1, 1, 1, 4], 2), vec![vec![1, 1, 1, 1], vec![4]]);
    }

    #[test]
    fn every_share_gets_a_step_while_steps_remain() {
        assert_eq!(shares(&[9, 1], 2), vec![vec![9], vec![1]]);
        assert_eq!(shares(&[1, 1, 9], 3), vec![vec![1], vec![1], vec![9]]);
        assert_eq!(shares(&[1], 2), vec![vec![1], vec![]]);
        assert_eq!(shares(&[], 2), vec![Vec::<usize>::new(); 2]);
    }
}
