//! `prism bench`: sweep methods × chunk sizes over one document on one loaded
//! engine, one run directory each, and keep the sweep's results.jsonl,
//! results.csv, report.md and charts up to date after every run, so a paused
//! or interrupted sweep still has a report and resumes where it stopped.

use super::summarize::{Bar, Document, Job, MemoryArg, MethodArgs, MethodName, OnOff};
use super::{DocumentLimit, EngineArgs, SamplingArgs};
use anyhow::{Context, Result};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Subcommand, ValueEnum};
use prism::bench::sweep::{self, Machine, Metric, Pending, Row};
use prism::bench::{charts, report};
use prism::engine::sampling::SamplingConfig;
use prism::engine::{Engine, GenerateOptions, LoadOptions};
use prism::methods::llm::EngineLlm;
use prism::methods::run::Outcome;
use prism::methods::MethodSpec;
use prism::quality::coherence::{score_coherence, CoherenceConfig};
use prism::quality::qa::{score_summary, QaPair};
use prism::rundir::{Checkpoint, RunDir};
use serde::de::IgnoredAny;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

const RESULTS: &str = "results.jsonl";
const RESULTS_CSV: &str = "results.csv";
const REPORT: &str = "report.md";
const RUNS: &str = "runs";

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    sweep: SweepArgs,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Rebuild results.csv, report.md and the charts of a bench directory from its results.jsonl.
    Report {
        /// The bench directory (`--out` of the sweep).
        dir: PathBuf,
    },
}

/// The sweep's flags. The required ones are `Option`s only because
/// `prism bench report` goes without them; clap requires them otherwise.
#[derive(Debug, Args)]
struct SweepArgs {
    /// The document: a UTF-8 text file.
    #[arg(required = true)]
    document: Option<PathBuf>,
    /// Methods, comma-separated: prism-amendments or prism-in-place, each optionally followed by
    /// -no-updates and/or -unconstrained (in that order), or any other `summarize --method`.
    /// A prism name sets --memory, --no-updates and --constrained for its runs.
    #[arg(long, value_delimiter = ',', required = true)]
    methods: Vec<String>,
    /// Chunk sizes in tokens, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    chunk_tokens: Vec<usize>,
    /// The bench directory: runs/<method>-<chunk tokens>/, results.jsonl, results.csv, report.md, *.svg.
    #[arg(long, required = true)]
    out: Option<PathBuf>,
    /// Continue the sweep in --out: finished runs are skipped, a run cut short resumes from its checkpoint.
    #[arg(long)]
    resume: bool,
    /// Read only the first chunks of the document, up to this many tokens in all.
    #[arg(long)]
    first_tokens: Option<usize>,
    #[command(flatten)]
    document_limit: DocumentLimit,
    /// Pause the sweep after this many runs; continue with --resume.
    #[arg(long)]
    stop_after_runs: Option<usize>,
    /// Judge every finished run's summary: coherence (BooookScore), and QA-F1 with --questions.
    /// Scores go into the run's row and coherence.json / qa.json in its directory.
    #[arg(long)]
    quality: bool,
    /// The judge model of --quality.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct")]
    judge_model: String,
    /// Question-answer pairs (as `prism qa generate` writes them) for the QA-F1 of --quality.
    #[arg(long, requires = "quality")]
    questions: Option<PathBuf>,
    #[command(flatten)]
    method_args: MethodArgs,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn run(args: BenchArgs, matches: &ArgMatches) -> Result<()> {
    match args.command {
        Some(BenchCommand::Report { dir }) => regenerate(&dir),
        None => sweep(args.sweep, matches),
    }
}

/// `prism bench report DIR`.
fn regenerate(dir: &Path) -> Result<()> {
    anyhow::ensure!(
        dir.join(RESULTS).is_file(),
        "{}: no {RESULTS} here; is it a bench directory?",
        dir.display()
    );
    let bench = RunDir::create(dir)?;
    let rows: Vec<Row> = bench.read_jsonl(RESULTS)?;
    write_reports(&bench, &rows)?;
    out!("{}", report::markdown(&rows))?;
    Ok(())
}

/// The settings a prism method's bench name fixes: the paper's ablations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PrismVariant {
    memory: MemoryArg,
    updates: bool,
    constrained: bool,
}

/// A method as `--methods` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BenchMethod {
    name: String,
    method: MethodName,
    /// Set for prism, whose variants are told apart by name.
    prism: Option<PrismVariant>,
}

impl BenchMethod {
    /// Parse one `--methods` name; an unknown one is an error listing every valid name.
    fn parse(name: &str) -> Result<Self, String> {
        if let Some(prism) = prism_variant(name) {
            return Ok(BenchMethod {
                name: name.to_string(),
                method: MethodName::Prism,
                prism: Some(prism),
            });
        }
        match MethodName::from_str(name, true) {
            Ok(method) if method != MethodName::Prism => Ok(BenchMethod {
                name: name.to_ascii_lowercase(),
                method,
                prism: None,
            }),
            _ => Err(format!(
                "unknown method `{name}`; valid names: {}",
                valid_names().join(", ")
            )),
        }
    }

    /// `base` with the settings this name fixes.
    fn args(&self, base: &MethodArgs) -> MethodArgs {
        let mut args = base.clone();
        if let Some(prism) = self.prism {
            args.memory = prism.memory;
            args.no_updates = !prism.updates;
            args.constrained = if prism.constrained {
                OnOff::On
            } else {
                OnOff::Off
            };
        }
        args
    }
}

/// `prism-{amendments,in-place}[-no-updates][-unconstrained]`, the names
/// `stats.json` labels prism's runs with.
fn prism_variant(name: &str) -> Option<PrismVariant> {
    let rest = name.strip_prefix("prism-")?;
    let (memory, rest) = if let Some(rest) = rest.strip_prefix("amendments") {
        (MemoryArg::Amendments, rest)
    } else {
        (MemoryArg::InPlace, rest.strip_prefix("in-place")?)
    };
    let (updates, rest) = match rest.strip_prefix("-no-updates") {
        Some(rest) => (false, rest),
        None => (true, rest),
    };
    let constrained = match rest {
        "" => true,
        "-unconstrained" => false,
        _ => return None,
    };
    Some(PrismVariant {
        memory,
        updates,
        constrained,
    })
}

/// Every name `--methods` accepts.
fn valid_names() -> Vec<String> {
    let mut names = Vec::new();
    for memory in ["amendments", "in-place"] {
        for ablation in [
            "",
            "-no-updates",
            "-unconstrained",
            "-no-updates-unconstrained",
        ] {
            names.push(format!("prism-{memory}{ablation}"));
        }
    }
    names.extend(
        MethodName::value_variants()
            .iter()
            .filter(|method| **method != MethodName::Prism)
            .filter_map(|method| Some(method.to_possible_value()?.get_name().to_string())),
    );
    names
}

/// The flags a prism name decides; giving them too would be silently overridden.
const SET_BY_PRISM_NAMES: [(&str, &str); 3] = [
    ("memory", "--memory"),
    ("no_updates", "--no-updates"),
    ("constrained", "--constrained"),
];

/// One run of the sweep.
struct Planned {
    method: BenchMethod,
    spec: MethodSpec,
    /// The sweep's chunk size for this run (`detail` splits finer from it).
    chunk_tokens: usize,
    /// Index into the split documents (one per chunk size in use).
    document: usize,
    /// `runs/<method>-<chunk tokens>`, relative to the bench directory.
    run_dir: String,
    /// The same under --out.
    path: PathBuf,
}

impl Planned {
    fn job<'a>(
        &'a self,
        documents: &'a [Document],
        sampling: &'a SamplingConfig,
        resume: bool,
    ) -> Job<'a> {
        Job {
            spec: &self.spec,
            document: &documents[self.document],
            sampling,
            out: &self.path,
            resume,
            stop_after: None,
        }
    }
}

fn sweep(args: SweepArgs, matches: &ArgMatches) -> Result<()> {
    let document_path = args
        .document
        .as_deref()
        .expect("clap requires DOCUMENT without a subcommand");
    let out = args
        .out
        .as_deref()
        .expect("clap requires --out without a subcommand");
    let methods = parse_methods(&args.methods)?;
    if methods.iter().any(|method| method.prism.is_some()) {
        for (id, flag) in SET_BY_PRISM_NAMES {
            anyhow::ensure!(
                matches.value_source(id) != Some(ValueSource::CommandLine),
                "{flag} is set by each prism method's name in bench (e.g. prism-in-place-no-updates-unconstrained); leave it out"
            );
        }
    }
    let chunk_sizes = distinct(&args.chunk_tokens, "--chunk-tokens")?;
    let specs = methods
        .iter()
        .map(|method| method.args(&args.method_args).spec(method.method))
        .collect::<Result<Vec<_>>>()?;
    let sampling = args.sampling.config(SamplingConfig::for_summaries())?;

    let is_nonempty_dir = std::fs::read_dir(out).is_ok_and(|mut entries| entries.next().is_some());
    anyhow::ensure!(
        args.resume || !is_nonempty_dir,
        "{} is not empty; pass --resume to continue the sweep in it, or choose another --out",
        out.display()
    );
    let questions = args
        .questions
        .as_deref()
        .map(prism::quality::qa::read_pairs)
        .transpose()?;
    let mut judge: Option<Engine> = None;
    let text = args.document_limit.read(document_path)?;
    let mut engine = args.engine.load()?;
    let document_tokens = Document::count(&engine, document_path, &text)?;
    // One split per chunk size actually used: `detail` picks its own from --detail.
    let mut documents: Vec<Document> = Vec::new();
    let bench = RunDir::create(out)?;
    let mut rows: Vec<Row> = bench.read_jsonl(RESULTS)?;
    write_reports(&bench, &rows)?;

    // Chunk size by chunk size, so a paused sweep has whole tables.
    let mut plan = Vec::new();
    for &chunk_tokens in &chunk_sizes {
        for (method, spec) in methods.iter().zip(&specs) {
            let size = spec.chunk_tokens(chunk_tokens, document_tokens)?;
            let document = match documents.iter().position(|d| d.chunk_tokens == size) {
                Some(index) => index,
                None => {
                    documents.push(Document::split(
                        &engine,
                        &text,
                        document_tokens,
                        size,
                        args.first_tokens,
                    )?);
                    documents.len() - 1
                }
            };
            let name = format!("{}-{chunk_tokens}", method.name);
            plan.push(Planned {
                method: method.clone(),
                spec: spec.clone(),
                chunk_tokens,
                document,
                run_dir: format!("{RUNS}/{name}"),
                path: out.join(RUNS).join(name),
            });
        }
    }
    let context = SweepContext::new(document_path, &engine);
    let job = |planned| Planned::job(planned, &documents, &sampling, args.resume);
    let mut pending = Vec::new();
    for planned in &plan {
        let fingerprint = job(planned).fingerprint(&engine.identity());
        if let Some(index) = finished(&rows, planned, out) {
            let row = &rows[index];
            anyhow::ensure!(
                row.fingerprint == fingerprint,
                "{}: finished with other settings than this sweep's; choose another --out",
                out.join(&row.run_dir).display()
            );
        } else {
            pending.push(planned);
        }
    }
    eprintln!(
        "{}: {} tokens; {} run{} to do ({} already finished){}",
        document_path.display(),
        documents[0].tokens,
        pending.len(),
        if pending.len() == 1 { "" } else { "s" },
        plan.len() - pending.len(),
        estimate_note(&rows, &pending, &documents),
    );

    if args.quality {
        // Runs finished by an earlier session without --quality are judged now,
        // so a sweep can be scored after the fact without redoing it.
        let unjudged = plan
            .iter()
            .filter_map(|planned| finished(&rows, planned, out))
            .filter(|&index| !is_judged(&rows[index], questions.is_some()))
            .collect::<Vec<_>>();
        for index in unjudged {
            let judge = loaded_judge(&mut judge, &args)?;
            let run_dir = out.join(&rows[index].run_dir);
            eprintln!("judging {}", run_dir.display());
            judge_summary(
                judge,
                &run_dir,
                questions.as_deref(),
                &mut rows[index].stats,
            )?;
            bench.rewrite_jsonl(RESULTS, &rows)?;
            write_reports(&bench, &rows)?;
        }
    }

    let mut bar = Bar::new(String::new());
    for (index, planned) in pending.iter().enumerate() {
        if args.stop_after_runs.is_some_and(|limit| index >= limit) {
            bar.bar.finish_and_clear();
            eprintln!(
                "{}: paused after {index} runs; continue with --resume",
                out.display()
            );
            out!("{}", report::markdown(&rows))?;
            return Ok(());
        }
        let position = plan.len() - pending.len() + index + 1;
        bar.set_prefix(format!(
            "{} @{} [run {position}/{}] ",
            planned.method.name,
            planned.chunk_tokens,
            plan.len()
        ));
        // Each run starts cold, as it would on a freshly loaded engine.
        engine.clear_cache();
        let job = job(planned);
        let outcome = job.run(&mut engine, &mut bar)?;
        let Outcome::Finished { stats, .. } = outcome else {
            anyhow::bail!("{}: stopped before finishing", job.out.display());
        };
        let stats = serde_json::from_value(serde_json::to_value(&stats)?)?;
        let mut stats = Row::stats_from_json(stats);
        if args.quality {
            let judge = loaded_judge(&mut judge, &args)?;
            bar.set_prefix(format!("judging {} ", planned.method.name));
            judge_summary(judge, job.out, questions.as_deref(), &mut stats)?;
        }
        let row = context.row(
            planned,
            &documents[planned.document],
            job.fingerprint(&engine.identity()),
            stats,
        );
        bench.append_jsonl(RESULTS, &row)?;
        rows.push(row);
        write_reports(&bench, &rows)?;
        let last = rows.last().expect("a row was just added");
        bar.bar.suspend(|| {
            eprintln!(
                "{}: cache hit {:.1}%, net {} tokens, output {}, cost index {:.4}, {:.0}s{}",
                job.out.display(),
                last.metric(Metric::CacheHit).unwrap_or(0.0),
                last.number("net_tokens").unwrap_or(0.0),
                last.number("output_tokens").unwrap_or(0.0),
                last.metric(Metric::CostIndex).unwrap_or(0.0),
                last.number("wall_seconds").unwrap_or(0.0),
                estimate_note(&rows, &pending[index + 1..], &documents),
            )
        });
    }
    bar.bar.finish_and_clear();
    eprintln!("{}: sweep finished; report in {REPORT}", out.display());
    out!("{}", report::markdown(&rows))?;
    Ok(())
}

fn parse_methods(names: &[String]) -> Result<Vec<BenchMethod>> {
    let methods = names
        .iter()
        .map(|name| BenchMethod::parse(name.trim()))
        .collect::<Result<Vec<_>, String>>()
        .map_err(anyhow::Error::msg)?;
    distinct(
        &methods.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
        "--methods",
    )?;
    Ok(methods)
}

/// `values`, refusing an empty list or one with repeats.
fn distinct<T: PartialEq + Clone + std::fmt::Display>(values: &[T], flag: &str) -> Result<Vec<T>> {
    anyhow::ensure!(!values.is_empty(), "{flag} lists nothing");
    for (index, value) in values.iter().enumerate() {
        anyhow::ensure!(
            !values[..index].contains(value),
            "{flag} lists {value} twice"
        );
    }
    Ok(values.to_vec())
}

/// The index of `planned`'s row if it has one and its run directory its stats.json.
fn finished(rows: &[Row], planned: &Planned, out: &Path) -> Option<usize> {
    let index = rows
        .iter()
        .rposition(|row| row.run_dir == planned.run_dir)?;
    out.join(&rows[index].run_dir)
        .join(RunDir::STATS)
        .is_file()
        .then_some(index)
}

/// Whether `row` holds the scores --quality adds (QA-F1 only when questions
/// are given this time).
fn is_judged(row: &Row, with_questions: bool) -> bool {
    let has = |key: &str| row.stats.contains_key(key);
    (has("coherence") || has("coherence_error")) && (!with_questions || has("qa_f1"))
}

/// A rough estimate of the `pending` runs' time, as a suffix for a progress line.
fn estimate_note(rows: &[Row], pending: &[&Planned], documents: &[Document]) -> String {
    if pending.is_empty() {
        return String::new();
    }
    let pending: Vec<Pending> = pending
        .iter()
        .map(|planned| {
            let chunks = &documents[planned.document].chunks;
            Pending {
                method: planned.method.name.clone(),
                chunk_tokens: planned.chunk_tokens,
                read_tokens: chunks.iter().map(|chunk| chunk.tokens).sum(),
                chunks: chunks.len(),
                steps_done: steps_done(&planned.path),
            }
        })
        .collect();
    let forecast = sweep::estimate(rows, &pending);
    let unpaced = forecast.unpaced_methods.join(", ");
    match (forecast.unpaced_methods.is_empty(), forecast.seconds > 0.0) {
        (true, _) => format!(
            "; the rest may take roughly {} (paced by the finished runs)",
            duration(forecast.seconds)
        ),
        (false, true) => format!(
            "; the rest may take roughly {} plus the runs of {unpaced}, \
             which get an estimate after their first finished run",
            duration(forecast.seconds)
        ),
        (false, false) => {
            "; a rough time estimate follows each method's first finished run".to_string()
        }
    }
}

/// Steps an earlier session of the run in `run_dir` completed, for the time
/// estimate only: 0 when it has no checkpoint or one that cannot be read (the
/// run itself reports that when it starts).
fn steps_done(run_dir: &Path) -> usize {
    std::fs::read(run_dir.join(RunDir::CHECKPOINT))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Checkpoint<IgnoredAny>>(&bytes).ok())
        .map_or(0, |checkpoint| checkpoint.completed_steps)
}

fn duration(seconds: f64) -> String {
    let minutes = (seconds / 60.0).round() as u64;
    match minutes {
        0 => format!("{seconds:.0}s"),
        1..=119 => format!("{minutes} min"),
        _ => format!("{:.1} h", seconds / 3600.0),
    }
}

/// What every row of this session shares.
struct SweepContext {
    model: String,
    document: String,
    device: String,
    machine: Machine,
    git_revision: String,
    git_dirty: Option<bool>,
    command: String,
}

impl SweepContext {
    fn new(document: &Path, engine: &prism::engine::Engine) -> Self {
        let (git_revision, git_dirty) = git_state();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        SweepContext {
            model: engine.name().to_string(),
            document: document.file_name().map_or_else(
                || document.display().to_string(),
                |name| name.to_string_lossy().into_owned(),
            ),
            device: serde_json::to_value(engine.identity().device)
                .ok()
                .and_then(|value| value.as_str().map(str::to_string))
                .unwrap_or_default(),
            machine: Machine::from_proc(
                std::fs::read_to_string("/proc/cpuinfo").ok().as_deref(),
                std::fs::read_to_string("/proc/meminfo").ok().as_deref(),
                threads,
                prism::engine::device::default_threads(),
            ),
            git_revision,
            git_dirty,
            command: command_line(),
        }
    }

    fn row(
        &self,
        planned: &Planned,
        document: &Document,
        fingerprint: String,
        stats: serde_json::Map<String, serde_json::Value>,
    ) -> Row {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        Row {
            method: planned.method.name.clone(),
            chunk_tokens: planned.chunk_tokens,
            model: self.model.clone(),
            document: self.document.clone(),
            document_sha256: document.sha256.clone(),
            document_tokens: document.tokens,
            read_tokens: document.chunks.iter().map(|chunk| chunk.tokens).sum(),
            device: self.device.clone(),
            machine: self.machine.clone(),
            git_revision: self.git_revision.clone(),
            git_dirty: self.git_dirty,
            date: sweep::utc_timestamp(now),
            command: self.command.clone(),
            run_dir: planned.run_dir.clone(),
            fingerprint,
            stats,
        }
    }
}

/// The judge of `--quality`, loaded the first time it is needed.
fn loaded_judge<'a>(judge: &'a mut Option<Engine>, args: &SweepArgs) -> Result<&'a mut Engine> {
    match judge {
        Some(judge) => Ok(judge),
        None => Ok(judge.insert(load_judge(args)?)),
    }
}

/// The judge of `--quality`, on the sweep's device.
fn load_judge(args: &SweepArgs) -> Result<Engine> {
    let source = prism::engine::source::resolve(&args.judge_model)?;
    let options = LoadOptions {
        device: args.engine.device,
        prefill_weights: None,
    };
    Engine::load(&source, &options).with_context(|| format!("loading judge {}", args.judge_model))
}

/// Score the summary in `run_dir` with `judge` and add the scores to `stats`:
/// `coherence` and `coherence_unparsed`, and `qa_f1` when `questions` are
/// given. A summary the judge cannot score (no sentences) is recorded as
/// `coherence_error`, so one odd run does not stop the sweep.
fn judge_summary(
    judge: &mut Engine,
    run_dir: &Path,
    questions: Option<&[QaPair]>,
    stats: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let dir = RunDir::create(run_dir)?;
    let summary_path = dir.file(RunDir::SUMMARY)?;
    let summary = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    judge.clear_cache();
    let mut llm = EngineLlm::new(judge, GenerateOptions::default());
    let config = CoherenceConfig { constrained: true };
    match score_coherence(&mut llm, &summary, &config, &mut |_, _| {}) {
        Ok(report) => {
            stats.insert("coherence".into(), report.score.into());
            stats.insert("coherence_unparsed".into(), report.unparsed.into());
            dir.write_json("coherence.json", &report)?;
        }
        Err(err) => {
            stats.insert("coherence_error".into(), err.to_string().into());
        }
    }
    if let Some(questions) = questions {
        let score = score_summary(&mut llm, &summary, questions)?;
        stats.insert("qa_f1".into(), score.correct_f1.into());
        dir.write_json("qa.json", &score)?;
    }
    Ok(())
}

/// The short revision of prism's source tree and whether it has uncommitted
/// changes: ("unknown", None) when git or the tree is not there.
fn git_state() -> (String, Option<bool>) {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(revision) if !revision.is_empty() => {
            // Committed results change while a sweep runs; they are not the source.
            let dirty = git(&[
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)results",
            ])
            .map(|status| !status.is_empty());
            (revision, dirty)
        }
        _ => ("unknown".to_string(), None),
    }
}

/// This process's command line as a shell would take it back.
fn command_line() -> String {
    let quote = |arg: String| {
        let plain = !arg.is_empty()
            && arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./,=:@+%".contains(c));
        if plain {
            arg
        } else {
            format!("'{}'", arg.replace('\'', r"'\''"))
        }
    };
    std::iter::once("prism".to_string())
        .chain(std::env::args().skip(1).map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Rebuild results.csv, report.md and the charts from `rows`.
fn write_reports(bench: &RunDir, rows: &[Row]) -> Result<()> {
    bench.write_text(RESULTS_CSV, &sweep::csv(rows))?;
    bench.write_text(REPORT, &report::markdown(rows))?;
    for metric in Metric::ALL {
        let chart = charts::svg(metric, &sweep::series(rows, metric))?;
        bench
            .write_text(metric.chart_file(), &chart)
            .with_context(|| format!("writing {}", metric.chart_file()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prism_names_fix_memory_updates_and_constraint() {
        let method = BenchMethod::parse("prism-in-place-no-updates-unconstrained").unwrap();
        assert_eq!(method.method, MethodName::Prism);
        assert_eq!(
            method.prism,
            Some(PrismVariant {
                memory: MemoryArg::InPlace,
                updates: false,
                constrained: false
            })
        );
        let amendments = BenchMethod::parse("prism-amendments")
            .unwrap()
            .prism
            .unwrap();
        assert_eq!(amendments.memory, MemoryArg::Amendments);
        assert!(amendments.updates && amendments.constrained);
        let unconstrained = BenchMethod::parse("prism-amendments-unconstrained")
            .unwrap()
            .prism
            .unwrap();
        assert!(unconstrained.updates && !unconstrained.constrained);
    }

    #[test]
    fn every_valid_name_parses_to_itself() {
        for name in valid_names() {
            let method = BenchMethod::parse(&name).unwrap();
            assert_eq!(method.name, name);
        }
    }

    #[test]
    fn other_methods_parse_through_their_value_enum() {
        for method in MethodName::value_variants() {
            if *method == MethodName::Prism {
                continue;
            }
            let name = method.to_possible_value().unwrap().get_name().to_string();
            let parsed = BenchMethod::parse(&name.to_uppercase()).unwrap();
            assert_eq!(
                (parsed.method, parsed.name, parsed.prism),
                (*method, name, None)
            );
        }
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        for bad in [
            "prism",
            "prism-amendments-unconstrained-no-updates",
            "prism-inplace",
            "prism-amendments-",
            "nonsense",
        ] {
            let err = BenchMethod::parse(bad).unwrap_err();
            assert!(err.starts_with(&format!("unknown method `{bad}`; valid names: ")));
            assert!(err.contains("prism-amendments, prism-amendments-no-updates"));
            assert!(err.contains("prism-in-place-no-updates-unconstrained"));
        }
    }

    #[test]
    fn names_override_the_shared_prism_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            method_args: MethodArgs,
        }
        let base = Flags::parse_from(["x"]).method_args;
        let args = BenchMethod::parse("prism-in-place-no-updates-unconstrained")
            .unwrap()
            .args(&base);
        assert_eq!(args.memory, MemoryArg::InPlace);
        assert!(args.no_updates);
        assert_eq!(args.constrained, OnOff::Off);
        assert_eq!(args.query, base.query);
    }

    #[test]
    fn repeated_values_are_refused() {
        assert!(distinct(&[500, 1000], "--chunk-tokens").is_ok());
        let err = distinct(&[500, 500], "--chunk-tokens").unwrap_err();
        assert_eq!(err.to_string(), "--chunk-tokens lists 500 twice");
        assert!(distinct::<usize>(&[], "--chunk-tokens").is_err());
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(20.0), "20s");
        assert_eq!(duration(600.0), "10 min");
        assert_eq!(duration(3.0 * 3600.0), "3.0 h");
    }
}
