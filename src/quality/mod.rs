//! Measures of what a summary gives a reader: question answering from the
//! summary alone, scored with Correct-F1 against reference answers ([`f1`])
//! over pairs written by the model ([`qa`]); coherence, where a judge
//! model says sentence by sentence whether the summary would confuse a reader
//! (BooookScore, [`coherence`]) over the sentences [`sentences`] finds; and,
//! without a model, how far a summary repeats itself or copies its method's
//! prompt ([`degeneration`]).

pub mod coherence;
pub mod degeneration;
pub mod f1;
pub mod qa;
pub mod sentences;
