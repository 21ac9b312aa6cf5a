//! Judging a summary's coherence with a model ([`coherence`]). QA lives in
//! [`crate::qa`], below the methods, because Chain of Summaries asks questions as it works.

pub mod coherence;
