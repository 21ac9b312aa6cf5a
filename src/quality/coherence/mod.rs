//! Coherence as BooookScore measures it: the share of a summary's sentences that a
//! judge model, asked one sentence at a time, finds would not confuse a reader.

use crate::engine::constraint::Grammar;
use crate::error::{Error, Result};
use crate::llm::{Llm, Prompt, Request};
use crate::metrics::{Figures, Ledger};
use crate::sentences::split_sentences;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::time::Instant;

/// The kinds of coherence error BooookScore distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ErrorType {
    #[serde(rename = "entity omission")]
    EntityOmission,
    #[serde(rename = "event omission")]
    EventOmission,
    #[serde(rename = "causal omission")]
    CausalOmission,
    #[serde(rename = "discontinuity")]
    Discontinuity,
    #[serde(rename = "salience")]
    Salience,
    #[serde(rename = "language")]
    Language,
    #[serde(rename = "inconsistency")]
    Inconsistency,
    #[serde(rename = "duplication")]
    Duplication,
}

impl ErrorType {
    pub const ALL: [ErrorType; 8] = [
        ErrorType::EntityOmission,
        ErrorType::EventOmission,
        ErrorType::CausalOmission,
        ErrorType::Discontinuity,
        ErrorType::Salience,
        ErrorType::Language,
        ErrorType::Inconsistency,
        ErrorType::Duplication,
    ];

    /// The name the prompt, the grammar and the report use.
    pub fn name(self) -> &'static str {
        match self {
            ErrorType::EntityOmission => "entity omission",
            ErrorType::EventOmission => "event omission",
            ErrorType::CausalOmission => "causal omission",
            ErrorType::Discontinuity => "discontinuity",
            ErrorType::Salience => "salience",
            ErrorType::Language => "language",
            ErrorType::Inconsistency => "inconsistency",
            ErrorType::Duplication => "duplication",
        }
    }

    /// What the judge is told the error is.
    fn definition(self) -> &'static str {
        match self {
            ErrorType::EntityOmission => "a person, place or thing comes up without enough said for the reader to know who or what it is",
            ErrorType::EventOmission => "an event is mentioned but what happened, or how it turned out, is left unclear",
            ErrorType::CausalOmission => "why something happens, or why someone acts, is missing or too thin",
            ErrorType::Discontinuity => "the sentence jumps in time, place or point of view with nothing linking it to what came before",
            ErrorType::Salience => "the sentence dwells on a detail that does nothing for the main story",
            ErrorType::Language => "a grammar or spelling mistake, or wording that can be read more than one way",
            ErrorType::Inconsistency => "the sentence contradicts another part of the summary",
            ErrorType::Duplication => "the sentence repeats what another sentence already says",
        }
    }

    /// Other words a judge writing freely may use for this error.
    fn aliases(self) -> &'static [&'static str] {
        match self {
            ErrorType::Language => &["grammar", "grammatical", "spelling", "wording"],
            ErrorType::Inconsistency => &[
                "inconsistent",
                "contradiction",
                "contradictory",
                "contradicts",
            ],
            ErrorType::Duplication => &[
                "duplicate",
                "duplicated",
                "repetition",
                "repeated",
                "redundant",
                "redundancy",
            ],
            ErrorType::Salience => &["salient", "irrelevant"],
            ErrorType::Discontinuity => &["discontinuous"],
            _ => &[],
        }
    }
}

impl std::fmt::Display for ErrorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the judge said about one sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The sentence would not confuse a reader.
    Clean,
    /// It would, through these errors (possibly none named).
    Confusing(Vec<ErrorType>),
    /// The judge's reply could not be read either way.
    Unparsed,
}

/// The most error types a constrained verdict may list.
const MAX_VERDICT_TYPES: usize = 3;

/// Tokens a verdict may take: a constrained one with three types needs about
/// 30; a free reply is cut off after this.
const VERDICT_TOKENS: usize = 64;

/// Settings of one coherence scoring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoherenceConfig {
    /// Decode each verdict under [`verdict_grammar`], so it always parses.
    pub constrained: bool,
}

/// One judged sentence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentenceVerdict {
    pub sentence: String,
    /// `clean`, `confusing` or `unparsed`.
    pub verdict: VerdictKind,
    /// The errors named; empty unless confusing.
    pub types: Vec<ErrorType>,
    /// The judge's reply, verbatim.
    pub raw: String,
}

/// A [`Verdict`] without its types, as the report names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerdictKind {
    Clean,
    Confusing,
    Unparsed,
}

/// The cost of all judge calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeStats {
    pub calls: usize,
    #[serde(flatten)]
    pub figures: Figures,
    pub seconds: f64,
}

/// The coherence of one summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoherenceReport {
    /// clean / sentences: unparsed verdicts count against the summary.
    pub score: f64,
    /// clean / (clean + confusing); `None` when no verdict parsed.
    pub score_parsed: Option<f64>,
    pub sentences: usize,
    pub clean: usize,
    pub confusing: usize,
    pub unparsed: usize,
    /// How often each error was named, in the order of [`ErrorType::ALL`]; unnamed ones left out.
    pub error_counts: Map<String, Value>,
    pub constrained: bool,
    pub verdicts: Vec<SentenceVerdict>,
    pub judge: JudgeStats,
}

const SYSTEM: &str = "You check summaries for sentences that would confuse a reader. You answer in exactly the format asked for.";

/// The fixed instructions: the task, the error types and the answer format.
fn instructions() -> String {
    let kinds: String = ErrorType::ALL
        .iter()
        .map(|kind| format!("- {}: {}.\n", kind.name(), kind.definition()))
        .collect();
    format!(
        "## Task\nBelow is a summary of a longer text, then one sentence taken from it. Decide whether that sentence would confuse a reader who has read only the summary, and if it would, which kinds of error cause the confusion. Judge only that sentence, in the light of the whole summary.\n\n## Kinds of error\n{kinds}\n## Answer format\nReply with one JSON object and nothing else:\n{{\"confusing\": false}} if the sentence is clear, or\n{{\"confusing\": true, \"types\": [\"causal omission\"]}} if it is not, listing one to {MAX_VERDICT_TYPES} kinds of error from the list above.\n"
    )
}

/// The prompt that asks about `sentence`: everything before the sentence is
/// the same for every sentence of `summary`.
pub fn verdict_prompt(summary: &str, sentence: &str) -> Prompt {
    Prompt {
        system: Some(SYSTEM.to_string()),
        segments: vec![
            instructions(),
            format!("\n## Summary\n{}\n", summary.trim()),
            format!(
                "\n## Sentence to check\n{sentence}\n\nWould this sentence confuse a reader of the summary? Answer with the JSON object only.\n"
            ),
        ],
        source: None,
        shared_segments: None,
    }
}

/// The verdicts a constrained judge may write: `{"confusing": false}` or
/// `{"confusing": true, "types": [...]}` with one to three known types.
pub fn verdict_grammar() -> Grammar {
    let names: Vec<&str> = ErrorType::ALL.iter().map(|kind| kind.name()).collect();
    Grammar::JsonSchema(json!({
        "anyOf": [
            {
                "type": "object",
                "properties": {"confusing": {"const": false}},
                "required": ["confusing"],
                "additionalProperties": false
            },
            {
                "type": "object",
                "properties": {
                    "confusing": {"const": true},
                    "types": {
                        "type": "array",
                        "items": {"enum": names},
                        "minItems": 1,
                        "maxItems": MAX_VERDICT_TYPES
                    }
                },
                "required": ["confusing", "types"],
                "additionalProperties": false
            }
        ]
    }))
}

/// Judge every sentence of `summary` with `llm`, calling `progress(done,
/// total)` after each.
pub fn score_coherence(
    llm: &mut dyn Llm,
    summary: &str,
    config: &CoherenceConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<CoherenceReport> {
    let sentences = split_sentences(summary);
    if sentences.is_empty() {
        return Err(Error::invalid(
            "summary",
            "has no sentences to judge (no letters or digits)",
        ));
    }
    let grammar = config.constrained.then(verdict_grammar);
    let start = Instant::now();
    let mut prompts = Vec::with_capacity(sentences.len());
    for sentence in &sentences {
        let prompt = verdict_prompt(summary, sentence);
        let prompt_tokens = llm.prompt_tokens(&prompt)?;
        let context = llm.context_tokens();
        if prompt_tokens + VERDICT_TOKENS > context {
            return Err(Error::invalid(
                "summary",
                format!(
                    "with the judge's instructions it takes {prompt_tokens} tokens, which with {VERDICT_TOKENS} for the verdict do not fit the judge model's context of {context} tokens"
                ),
            ));
        }
        prompts.push(prompt);
    }
    let requests: Vec<Request> = prompts
        .iter()
        .map(|prompt| Request {
            grammar: grammar.as_ref(),
            ..Request::independent(prompt, VERDICT_TOKENS)
        })
        .collect();
    // The sentences are judged independently: each prompt is the summary
    // and one sentence.
    let completions = llm.complete_each(&requests, &mut |done| progress(done, sentences.len()))?;
    let mut ledger = Ledger::default();
    let mut verdicts = Vec::with_capacity(sentences.len());
    for (sentence, completion) in sentences.iter().zip(completions) {
        ledger.record(&completion.usage);
        let (verdict, types) = match parse_verdict(&completion.text) {
            Verdict::Clean => (VerdictKind::Clean, Vec::new()),
            Verdict::Confusing(types) => (VerdictKind::Confusing, types),
            Verdict::Unparsed => (VerdictKind::Unparsed, Vec::new()),
        };
        verdicts.push(SentenceVerdict {
            sentence: sentence.clone(),
            verdict,
            types,
            raw: completion.text,
        });
    }
    let judge = JudgeStats {
        calls: ledger.calls,
        figures: ledger.figures(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(report(verdicts, config.constrained, judge))
}

/// Count the verdicts and derive the scores.
fn report(verdicts: Vec<SentenceVerdict>, constrained: bool, judge: JudgeStats) -> CoherenceReport {
    let count = |kind: VerdictKind| verdicts.iter().filter(|v| v.verdict == kind).count();
    let (clean, confusing, unparsed) = (
        count(VerdictKind::Clean),
        count(VerdictKind::Confusing),
        count(VerdictKind::Unparsed),
    );
    let mut error_counts = Map::new();
    for kind in ErrorType::ALL {
        let named = verdicts.iter().filter(|v| v.types.contains(&kind)).count();
        if named > 0 {
            error_counts.insert(kind.name().to_string(), named.into());
        }
    }
    let parsed = clean + confusing;
    CoherenceReport {
        score: clean as f64 / verdicts.len() as f64,
        score_parsed: (parsed > 0).then(|| clean as f64 / parsed as f64),
        sentences: verdicts.len(),
        clean,
        confusing,
        unparsed,
        error_counts,
        constrained,
        verdicts,
        judge,
    }
}

/// Read a judge's reply. Accepted forms, in the order tried:
///
/// - a JSON object (fenced or not, with text around it) with a yes/no field
///   (`confusing`, `is_confusing`, `confusion`, `confused`; a boolean or a
///   yes/no string) and/or a list or string of types (`types`, `type`,
///   `errors`, `error_types`); types alone mean confusing. A `{` that opens
///   no readable object is unparsed, never guessed at;
/// - text whose first word answers (after labels like `Answer:`): `no`,
///   `none`, `nothing`, `not`, `clear`, `false` mean clean (`No confusion`); `yes`,
///   `true`, `confusing` mean confusing, with the types named after it
///   (`Yes: causal omission, duplication`);
/// - text that says it plainly (`this sentence is not confusing`, `it would
///   confuse a reader because …`);
/// - text that opens with an error type (`Causal omission: why …?`).
///
/// Type names match in any case, with spaces, hyphens or underscores, and
/// with small typos; a few synonyms (`repetition`, `contradiction`) count.
pub fn parse_verdict(raw: &str) -> Verdict {
    let text = raw.trim();
    if let Some(open) = text.find('{') {
        let mut values = serde_json::Deserializer::from_str(&text[open..]).into_iter::<Value>();
        return match values.next() {
            Some(Ok(Value::Object(map))) => verdict_from_json(&map),
            _ => Verdict::Unparsed,
        };
    }
    let lower = text.to_lowercase();
    let words = words(&lower);
    let answer = words
        .iter()
        .position(|word| {
            !matches!(
                word.as_str(),
                "answer" | "verdict" | "output" | "response" | "reply" | "result"
            )
        })
        .map_or(&[][..], |at| &words[at..]);
    match answer.first().map(String::as_str) {
        Some("no" | "nope" | "none" | "nothing" | "not" | "clear" | "false") => {
            return Verdict::Clean
        }
        Some("yes" | "yeah" | "true" | "confusing" | "confused") => {
            return Verdict::Confusing(find_types(&answer[1..]))
        }
        _ => {}
    }
    let flat = words.join(" ");
    const CLEAR: &[&str] = &[
        "not confusing",
        "not be confusing",
        "no confusion",
        "not confuse",
        "wouldn t confuse",
        "won t confuse",
        "doesn t confuse",
        "isn t confusing",
        "is clear",
        "no error",
        "no errors",
    ];
    const CONFUSING: &[&str] = &[
        "is confusing",
        "be confusing",
        "would confuse",
        "could confuse",
        "may confuse",
        "might confuse",
        "confusing because",
    ];
    if CLEAR.iter().any(|phrase| contains_phrase(&flat, phrase)) {
        return Verdict::Clean;
    }
    if CONFUSING
        .iter()
        .any(|phrase| contains_phrase(&flat, phrase))
    {
        return Verdict::Confusing(find_types(&words));
    }
    if starts_with_type(answer) {
        return Verdict::Confusing(find_types(answer));
    }
    Verdict::Unparsed
}

/// Whether `phrase` occurs in `flat` on word boundaries.
fn contains_phrase(flat: &str, phrase: &str) -> bool {
    format!(" {flat} ").contains(&format!(" {phrase} "))
}

fn verdict_from_json(map: &Map<String, Value>) -> Verdict {
    let field = |names: &[&str]| {
        map.iter()
            .find(|(key, _)| names.contains(&key.to_lowercase().as_str()))
            .map(|(_, value)| value)
    };
    let flag =
        field(&["confusing", "is_confusing", "confusion", "confused"]).and_then(
            |value| match value {
                Value::Bool(flag) => Some(*flag),
                Value::String(text) => match parse_verdict(text) {
                    Verdict::Clean => Some(false),
                    Verdict::Confusing(_) => Some(true),
                    Verdict::Unparsed => None,
                },
                _ => None,
            },
        );
    let types = match field(&["types", "type", "errors", "error_types", "error_type"]) {
        Some(Value::Array(items)) => {
            let mut types: Vec<ErrorType> = items
                .iter()
                .filter_map(Value::as_str)
                .flat_map(|item| find_types(&words(&item.to_lowercase())))
                .collect();
            types.sort();
            types.dedup();
            types
        }
        Some(Value::String(item)) => find_types(&words(&item.to_lowercase())),
        _ => Vec::new(),
    };
    match flag {
        Some(false) => Verdict::Clean,
        Some(true) => Verdict::Confusing(types),
        None if !types.is_empty() => Verdict::Confusing(types),
        None => Verdict::Unparsed,
    }
}

/// The runs of letters and digits in `text`; underscores and hyphens separate.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_string)
        .collect()
}

/// The error types named anywhere in `words`, each once, in [`ErrorType::ALL`] order.
fn find_types(words: &[String]) -> Vec<ErrorType> {
    ErrorType::ALL
        .into_iter()
        .filter(|kind| (0..words.len()).any(|at| names_type_at(words, at, *kind)))
        .collect()
}

/// Whether the first words of `words` name an error type.
fn starts_with_type(words: &[String]) -> bool {
    ErrorType::ALL
        .into_iter()
        .any(|kind| names_type_at(words, 0, kind))
}

/// Whether `words[at..]` begins with the name of `kind` (word by word, or run
/// together as one word) or one of its synonyms.
fn names_type_at(words: &[String], at: usize, kind: ErrorType) -> bool {
    let Some(word) = words.get(at) else {
        return false;
    };
    let name: Vec<&str> = kind.name().split(' ').collect();
    let spelled_out = words.len() >= at + name.len()
        && name
            .iter()
            .zip(&words[at..])
            .all(|(expected, word)| close_enough(expected, word));
    spelled_out
        || (name.len() > 1 && close_enough(&name.concat(), word))
        || kind.aliases().contains(&word.as_str())
}

/// Whether `word` is `expected` give or take a typo: a small edit distance,
/// growing with the length, or the same stem with another ending.
fn close_enough(expected: &str, word: &str) -> bool {
    let length = expected.chars().count();
    let tolerance = match length {
        0..=4 => 0,
        5..=7 => 1,
        _ => 2,
    };
    let stem: String = expected.chars().take(length.saturating_sub(1)).collect();
    edit_distance(expected, word) <= tolerance || (length >= 6 && word.starts_with(&stem))
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
