//! A sweep's `report.md`: where it ran, one table per chunk size like the PRISM
//! paper's Table 3, and per-metric tables across chunk sizes like its Figure 5.

use super::results::{chunk_sizes, find, mean, measured, methods, runs_of, Metric, Row, Scores};
use crate::engine::sampling::SamplingConfig;
use crate::methods::prism::PrismFigures;
use crate::methods::MethodFigures;
use std::fmt::Write;

/// Shown for a figure a run did not report.
const MISSING: &str = "–";

/// The report of `rows` as Markdown.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::new();
    let documents = distinct(rows, |row| row.document.clone());
    let _ = writeln!(out, "# prism bench: {}\n", or_none(&documents));
    header(&mut out, rows);
    if rows.is_empty() {
        out.push_str("No run has finished yet.\n");
        return out;
    }
    out.push_str(
        "Total: prompt tokens encoded; net: those not taken from the KV cache; \
         cache hit = reused / total. Cost index = (net + 3 × output) / 10⁶, as the PRISM paper \
         weighs encoding against decoding. Wall time includes every session of a resumed run. \
         Rep. 4-gram: the share of the summary's word 4-grams that occur in it more than once; \
         echo: the share of its sentences (of 4 words or more) copied from the method's own prompt.\n\n",
    );
    if documents.len() < 2 {
        tables(&mut out, rows, 2);
        return out;
    }
    if has_tasks(rows) {
        out.push_str("## All tasks\n\n");
        retrieval_table(&mut out, rows);
        out.push('\n');
    }
    for document in &documents {
        let _ = writeln!(out, "## {document}\n");
        let of_document: Vec<Row> = rows
            .iter()
            .filter(|row| &row.document == document)
            .cloned()
            .collect();
        tables(&mut out, &of_document, 3);
    }
    out
}

/// The tables of one document's rows, their headings at `level`.
fn tables(out: &mut String, rows: &[Row], level: usize) {
    let heading = "#".repeat(level);
    let sizes = chunk_sizes(rows);
    let retrieval = has_tasks(rows);
    if retrieval {
        let _ = writeln!(out, "{heading} Accuracy and cost\n");
        retrieval_table(out, rows);
        out.push('\n');
    }
    for &size in sizes.iter().filter(|_| !retrieval) {
        let _ = writeln!(out, "{heading} Chunks of {size} tokens\n");
        table_at_chunk_size(out, rows, size);
        out.push('\n');
    }
    if retrieval {
        let _ = writeln!(out, "{heading} Answers by task\n");
        answers_by_task(out, rows);
        out.push('\n');
    }
    // With one chunk size these tables would only repeat the one above.
    if sizes.len() < 2 {
        return;
    }
    let _ = writeln!(out, "{heading} Across chunk sizes\n");
    for metric in measured(rows) {
        let _ = writeln!(out, "{heading}# {}\n", metric_title(metric));
        table_across_chunk_sizes(out, rows, metric);
        out.push('\n');
    }
}

fn header(out: &mut String, rows: &[Row]) {
    let line = |out: &mut String, name: &str, values: Vec<String>| {
        let _ = writeln!(out, "- {name}: {}", or_none(&values));
    };
    line(out, "Model", distinct(rows, |row| row.model.clone()));
    line(
        out,
        "Machine",
        distinct(rows, |row| {
            format!("{}, device {}", row.machine.describe(), row.device)
        }),
    );
    line(
        out,
        "Document",
        distinct(rows, |row| {
            let short = row
                .document_sha256
                .get(..12)
                .unwrap_or(&row.document_sha256);
            format!(
                "{} ({} tokens, sha256 {short}…)",
                row.document, row.document_tokens
            )
        }),
    );
    let read: Vec<usize> = rows
        .iter()
        .filter(|row| row.read_tokens < row.document_tokens)
        .map(|row| row.read_tokens)
        .collect();
    if let (Some(fewest), Some(most)) = (read.iter().min(), read.iter().max()) {
        let span = if fewest == most {
            fewest.to_string()
        } else {
            format!("{fewest} to {most}")
        };
        let _ = writeln!(
            out,
            "- Read: the first {span} tokens (whole chunks up to --first-tokens)"
        );
    }
    line(
        out,
        "prism revision",
        distinct(rows, |row| match row.git_dirty {
            Some(true) => format!("{} with uncommitted changes", row.git_revision),
            _ => row.git_revision.clone(),
        }),
    );
    line(
        out,
        "Command",
        distinct(rows, |row| format!("`{}`", row.command)),
    );
    let mut dates: Vec<&str> = rows.iter().map(|row| row.date.as_str()).collect();
    dates.sort_unstable();
    let dates = match (dates.first(), dates.last()) {
        (Some(first), Some(last)) if first == last => first.to_string(),
        (Some(first), Some(last)) => format!("{first} to {last}"),
        _ => MISSING.to_string(),
    };
    let _ = writeln!(out, "- Date: {dates}");
    let _ = writeln!(out, "- Runs: {}\n", rows.len());
}

/// Table 3 of the paper for one chunk size, with our wall time, calls and
/// summary length added.
fn table_at_chunk_size(out: &mut String, rows: &[Row], chunk_tokens: usize) {
    let revisions = revision_columns(rows);
    // Runs with --reuse-segments also show the hit that counts taken segments.
    let segments = rows
        .iter()
        .any(|row| row.figures.segment_hit_rate.is_some());
    let quality = quality_columns(rows);
    // Wall times of runs on different thread counts do not compare; say which is which.
    let mut thread_counts: Vec<usize> = rows.iter().map(|row| row.machine.engine_threads).collect();
    thread_counts.sort_unstable();
    thread_counts.dedup();
    let threads_vary = thread_counts.len() > 1;
    let extra_titles = revisions.iter().map(|(_, title)| *title);
    let extra_titles: Vec<&str> = extra_titles
        .chain(segments.then_some("Hit with segments (%)"))
        .chain(quality.iter().map(|(_, title)| *title))
        .collect();
    table_head(out, threads_vary, &extra_titles);
    let mut shown = Vec::new();
    for method in methods(rows) {
        let Some(row) = find(rows, method, chunk_tokens) else {
            continue;
        };
        let thousands = |tokens: usize| cell(Some(tokens as f64 / 1000.0), 1);
        let figures = &row.figures;
        let _ = write!(
            out,
            "| {method} | {} | {} | {} | {} | {} | {} |",
            cell(row.metric(Metric::CacheHit), 1),
            thousands(figures.prompt_tokens),
            thousands(figures.net_tokens),
            thousands(figures.output_tokens),
            cell(Some(figures.cost_index), 4),
            cell(Some(row.run.wall_seconds), 0),
        );
        if threads_vary {
            let _ = write!(out, " {} |", row.machine.engine_threads);
        }
        let percent = |share: Option<f64>| cell(share.map(|share| 100.0 * share), 1);
        let count = |value: Option<usize>| cell(value.map(|value| value as f64), 0);
        let _ = write!(
            out,
            " {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.run.calls,
            row.run.summary_tokens,
            row.run.summary_words,
            count(row.run.summary_words_target),
            percent(row.run.compression),
            percent(row.run.copied_8gram_share),
            count(row.run.longest_copy_words),
            percent(row.run.repeated_ngram_share),
            percent(row.run.echo_share),
        );
        for (count, _) in &revisions {
            let count = prism_figures(row).map(|prism| count(prism) as f64);
            let _ = write!(out, " {} |", cell(count, 0));
        }
        if segments {
            let _ = write!(out, " {} |", percent(figures.segment_hit_rate));
        }
        for (score, _) in &quality {
            let _ = write!(out, " {} |", cell(score(&row.scores), 3));
        }
        out.push('\n');
        shown.push(row);
    }
    let _ = writeln!(out, "\n{}", sampling_line(&shown));
}

/// A PRISM count shown as a column of Table 3.
type Count = fn(&PrismFigures) -> usize;

/// A quality score shown as a column of Table 3.
type Score = fn(&Scores) -> Option<f64>;

/// PRISM's counts of revisions it refused or cut, when some run has them.
fn revision_columns(rows: &[Row]) -> Vec<(Count, &'static str)> {
    if rows.iter().any(|row| prism_figures(row).is_some()) {
        vec![
            (|prism| prism.revisions_duplicate, "Duplicate revisions"),
            (|prism| prism.revisions_echo, "Echo revisions"),
            (|prism| prism.revisions_copy, "Copy revisions"),
            (|prism| prism.revisions_ungrounded, "Ungrounded revisions"),
            (
                |prism| prism.revisions_first_person,
                "First-person revisions",
            ),
            (|prism| prism.revision_lines_skipped, "Lines skipped"),
            (|prism| prism.revisions_capped, "Capped revisions"),
            (
                |prism| prism.revision_steps_stopped,
                "Steps stopped at a repeat",
            ),
        ]
    } else {
        Vec::new()
    }
}

/// Quality columns only when `bench --quality` scored some run.
fn quality_columns(rows: &[Row]) -> Vec<(Score, &'static str)> {
    [
        ((|scores: &Scores| scores.coherence) as Score, "Coherence"),
        (|scores: &Scores| scores.qa_f1, "QA-F1"),
    ]
    .into_iter()
    .filter(|(score, _)| rows.iter().any(|row| score(&row.scores).is_some()))
    .collect()
}

/// The head of a Table 3: the columns every run has, a threads column when
/// thread counts vary, then `extra_titles`.
fn table_head(out: &mut String, threads_vary: bool, extra_titles: &[&str]) {
    out.push_str(
        "| Method | Cache hit (%) | Total (×10³) | Net (×10³) | Output (×10³) | Cost index | Wall (s) |",
    );
    if threads_vary {
        out.push_str(" Threads |");
    }
    out.push_str(" Calls | Summary tokens | Summary words | Target words | Compression (%) | Copied 8-gram (%) | Longest copy | Rep. 4-gram (%) | Echo (%) |");
    for title in extra_titles {
        let _ = write!(out, " {title} |");
    }
    out.push_str("\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    out.push_str(&"--:|".repeat(extra_titles.len() + usize::from(threads_vary)));
    out.push('\n');
}

/// PRISM's own figures of `row`, when it is a PRISM run that recorded today's counts.
fn prism_figures(row: &Row) -> Option<&PrismFigures> {
    match &row.method_figures {
        MethodFigures::Prism(figures) => Some(figures),
        _ => None,
    }
}

/// The line under a table that names the sampling settings its rows used:
/// one description when they share it, else each with its methods.
fn sampling_line(rows: &[&Row]) -> String {
    let mut settings: Vec<(String, Vec<&str>)> = Vec::new();
    for row in rows {
        let described = match &row.run.sampling {
            Some(sampling) => describe_sampling(sampling),
            None => "not recorded".to_string(),
        };
        match settings.iter_mut().find(|(text, _)| *text == described) {
            Some((_, methods)) => methods.push(row.method.as_str()),
            None => settings.push((described, vec![row.method.as_str()])),
        }
    }
    match settings.as_slice() {
        [] => format!("Sampling: {MISSING}"),
        [(text, _)] => format!("Sampling: {text}."),
        _ => {
            let parts: Vec<String> = settings
                .iter()
                .map(|(text, methods)| format!("{text} ({})", methods.join(", ")))
                .collect();
            format!("Sampling: {}.", parts.join("; "))
        }
    }
}

/// A run's sampling settings in words.
fn describe_sampling(sampling: &SamplingConfig) -> String {
    let mut parts = Vec::new();
    parts.push(match sampling.temperature {
        t if t > 0.0 => format!("temperature {}", short(t)),
        _ => "greedy".to_string(),
    });
    if sampling.repeat_penalty != 1.0 {
        parts.push(format!(
            "repeat penalty {} over {} tokens",
            short(sampling.repeat_penalty.into()),
            sampling.repeat_last_n
        ));
    }
    parts.push(if sampling.dry_multiplier != 0.0 {
        let mut window = match sampling.dry_penalty_last_n {
            0 => String::new(),
            n => format!(", last {n} tokens"),
        };
        window.push_str(if sampling.dry_prompt {
            ", prompt included"
        } else {
            ", output only"
        });
        format!(
            "DRY multiplier {} (base {}, allowed length {}{window})",
            short(sampling.dry_multiplier.into()),
            short(sampling.dry_base.into()),
            sampling.dry_allowed_length,
        )
    } else {
        "DRY off".to_string()
    });
    parts.push(match sampling.no_repeat_ngram {
        0 => "no-repeat n-gram off".to_string(),
        n => format!("no-repeat {n}-grams"),
    });
    parts.push(match sampling.no_copy_ngram {
        0 => "no-copy off".to_string(),
        n => format!("no copied {n}-token runs"),
    });
    parts.push(
        if sampling.loop_guard {
            "loop guard on"
        } else {
            "loop guard off"
        }
        .to_string(),
    );
    parts.join(", ")
}

/// A setting as short as it reads exactly: `0.8`, not the `0.800000011920929`
/// an `f32` becomes in JSON.
fn short(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Figure 5 of the paper as a table: methods × chunk sizes of one metric.
fn table_across_chunk_sizes(out: &mut String, rows: &[Row], metric: Metric) {
    let sizes = chunk_sizes(rows);
    out.push_str("| Method |");
    for size in &sizes {
        let _ = write!(out, " {size} |");
    }
    out.push_str("\n|---|");
    out.push_str(&"--:|".repeat(sizes.len()));
    out.push('\n');
    for method in methods(rows) {
        let _ = write!(out, "| {method} |");
        for &size in &sizes {
            let value = mean(&runs_of(rows, method, size), metric);
            let value = match metric {
                Metric::NetTokens | Metric::OutputTokens => value.map(|n| n / 1000.0),
                Metric::CacheHit | Metric::CostIndex | Metric::Accuracy => value,
            };
            let _ = write!(out, " {} |", cell(value, metric_decimals(metric)));
        }
        out.push('\n');
    }
}

fn metric_title(metric: Metric) -> String {
    match metric {
        Metric::NetTokens | Metric::OutputTokens => format!("{} (×10³)", metric.title()),
        Metric::CacheHit | Metric::CostIndex | Metric::Accuracy => metric.title().to_string(),
    }
}

fn metric_decimals(metric: Metric) -> usize {
    match metric {
        Metric::CostIndex => 4,
        Metric::Accuracy => 0,
        Metric::CacheHit | Metric::NetTokens | Metric::OutputTokens => 1,
    }
}

/// Whether `rows` are code-retrieval runs, one per task.
fn has_tasks(rows: &[Row]) -> bool {
    rows.iter().any(|row| row.task.is_some())
}

/// The code-retrieval counterpart of Table 3, a row per method and chunk
/// size: accuracy over the tasks, and each figure as the mean of one task's run.
fn retrieval_table(out: &mut String, rows: &[Row]) {
    out.push_str(
        "| Method | Chunk tokens | Tasks | Accuracy (%) | Cache hit (%) | Net (×10³) | Output (×10³) | Cost index | Wall (s) |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let mut shown = Vec::new();
    let sizes = chunk_sizes(rows);
    let cells = methods(rows)
        .into_iter()
        .flat_map(|method| sizes.iter().map(move |&size| (method, size)));
    for (method, chunk_tokens) in cells {
        let runs = runs_of(rows, method, chunk_tokens);
        if runs.is_empty() {
            continue;
        }
        let thousands = |metric| cell(mean(&runs, metric).map(|n| n / 1000.0), 1);
        let wall = runs.iter().map(|row| row.run.wall_seconds).sum::<f64>() / runs.len() as f64;
        let _ = writeln!(
            out,
            "| {method} | {chunk_tokens} | {} | {} | {} | {} | {} | {} | {} |",
            runs.len(),
            cell(mean(&runs, Metric::Accuracy), 0),
            cell(mean(&runs, Metric::CacheHit), 1),
            thousands(Metric::NetTokens),
            thousands(Metric::OutputTokens),
            cell(mean(&runs, Metric::CostIndex), 4),
            cell(Some(wall), 0),
        );
        shown.extend(runs);
    }
    let _ = writeln!(
        out,
        "\nFigures are means per task; accuracy is the share of tasks whose answer named the function sought first.\n{}",
        sampling_line(&shown)
    );
}

/// Every code-retrieval run's answer: what it named, and whether that was right.
fn answers_by_task(out: &mut String, rows: &[Row]) {
    out.push_str("| Task | Method | Chunk tokens | Named | Right |\n|---|---|--:|---|---|\n");
    for row in rows {
        let Some(task) = &row.task else { continue };
        let right = match row.scores.correct {
            Some(true) => "yes",
            Some(false) => "no",
            None => MISSING,
        };
        let _ = writeln!(
            out,
            "| {task} | {} | {} | {} | {right} |",
            row.method,
            row.chunk_tokens,
            row.scores.retrieved.as_deref().unwrap_or(MISSING),
        );
    }
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or(MISSING.to_string(), |value| format!("{value:.decimals$}"))
}

/// The distinct values of `key` over `rows`, in order of first appearance.
fn distinct(rows: &[Row], key: impl Fn(&Row) -> String) -> Vec<String> {
    super::results::distinct(rows.iter().map(key))
}

fn or_none(values: &[String]) -> String {
    if values.is_empty() {
        MISSING.to_string()
    } else {
        values.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::tests::row;
    use serde_json::json;

    fn rows() -> Vec<Row> {
        let stats = |hit: f64, net: u64| {
            json!({
                "cache_hit_rate": hit, "prompt_tokens": 5600, "net_tokens": net,
                "output_tokens": 470, "cost_index": (net as f64 + 1410.0) / 1e6,
                "wall_seconds": 12.4, "calls": 6, "summary_tokens": 210,
                "summary_words": 160, "summary_words_target": 150, "compression": 0.1,
                "copied_8gram_share": 0.05, "longest_copy_words": 9,
                "repeated_ngram_share": 0.125, "echo_share": 0.0,
                "sampling": {
                    "temperature": 0.0, "top_k": null, "top_p": null,
                    "repeat_penalty": 1.0, "repeat_last_n": 64, "seed": 1,
                    "dry_multiplier": 0.800000011920929, "loop_guard": true,
                },
            })
        };
        let mut rows = vec![
            row("prism-amendments", 1000, stats(0.69, 1710)),
            row("prism-in-place", 1000, stats(0.49, 2500)),
            row("prism-amendments", 500, stats(0.75, 1400)),
        ];
        for (row, date) in rows
            .iter_mut()
            .zip(["2025-03-02", "2025-03-01", "2025-03-03"])
        {
            row.date = date.into();
            row.command = "prism bench doc.txt".into();
        }
        rows
    }

    #[test]
    fn header_names_model_document_command_and_date_range() {
        let report = markdown(&rows());
        assert!(report.starts_with("# prism bench: doc.txt\n"));
        assert!(report.contains("- Model: tiny\n"));
        assert!(report.contains("- Command: `prism bench doc.txt`\n"));
        assert!(report.contains("- Date: 2025-03-01 to 2025-03-03\n"));
        assert!(report.contains("- Runs: 3\n"));
        assert!(!report.contains("- Read:"), "whole documents were read");
        let mut partial = rows();
        partial[0].document_tokens = 5000;
        partial[1].document_tokens = 5000;
        partial[1].read_tokens = 980;
        let report = markdown(&partial);
        assert!(
            report.contains("- Read: the first 980 to 1000 tokens"),
            "{report}"
        );
    }

    #[test]
    fn the_hit_with_segments_is_a_column_only_when_a_run_reused_segments() {
        assert!(!markdown(&rows()).contains("Hit with segments"));
        let mut reused = rows();
        reused[0].figures.segment_hit_rate = Some(0.8123);
        let report = markdown(&reused);
        assert!(report.contains("| Hit with segments (%) |"), "{report}");
        assert!(report.contains("| 81.2 |"), "{report}");
    }

    /// A code-retrieval row: `task` of `repository`, answered right or not.
    fn retrieval_row(repository: &str, task: &str, chunk_tokens: usize, correct: bool) -> Row {
        let mut row = row(
            "prism-amendments-no-updates",
            chunk_tokens,
            serde_json::json!({"net_tokens": if correct { 1000 } else { 3000 }, "cost_index": 0.01}),
        );
        row.document = repository.into();
        row.task = Some(format!("{repository}/{task}"));
        row.scores.correct = Some(correct);
        row.scores.retrieved = Some(if correct { task.into() } else { "other".into() });
        row
    }

    #[test]
    fn code_retrieval_reports_accuracy_and_means_over_tasks() {
        let rows = vec![
            retrieval_row("pkg", "parse", 2000, true),
            retrieval_row("pkg", "format", 2000, false),
            retrieval_row("lib", "load", 2000, true),
            retrieval_row("pkg", "parse", 500, false),
        ];
        let report = markdown(&rows);
        let all = report.find("## All tasks").unwrap();
        let pkg = report.find("## pkg\n").unwrap();
        // Over all three tasks at 2000: two of three right, net tokens a mean.
        let row_2000 = "| prism-amendments-no-updates | 2000 | 3 | 67 | 0.0 | 1.7 |";
        assert!(report[all..pkg].contains(row_2000), "{report}");
        let row_500 = "| prism-amendments-no-updates | 500 | 1 | 0 |";
        assert!(report[all..pkg].contains(row_500), "{report}");
        let pkg_2000 = "| prism-amendments-no-updates | 2000 | 2 | 50 |";
        assert!(report[pkg..].contains(pkg_2000), "{report}");
        assert!(!report.contains("Chunks of 2000 tokens"), "{report}");
        assert!(report.contains("| pkg/format | prism-amendments-no-updates | 2000 | other | no |"));
        let accuracy = crate::bench::results::series(&rows, Metric::Accuracy);
        assert_eq!(accuracy[0].points, [(500, 0.0), (2000, 50.0)]);
        assert!(report.contains("#### Accuracy (%)"), "{report}");
    }

    #[test]
    fn several_documents_get_a_section_each_with_only_their_rows() {
        let mut rows = rows();
        let mut other = rows[0].clone();
        other.document = "other.txt".into();
        other.figures.net_tokens = 98_700;
        rows.push(other);
        let report = markdown(&rows);
        assert!(report.starts_with("# prism bench: doc.txt; other.txt\n"));
        let doc = report.find("## doc.txt\n").unwrap();
        let other = report.find("## other.txt\n").unwrap();
        assert!(doc < other);
        assert!(report[doc..other].contains("### Chunks of 500 tokens"));
        assert!(report[doc..other].contains("### Across chunk sizes"));
        assert!(!report[doc..other].contains("| 98.7 |"), "{report}");
        assert!(report[other..].contains("| 98.7 |"), "{report}");
        assert!(!report[other..].contains("### Chunks of 500 tokens"));
        let series = crate::bench::results::series(&rows, Metric::NetTokens);
        let names: Vec<&str> = series.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(
            names,
            [
                "prism-amendments (doc.txt)",
                "prism-in-place (doc.txt)",
                "prism-amendments (other.txt)"
            ]
        );
    }

    #[test]
    fn one_table_3_per_chunk_size_with_methods_as_rows() {
        let report = markdown(&rows());
        let at_500 = report.find("## Chunks of 500 tokens").unwrap();
        let at_1000 = report.find("## Chunks of 1000 tokens").unwrap();
        assert!(at_500 < at_1000, "chunk sizes ascend");
        let table = &report[at_1000..report.find("## Across").unwrap()];
        assert!(
            table.contains(
                "| prism-amendments | 69.0 | 5.6 | 1.7 | 0.5 | 0.0031 | 12 | 6 | 210 | 160 | 150 | 10.0 | 5.0 | 9 | 12.5 | 0.0 |\n"
            ),
            "{table}"
        );
        assert!(table.contains("| prism-in-place | 49.0 |"));
        // Methods keep the order they first appeared in.
        assert!(table.find("prism-amendments").unwrap() < table.find("prism-in-place").unwrap());
        // A method without a run at a chunk size has no row in that table.
        let table = &report[at_500..at_1000];
        assert!(!table.contains("prism-in-place"));
    }

    #[test]
    fn runs_on_different_thread_counts_get_a_threads_column() {
        let report = markdown(&rows());
        assert!(!report.contains("Threads"), "one thread count: no column");
        let mut mixed = rows();
        mixed[0].machine.engine_threads = 2;
        mixed[1].machine.engine_threads = 1;
        mixed[2].machine.engine_threads = 1;
        let report = markdown(&mixed);
        assert!(
            report.contains("| Wall (s) | Threads | Calls |"),
            "{report}"
        );
        assert!(
            report.contains(
                "| prism-amendments | 69.0 | 5.6 | 1.7 | 0.5 | 0.0031 | 12 | 2 | 6 | 210 | 160 | 150 | 10.0 | 5.0 | 9 | 12.5 | 0.0 |"
            ),
            "{report}"
        );
        assert!(report
            .contains("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"));
    }

    #[test]
    fn figure_5_tables_mark_missing_runs() {
        let report = markdown(&rows());
        let hit = &report[report.find("### Cache hit (%)").unwrap()..];
        assert!(hit.contains("| Method | 500 | 1000 |\n|---|--:|--:|\n"));
        assert!(hit.contains("| prism-amendments | 75.0 | 69.0 |"));
        assert!(hit.contains("| prism-in-place | – | 49.0 |"));
        assert!(report.contains("### Net prompt tokens encoded (×10³)"));
        assert!(report.contains("### Cost index"));
    }

    #[test]
    fn one_chunk_size_gets_no_tables_across_chunk_sizes() {
        let report = markdown(&rows()[..2]);
        assert!(report.contains("## Chunks of 1000 tokens"));
        assert!(!report.contains("## Across chunk sizes"), "{report}");
    }

    #[test]
    fn figures_a_row_predates_show_as_dashes() {
        let report = markdown(&[row("incremental", 500, json!({"calls": 3}))]);
        assert!(
            report
                .contains("| incremental | 0.0 | 0.0 | 0.0 | 0.0 | 0.0000 | 0 | 3 | 0 | 0 | – | – | – | – | – | – |\n"),
            "{report}"
        );
        assert!(report.contains("\nSampling: not recorded.\n"), "{report}");
    }

    #[test]
    fn revision_counts_get_columns_when_a_run_has_them() {
        let report = markdown(&rows());
        assert!(!report.contains("revisions"), "no run has them: no columns");
        let mut with = rows();
        with[0].method_figures = MethodFigures::Prism(PrismFigures {
            revisions_applied: 9,
            revisions_rejected: 2,
            revisions_duplicate: 4,
            revisions_echo: 1,
            revisions_copy: 2,
            revisions_ungrounded: 6,
            revisions_first_person: 7,
            revision_lines_skipped: 5,
            revisions_capped: 0,
            revision_steps_stopped: 3,
            consolidations: 0,
        });
        let report = markdown(&with);
        assert!(
            report.contains(
                "| Echo (%) | Duplicate revisions | Echo revisions | Copy revisions | Ungrounded revisions | First-person revisions | Lines skipped | Capped revisions | Steps stopped at a repeat |\n\
                 |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
            ),
            "{report}"
        );
        assert!(
            report.contains("| 9 | 12.5 | 0.0 | 4 | 1 | 2 | 6 | 7 | 5 | 0 | 3 |\n"),
            "{report}"
        );
        // A run without them shows dashes.
        assert!(
            report.contains("| 9 | 12.5 | 0.0 | – | – | – | – | – | – | – | – |\n"),
            "{report}"
        );
    }

    #[test]
    fn each_table_names_its_sampling_settings() {
        let report = markdown(&rows());
        let at_1000 = report.find("## Chunks of 1000 tokens").unwrap();
        let table = &report[at_1000..report.find("## Across").unwrap()];
        // Base and allowed length are left out of the JSON at their defaults.
        assert!(
            table.contains(
                "\nSampling: greedy, DRY multiplier 0.8 (base 1.75, allowed length 2, output only), \
                 no-repeat n-gram off, no-copy off, loop guard on.\n"
            ),
            "{table}"
        );
        let mut mixed = rows();
        mixed[1].run.sampling = serde_json::from_value(json!({
            "temperature": 0.7, "repeat_penalty": 1.100000023841858, "repeat_last_n": 64, "seed": 1,
            "dry_multiplier": 0.5, "dry_base": 2.0, "dry_allowed_length": 3,
            "dry_penalty_last_n": 256, "dry_prompt": true, "no_repeat_ngram": 4,
        }))
        .unwrap();
        let report = markdown(&mixed);
        assert!(
            report.contains(
                "\nSampling: greedy, DRY multiplier 0.8 (base 1.75, allowed length 2, output only), \
                 no-repeat n-gram off, no-copy off, loop guard on (prism-amendments); \
                 temperature 0.7, repeat penalty 1.1 over 64 tokens, \
                 DRY multiplier 0.5 (base 2, allowed length 3, last 256 tokens, prompt included), \
                 no-repeat 4-grams, no-copy off, loop guard off (prism-in-place).\n"
            ),
            "{report}"
        );
        // Settings from before the repetition controls existed read as off.
        let mut old = rows();
        old[0].run.sampling = serde_json::from_value(
            json!({"temperature": 0.0, "repeat_penalty": 1.0, "repeat_last_n": 64, "seed": 1}),
        )
        .unwrap();
        let report = markdown(&old[..1]);
        assert!(
            report.contains(
                "Sampling: greedy, DRY off, no-repeat n-gram off, no-copy off, loop guard off.\n"
            ),
            "{report}"
        );
    }

    #[test]
    fn an_empty_sweep_says_so() {
        let report = markdown(&[]);
        assert!(report.contains("No run has finished yet."));
        assert!(report.contains("- Model: –"));
    }
}
