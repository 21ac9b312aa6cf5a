//! `--quality`: the judge model, loaded when first needed, scores each
//! finished summary for coherence and QA-F1.

use super::plan::{finished, Planned};
use super::{write_reports, Judging, SweepProgress, RESULTS};
use crate::bench::results::{Row, Scores};
use crate::engine::{Engine, EngineConfig, GenerateOptions};
use crate::error::{Error, Result};
use crate::llm::Backend;
use crate::models;
use crate::qa::score_summary;
use crate::quality::coherence::{score_coherence, CoherenceConfig};
use crate::run::dir::RunDir;
use std::path::Path;

/// Judge the runs an earlier session finished without `--quality`, so a
/// sweep can be scored after the fact without redoing it.
pub(super) fn judge_earlier_runs(
    bench: &RunDir,
    rows: &mut [Row],
    plan: &[Planned],
    judging: &Judging,
    judge: &mut Option<Backend>,
    progress: &mut dyn SweepProgress,
) -> Result<()> {
    let unjudged = plan
        .iter()
        .filter_map(|planned| finished(rows, planned, bench.path()))
        .filter(|&index| !rows[index].scores.complete(judging.questions.is_some()))
        .collect::<Vec<_>>();
    for index in unjudged {
        let judge = loaded_judge(judge, judging)?;
        let run_dir = bench.path().join(&rows[index].run_dir);
        progress.note(&format!("judging {}", run_dir.display()));
        rows[index].scores = judge_summary(judge, &run_dir, judging)?;
        bench.rewrite_jsonl(RESULTS, rows)?;
        write_reports(bench, rows)?;
    }
    Ok(())
}

/// The judge of `--quality`, loaded on the sweep's device the first time it is needed.
pub(super) fn loaded_judge<'a>(
    judge: &'a mut Option<Backend>,
    judging: &Judging,
) -> Result<&'a mut Backend> {
    match judge {
        Some(judge) => Ok(judge),
        None => {
            let source = models::resolve(&judging.judge_model)?;
            let config = EngineConfig {
                device: judging.device,
                ..EngineConfig::new(source)
            };
            let engine = Engine::open(&config)?;
            Ok(judge.insert(Backend::Local(Box::new(engine))))
        }
    }
}

/// The final answer a finished run wrote.
pub(super) fn read_answer(run_dir: &Path) -> Result<String> {
    let path = run_dir.join(RunDir::SUMMARY);
    std::fs::read_to_string(&path).map_err(|err| Error::io(&path, err))
}

/// Score the summary in `run_dir` with `judge`: coherence, and QA-F1 when
/// `questions` are given; the judges' reports go into the run directory as
/// coherence.json and qa.json. A summary the judge cannot score (no
/// sentences) gets a `coherence_error`, so one odd run does not stop the sweep.
pub(super) fn judge_summary(
    judge: &mut Backend,
    run_dir: &Path,
    judging: &Judging,
) -> Result<Scores> {
    let dir = RunDir::create(run_dir)?;
    let summary = read_answer(run_dir)?;
    judge.clear_cache();
    let mut llm = judge.llm_side_by_side(GenerateOptions::default(), judging.concurrency)?;
    let config = CoherenceConfig { constrained: true };
    let mut scores = Scores::default();
    match score_coherence(&mut *llm, &summary, &config, &mut |_, _| {}) {
        Ok(report) => {
            scores.coherence = Some(report.score);
            scores.coherence_unparsed = Some(report.unparsed);
            dir.write_json("coherence.json", &report)?;
        }
        Err(err) => scores.coherence_error = Some(err.to_string()),
    }
    if let Some(questions) = &judging.questions {
        let score = score_summary(&mut *llm, &summary, questions)?;
        scores.qa_f1 = Some(score.correct_f1);
        dir.write_json("qa.json", &score)?;
    }
    Ok(scores)
}
