//! Decoder-only transformer models: what each supported architecture is, and
//! the configuration read from a GGUF file's metadata or a `config.json`.

mod attention;
mod rope;
mod transformer;
mod weight_file;
mod weights;

pub use transformer::{Rows, Transformer, PREFILL_BATCH};
pub(crate) use weight_file::WeightFile;
pub use weights::{Pass, PrefillWeights};

use crate::error::{Error, Result};
use candle_core::quantized::gguf_file;
use std::path::Path;

/// The model families prism can run.
///
/// Llama and Qwen2 share one forward pass (`transformer.rs`); the few ways they
/// differ are properties of this type, so there is no second copy of the
/// model code with small variations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Qwen2,
}

impl Architecture {
    /// Parse the name a GGUF file (`general.architecture`) or a `config.json`
    /// (`model_type`) gives.
    pub fn from_name(name: &str, model: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            other => Err(Error::UnsupportedArchitecture {
                model: model.to_string(),
                architecture: other.to_string(),
            }),
        }
    }

    /// The prefix of this architecture's GGUF metadata keys.
    fn gguf_prefix(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }

    /// Qwen2 adds learned biases to the query, key and value projections.
    fn attention_bias(self) -> bool {
        matches!(self, Architecture::Qwen2)
    }

    /// Which RoPE layout the stored q/k weights expect. llama.cpp's converter
    /// permutes Llama's q/k rows so that rotation pairs adjacent dimensions
    /// (interleaved); Qwen2 GGUF files and every Hugging Face checkpoint keep
    /// the split-halves (NeoX) layout.
    fn rope_interleaved(self, from_gguf: bool) -> bool {
        from_gguf && self == Architecture::Llama
    }
}

/// The longest context prism accepts from a model's metadata: four times
/// that of the largest shipped Llama and Qwen models.
pub const MAX_CONTEXT_TOKENS: usize = 1 << 19;

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_interleaved: bool,
    pub attention_bias: bool,
    /// The longest sequence the model was trained for; prompts beyond it are refused.
    pub context_tokens: usize,
}

impl Config {
    /// Read the configuration from GGUF metadata (`{arch}.block_count` and friends).
    pub fn from_gguf(content: &gguf_file::Content, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            reason,
        };
        let get = |key: &str| {
            content
                .metadata
                .get(key)
                .ok_or_else(|| bad(format!("metadata key `{key}` is missing")))
        };
        let arch_name = get("general.architecture")?
            .to_string()
            .map_err(|e| bad(format!("general.architecture: {e}")))?;
        let architecture = Architecture::from_name(arch_name, &path.display().to_string())?;
        let prefix = architecture.gguf_prefix();
        let integer = |key: &str| -> Result<usize> {
            let key = format!("{prefix}.{key}");
            let value = get(&key)?;
            value
                .to_u64()
                .or_else(|_| value.to_u32().map(u64::from))
                .map(|v| v as usize)
                .map_err(|e| bad(format!("{key}: {e}")))
        };
        let float = |key: &str, default: f64| -> Result<f64> {
            let key = format!("{prefix}.{key}");
            match content.metadata.get(&key) {
                None => Ok(default),
                Some(value) => value
                    .to_f32()
                    .map(f64::from)
                    .map_err(|e| bad(format!("{key}: {e}"))),
            }
        };
        let hidden_size = integer("embedding_length")?;
        let heads = integer("attention.head_count")?;
        let kv_heads = integer("attention.head_count_kv").unwrap_or(heads);
        let vocab_size = match content.metadata.get("tokenizer.ggml.tokens") {
            Some(tokens) => tokens.to_vec().map(Vec::len).unwrap_or(0),
            None => 0,
        };
        let vocab_size = match content.tensor_infos.get("token_embd.weight") {
            Some(info) => *info
                .shape
                .dims()
                .first()
                .ok_or_else(|| bad("tensor token_embd.weight has no dimensions".to_string()))?,
            None => vocab_size,
        };
        let config = Config {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: integer("feed_forward_length")?,
            layers: integer("block_count")?,
            heads,
            kv_heads,
            head_dim: integer("rope.dimension_count").unwrap_or(hidden_size / heads.max(1)),
            rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-6)?,
            rope_theta: float("rope.freq_base", 10_000.0)?,
            rope_interleaved: architecture.rope_interleaved(true),
            attention_bias: architecture.attention_bias(),
            context_tokens: integer("context_length")?,
        };
        config.validate().map_err(bad)?;
        Ok(config)
    }

    /// Read the configuration from a Hugging Face `config.json`.
    pub fn from_hf_json(json: &str, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            reason,
        };
        let hf: HfConfig = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(
                "rope_scaling is set; prism supports only unscaled RoPE".to_string(),
            ));
        }
        let architecture = Architecture::from_name(&hf.model_type, &path.display().to_string())?;
        let heads = hf.num_attention_heads;
        let config = Config {
            architecture,
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            layers: hf.num_hidden_layers,
            heads,
            kv_heads: hf.num_key_value_heads.unwrap_or(heads),
            head_dim: hf.head_dim.unwrap_or(hf.hidden_size / heads.max(1)),
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: hf.rope_theta,
            rope_interleaved: architecture.rope_interleaved(false),
            attention_bias: hf.attention_bias.unwrap_or(architecture.attention_bias()),
            context_tokens: hf.max_position_embeddings,
        };
        config.validate().map_err(bad)?;
        Ok(config)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("context length", self.context_tokens),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(format!("{name} is zero"));
        }
        // Checked before anything is allocated from them: the RoPE tables
        // alone take context × head dimension floats, and a corrupt file
        // can claim billions.
        let bounded = [
            ("vocab_size", self.vocab_size, 1 << 22),
            ("hidden_size", self.hidden_size, 1 << 16),
            ("intermediate_size", self.intermediate_size, 1 << 18),
            ("layers", self.layers, 1 << 10),
            ("heads", self.heads, 1 << 10),
            ("head_dim", self.head_dim, 1 << 12),
            ("context length", self.context_tokens, MAX_CONTEXT_TOKENS),
        ];
        if let Some((name, value, limit)) = bounded.iter().find(|(_, value, limit)| value > limit) {
            return Err(format!(
                "{name} of {value} is beyond what prism supports ({limit}); the file is likely corrupt"
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "{} attention heads do not divide into {} key/value heads",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head dimension {} is odd", self.head_dim));
        }
        Ok(())
    }
}

/// The fields of a Llama or Qwen2 `config.json` that prism reads.
#[derive(Debug, serde::Deserialize)]
struct HfConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    max_position_embeddings: usize,
    attention_bias: Option<bool>,
    rope_scaling: Option<serde_json::Value>,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

fn default_rope_theta() -> f64 {
    10_000.0
}
