//! When the limiter stops asking Redis and decides locally, and when it asks
//! again: a pure state machine (time is an argument) that the limiter drives
//! with each call's outcome.
//!
//! A failed or timed-out call is answered locally either way; the question is
//! only whether the *next* requests skip Redis. One slow call, or a blip
//! shorter than [`Thresholds::failing_for`], must not move a replica to
//! local limits (N replicas → N × the rate), so the switch needs both
//! [`Thresholds::failures`] failures in a row (no success between them) and
//! that run to have lasted `failing_for`. Once local, one request per
//! [`Thresholds::hold_off`] probes Redis; the first probe that succeeds
//! switches back.

use std::time::Duration;

/// When to switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Failures in a row before switching to local decisions.
    pub failures: u32,
    /// How long the run of failures must have lasted (first to last).
    pub failing_for: Duration,
    /// While local, time between two probes of Redis.
    pub hold_off: Duration,
}

/// How one request is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Ask Redis (Redis is in use).
    Redis,
    /// Ask Redis to see whether it is back (decisions are local).
    Probe,
    /// Decide locally without asking Redis.
    Local,
}

/// A change of where decisions are taken, to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// From Redis to local decisions.
    ToLocal {
        /// Failures in a row that caused it.
        failures: u32,
        /// From the first of them to the last.
        over: Duration,
    },
    /// Back from local decisions to Redis.
    ToRedis {
        /// How long decisions were local.
        after: Duration,
    },
}

/// The run of failures seen while using Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first: Duration,
    count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Asking Redis; `run` is the current run of failures, if any.
    Redis { run: Option<Run> },
    /// Deciding locally since `since`; the next probe goes at `probe_at`.
    Local { since: Duration, probe_at: Duration },
}

/// Where decisions are taken; times are from any fixed origin.
#[derive(Debug, Clone)]
pub struct Fallback {
    thresholds: Thresholds,
    state: State,
}

impl Fallback {
    /// Starts on Redis.
    pub fn new(thresholds: Thresholds) -> Self {
        Self {
            thresholds,
            state: State::Redis { run: None },
        }
    }

    /// How the request arriving at `now` is decided. A probe is handed out
    /// once per hold-off, so a probe whose request was dropped is followed
    /// by another one.
    pub fn route(&mut self, now: Duration) -> Route {
        match &mut self.state {
            State::Redis { .. } => Route::Redis,
            State::Local { probe_at, .. } if now >= *probe_at => {
                *probe_at = now + self.thresholds.hold_off;
                Route::Probe
            }
            State::Local { .. } => Route::Local,
        }
    }

    /// Whether Redis is in use, without handing out a probe.
    pub fn on_redis(&self) -> bool {
        matches!(self.state, State::Redis { .. })
    }

    /// The outcome (`ok`) at `now` of a Redis call made on `route`.
    pub fn record(&mut self, now: Duration, route: Route, ok: bool) -> Option<Switch> {
        match (self.state, route) {
            (State::Redis { .. }, Route::Redis) if ok => {
                self.state = State::Redis { run: None };
                None
            }
            (State::Redis { run }, Route::Redis) => {
                let run = run.map_or(
                    Run {
                        first: now,
                        count: 1,
                    },
                    |r| Run {
                        count: r.count.saturating_add(1),
                        ..r
                    },
                );
                let over = now.saturating_sub(run.first);
                if run.count >= self.thresholds.failures && over >= self.thresholds.failing_for {
                    self.state = State::Local {
                        since: now,
                        probe_at: now + self.thresholds.hold_off,
                    };
                    return Some(Switch::ToLocal {
                        failures: run.count,
                        over,
                    });
                }
                self.state = State::Redis { run: Some(run) };
                None
            }
            (State::Local { since, .. }, Route::Probe) if ok => {
                self.state = State::Redis { run: None };
                Some(Switch::ToRedis {
                    after: now.saturating_sub(since),
                })
            }
            (State::Local { since, .. }, Route::Probe) => {
                self.state = State::Local {
                    since,
                    probe_at: now + self.thresholds.hold_off,
                };
                None
            }
            // A call begun before the last switch says nothing about now,
            // and a local decision made no call.
            _ => None,
        }
    }
}
