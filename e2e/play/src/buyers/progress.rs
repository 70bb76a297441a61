//! What the run shows while it plays: on a terminal a progress bar with the
//! live counts, otherwise a plain status line every few seconds; and the
//! caller's own lines, printed so they do not tear the bar.

use std::{
    fmt::Display,
    io::IsTerminal,
    sync::Arc,
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::tally::{Counters, Tally};

/// How often the bar is redrawn.
const BAR_EVERY: Duration = Duration::from_millis(250);
/// How often a plain status line is printed when there is no terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// The run's display on standard error; cheap to clone and usable from
/// any task.
#[derive(Clone)]
pub struct Progress(Arc<Inner>);

struct Inner {
    mode: Mode,
    started: Instant,
    expected: Duration,
}

enum Mode {
    Bar(ProgressBar),
    Plain(Duration),
    Hidden,
}

impl Progress {
    /// A display for a run expected to last `expected`: a bar when
    /// standard error is a terminal, else plain lines every 5 s.
    pub fn new(expected: Duration) -> Self {
        if std::io::stderr().is_terminal() {
            Self::bar(expected)
        } else {
            Self::plain(expected, PLAIN_EVERY)
        }
    }

    /// Plain lines, a status line every `every`.
    pub fn plain(expected: Duration, every: Duration) -> Self {
        Self::with(Mode::Plain(every), expected)
    }

    /// Shows nothing (tests).
    pub fn hidden() -> Self {
        Self::with(Mode::Hidden, Duration::ZERO)
    }

    fn bar(expected: Duration) -> Self {
        let bar = ProgressBar::with_draw_target(
            Some(expected.as_millis() as u64),
            ProgressDrawTarget::stderr(),
        );
        let template = if expected.is_zero() {
            "{spinner} {elapsed_precise} {msg}"
        } else {
            "{spinner} {elapsed_precise}/{prefix} [{bar:24}] {msg}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(clock(expected));
        Self::with(Mode::Bar(bar), expected)
    }

    fn with(mode: Mode, expected: Duration) -> Self {
        Self(Arc::new(Inner {
            mode,
            started: Instant::now(),
            expected,
        }))
    }

    /// Time since the display was made.
    pub fn elapsed(&self) -> Duration {
        self.0.started.elapsed()
    }

    /// Prints `msg` on a line of its own, above the bar when there is one.
    pub fn line(&self, msg: impl Display) {
        match &self.0.mode {
            Mode::Bar(bar) if !bar.is_finished() => bar.println(msg.to_string()),
            Mode::Hidden => {}
            _ => eprintln!("{msg}"),
        }
    }

    /// Shows `tally`: redraws the bar, or prints a status line.
    pub fn show(&self, tally: &Tally) {
        let elapsed = self.elapsed();
        match &self.0.mode {
            Mode::Bar(bar) => {
                bar.set_position(elapsed.min(self.0.expected).as_millis() as u64);
                bar.set_message(summary(tally));
            }
            Mode::Plain(_) => eprintln!(
                "[{}/{}] {}",
                clock(elapsed),
                clock(self.0.expected),
                summary(tally)
            ),
            Mode::Hidden => {}
        }
    }

    /// Removes the bar, leaving the final counts as a line.
    pub fn finish(&self, tally: &Tally) {
        if let Mode::Bar(bar) = &self.0.mode {
            bar.finish_and_clear();
        }
        self.line(format!(
            "[{}] buyers done: {}",
            clock(self.elapsed()),
            summary(tally)
        ));
    }

    /// Shows `counters` until the returned guard is dropped.
    pub(crate) fn follow(&self, counters: Counters) -> Following {
        let every = match self.0.mode {
            Mode::Bar(_) => BAR_EVERY,
            Mode::Plain(every) => every,
            Mode::Hidden => return Following(None),
        };
        let progress = self.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is immediate: nothing has happened yet.
            tick.tick().await;
            loop {
                tick.tick().await;
                progress.show(&counters.tally());
            }
        });
        Following(Some(task))
    }
}

/// Stops following the counters when dropped.
pub(crate) struct Following(Option<tokio::task::JoinHandle<()>>);

impl Drop for Following {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// The live counts on one line.
pub fn summary(tally: &Tally) -> String {
    format!(
        "active {} · arrived {} · queued {} · admitted {} · rate-limited {} · acknowledged {} · paid {} · errors {}",
        tally.active,
        tally.arrived,
        tally.queued,
        tally.admitted,
        tally.rate_limited,
        tally.acknowledged,
        tally.paid,
        tally.errors()
    )
}

/// `m:ss` (or `h:mm:ss`).
fn clock(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_every_live_count() {
        let tally = Tally {
            active: 3,
            arrived: 5,
            queued: 2,
            admitted: 1,
            rate_limited: 4,
            acknowledged: 6,
            paid: 4,
            transport_errors: 1,
            ..Tally::default()
        };
        assert_eq!(
            summary(&tally),
            "active 3 · arrived 5 · queued 2 · admitted 1 · rate-limited 4 · acknowledged 6 · paid 4 · errors 1"
        );
    }

    #[test]
    fn clocks_read_minutes_and_hours() {
        assert_eq!(clock(Duration::from_secs(65)), "1:05");
        assert_eq!(clock(Duration::from_secs(3725)), "1:02:05");
    }
}
