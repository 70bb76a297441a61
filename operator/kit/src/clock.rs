//! The time every time-driven decision reads, injected so sale phases can be
//! tested without waiting for them.
//!
//! Two clocks: the wall clock for schedules, for what is compared with other
//! systems' times (a Prometheus sample's timestamp) and for the status; the
//! monotonic clock for everything that measures how long something lasted,
//! so a wall-clock step (NTP, a VM resumed) neither stretches nor cuts a
//! run, a dead-man bound or a hold-down.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use jiff::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// Now, on the wall clock.
    fn now(&self) -> Timestamp;

    /// Now on a clock that never steps: the time since an arbitrary origin,
    /// fixed for the process. Only differences of two readings mean
    /// anything.
    fn monotonic(&self) -> Duration;

    /// Now on both clocks.
    fn moment(&self) -> Moment {
        Moment {
            wall: self.now(),
            mono: self.monotonic(),
        }
    }
}

/// One instant read on both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    /// The wall clock.
    pub wall: Timestamp,
    /// The monotonic clock ([`Clock::monotonic`]).
    pub mono: Duration,
}

/// The system's wall clock and its monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}
