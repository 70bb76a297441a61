//! The gradient controller alone, with time passed in: no clock, no locks,
//! no atomics, so it can be driven through minutes of simulated time in a
//! test. See the [parent module](super) for the algorithm.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::Settings;

/// The percentile of a window's (or a probe's) samples taken as its RTT.
const PERCENTILE: f64 = 0.5;
/// Fewest samples a window needs before it may move the limit: the median
/// of a handful is noise.
const MIN_WINDOW_SAMPLES: usize = 10;
/// The gradient's bounds: the limit at most halves or doubles per window.
const MIN_GRADIENT: f64 = 0.5;
const MAX_GRADIENT: f64 = 2.0;
/// Each probe interval is drawn from `interval × (1 ± this)`.
const PROBE_JITTER: f64 = 0.1;
/// Windows in a row at `min_limit` that start a probe before its time.
const WINDOWS_AT_MIN_BEFORE_PROBE: u32 = 5;

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Measuring the min RTT at `min_limit`; `resume_limit` comes back after.
    Probing { resume_limit: usize },
    /// Windows of samples move the limit until `next_probe`.
    Sampling {
        window_start: Instant,
        next_probe: Instant,
    },
}

/// The gradient concurrency controller: feed it every finished request with
/// [`record`](Self::record) and read the [`limit`](Self::limit).
#[derive(Debug)]
pub struct Gradient {
    settings: Settings,
    limit: usize,
    phase: Phase,
    /// When the latest probe began: requests started earlier ran at the
    /// pre-probe concurrency, so their latency is not a sample.
    epoch: Instant,
    /// The current window's (or probe's) samples.
    samples: Vec<Duration>,
    min_rtt: Option<Duration>,
    sample_rtt: Option<Duration>,
    windows_at_min: u32,
    rng: StdRng,
}

impl Gradient {
    /// A controller that starts probing at `now` (no baseline yet); `seed`
    /// drives the probe-interval jitter. `settings` are made consistent as
    /// each field of [`Settings`] describes.
    pub fn new(settings: Settings, now: Instant, seed: u64) -> Self {
        let settings = settings.sanitized();
        Self {
            limit: settings.min_limit,
            phase: Phase::Probing {
                resume_limit: settings.initial_limit,
            },
            epoch: now,
            samples: Vec::with_capacity(settings.probe_samples.max(MIN_WINDOW_SAMPLES)),
            min_rtt: None,
            sample_rtt: None,
            windows_at_min: 0,
            rng: StdRng::seed_from_u64(seed),
            settings,
        }
    }

    /// The concurrency limit now (`min_limit` while probing).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The latest probe's measurement; `None` until the first probe ends.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    /// The latest window's RTT; `None` until the first window ends.
    pub fn sample_rtt(&self) -> Option<Duration> {
        self.sample_rtt
    }

    /// Whether a min-RTT probe is under way.
    pub fn is_probing(&self) -> bool {
        matches!(self.phase, Phase::Probing { .. })
    }

    /// When the next probe is due (it starts with the first sample after
    /// that); `None` while probing.
    pub fn next_probe(&self) -> Option<Instant> {
        match self.phase {
            Phase::Probing { .. } => None,
            Phase::Sampling { next_probe, .. } => Some(next_probe),
        }
    }

    /// One request that started at `started` finished normally at
    /// `finished`. Calls should come in order of `finished`; the small
    /// reorderings of threads racing for a lock do no harm.
    pub fn record(&mut self, started: Instant, finished: Instant) {
        if started < self.epoch {
            return;
        }
        let rtt = finished.saturating_duration_since(started);
        match self.phase {
            Phase::Probing { resume_limit } => {
                self.samples.push(rtt);
                if self.samples.len() >= self.settings.probe_samples {
                    self.min_rtt = Some(percentile(&mut self.samples));
                    self.samples.clear();
                    self.limit = resume_limit;
                    self.phase = Phase::Sampling {
                        window_start: finished,
                        next_probe: finished + self.jittered_interval(),
                    };
                }
            }
            Phase::Sampling {
                window_start,
                next_probe,
            } => {
                if finished >= next_probe {
                    // This request started before the probe: not a sample.
                    self.start_probe(finished);
                    return;
                }
                self.samples.push(rtt);
                if finished.saturating_duration_since(window_start) >= self.settings.sample_window
                    && self.samples.len() >= MIN_WINDOW_SAMPLES
                {
                    self.end_window(finished, next_probe);
                }
            }
        }
    }

    /// Takes the window's RTT and moves the limit by the gradient.
    fn end_window(&mut self, now: Instant, next_probe: Instant) {
        let sample_rtt = percentile(&mut self.samples);
        self.samples.clear();
        self.sample_rtt = Some(sample_rtt);
        if let Some(min_rtt) = self.min_rtt {
            self.limit = self.next_limit(min_rtt, sample_rtt);
        }
        if self.limit == self.settings.min_limit {
            self.windows_at_min += 1;
        } else {
            self.windows_at_min = 0;
        }
        if self.windows_at_min >= WINDOWS_AT_MIN_BEFORE_PROBE {
            self.start_probe(now);
        } else {
            self.phase = Phase::Sampling {
                window_start: now,
                next_probe,
            };
        }
    }

    /// `clamp(limit × g + sqrt(limit × g))` with
    /// `g = clamp(min_rtt × (1 + buffer) / sample_rtt, 0.5, 2)`.
    fn next_limit(&self, min_rtt: Duration, sample_rtt: Duration) -> usize {
        let target = min_rtt.as_secs_f64() * (1.0 + self.settings.buffer);
        let gradient = if sample_rtt.is_zero() {
            MAX_GRADIENT
        } else {
            (target / sample_rtt.as_secs_f64()).clamp(MIN_GRADIENT, MAX_GRADIENT)
        };
        let scaled = self.limit as f64 * gradient;
        // Float to int casts saturate, and the clamp bounds the result anyway.
        let next = (scaled + scaled.sqrt()).round() as usize;
        next.clamp(self.settings.min_limit, self.settings.max_limit)
    }

    fn start_probe(&mut self, now: Instant) {
        self.phase = Phase::Probing {
            resume_limit: self.limit,
        };
        self.limit = self.settings.min_limit;
        self.epoch = now;
        self.samples.clear();
        self.windows_at_min = 0;
    }

    fn jittered_interval(&mut self) -> Duration {
        let factor = self
            .rng
            .random_range(1.0 - PROBE_JITTER..=1.0 + PROBE_JITTER);
        self.settings.probe_interval.mul_f64(factor)
    }
}

/// The [`PERCENTILE`] of `samples` (nearest rank); zero if there are none.
/// Reorders `samples`.
fn percentile(samples: &mut [Duration]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank: the smallest sample with at least PERCENTILE of them at
    // or below it.
    let rank = (PERCENTILE * samples.len() as f64).ceil() as usize;
    let index = rank.saturating_sub(1).min(samples.len() - 1);
    *samples.select_nth_unstable(index).1
}
