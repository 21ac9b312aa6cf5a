//! Judging what a summary gives a reader with a model: coherence, where a
//! judge says sentence by sentence whether the summary would confuse a reader
//! (BooookScore, [`coherence`]). Question answering from the summary alone
//! lives in [`crate::qa`], below the methods, because Chain of Summaries asks
//! questions as it works; the model-free repetition and echo figures are in
//! [`crate::metrics::degeneration`], since every run's stats carry them.

pub mod coherence;
