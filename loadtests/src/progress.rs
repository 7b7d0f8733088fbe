//! A progress bar for long runs. `indicatif` draws nothing when stderr is not a terminal, so
//! logs and CI output stay clean without a flag.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

/// Finished requests of one scenario, with its label.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
    failed: Arc<AtomicU64>,
}

impl Progress {
    /// A bar over `total` requests (a spinner with a count when the run is bounded by time).
    pub fn new(label: &str, total: Option<usize>) -> Self {
        let bar = match total {
            Some(n) => {
                let bar = ProgressBar::new(n as u64);
                if let Ok(style) = ProgressStyle::with_template(
                    "{prefix:>24} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}",
                ) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar
            }
            None => {
                let bar = ProgressBar::new_spinner();
                if let Ok(style) = ProgressStyle::with_template(
                    "{prefix:>24} {spinner} {pos} done {elapsed_precise} {msg}",
                ) {
                    bar.set_style(style);
                }
                bar
            }
        };
        bar.set_prefix(label.to_owned());
        Self::of(bar)
    }

    fn of(bar: ProgressBar) -> Self {
        Self {
            bar,
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Draws nothing (tests, `--json` pipelines).
    pub fn hidden() -> Self {
        Self::of(ProgressBar::hidden())
    }

    /// One more request finished; `failed` ones are counted in the message.
    pub fn finished(&self, ok: bool) {
        self.bar.inc(1);
        if !ok {
            let failed = self.failed.fetch_add(1, Ordering::Relaxed) + 1;
            self.bar.set_message(format!("{failed} failed"));
        }
    }

    pub fn done(&self) {
        self.bar.finish_and_clear();
    }
}
