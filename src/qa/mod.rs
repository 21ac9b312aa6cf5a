//! Question–answer pairs about a document: written by the model from a passage,
//! answered from a summary alone, and scored with Correct-F1.

pub mod f1;

use crate::chunk::Chunk;
use crate::engine::constraint::Grammar;
use crate::engine::Usage;
use crate::error::{Error, Result};
use crate::llm::{Llm, Prompt, Request};
use crate::metrics::{Figures, Ledger};
use f1::{mean_f1, token_f1};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;

/// A question about a document with its short reference answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QaPair {
    pub question: String,
    pub answer: String,
    /// The chunk of the document the pair was written from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<usize>,
}

/// The system turn of every prompt about a document, its passages or its summary.
pub const SYSTEM: &str = "You help turn a document into a short summary that answers questions about it. Do exactly what each request asks and write nothing else.";

/// The opening of a prompt about one passage; what is asked comes after the passage.
const PASSAGE_HEADER: &str = "Passage from a document:\n\n";

/// Answers longer than this are sentences, not the short answers asked for
/// (and, under the schema's length limit, often cut off mid-word).
const MAX_ANSWER_WORDS: usize = 12;
/// Room for one generated pair, in tokens.
const TOKENS_PER_PAIR: usize = 64;
/// The most tokens of one answer to a question.
pub const ANSWER_TOKENS: usize = 32;

/// A prompt about `passage`: the shared system turn, the passage, then `request`.
pub fn passage_prompt(passage: &str, request: Vec<String>) -> Prompt {
    let mut segments = vec![
        PASSAGE_HEADER.to_string(),
        format!("{}\n", passage.trim_end()),
    ];
    segments.extend(request);
    Prompt {
        system: Some(SYSTEM.to_string()),
        segments,
        source: None,
        shared_segments: None,
    }
}

/// How many pairs each of `parts` chunks gets so that they add up to
/// `total`, spread as evenly as whole numbers allow.
pub fn spread(total: usize, parts: usize) -> Vec<usize> {
    (0..parts)
        .map(|i| (i + 1) * total / parts - i * total / parts)
        .collect()
}

/// The JSON Schema of exactly `count` pairs, for constrained decoding.
/// Length limits keep a small model from writing one endless string.
pub fn pairs_schema(count: usize) -> Value {
    serde_json::json!({
        "type": "array",
        "minItems": count,
        "maxItems": count,
        "items": {
            "type": "object",
            "properties": {
                "question": {"type": "string", "minLength": 8, "maxLength": 200},
                "answer": {"type": "string", "minLength": 1, "maxLength": 80}
            },
            "required": ["question", "answer"],
            "additionalProperties": false
        }
    })
}

/// What one generation call gave.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The usable pairs, at most as many as asked for.
    pub pairs: Vec<QaPair>,
    /// What the model wrote, verbatim.
    pub output: String,
    pub usage: Usage,
}

/// The prompt asking for `count` pairs about `passage`.
pub fn generation_prompt(passage: &str, count: usize, constrained: bool) -> Prompt {
    let plural = if count == 1 { "" } else { "s" };
    let form = if constrained {
        "Give them as a JSON list of objects, each with a \"question\" and an \"answer\"."
            .to_string()
    } else {
        "Write each pair as two lines:\nQ: the question\nA: the answer".to_string()
    };
    passage_prompt(
        passage,
        vec![format!(
            "\nWrite {count} question{plural} that a reader of the whole document should be able to answer, each with its answer. Each question asks about one fact stated in this passage (who does what, what something is for, how, where or when it is done) and names what it is about, so that it makes sense without the passage in view: never ask about \"the passage\" itself. Each answer is a word or a short phrase from the passage, not a sentence or a list. {form}\n"
        )],
    )
}

/// Ask the model for `count` pairs about `passage` (chunk `chunk` of its
/// document). Output that does not parse gives fewer pairs, never an error;
/// with `constrained` the output is held to [`pairs_schema`].
pub fn generate_pairs(
    llm: &mut dyn Llm,
    passage: &str,
    chunk: Option<usize>,
    count: usize,
    constrained: bool,
) -> Result<Generated> {
    let prompt = generation_prompt(passage, count, constrained);
    let grammar = constrained.then(|| Grammar::JsonSchema(pairs_schema(count)));
    let completion = llm.complete(&prompt, count * TOKENS_PER_PAIR + 16, grammar.as_ref())?;
    let passage_words = word_set(passage);
    let pairs = parse_pairs(&completion.text)
        .into_iter()
        .filter(|(question, answer)| worth_asking(question, answer, &passage_words))
        .take(count)
        .map(|(question, answer)| QaPair {
            question,
            answer,
            chunk,
        })
        .collect();
    Ok(Generated {
        pairs,
        output: completion.text,
        usage: completion.usage,
    })
}

/// Words this short (articles, "of", "was") say nothing about where an answer came from.
const MIN_GROUNDING_LETTERS: usize = 4;

/// The words of `text` as Correct-F1 compares them.
fn word_set(text: &str) -> HashSet<String> {
    f1::normalize(text)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The words of `answer` of [`MIN_GROUNDING_LETTERS`] or more, normalized.
fn telling_words(answer: &str) -> Vec<String> {
    f1::normalize(answer)
        .split_whitespace()
        .filter(|word| word.chars().count() >= MIN_GROUNDING_LETTERS)
        .map(str::to_string)
        .collect()
}

/// Whether a pair is worth asking of a summary, given the words of the
/// passage it was written from:
/// - its answer comes from the passage: at least half of its telling
///   words occur there. Asked about a manual, Qwen2.5-Coder-1.5B answered
///   "What is the name of the passage?" with the prompt's own heading,
///   "Passage from a document";
/// - its question does not already hold every telling word of its answer
///   ("the names of the office workers mentioned: Office Workers");
/// - it does not ask about "the passage" where the passage itself never
///   uses the word: a reader of the whole document's summary cannot tell
///   which passage that is.
fn worth_asking(question: &str, answer: &str, passage_words: &HashSet<String>) -> bool {
    let telling = telling_words(answer);
    let asked = word_set(question);
    let found = telling
        .iter()
        .filter(|word| passage_words.contains(*word))
        .count();
    let grounded = 2 * found >= telling.len();
    let given_away = !telling.is_empty() && telling.iter().all(|word| asked.contains(word));
    let about_the_passage = asked.contains("passage") && !passage_words.contains("passage");
    grounded && !given_away && !about_the_passage
}

/// The pairs written about a whole document, and what their calls cost.
#[derive(Debug, Clone, Default)]
pub struct DocumentPairs {
    pub pairs: Vec<QaPair>,
    pub ledger: Ledger,
}

/// Ask for `total` pairs about the document in `chunks`, spread over them as
/// [`spread`] says; `on_chunk` hears of each chunk asked, with the pairs it
/// gave and those asked of it. A question asked of an earlier chunk is
/// dropped: one summary gives one answer to it. What a chunk falls short
/// of its share is asked of the next, so the total is reached when later
/// chunks can make it up.
pub fn generate_document_pairs(
    llm: &mut dyn Llm,
    chunks: &[Chunk],
    total: usize,
    constrained: bool,
    on_chunk: &mut dyn FnMut(&Chunk, usize, usize),
) -> Result<DocumentPairs> {
    let mut written = DocumentPairs::default();
    let mut asked = HashSet::new();
    let mut owed = 0;
    for (chunk, share) in chunks.iter().zip(spread(total, chunks.len())) {
        let count = share + owed;
        if count == 0 {
            continue;
        }
        let generated = generate_pairs(llm, &chunk.text, Some(chunk.index), count, constrained)
            .map_err(|err| {
                Error::invalid(
                    format!("chunk {}/{}", chunk.index + 1, chunks.len()),
                    err.to_string(),
                )
            })?;
        written.ledger.record(&generated.usage);
        let new: Vec<QaPair> = generated
            .pairs
            .into_iter()
            .filter(|pair| asked.insert(f1::normalize(&pair.question)))
            .collect();
        on_chunk(chunk, new.len(), count);
        owed = count - new.len();
        written.pairs.extend(new);
    }
    Ok(written)
}

/// The question–answer pairs in model output: a JSON list of objects (or
/// objects anywhere in the text, as a cut-off list leaves them), else
/// `Q:`/`A:` lines, numbered or bulleted lines, or lines that end in a
/// question mark followed by their answer. Pairs with an empty, placeholder
/// or overlong part, and repeated questions, are dropped.
pub fn parse_pairs(text: &str) -> Vec<(String, String)> {
    let mut found = json_pairs(text);
    if found.is_empty() {
        found = line_pairs(text);
    }
    let mut seen = HashSet::new();
    found
        .into_iter()
        .map(|(question, answer)| (tidy(&question), tidy(&answer)))
        .filter(|(question, answer)| usable(question) && usable(answer))
        .filter(|(_, answer)| answer.split_whitespace().count() <= MAX_ANSWER_WORDS)
        .filter(|(question, _)| seen.insert(f1::normalize(question)))
        .collect()
}

/// Pairs from every JSON value in `text`, read left to right.
fn json_pairs(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find(['[', '{']) {
        let start = at + offset;
        let mut values = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => {
                collect_pairs(&value, &mut pairs);
                at = start + values.byte_offset();
            }
            // Not a whole value from here (a cut-off list): its items may still be.
            _ => at = start + 1,
        }
    }
    pairs
}

/// Objects with a question and an answer, at any depth of `value`.
fn collect_pairs(value: &Value, pairs: &mut Vec<(String, String)>) {
    match value {
        Value::Array(items) => items.iter().for_each(|item| collect_pairs(item, pairs)),
        Value::Object(object) => {
            let field = |names: [&str; 2]| {
                object.iter().find_map(|(key, value)| {
                    names
                        .iter()
                        .any(|name| key.eq_ignore_ascii_case(name))
                        .then(|| match value {
                            Value::String(text) => Some(text.clone()),
                            Value::Number(number) => Some(number.to_string()),
                            _ => None,
                        })
                        .flatten()
                })
            };
            match (field(["question", "q"]), field(["answer", "a"])) {
                (Some(question), Some(answer)) => pairs.push((question, answer)),
                _ => object
                    .values()
                    .for_each(|value| collect_pairs(value, pairs)),
            }
        }
        _ => {}
    }
}

/// Pairs from line-oriented output.
fn line_pairs(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut question: Option<String> = None;
    for raw in text.lines() {
        let line = strip_marker(raw);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = strip_label(line, &["question", "q"]) {
            match split_answer(rest) {
                Some(pair) => pairs.push(pair),
                None => question = Some(rest.to_string()),
            }
        } else if let Some(rest) = strip_label(line, &["answer", "a"]) {
            if let Some(question) = question.take() {
                pairs.push((question, rest.to_string()));
            }
        } else if let Some(pair) = split_answer(line) {
            pairs.push(pair);
        } else if line.ends_with('?') {
            question = Some(line.to_string());
        } else if let Some(question) = question.take() {
            pairs.push((question, line.to_string()));
        }
    }
    pairs
}

/// `line` without a leading list marker (`1.`, `2)`, `-`, `*`, `•`) or markdown emphasis.
fn strip_marker(line: &str) -> &str {
    let line = line
        .trim()
        .trim_start_matches(['#', '*', '-', '•', '>'])
        .trim_start();
    let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits > 0 {
        if let Some(rest) = line[digits..].strip_prefix(['.', ')', ':']) {
            return rest.trim_start().trim_start_matches('*').trim();
        }
    }
    line.trim()
}

/// What follows a label such as `Q:`, `Q1.`, `Question 2:` or `**A:**`, when
/// `line` starts with one of `labels` (matched without case).
fn strip_label<'a>(line: &'a str, labels: &[&str]) -> Option<&'a str> {
    let word_end = line
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(line.len());
    let word = &line[..word_end];
    if !labels.iter().any(|label| word.eq_ignore_ascii_case(label)) {
        return None;
    }
    let rest = line[word_end..].trim_start();
    let rest = rest
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start();
    let rest = rest.strip_prefix([':', '.', ')'])?;
    Some(rest.trim_start_matches('*').trim())
}

/// A question and its answer written on one line: `What is X? Y` or
/// `What is X? A: Y`.
fn split_answer(line: &str) -> Option<(String, String)> {
    let mark = line.find('?')?;
    let question = &line[..=mark];
    let rest = line[mark + 1..]
        .trim()
        .trim_start_matches(['-', '–', '—', ':', '*', '('])
        .trim();
    let answer = strip_label(rest, &["answer", "a"]).unwrap_or(rest);
    let answer = answer.trim_end_matches(')').trim();
    (!answer.is_empty()).then(|| (question.trim().to_string(), answer.to_string()))
}

/// `text` trimmed, without wrapping quotes or backticks.
fn tidy(text: &str) -> String {
    text.trim()
        .trim_matches(['"', '\'', '`', '“', '”'])
        .trim()
        .to_string()
}

/// Says something, and is not a template placeholder such as `<answer>`.
fn usable(text: &str) -> bool {
    text.chars().any(char::is_alphanumeric) && !(text.starts_with('<') && text.ends_with('>'))
}

/// Instructions of every answer prompt; the summary follows them.
const ANSWER_INSTRUCTIONS: &str = "Here is a summary of a document, then one question about it. Answer the question using only what the summary says, with a word or a short phrase, not a full sentence. If the summary does not tell, reply: I don't know.\n\nSummary:\n";

/// The prompt asking `question` of `summary`: instructions and summary
/// first, the question last, so every question about one summary reuses
/// the summary's KV.
pub fn answer_prompt(summary: &str, question: &str) -> Prompt {
    Prompt {
        system: Some(SYSTEM.to_string()),
        segments: vec![
            ANSWER_INSTRUCTIONS.to_string(),
            format!("{}\n", summary.trim()),
            format!("\nQuestion: {}\nAnswer in a few words:\n", question.trim()),
        ],
        source: None,
        shared_segments: None,
    }
}

/// A question answered from a summary, with the answer's score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answered {
    pub question: String,
    pub reference: String,
    pub answer: String,
    /// Correct-F1 of `answer` against `reference`.
    pub f1: f64,
}

/// Ask `prompt` (an [`answer_prompt`]) and score the reply against `pair`'s answer.
pub fn ask(llm: &mut dyn Llm, prompt: &Prompt, pair: &QaPair) -> Result<(Answered, Usage)> {
    let completion = llm.complete(prompt, ANSWER_TOKENS, None)?;
    Ok((answered(pair, &completion.text), completion.usage))
}

/// `reply` to `pair`'s question, cleaned and scored against its answer.
fn answered(pair: &QaPair, reply: &str) -> Answered {
    let answer = clean_answer(reply);
    let f1 = token_f1(&answer, &pair.answer);
    Answered {
        question: pair.question.clone(),
        reference: pair.answer.clone(),
        answer,
        f1,
    }
}

/// How well a summary answers a set of questions.
#[derive(Debug, Clone, Serialize)]
pub struct QaScore {
    /// Mean Correct-F1 over the questions.
    pub correct_f1: f64,
    pub questions: Vec<Answered>,
    /// Calls of the model answering from the summary, one per question.
    pub calls: usize,
    pub figures: Figures,
}

/// Answer every question of `pairs` from `summary` alone and score the
/// answers. The questions are independent calls ([`Llm::complete_each`]).
pub fn score_summary(llm: &mut dyn Llm, summary: &str, pairs: &[QaPair]) -> Result<QaScore> {
    let prompts: Vec<Prompt> = pairs
        .iter()
        .map(|pair| answer_prompt(summary, &pair.question))
        .collect();
    let requests: Vec<Request> = prompts
        .iter()
        .map(|prompt| Request::independent(prompt, ANSWER_TOKENS))
        .collect();
    let completions = llm.complete_each(&requests, &mut |_| {})?;
    let mut ledger = Ledger::default();
    let mut questions = Vec::new();
    for (pair, completion) in pairs.iter().zip(completions) {
        ledger.record(&completion.usage);
        questions.push(answered(pair, &completion.text));
    }
    let f1s: Vec<f64> = questions.iter().map(|answered| answered.f1).collect();
    Ok(QaScore {
        correct_f1: mean_f1(&f1s).unwrap_or_default(),
        questions,
        calls: ledger.calls,
        figures: ledger.figures(),
    })
}

/// The answer in a reply: its first non-empty line, without an `Answer:` label.
pub fn clean_answer(reply: &str) -> String {
    let line = reply.lines().map(str::trim).find(|line| !line.is_empty());
    let line = line.unwrap_or_default();
    let line = strip_label(line, &["answer", "a"]).unwrap_or(line);
    tidy(line)
}

/// The pairs of a JSONL file, one `{"question", "answer", "chunk"?}` object a line.
/// Blank lines are skipped; a line that is not a pair, or a file with none, is an error.
pub fn read_pairs(path: &Path) -> Result<Vec<QaPair>> {
    let text = std::fs::read_to_string(path).map_err(|err| Error::io(path, err))?;
    let mut pairs = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let pair: QaPair = serde_json::from_str(line).map_err(|err| {
            Error::invalid(
                format!("{}: line {}", path.display(), index + 1),
                format!("not a question-answer pair ({err})"),
            )
        })?;
        pairs.push(pair);
    }
    if pairs.is_empty() {
        return Err(Error::invalid(
            path.display().to_string(),
            "holds no question-answer pairs",
        ));
    }
    Ok(pairs)
}

/// Write `pairs` as JSONL, replacing `path` whole.
pub fn write_pairs(path: &Path, pairs: &[QaPair]) -> Result<()> {
    let mut text = String::new();
    for pair in pairs {
        text.push_str(&serde_json::to_string(pair).expect("a pair serializes"));
        text.push('\n');
    }
    crate::run::dir::write_atomic(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse_pairs(text)
    }

    fn pair(q: &str, a: &str) -> (String, String) {
        (q.to_string(), a.to_string())
    }

    #[test]
    fn spread_adds_up_and_is_even() {
        assert_eq!(spread(6, 3), vec![2, 2, 2]);
        assert_eq!(spread(7, 3), vec![2, 2, 3]);
        assert_eq!(spread(2, 5), vec![0, 0, 1, 0, 1]);
        assert_eq!(spread(0, 2), vec![0, 0]);
        assert!(spread(5, 0).is_empty());
        for (total, parts) in [(24, 7), (3, 10), (100, 1)] {
            let shares = spread(total, parts);
            assert_eq!(shares.iter().sum::<usize>(), total);
            let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(max - min <= 1, "{shares:?}");
        }
    }

    #[test]
    fn parses_a_json_list() {
        let text = r#"[{"question": "Who wrote it?", "answer": "Walton"}, {"question": "Where to?", "answer": "North"}]"#;
        assert_eq!(
            pairs(text),
            vec![pair("Who wrote it?", "Walton"), pair("Where to?", "North")]
        );
    }

    #[test]
    fn parses_json_in_fences_in_a_wrapper_object_or_with_other_keys() {
        let text = "Sure!\n```json\n{\"pairs\": [{\"Q\": \"How many?\", \"A\": 3}]}\n```";
        assert_eq!(pairs(text), vec![pair("How many?", "3")]);
    }

    #[test]
    fn a_cut_off_json_list_keeps_its_whole_items() {
        let text = r#"[{"question": "Who sails?", "answer": "Walton"}, {"question": "Where is the ship go"#;
        assert_eq!(pairs(text), vec![pair("Who sails?", "Walton")]);
    }

    #[test]
    fn parses_q_and_a_lines() {
        let text = "Q: Who sails north?\nA: Walton\n\nQ: What stops the ship?\nA: Ice.\n";
        assert_eq!(
            pairs(text),
            vec![
                pair("Who sails north?", "Walton"),
                pair("What stops the ship?", "Ice.")
            ]
        );
    }

    #[test]
    fn parses_numbered_and_labelled_variants() {
        let text = "1. **Q1:** Who sails north?\n   **A1:** Walton\n2) Question 2: What stops the ship? Answer: ice\n- What is found on the ice? - Victor\n3. Where does he go?\nTo the North Pole\n";
        assert_eq!(
            pairs(text),
            vec![
                pair("Who sails north?", "Walton"),
                pair("What stops the ship?", "ice"),
                pair("What is found on the ice?", "Victor"),
                pair("Where does he go?", "To the North Pole"),
            ]
        );
    }

    #[test]
    fn malformed_output_gives_fewer_pairs_without_panicking() {
        assert!(pairs("").is_empty());
        assert!(pairs("I cannot do that.").is_empty());
        assert!(pairs("A: an answer with no question").is_empty());
        assert!(pairs("Q: a question with no answer?").is_empty());
        assert!(pairs("[[[{{{\"question\": ").is_empty());
        assert!(pairs("Q: <question>\nA: <answer>").is_empty());
        assert!(pairs("Q: ???\nA: ...").is_empty());
        let long = format!("Q: Why?\nA: {}", "word ".repeat(13));
        assert!(pairs(&long).is_empty());
        // Multi-byte text around the markers.
        assert_eq!(
            pairs("— Q： wer?\nQ: Wer segelt nach Norden?\nA: Walton — ja"),
            vec![pair("Wer segelt nach Norden?", "Walton — ja")]
        );
    }

    #[test]
    fn repeated_questions_are_kept_once() {
        let text = "Q: Who sails?\nA: Walton\nQ: who sails\nA: Victor\n";
        assert_eq!(pairs(text), vec![pair("Who sails?", "Walton")]);
    }

    #[test]
    fn the_schema_asks_for_exactly_the_count() {
        let schema = pairs_schema(4);
        assert_eq!(schema["minItems"], 4);
        assert_eq!(schema["maxItems"], 4);
        assert_eq!(
            schema["items"]["required"],
            serde_json::json!(["question", "answer"])
        );
    }

    #[test]
    fn answers_are_cleaned() {
        assert_eq!(clean_answer("\n  Answer: \"Walton\"\nmore text"), "Walton");
        assert_eq!(clean_answer("A: ice"), "ice");
        assert_eq!(clean_answer("Apples and pears"), "Apples and pears");
        assert_eq!(clean_answer(""), "");
    }

    #[test]
    fn answer_prompts_share_everything_but_the_question() {
        let a = answer_prompt("The ship sails north.", "Who sails?");
        let b = answer_prompt("The ship sails north.", "Where to?");
        assert_eq!(a.system, b.system);
        assert_eq!(a.segments[..2], b.segments[..2]);
        assert_ne!(a.segments[2], b.segments[2]);
    }

    #[test]
    fn pairs_round_trip_through_jsonl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qa.jsonl");
        let written = vec![
            QaPair {
                question: "Who?".into(),
                answer: "Walton".into(),
                chunk: Some(2),
            },
            QaPair {
                question: "Où?".into(),
                answer: "au nord".into(),
                chunk: None,
            },
        ];
        write_pairs(&path, &written).unwrap();
        assert_eq!(read_pairs(&path).unwrap(), written);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.lines().nth(1).unwrap().contains("chunk"));
    }

    #[test]
    fn bad_pair_files_are_refused_with_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qa.jsonl");
        std::fs::write(
            &path,
            "{\"question\": \"Who?\", \"answer\": \"x\"}\n{\"question\": 3}\n",
        )
        .unwrap();
        let err = read_pairs(&path).unwrap_err().to_string();
        assert!(
            err.contains("line 2") && err.contains("not a question-answer pair"),
            "{err}"
        );
        std::fs::write(&path, "\n  \n").unwrap();
        assert!(read_pairs(&path)
            .unwrap_err()
            .to_string()
            .contains("holds no"));
        let missing = dir.path().join("missing.jsonl");
        assert!(read_pairs(&missing)
            .unwrap_err()
            .to_string()
            .contains("missing.jsonl"));
    }
}
