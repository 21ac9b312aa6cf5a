//! Helpers shared by the integration tests.

use prism::engine::cache_slots::{place, Placement, SlotView};
use prism::engine::Usage;
use prism::llm::remote::CacheFigures;
use prism::llm::{
    complete_in_turn_checking_after, Completion, Llm, ModelInfo, Prompt, Request, TokenCounter,
};
use prism::run::dir::RunDir;
use prism::run::RunFiles;
use std::path::{Path, PathBuf};

/// Path of a model file that `scripts/setup` fetched into the models directory.
/// Panics with the command to run when it is missing: tests never download.
pub fn fetched_model(file_name: &str) -> PathBuf {
    let path = prism::models::models_dir().join(file_name);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/setup` (or `prism models fetch`) before the tests",
        path.display()
    );
    path
}

/// A tiny random model (see [`write_tiny_model`]) in `dir` whose tokenizer
/// knows exactly `words` after `<s>` (id 0) and `</s>` (id 1), loaded.
pub fn tiny_engine_with_words(
    dir: &std::path::Path,
    seed: u64,
    words: impl IntoIterator<Item = String>,
    name: &str,
) -> prism::engine::Engine {
    write_tiny_model(dir, TinyArch::Llama, seed);
    let mut vocab = serde_json::Map::new();
    vocab.insert("<s>".into(), 0.into());
    vocab.insert("</s>".into(), 1.into());
    for word in words {
        let id = vocab.len();
        vocab.insert(word, id.into());
    }
    assert_eq!(vocab.len(), TINY_VOCAB);
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<s>"), special(1, "</s>")],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": "</s>"}"#,
    )
    .unwrap();
    let source = prism::engine::source::ModelSource::HfDir {
        dir: dir.to_path_buf(),
        name: name.into(),
    };
    prism::engine::Engine::open(&prism::engine::EngineConfig::new(source)).unwrap()
}

/// Which tiny model to write.
#[derive(Debug, Clone, Copy)]
pub enum TinyArch {
    Llama,
    Qwen2,
}

pub const TINY_VOCAB: usize = 64;
pub const TINY_CONTEXT: usize = 256;

/// Write a random-weight model (config.json, model.safetensors, tokenizer.json)
/// with 2 layers, hidden size 32 and 4 query / 2 key-value heads into `dir`.
/// The same seed writes the same weights.
pub fn write_tiny_model(dir: &std::path::Path, arch: TinyArch, seed: u64) {
    use candle_core::{Device, Tensor};
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    let (hidden, intermediate, layers, heads, kv_heads) =
        (32usize, 64usize, 2usize, 4usize, 2usize);
    let head_dim = hidden / heads;
    let model_type = match arch {
        TinyArch::Llama => "llama",
        TinyArch::Qwen2 => "qwen2",
    };
    let config = serde_json::json!({
        "model_type": model_type,
        "vocab_size": TINY_VOCAB,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": TINY_CONTEXT,
        "tie_word_embeddings": matches!(arch, TinyArch::Qwen2),
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tensor = |dims: &[usize], scale: f32| {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
        Tensor::from_vec(data, dims, &Device::Cpu).unwrap()
    };
    let mut weights: HashMap<String, Tensor> = HashMap::new();
    weights.insert(
        "model.embed_tokens.weight".into(),
        tensor(&[TINY_VOCAB, hidden], 1.0),
    );
    for layer in 0..layers {
        let p = format!("model.layers.{layer}");
        let shapes = [
            ("self_attn.q_proj", heads * head_dim, hidden),
            ("self_attn.k_proj", kv_heads * head_dim, hidden),
            ("self_attn.v_proj", kv_heads * head_dim, hidden),
            ("self_attn.o_proj", hidden, heads * head_dim),
            ("mlp.gate_proj", intermediate, hidden),
            ("mlp.up_proj", intermediate, hidden),
            ("mlp.down_proj", hidden, intermediate),
        ];
        for (name, out_dim, in_dim) in shapes {
            weights.insert(
                format!("{p}.{name}.weight"),
                tensor(&[out_dim, in_dim], 0.3),
            );
        }
        if matches!(arch, TinyArch::Qwen2) {
            for (name, dim) in [
                ("q_proj", heads * head_dim),
                ("k_proj", kv_heads * head_dim),
                ("v_proj", kv_heads * head_dim),
            ] {
                weights.insert(format!("{p}.self_attn.{name}.bias"), tensor(&[dim], 0.3));
            }
        }
        weights.insert(
            format!("{p}.input_layernorm.weight"),
            tensor(&[hidden], 1.0),
        );
        weights.insert(
            format!("{p}.post_attention_layernorm.weight"),
            tensor(&[hidden], 1.0),
        );
    }
    weights.insert("model.norm.weight".into(), tensor(&[hidden], 1.0));
    if matches!(arch, TinyArch::Llama) {
        weights.insert("lm_head.weight".into(), tensor(&[TINY_VOCAB, hidden], 1.0));
    }
    candle_core::safetensors::save(&weights, dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer_json()).unwrap();
}

/// A word-level tokenizer over 64 ids: `<s>`, `</s>`, then the words `w2` … `w63`.
fn tiny_tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<s>".into(), 0.into());
    vocab.insert("</s>".into(), 1.into());
    for id in 2..TINY_VOCAB {
        vocab.insert(format!("w{id}"), id.into());
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "</s>"}
    })
    .to_string()
}

/// A tiny model that can chat: a chat template, and a context long enough
/// for PRISM's prompts, which hold its schema and instructions.
pub fn tiny_chat_model(dir: &Path) {
    write_tiny_model(dir, TinyArch::Llama, 5);
    let config_path = dir.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let config = config.replace(
        "\"max_position_embeddings\":256",
        "\"max_position_embeddings\":8192",
    );
    std::fs::write(&config_path, config).unwrap();
    let template = "{% for message in messages %}{{ message.content }} {% endfor %}";
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({ "chat_template": template }).to_string(),
    )
    .unwrap();
}

/// `doc.txt` in `dir`: eight short paragraphs of the tiny model's words.
pub fn words_document(dir: &Path) -> PathBuf {
    let path = dir.join("doc.txt");
    let paragraphs: Vec<String> = (0..8)
        .map(|p| {
            (0..6)
                .map(|w| format!("w{}", 2 + (p * 7 + w) % 60))
                .collect::<Vec<_>>()
                .join(" ")
                + "."
        })
        .collect();
    std::fs::write(&path, paragraphs.join("\n\n")).unwrap();
    path
}

/// The run files of a test run in `dir` (fingerprint "test", default
/// sampling): a fresh start or `resume`, stopping after `stop_after` units
/// when given.
pub fn scripted_files(dir: &RunDir, resume: bool, stop_after: Option<usize>) -> RunFiles<'_> {
    RunFiles {
        dir,
        fingerprint: "test".into(),
        resume,
        stop_after,
        sampling: Default::default(),
    }
}

/// The `prism` binary built for these tests.
pub fn prism() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_prism"))
}

/// Run `prism` and return (exit success, stdout, stderr).
pub fn run_prism(args: &[&str]) -> (bool, String, String) {
    let output = prism().args(args).output().expect("prism runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Assert a failed run printed exactly one line, an `error:` line containing `needle`, and no panic.
pub fn assert_one_error_line(result: &(bool, String, String), needle: &str) {
    let (success, _, stderr) = result;
    assert!(!success, "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(lines[0].contains(needle), "`{needle}` not in: {stderr}");
}

/// Assert a failed run ended with exactly one error line, an `error:` line
/// containing `needle`, after whatever progress it reported, and no panic.
pub fn assert_ends_with_one_error_line(result: &(bool, String, String), needle: &str) {
    let (success, _, stderr) = result;
    assert!(!success, "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "expected one error line, got: {stderr}");
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    assert_eq!(
        last,
        Some(errors[0]),
        "the error is not the last line: {stderr}"
    );
    assert!(errors[0].contains(needle), "`{needle}` not in: {stderr}");
}

/// A model that answers from a script and counts tokens as characters, with a
/// prefix cache over the characters of earlier prompts, as the engine has over
/// token ids: one cached sequence by default, or several
/// ([`ScriptedLlm::with_cache_slots`]) chosen as the engine's cache slots are.
pub struct ScriptedLlm {
    replies: Vec<String>,
    /// Every prompt it was given, in order.
    pub prompts: Vec<Prompt>,
    /// Cached sequences with the call that last used each.
    slots: Vec<(Vec<char>, usize)>,
    slot_limit: usize,
    context_tokens: usize,
    /// How many calls it says it runs side by side ([`ModelInfo::concurrency`]).
    at_once: usize,
    /// The size of every set of independent calls handed over, which still
    /// runs in turn, so the script is read in order.
    pub batches: Vec<usize>,
}

impl ScriptedLlm {
    pub fn new(replies: &[&str]) -> Self {
        Self::with_cache_slots(replies, 1)
    }

    /// Keep up to `slots` sequences: a prompt continues the one sharing its
    /// longest prefix (ties to the one used last), and when that would throw
    /// away most of it, works in another (a new one under the limit, else the
    /// least recently used), as `engine::cache_slots` does.
    pub fn with_cache_slots(replies: &[&str], slots: usize) -> Self {
        ScriptedLlm {
            replies: replies.iter().map(|r| r.to_string()).collect(),
            prompts: Vec::new(),
            slots: vec![(Vec::new(), 0)],
            slot_limit: slots.max(1),
            context_tokens: 1_000_000,
            at_once: 1,
            batches: Vec::new(),
        }
    }

    /// Say that `calls` run side by side, so methods hand over batches.
    pub fn with_concurrency(mut self, calls: usize) -> Self {
        self.at_once = calls;
        self
    }

    /// Report a context of `tokens` (characters) to the method under test.
    pub fn with_context(mut self, tokens: usize) -> Self {
        self.context_tokens = tokens;
        self
    }

    fn chars(prompt: &Prompt) -> Vec<char> {
        prompt
            .system
            .iter()
            .chain(&prompt.segments)
            .flat_map(|s| s.chars())
            .collect()
    }

    /// The slot `chars` goes to, and how many of its characters it reuses.
    fn take_slot(&mut self, chars: &[char]) -> (usize, usize) {
        let shared = |cached: &[char]| cached.iter().zip(chars).take_while(|(a, b)| a == b).count();
        let views: Vec<SlotView> = self
            .slots
            .iter()
            .map(|(cached, last_used)| SlotView {
                shared: shared(cached),
                len: cached.len(),
                last_used: *last_used as u64,
            })
            .collect();
        match place(&views, self.slot_limit) {
            Placement::Continue(index) => (index, views[index].shared),
            Placement::Copy { from, into } => {
                let index = into.unwrap_or_else(|| {
                    self.slots.push((Vec::new(), 0));
                    self.slots.len() - 1
                });
                (index, views[from].shared)
            }
        }
    }
}

impl ScriptedLlm {
    fn reply(&mut self, prompt: &Prompt, max_tokens: usize) -> Completion {
        let chars = Self::chars(prompt);
        let (slot, reused) = self.take_slot(&chars);
        // Like the engine, stop at the budget: a longer reply is cut off.
        let text: String = self
            .replies
            .get(self.prompts.len())
            .map(|reply| reply.chars().take(max_tokens).collect())
            .unwrap_or_default();
        self.prompts.push(prompt.clone());
        self.slots[slot] = (chars.clone(), self.prompts.len());
        Completion {
            usage: Usage {
                prompt_tokens: chars.len(),
                reused_tokens: reused.min(chars.len() - 1),
                output_tokens: text.chars().count(),
                ..Usage::default()
            },
            text,
        }
    }
}

impl Llm for ScriptedLlm {
    fn complete_each(
        &mut self,
        requests: &[Request<'_>],
        done: &mut dyn FnMut(usize),
    ) -> prism::Result<Vec<Completion>> {
        if requests.iter().all(|request| request.independent) {
            self.batches.push(requests.len());
        }
        complete_in_turn_checking_after(requests, done, |request| {
            Ok(self.reply(request.prompt, request.max_tokens))
        })
    }

    fn info(&self) -> ModelInfo<'_> {
        ModelInfo {
            context_tokens: self.context_tokens,
            concurrency: self.at_once,
            cache_figures: CacheFigures::Measured,
            counter: &Chars,
        }
    }
}

/// Tokens counted as characters, as [`ScriptedLlm`] counts them.
struct Chars;

impl TokenCounter for Chars {
    fn count_tokens(&self, text: &str) -> prism::Result<usize> {
        Ok(text.chars().count())
    }

    fn prompt_tokens(&self, prompt: &Prompt) -> prism::Result<usize> {
        Ok(ScriptedLlm::chars(prompt).len())
    }
}

/// The largest difference between two logit vectors `(vocab,)`.
pub fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    let (a, b) = (a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
