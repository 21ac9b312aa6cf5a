//! Rough time estimates for a sweep's runs still to do, paced by those done.

use super::plan::Planned;
use crate::bench::results::{self, Pending, Row};
use crate::job::Document;
use crate::run::dir::{Checkpoint, RunDir};
use serde::de::IgnoredAny;
use std::path::Path;

/// How many runs are left and how many were finished before, with a
/// rough time estimate for the rest.
pub(super) fn runs_to_do_note(
    rows: &[Row],
    plan: &[Planned],
    pending: &[&Planned],
    documents: &[Document],
    concurrency: usize,
) -> String {
    format!(
        "{} run{} to do ({} already finished){}",
        pending.len(),
        if pending.len() == 1 { "" } else { "s" },
        plan.len() - pending.len(),
        estimate_note(rows, pending, documents, concurrency),
    )
}

/// A rough estimate of the `pending` runs' time, as a suffix for a progress
/// line. With `concurrency` runs in flight, the rest takes about the sum of their
/// times divided by it, as each run's own time already includes the wait for
/// a shared server.
pub(super) fn estimate_note(
    rows: &[Row],
    pending: &[&Planned],
    documents: &[Document],
    concurrency: usize,
) -> String {
    if pending.is_empty() {
        return String::new();
    }
    let in_flight = concurrency.clamp(1, pending.len()) as f64;
    let pending: Vec<Pending> = pending
        .iter()
        .map(|planned| {
            let chunks = &documents[planned.document].chunks;
            Pending {
                method: planned.method.name.clone(),
                chunk_tokens: planned.chunk_tokens,
                read_tokens: documents[planned.document].read_tokens,
                chunks: chunks.len(),
                steps_done: steps_done(&planned.path),
            }
        })
        .collect();
    let forecast = results::estimate(rows, &pending);
    let seconds = forecast.seconds / in_flight;
    let unpaced = forecast.unpaced_methods.join(", ");
    match (forecast.unpaced_methods.is_empty(), forecast.seconds > 0.0) {
        (true, _) => format!(
            "; the rest may take roughly {} (paced by the finished runs)",
            duration(seconds)
        ),
        (false, true) => format!(
            "; the rest may take roughly {} plus the runs of {unpaced}, \
             which get an estimate after their first finished run",
            duration(seconds)
        ),
        (false, false) => {
            "; a rough time estimate follows each method's first finished run".to_string()
        }
    }
}

/// Steps an earlier session of the run in `run_dir` completed, for the time
/// estimate only: 0 when it has no checkpoint or one that cannot be read (the
/// run itself reports that when it starts).
pub(super) fn steps_done(run_dir: &Path) -> usize {
    std::fs::read(run_dir.join(RunDir::CHECKPOINT))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Checkpoint<IgnoredAny>>(&bytes).ok())
        .map_or(0, |checkpoint| checkpoint.completed_steps)
}

pub(super) fn duration(seconds: f64) -> String {
    let minutes = (seconds / 60.0).round() as u64;
    match minutes {
        0 => format!("{seconds:.0}s"),
        1..=119 => format!("{minutes} min"),
        _ => format!("{:.1} h", seconds / 3600.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(20.0), "20s");
        assert_eq!(duration(600.0), "10 min");
        assert_eq!(duration(3.0 * 3600.0), "3.0 h");
    }
}
