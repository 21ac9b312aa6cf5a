//! Whether a server kept to the grammar it was sent, checked on its reply
//! with the grammar machinery the local engine decodes under.

use crate::engine::constraint::{Grammar, Grammars};
use crate::engine::tokenizer::Tokenizer;
use std::sync::OnceLock;

/// Checks replies against grammars for one tokenizer, built at first use.
#[derive(Default)]
pub(super) struct GrammarCheck {
    /// `None` when the tokenizer cannot carry a grammar (it names no end token).
    grammars: OnceLock<Option<Grammars>>,
}

impl GrammarCheck {
    /// Whether `text` is what `grammar` admits, or the start of it (a reply
    /// may stop at its token budget or at a refused line); `None` when this
    /// tokenizer or grammar cannot be checked here, which is said at debug
    /// level and taken as kept.
    pub(super) fn admits(
        &self,
        tokenizer: &Tokenizer,
        model: &str,
        grammar: &Grammar,
        text: &str,
    ) -> Option<bool> {
        let grammars = self
            .grammars
            .get_or_init(|| {
                Grammars::new(tokenizer, tokenizer.vocab_size(), model)
                    .map_err(|e| tracing::debug!("replies are not checked against grammars: {e}"))
                    .ok()
            })
            .as_ref()?;
        let mut constraint = grammars
            .constraint(grammar)
            .map_err(|e| tracing::debug!("the reply is not checked: {e}"))
            .ok()?;
        let tokens = tokenizer.encode(text).ok()?;
        Some(
            tokens
                .into_iter()
                .all(|token| constraint.accept(token).is_ok()),
        )
    }
}
