//! The progress bar runs and sweeps draw on stderr (hidden with `--quiet`).

use indicatif::{ProgressBar, ProgressStyle};
use prism::bench::sweep::SweepProgress;
use prism::metrics::Figures;
use prism::run::{Position, Progress};

/// A progress bar on stderr: the stage, steps done, cache hit rate so far, ETA.
pub struct Bar {
    pub bar: ProgressBar,
    /// Shown before the stage, e.g. the method and chunk size within a sweep.
    prefix: String,
}

impl Bar {
    pub fn new(prefix: String) -> Self {
        let bar = if super::is_quiet() {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(0)
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {pos}/{len} [{bar:30}] {msg} elapsed {elapsed} eta {eta}",
            )
            .expect("a valid progress template")
            .progress_chars("=> "),
        );
        Bar { bar, prefix }
    }

    /// Show `prefix` before the stage from now on.
    pub fn set_prefix(&mut self, prefix: String) {
        self.prefix = prefix;
    }

    fn show(&self, position: &Position, figures: Option<&Figures>) {
        self.bar.set_length(position.total as u64);
        self.bar.set_position(position.done as u64);
        let hit = figures.map_or(String::new(), |figures| {
            format!(", cache hit {:.1}%", 100.0 * figures.cache_hit_rate)
        });
        self.bar
            .set_message(format!("{}{}{hit}", self.prefix, position.stage));
    }
}

impl Progress for Bar {
    fn begin(&mut self, position: &Position) {
        self.show(position, None);
        self.bar.reset_eta();
    }

    fn step_done(&mut self, position: &Position, figures: &Figures) {
        self.show(position, Some(figures));
    }
}

impl SweepProgress for Bar {
    fn run_begins(&mut self, label: &str) {
        self.set_prefix(label.to_string());
    }

    fn note(&mut self, line: &str) {
        self.bar.suspend(|| note!("{line}"));
    }
}
