//! The rows of a method × chunk-size sweep (`prism bench`): one per finished
//! run, as `results.jsonl` holds them, and what is derived from them without
//! running anything: the CSV, the figures charts and tables plot, and a rough
//! estimate of the time the remaining runs will take.

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
    /// The document's file name.
    pub document: String,
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
    /// What `metric` measured in this run.
    pub fn metric(&self, metric: Metric) -> f64 {
        let figures = &self.figures;
        match metric {
            Metric::CacheHit => 100.0 * figures.cache_hit_rate,
            Metric::NetTokens => figures.net_tokens as f64,
            Metric::OutputTokens => figures.output_tokens as f64,
            Metric::CostIndex => figures.cost_index,
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
}

impl Metric {
    pub const ALL: [Metric; 4] = [
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
        }
    }

    /// The chart's file name in the bench directory.
    pub fn chart_file(self) -> &'static str {
        match self {
            Metric::CacheHit => "cache_hit.svg",
            Metric::NetTokens => "net_tokens.svg",
            Metric::OutputTokens => "output_tokens.svg",
            Metric::CostIndex => "cost_index.svg",
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
    let mut methods: Vec<&str> = Vec::new();
    for row in rows {
        if !methods.contains(&row.method.as_str()) {
            methods.push(&row.method);
        }
    }
    methods
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

/// One series per method of `metric` against chunk size; chunk sizes where a
/// method has no value are left out of its series.
pub fn series(rows: &[Row], metric: Metric) -> Vec<Series> {
    let sizes = chunk_sizes(rows);
    methods(rows)
        .into_iter()
        .map(|method| Series {
            method: method.to_string(),
            points: sizes
                .iter()
                .filter_map(|&size| Some((size, find(rows, method, size)?.metric(metric))))
                .collect(),
        })
        .collect()
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
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A row of `method` whose stats are zero but for `stats`, given as
    /// `stats.json` would hold them.
    pub(crate) fn row(method: &str, chunk_tokens: usize, stats: Value) -> Row {
        let base = Row {
            method: method.into(),
            chunk_tokens,
            model: "tiny".into(),
            document: "doc.txt".into(),
            read_tokens: 1000,
            ..Row::default()
        };
        let mut fields = serde_json::to_value(base).unwrap();
        for (key, value) in stats.as_object().unwrap() {
            fields[key] = value.clone();
        }
        serde_json::from_value(fields).unwrap()
    }

    #[test]
    fn judge_scores_read_back_from_a_flat_row() {
        let mut fields =
            serde_json::to_value(row("whole", 2000, json!({"net_tokens": 5}))).unwrap();
        fields["coherence"] = json!(1.0);
        fields["qa_f1"] = json!(0.207);
        let row: Row = serde_json::from_value(fields).unwrap();
        assert_eq!(row.scores.coherence, Some(1.0));
        assert_eq!(row.scores.qa_f1, Some(0.207));
        assert!(row.scores.complete(true));
        assert_eq!(
            row.method_figures,
            MethodFigures::default(),
            "scores are not the method's"
        );
        assert_eq!(row.figures.net_tokens, 5);
        let back = serde_json::to_value(&row).unwrap();
        assert_eq!(back["qa_f1"], 0.207);
        assert!(back.get("coherence_error").is_none());
        assert!(!Row::default().scores.complete(false));
    }

    #[test]
    fn each_method_s_figures_read_back_as_its_own_type() {
        let prism = json!({"revisions_applied": 4, "revisions_rejected": 1, "revisions_duplicate": 2,
            "revisions_echo": 0, "revisions_capped": 3, "revision_steps_stopped": 0, "consolidations": 1});
        let read = row("prism-amendments", 2000, prism).method_figures;
        let MethodFigures::Prism(figures) = read else {
            panic!("{read:?}")
        };
        assert_eq!(
            (figures.revisions_applied, figures.revisions_capped),
            (4, 3)
        );
        let incremental = json!({"compressions": 2, "compression_failures": 0});
        let read = row("incremental", 2000, incremental).method_figures;
        assert!(matches!(read, MethodFigures::Incremental(_)), "{read:?}");
        let gu_json = json!({"updates_rejected": 1, "compressions": 0, "compressions_failed": 0, "memory_tokens": 90});
        let read = row("gu-json", 2000, gu_json).method_figures;
        let MethodFigures::Cok(figures) = read else {
            panic!("{read:?}")
        };
        assert_eq!(
            (figures.updates_rejected, figures.chains_complete),
            (Some(1), None)
        );
    }

    #[test]
    fn figures_an_earlier_prism_recorded_are_kept_as_they_were() {
        // PRISM before it counted duplicates, and a stat since renamed.
        let older =
            json!({"revisions_applied": 4, "revisions_rejected": 1, "stats_document_tokens": 7});
        let original = row("prism-amendments", 500, older);
        let MethodFigures::Recorded(fields) = &original.method_figures else {
            panic!("{:?}", original.method_figures)
        };
        assert_eq!(fields.len(), 3, "{fields:?}");
        let line = serde_json::to_string(&original).unwrap();
        let back: Row = serde_json::from_str(&line).unwrap();
        assert_eq!(back, original);
        assert_eq!(
            serde_json::to_string(&back).unwrap(),
            line,
            "rewriting loses nothing"
        );
    }

    #[test]
    fn rows_round_trip_through_json_with_their_stats_flat() {
        let original = row("a", 500, json!({"cache_hit_rate": 0.5, "calls": 2}));
        let line = serde_json::to_string(&original).unwrap();
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["calls"], 2);
        assert_eq!(value["machine"]["threads"], 0);
        let back: Row = serde_json::from_str(&line).unwrap();
        assert_eq!(back, original);
        // A row from before prism measured repetition and recorded sampling still reads.
        assert!(value.get("repeated_ngram_share").is_none() && value.get("sampling").is_none());
        assert_eq!(back.run.repeated_ngram_share, None);
    }

    #[test]
    fn csv_flattens_nested_fields_and_escapes_cells() {
        let mut first = row("a", 500, json!({"calls": 2}));
        first.command = "prism bench \"my, doc.txt\"".into();
        first.machine.cpu = "Xeon".into();
        let second = row("b", 1000, json!({"calls": 3, "retries": 1}));
        let text = csv(&[first, second]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let header: Vec<&str> = lines[0].split(',').collect();
        assert_eq!(header[0], "method");
        assert!(header.contains(&"machine.cpu") && header.contains(&"machine.memory_gib"));
        // A column only the second row has comes last; the first row's cell is empty.
        assert_eq!(*header.last().unwrap(), "retries");
        assert!(lines[1].ends_with(','), "{}", lines[1]);
        assert!(lines[2].ends_with(",1"), "{}", lines[2]);
        let calls = header.iter().position(|&name| name == "calls").unwrap();
        let cell = |line: &str| line.split(',').nth(calls + 1).map(str::to_string);
        // The quoted command holds one comma, so cells after it shift by one.
        assert_eq!(cell(lines[1]), Some("2".into()));
        assert!(lines[1].contains(r#","prism bench ""my, doc.txt""","#));
        // git_dirty is null: an empty cell, not "null".
        assert!(!text.contains("null"));
    }

    #[test]
    fn csv_quotes_line_breaks() {
        assert_eq!(csv_field("a\nb"), "\"a\nb\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn series_follow_methods_in_order_and_skip_missing_runs() {
        let rows = [
            row("b", 1000, json!({"cache_hit_rate": 0.5})),
            row("a", 500, json!({"cache_hit_rate": 0.25})),
            row("a", 1000, json!({"cache_hit_rate": 0.75})),
        ];
        let series = series(&rows, Metric::CacheHit);
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].method, "b");
        assert_eq!(series[0].points, vec![(1000, 50.0)]);
        assert_eq!(series[1].points, vec![(500, 25.0), (1000, 75.0)]);
    }

    #[test]
    fn a_run_recorded_twice_counts_once_with_its_last_row() {
        let rows = [
            row("a", 500, json!({"calls": 1})),
            row("a", 500, json!({"calls": 2})),
        ];
        assert_eq!(find(&rows, "a", 500).unwrap().run.calls, 2);
    }

    fn pending(method: &str, chunk_tokens: usize, chunks: usize) -> Pending {
        Pending {
            method: method.into(),
            chunk_tokens,
            read_tokens: 2000,
            chunks,
            steps_done: 0,
        }
    }

    #[test]
    fn estimates_scale_prefill_with_tokens_and_the_rest_with_chunks() {
        // 1000 tokens read in 4 chunks: 20 s of prefill (2000 net at 100/s), 80 s the rest.
        let rows = [row(
            "a",
            250,
            json!({"wall_seconds": 100.0, "chunks": 4, "net_tokens": 2000, "prefill_tokens_per_second": 100.0}),
        )];
        // Twice the tokens in twice the chunks: twice the time.
        let seconds = estimate(&rows, &[pending("a", 250, 8)]).seconds;
        assert!((seconds - 200.0).abs() < 1e-9);
        // Twice the tokens in one chunk: 40 s of prefill, 20 s for the chunk.
        let seconds = estimate(&rows, &[pending("a", 2000, 1)]).seconds;
        assert!((seconds - 60.0).abs() < 1e-9);
        // Half of it done by an earlier session.
        let half_done = Pending {
            steps_done: 4,
            ..pending("a", 250, 8)
        };
        let seconds = estimate(&rows, &[half_done]).seconds;
        assert!((seconds - 100.0).abs() < 1e-9);
    }

    #[test]
    fn estimates_use_the_same_method_at_the_nearest_chunk_size() {
        let rows = [
            row("slow", 500, json!({"wall_seconds": 100.0, "chunks": 2})),
            row("slow", 4000, json!({"wall_seconds": 300.0, "chunks": 2})),
            row("fast", 500, json!({"wall_seconds": 10.0, "chunks": 2})),
        ];
        // No prefill rate: all of the time counts per chunk (slow at 500: 50 s, at 4000: 150 s).
        let seconds = estimate(&rows, &[pending("slow", 1000, 2)]).seconds;
        assert!((seconds - 100.0).abs() < 1e-9);
        let seconds = estimate(&rows, &[pending("slow", 3000, 2)]).seconds;
        assert!((seconds - 300.0).abs() < 1e-9);
    }

    #[test]
    fn methods_with_no_finished_run_are_named_instead_of_guessed() {
        let rows = [row("fast", 500, json!({"wall_seconds": 10.0, "chunks": 2}))];
        let runs = [
            pending("new", 500, 3),
            pending("fast", 500, 2),
            pending("new", 1000, 3),
            pending("other", 500, 1),
        ];
        let forecast = estimate(&rows, &runs);
        assert!((forecast.seconds - 10.0).abs() < 1e-9);
        assert_eq!(forecast.unpaced_methods, ["new", "other"]);
        let forecast = estimate(&[], &[pending("new", 500, 1)]);
        assert_eq!(forecast.seconds, 0.0);
        assert_eq!(forecast.unpaced_methods, ["new"]);
    }

    #[test]
    fn utc_timestamps_match_known_dates() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_timestamp(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn machine_reads_proc_files_and_falls_back() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Test CPU @ 2GHz\nphysical id\t: 0\ncore id\t: 0\n\n\
                       processor\t: 1\nmodel name\t: Test CPU @ 2GHz\nphysical id\t: 0\ncore id\t: 0\n\n\
                       processor\t: 2\nmodel name\t: Test CPU @ 2GHz\nphysical id\t: 0\ncore id\t: 1\n";
        let meminfo = "MemTotal:        8048576 kB\nMemFree: 1 kB\n";
        let machine = Machine::from_proc(Some(cpuinfo), Some(meminfo), 99, 2);
        assert_eq!(machine.cpu, "Test CPU @ 2GHz");
        assert_eq!((machine.cores, machine.threads), (Some(2), 3));
        assert_eq!(machine.memory_gib, Some(7.7));
        assert_eq!(
            machine.describe(),
            "Test CPU @ 2GHz (2 cores, 3 threads, 7.7 GiB RAM; prism used 2 threads)"
        );
        let unknown = Machine::from_proc(None, None, 4, 4);
        assert_eq!(unknown.cpu, "unknown CPU");
        assert_eq!(
            (unknown.cores, unknown.threads, unknown.memory_gib),
            (None, 4, None)
        );
        assert_eq!(
            unknown.describe(),
            "unknown CPU (4 threads; prism used 4 threads)"
        );
    }
}
