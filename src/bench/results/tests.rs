//! Tests of bench rows: reading them back, CSV, series and time estimates.

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
    let mut fields = serde_json::to_value(row("whole", 2000, json!({"net_tokens": 5}))).unwrap();
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
