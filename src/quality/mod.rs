//! Measures of what a summary gives a reader. The first is question answering:
//! how well questions about the document can be answered from the summary
//! alone, scored with Correct-F1 against reference answers ([`f1`]) over
//! pairs written by the model ([`qa`]).

pub mod f1;
pub mod qa;
