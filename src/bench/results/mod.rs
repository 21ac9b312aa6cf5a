//! The rows of a method × chunk-size sweep, one per finished run as `results.jsonl`
//! holds them, and what is derived from them: the CSV, chart figures and time left.

use crate::methods::MethodFigures;
use crate::metrics::Figures;
use crate::run::RunStats;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the judge of `bench --quality` made of a run's summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// The share of the summary's sentences the judge found clear (BooookScore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coherence: Option<f64>,
    /// Sentences whose verdict did not parse (counted as confusing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coherence_unparsed: Option<usize>,
    /// Why the summary could not be judged for coherence (it had no sentences).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coherence_error: Option<String>,
    /// Mean Correct-F1 of the questions answered from the summary alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qa_f1: Option<f64>,
    /// Code retrieval: the function of the repository the answer named first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrieved: Option<String>,
    /// Code retrieval: whether that is the function the task sought.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correct: Option<bool>,
}

impl Scores {
    /// Whether the scores `--quality` adds are here: coherence (or why it is
    /// missing), and QA-F1 when questions are asked this time.
    pub fn complete(&self, with_questions: bool) -> bool {
        (self.coherence.is_some() || self.coherence_error.is_some())
            && (!with_questions || self.qa_f1.is_some())
    }
}

/// One finished run of a sweep: where and how it ran, and its `stats.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Row {
    /// The method as `--methods` named it, e.g. `prism-amendments-no-updates`.
    pub method: String,
    /// The sweep's `--chunk-tokens` for this run; `detail` splits finer from
    /// it, which its `chunks` shows.
    pub chunk_tokens: usize,
    pub model: String,
    /// The document's file name (a repository's folder for code retrieval).
    pub document: String,
    /// The code-retrieval task the run answered, as `<repository>/<function>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    pub document_sha256: String,
    /// Tokens of the whole document.
    pub document_tokens: usize,
    /// Tokens of the chunks the run read (fewer with `--first-tokens`).
    pub read_tokens: usize,
    pub device: String,
    pub machine: Machine,
    /// `git rev-parse --short HEAD` of prism's source tree, or `unknown`.
    pub git_revision: String,
    /// Whether that tree had uncommitted changes outside `results/`; `None` when
    /// git could not tell.
    pub git_dirty: Option<bool>,
    /// When the run finished, UTC, as `2025-01-31T12:00:00Z`.
    pub date: String,
    /// The command line of the sweep session that finished the run.
    pub command: String,
    /// The run's directory, relative to the bench directory.
    pub run_dir: String,
    /// Fingerprint of the run's settings; a resumed sweep checks it.
    pub fingerprint: String,
    /// What `--quality` found, when the run was judged.
    #[serde(flatten)]
    pub scores: Scores,
    /// The name the method gave its run: `stats.json`'s `method`, which may
    /// say more than the sweep's name (`-unconstrained`).
    pub label: String,
    #[serde(flatten)]
    pub figures: Figures,
    #[serde(flatten)]
    pub run: RunStats,
    /// Declared last, since it reads the fields every other part leaves.
    #[serde(flatten)]
    pub method_figures: MethodFigures,
}

impl Row {
    /// What `metric` measured in this run; accuracy only for a scored
    /// code-retrieval run (100 when it named the function, else 0).
    pub fn metric(&self, metric: Metric) -> Option<f64> {
        let figures = &self.figures;
        match metric {
            Metric::CacheHit => Some(100.0 * figures.cache_hit_rate),
            Metric::NetTokens => Some(figures.net_tokens as f64),
            Metric::OutputTokens => Some(figures.output_tokens as f64),
            Metric::CostIndex => Some(figures.cost_index),
            Metric::Accuracy => self
                .scores
                .correct
                .map(|correct| 100.0 * f64::from(correct)),
        }
    }
}

/// The figures the sweep's charts and cross-chunk-size tables show, as the
/// PRISM paper's Figure 5 does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    CacheHit,
    NetTokens,
    OutputTokens,
    CostIndex,
    /// The share of code-retrieval tasks answered with the right function.
    Accuracy,
}

impl Metric {
    pub const ALL: [Metric; 5] = [
        Metric::Accuracy,
        Metric::CacheHit,
        Metric::NetTokens,
        Metric::OutputTokens,
        Metric::CostIndex,
    ];

    /// A title with the unit.
    pub fn title(self) -> &'static str {
        match self {
            Metric::CacheHit => "Cache hit (%)",
            Metric::NetTokens => "Net prompt tokens encoded",
            Metric::OutputTokens => "Output tokens decoded",
            Metric::CostIndex => "Cost index",
            Metric::Accuracy => "Accuracy (%)",
        }
    }

    /// The chart's file name in the bench directory.
    pub fn chart_file(self) -> &'static str {
        match self {
            Metric::CacheHit => "cache_hit.svg",
            Metric::NetTokens => "net_tokens.svg",
            Metric::OutputTokens => "output_tokens.svg",
            Metric::CostIndex => "cost_index.svg",
            Metric::Accuracy => "accuracy.svg",
        }
    }
}

/// One method's values of a metric, by chunk size (ascending).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub method: String,
    pub points: Vec<(usize, f64)>,
}

/// The methods in the order they first appear in `rows`.
pub fn methods(rows: &[Row]) -> Vec<&str> {
    distinct(rows.iter().map(|row| row.method.as_str()))
}

/// `values` without repeats, in the order they first appear.
pub fn distinct<T: PartialEq>(values: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen: Vec<T> = Vec::new();
    for value in values {
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen
}

/// The chunk sizes in `rows`, ascending.
pub fn chunk_sizes(rows: &[Row]) -> Vec<usize> {
    let mut sizes: Vec<usize> = rows.iter().map(|row| row.chunk_tokens).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The row of `method` at `chunk_tokens`; the last one when a run was
/// recorded twice.
pub fn find<'a>(rows: &'a [Row], method: &str, chunk_tokens: usize) -> Option<&'a Row> {
    rows.iter()
        .rev()
        .find(|row| row.method == method && row.chunk_tokens == chunk_tokens)
}

/// The metrics some row of `rows` measured, in [`Metric::ALL`]'s order:
/// accuracy only in code-retrieval sweeps.
pub fn measured(rows: &[Row]) -> impl Iterator<Item = Metric> + '_ {
    Metric::ALL
        .into_iter()
        .filter(|&metric| rows.iter().any(|row| row.metric(metric).is_some()))
}

/// The runs of `method` at `chunk_tokens`: one per code-retrieval task, or
/// the one run of a summary sweep; the last of each when a run was
/// recorded twice.
pub fn runs_of<'a>(rows: &'a [Row], method: &str, chunk_tokens: usize) -> Vec<&'a Row> {
    let mut runs: Vec<&Row> = Vec::new();
    for row in rows.iter().rev() {
        let same_run = |run: &&Row| run.task == row.task;
        if row.method == method && row.chunk_tokens == chunk_tokens && !runs.iter().any(same_run) {
            runs.push(row);
        }
    }
    runs.reverse();
    runs
}

/// The mean of `metric` over `runs` that measured it: the figure of a
/// summary run, the per-task mean of code-retrieval runs.
pub fn mean(runs: &[&Row], metric: Metric) -> Option<f64> {
    let values: Vec<f64> = runs.iter().filter_map(|row| row.metric(metric)).collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// One series per method of `metric` against chunk size, and per document
/// when the rows have several (named `method (document)`); chunk sizes where
/// a method has no value are left out of its series.
pub fn series(rows: &[Row], metric: Metric) -> Vec<Series> {
    let documents = distinct(rows.iter().map(|row| row.document.as_str()));
    let mut all = Vec::new();
    for document in &documents {
        let of_document: Vec<Row> = rows
            .iter()
            .filter(|row| row.document == *document)
            .cloned()
            .collect();
        let sizes = chunk_sizes(&of_document);
        for method in methods(&of_document) {
            all.push(Series {
                method: match documents.len() {
                    1 => method.to_string(),
                    _ => format!("{method} ({document})"),
                },
                points: sizes
                    .iter()
                    .filter_map(|&size| {
                        Some((size, mean(&runs_of(&of_document, method, size), metric)?))
                    })
                    .collect(),
            });
        }
    }
    all
}

/// `rows` as CSV: every field a column, nested objects flattened to
/// `parent.child` names, columns in the order they first appear.
pub fn csv(rows: &[Row]) -> String {
    let flat: Vec<Vec<(String, Value)>> = rows
        .iter()
        .map(|row| {
            let mut fields = Vec::new();
            let value = serde_json::to_value(row).expect("a row serializes to JSON");
            flatten("", value, &mut fields);
            fields
        })
        .collect();
    let mut columns: Vec<&str> = Vec::new();
    for fields in &flat {
        for (name, _) in fields {
            if !columns.contains(&name.as_str()) {
                columns.push(name);
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = columns.iter().map(|name| csv_field(name)).collect();
    out.push_str(&header.join(","));
    out.push('\n');
    for fields in &flat {
        let cells: Vec<String> = columns
            .iter()
            .map(|column| {
                fields
                    .iter()
                    .find(|(name, _)| name == column)
                    .map_or(String::new(), |(_, value)| csv_field(&plain_text(value)))
            })
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

fn flatten(prefix: &str, value: Value, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let name = if prefix.is_empty() {
                    key
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(&name, value, out);
            }
        }
        other => out.push((prefix.to_string(), other)),
    }
}

/// A JSON value as a cell: strings bare, null empty, the rest as JSON.
fn plain_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Quote a CSV cell when it holds a separator, quote or line break (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// A run the sweep has yet to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub method: String,
    pub chunk_tokens: usize,
    /// Tokens of the chunks it will read.
    pub read_tokens: usize,
    pub chunks: usize,
    /// Steps an earlier session of the run already took (0 for a new run).
    pub steps_done: usize,
}

/// A finished run's wall time split by what it grows with: seconds per token
/// read (prefill, at the run's measured prefill rate) and seconds per chunk
/// (decoding and the rest: each chunk's step writes about as much whatever
/// the chunk's size, so small chunks cost more per token).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pace {
    per_token: f64,
    per_chunk: f64,
}

impl Pace {
    fn of(row: &Row) -> Option<Pace> {
        let wall = row.run.wall_seconds;
        if row.read_tokens == 0 || row.run.chunks == 0 {
            return None;
        }
        let figures = &row.figures;
        let prefill = match figures.prefill_tokens_per_second {
            rate if rate > 0.0 => (figures.net_tokens as f64 / rate).min(wall),
            _ => 0.0,
        };
        Some(Pace {
            per_token: prefill / row.read_tokens as f64,
            per_chunk: (wall - prefill) / row.run.chunks as f64,
        })
    }

    /// Seconds `run` has left at this pace; a step counts as a chunk read.
    fn seconds(self, run: &Pending) -> f64 {
        let chunks = run.chunks.max(1) as f64;
        let left = 1.0 - (run.steps_done as f64 / chunks).min(1.0);
        left * (self.per_token * run.read_tokens as f64 + self.per_chunk * chunks)
    }
}

/// A rough forecast of the time a sweep's pending runs will take.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Seconds for the pending runs of methods with a finished run.
    pub seconds: f64,
    /// Methods with pending runs but no finished run to pace them by, in
    /// pending order. Methods differ too much in how much they decode (an
    /// incremental step can write thirty times what a PRISM step does) for
    /// one method's pace to stand for another's.
    pub unpaced_methods: Vec<String>,
}

/// Forecasts the `pending` runs: each is paced like the finished run of its
/// method nearest its chunk size.
pub fn estimate(rows: &[Row], pending: &[Pending]) -> Estimate {
    let paced: Vec<(&Row, Pace)> = rows
        .iter()
        .filter_map(|row| Some((row, Pace::of(row)?)))
        .collect();
    let size_gap = |a: usize, b: usize| (a.max(1) as f64 / b.max(1) as f64).ln().abs();
    let mut estimate = Estimate {
        seconds: 0.0,
        unpaced_methods: Vec::new(),
    };
    for run in pending {
        let nearest = paced
            .iter()
            .filter(|(row, _)| row.method == run.method)
            .min_by(|(a, _), (b, _)| {
                size_gap(a.chunk_tokens, run.chunk_tokens)
                    .total_cmp(&size_gap(b.chunk_tokens, run.chunk_tokens))
            });
        match nearest {
            Some((_, pace)) => estimate.seconds += pace.seconds(run),
            None if !estimate.unpaced_methods.contains(&run.method) => {
                estimate.unpaced_methods.push(run.method.clone())
            }
            None => {}
        }
    }
    estimate
}

/// `seconds` since the Unix epoch as a UTC timestamp, `2025-01-31T12:00:00Z`.
pub fn utc_timestamp(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The machine a run ran on, as far as `/proc` tells.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Machine {
    /// The CPU model name, or `unknown CPU`.
    pub cpu: String,
    /// Physical cores, when `/proc/cpuinfo` says.
    pub cores: Option<usize>,
    /// Hardware threads.
    pub threads: usize,
    /// Total memory in GiB, when `/proc/meminfo` says.
    pub memory_gib: Option<f64>,
    /// Threads prism computed with.
    pub engine_threads: usize,
}

impl Machine {
    /// Read the contents of `/proc/cpuinfo` and `/proc/meminfo` (either may be
    /// missing); `fallback_threads` counts threads when cpuinfo lists none.
    pub fn from_proc(
        cpuinfo: Option<&str>,
        meminfo: Option<&str>,
        fallback_threads: usize,
        engine_threads: usize,
    ) -> Self {
        let cpuinfo = cpuinfo.unwrap_or("");
        let mut cpu = None;
        let mut threads = 0;
        // A core is a (physical id, core id) pair; a line-oriented record per thread.
        let mut cores: Vec<(String, String)> = Vec::new();
        let mut physical = String::new();
        for line in cpuinfo.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "processor" => threads += 1,
                "model name" | "Hardware" | "cpu model" if cpu.is_none() && !value.is_empty() => {
                    cpu = Some(value.to_string())
                }
                "physical id" => physical = value.to_string(),
                "core id" => {
                    let core = (physical.clone(), value.to_string());
                    if !cores.contains(&core) {
                        cores.push(core);
                    }
                }
                _ => {}
            }
        }
        let memory_gib = meminfo.and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((kib / (1024.0 * 1024.0) * 10.0).round() / 10.0)
        });
        Machine {
            cpu: cpu.unwrap_or_else(|| "unknown CPU".into()),
            cores: (!cores.is_empty()).then_some(cores.len()),
            threads: if threads > 0 {
                threads
            } else {
                fallback_threads
            },
            memory_gib,
            engine_threads,
        }
    }

    /// One line for a report, e.g. `Xeon (2 cores, 4 threads, 7.8 GiB RAM; prism used 2 threads)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(cores) = self.cores {
            parts.push(format!("{cores} cores"));
        }
        parts.push(format!("{} threads", self.threads));
        if let Some(gib) = self.memory_gib {
            parts.push(format!("{gib} GiB RAM"));
        }
        format!(
            "{} ({}; prism used {} threads)",
            self.cpu,
            parts.join(", "),
            self.engine_threads
        )
    }
}

#[cfg(test)]
pub(crate) mod tests;
