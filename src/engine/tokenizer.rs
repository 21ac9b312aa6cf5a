//! Text ↔ token ids, from a `tokenizer.json` or from GGUF metadata.
