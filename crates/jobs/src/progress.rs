//! Progress of a long pass (a prune of a large backlog, a reconcile of many
//! unknown outcomes): a log line at most every `--progress-every` with the
//! rows done, the rate and the time left, and, for a person running
//! `payments-jobs` at a terminal, a progress bar on stderr.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How a pass reports its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressSettings {
    /// A progress line at most this often; the first one this long after
    /// the pass started (`0s`: after every batch).
    pub every: Duration,
    /// Also draw a bar on stderr (set only when stderr is a terminal and
    /// the logs are text).
    pub bar: bool,
}

impl Default for ProgressSettings {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(5),
            bar: false,
        }
    }
}

/// One pass's progress.
#[derive(Debug)]
pub(crate) struct Progress {
    job: &'static str,
    settings: ProgressSettings,
    started: Instant,
    last: Instant,
    done: u64,
    /// An estimate: rows may come and go during the pass.
    total: Option<u64>,
    /// The total was asked for and could not be had: do not ask again.
    no_total: bool,
    bar: Option<ProgressBar>,
}

impl Progress {
    pub(crate) fn start(job: &'static str, settings: ProgressSettings) -> Self {
        let now = Instant::now();
        Self {
            job,
            settings,
            started: now,
            last: now,
            done: 0,
            total: None,
            no_total: false,
            bar: None,
        }
    }

    /// Whether the caller should find the total now: it is unknown, and a
    /// report is due or a bar is wanted. Lets a short pass skip the count.
    pub(crate) fn wants_total(&self) -> bool {
        self.total.is_none() && !self.no_total && (self.settings.bar || self.due())
    }

    /// The estimated total (`None`: it could not be had).
    pub(crate) fn set_total(&mut self, total: Option<u64>) {
        let Some(total) = total else {
            self.no_total = true;
            return;
        };
        let total = total.max(self.done);
        self.total = Some(total);
        if self.settings.bar {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = ProgressBar::new(total);
                let style = ProgressStyle::with_template(
                    "{msg} [{bar:40}] {pos}/{len} rows ({percent}%), {eta} left",
                )
                .map(|s| s.progress_chars("=> "));
                bar.set_style(style.unwrap_or_else(|_| ProgressStyle::default_bar()));
                bar.set_message(self.job);
                bar
            });
            bar.set_length(total);
            bar.set_position(self.done);
        }
    }

    /// `done` rows so far (cumulative); a log line when one is due.
    pub(crate) fn update(&mut self, done: u64) {
        self.done = done;
        if let Some(total) = self.total
            && done > total
        {
            self.total = Some(done);
        }
        if let Some(bar) = &self.bar {
            bar.set_length(self.total.unwrap_or(done));
            bar.set_position(done);
        }
        if self.due() {
            self.last = Instant::now();
            match &self.bar {
                Some(bar) => bar.suspend(|| self.log()),
                None => self.log(),
            }
        }
    }

    fn due(&self) -> bool {
        self.last.elapsed() >= self.settings.every
    }

    fn log(&self) {
        let secs = self.started.elapsed().as_secs_f64();
        let per_sec = if secs > 0.0 {
            self.done as f64 / secs
        } else {
            0.0
        };
        let left = self.total.map(|total| total.saturating_sub(self.done));
        let eta = match left {
            Some(left) if per_sec > 0.0 => humantime::format_duration(Duration::from_secs(
                (left as f64 / per_sec).ceil() as u64,
            ))
            .to_string(),
            _ => "unknown".to_owned(),
        };
        tracing::info!(
            job = self.job,
            done = self.done,
            total = self.total,
            rows_per_sec = per_sec.round() as u64,
            eta = %eta,
            "progress"
        );
    }

    /// Clears the bar; the pass logs its own summary.
    pub(crate) fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
