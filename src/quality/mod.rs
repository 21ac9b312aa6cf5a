//! Measures of how good a summary is. [`coherence`] asks a judge model,
//! sentence by sentence, whether the summary would confuse a reader
//! (BooookScore), over the sentences [`sentences`] finds.

pub mod coherence;
pub mod sentences;
