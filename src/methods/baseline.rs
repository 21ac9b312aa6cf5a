//! What the summarizing baselines share: the system turn, the prompt that summarizes
//! one part, the `steps.jsonl` record of a call, and the test for a cut-off summary.

use crate::chunk::Chunk;
use crate::error::Result;
use crate::llm::{Completion, Llm, Prompt, Request, Source};
use crate::metrics::Tokens;
use std::time::Instant;

/// The system turn of every call, the same for all three methods, so
/// consecutive calls share at least it in the KV cache.
pub const SYSTEM: &str =
    "You write clear, faithful summaries of documents that keep every name and decision. You output only the summary, in plain prose.";

/// Words per token asked for when a summary must fit a token budget; the
/// ratio BooookScore uses, which leaves room for words of several tokens.
const WORDS_PER_TOKEN: f64 = 0.65;

/// The most words to ask for in a summary that must fit in `tokens` tokens.
pub fn words_for(tokens: usize) -> usize {
    (tokens as f64 * WORDS_PER_TOKEN).round() as usize
}

/// One model call, as a step records it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Call {
    #[serde(flatten)]
    pub tokens: Tokens,
    /// The most tokens the call could generate.
    pub max_tokens: usize,
    /// What the model wrote, verbatim.
    pub output: String,
    pub seconds: f64,
}

impl Call {
    /// Complete `prompt` in at most `max_tokens` tokens.
    pub fn run(llm: &mut dyn Llm, prompt: &Prompt, max_tokens: usize) -> Result<Call> {
        let start = Instant::now();
        let completion = llm.complete(prompt, max_tokens, None)?;
        Ok(Call::of(
            completion,
            max_tokens,
            start.elapsed().as_secs_f64(),
        ))
    }

    /// Complete every one of `requests`, side by side where `llm` runs
    /// calls so ([`Llm::complete_each`]). Each call's seconds are its own
    /// prefill and decode, not the wait for the others.
    pub fn run_each(llm: &mut dyn Llm, requests: &[Request]) -> Result<Vec<Call>> {
        let completions = llm.complete_each(requests, &mut |_| {})?;
        Ok(completions
            .into_iter()
            .zip(requests)
            .map(|(completion, request)| {
                let seconds = completion.usage.prefill_seconds + completion.usage.decode_seconds;
                Call::of(completion, request.max_tokens, seconds)
            })
            .collect())
    }

    fn of(completion: Completion, max_tokens: usize, seconds: f64) -> Call {
        Call {
            tokens: Tokens::of(&completion.usage),
            max_tokens,
            output: completion.text,
            seconds,
        }
    }

    /// The call generated all the tokens it was allowed, so the model was
    /// likely stopped by the budget rather than finishing on its own.
    pub fn filled_budget(&self) -> bool {
        self.tokens.output_tokens >= self.max_tokens
    }

    /// The summary the call wrote, without surrounding whitespace.
    pub fn summary(&self) -> &str {
        self.output.trim()
    }
}

/// Opens the summaries of earlier parts in [`part_prompt`]; the rest of the
/// prompt reads the same with or without them, so they add exactly their own tokens.
pub const EARLIER_HEADING: &str =
    "\n## Summaries of the parts before it (context only; do not summarize them again)\n";

/// One earlier summary as [`part_prompt`] shows it (a segment of its own, so
/// a prompt with one more earlier summary extends the previous prompt).
pub fn earlier_segment(summary: &str) -> String {
    format!("{summary}\n\n")
}

/// The prompt that summarizes `chunk` (of `chunks`), after the summaries of
/// the parts before it when `earlier` has any, in at most `words` words when given.
pub fn part_prompt(
    query: &str,
    chunk: &Chunk,
    chunks: usize,
    earlier: &[String],
    words: Option<usize>,
) -> Prompt {
    let part = chunk.index + 1;
    let mut segments = vec![format!(
        "Write a summary of one part of a longer document.\nThe summaries are for this request: {query}\n"
    )];
    if !earlier.is_empty() {
        segments.push(EARLIER_HEADING.to_string());
        segments.extend(earlier.iter().map(|summary| earlier_segment(summary)));
    }
    let source = segments.len();
    segments.push(format!(
        "\n## Part {part} of {chunks}\n{}\n",
        chunk.text.trim_end()
    ));
    let length = words.map_or(String::new(), |words| format!(", in at most {words} words"));
    segments.push(format!(
        "\nWrite the summary of part {part}{length}. Output only the summary."
    ));
    Prompt {
        system: Some(SYSTEM.to_string()),
        segments,
        source: Some(Source::segment(source)),
        shared_segments: None,
    }
}

/// Summarize the chunks after the first `done` each on its own
/// ([`part_prompt`] without earlier summaries, in at most `words` words when
/// given): as many as `llm` runs at once, since no call needs another's answer.
pub fn summarize_alone<'c>(
    llm: &mut dyn Llm,
    query: &str,
    chunks: &'c [Chunk],
    done: usize,
    words: Option<usize>,
    max_tokens: usize,
) -> Result<Vec<(&'c Chunk, Call)>> {
    let at_once = llm.info().concurrency.max(1);
    let next = &chunks[done.min(chunks.len())..chunks.len().min(done + at_once)];
    let prompts: Vec<Prompt> = next
        .iter()
        .map(|chunk| part_prompt(query, chunk, chunks.len(), &[], words))
        .collect();
    let requests: Vec<Request> = prompts
        .iter()
        .map(|prompt| Request::independent(prompt, max_tokens))
        .collect();
    Ok(next.iter().zip(Call::run_each(llm, &requests)?).collect())
}

/// Whether `text` stops in the middle of a sentence: it does not end with a
/// full stop, question mark or exclamation mark, once closing quotes and
/// brackets are set aside. Empty text has no complete sentence, and an
/// ellipsis counts as trailing off, since a summary should end on a full sentence.
pub fn ends_mid_sentence(text: &str) -> bool {
    let text = text
        .trim_end()
        .trim_end_matches(['"', '\'', '”', '’', '»', ')', ']', '}']);
    if text.ends_with("...") || text.ends_with('…') {
        return true;
    }
    !text.ends_with(['.', '!', '?'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_sentences_end_on_their_mark() {
        assert!(!ends_mid_sentence("The ship sails north."));
        assert!(!ends_mid_sentence("Will it return?  \n"));
        assert!(!ends_mid_sentence("It sank!"));
    }

    #[test]
    fn cut_text_is_mid_sentence() {
        assert!(ends_mid_sentence("The ship sails north and the"));
        assert!(ends_mid_sentence("The crew:"));
        assert!(ends_mid_sentence("They sailed north, then"));
        assert!(ends_mid_sentence(""));
        assert!(ends_mid_sentence("   \n"));
    }

    #[test]
    fn closing_quotes_and_brackets_are_set_aside() {
        assert!(!ends_mid_sentence("He said, \"Stop.\""));
        assert!(!ends_mid_sentence("He said, “Stop!”"));
        assert!(!ends_mid_sentence("She asked, 'Why?'"));
        assert!(!ends_mid_sentence("(This is the end.)"));
        assert!(!ends_mid_sentence("They left (for good)."));
        assert!(!ends_mid_sentence("[All of it.]\n"));
        assert!(ends_mid_sentence("He said, \"Stop"));
        assert!(ends_mid_sentence("He said \"stop\""));
        assert!(ends_mid_sentence("They left (for good)"));
    }

    #[test]
    fn an_ellipsis_trails_off() {
        assert!(ends_mid_sentence("And then..."));
        assert!(ends_mid_sentence("And then…"));
        assert!(ends_mid_sentence("He whispered, \"and then...\""));
    }

    #[test]
    fn words_follow_the_token_budget() {
        assert_eq!(words_for(900), 585);
        assert_eq!(words_for(0), 0);
    }

    #[test]
    fn earlier_summaries_only_extend_the_prompt() {
        let chunk = Chunk {
            index: 2,
            text: "Text of the third part.\n\n".into(),
            tokens: 6,
            start_byte: 0,
        };
        let one = part_prompt("Q", &chunk, 5, &["A.".into()], None);
        let two = part_prompt("Q", &chunk, 5, &["A.".into(), "B.".into()], None);
        assert_eq!(one.segments[..3], two.segments[..3]);
        assert!(two.segments[4].starts_with("\n## Part 3 of 5\n"));
        let alone = part_prompt("Q", &chunk, 5, &[], Some(40));
        assert_eq!(alone.segments.len(), 3);
        assert!(alone.segments[2].contains("at most 40 words"));
    }
}
