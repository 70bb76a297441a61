//! What every benchmark of the project shares, so that a figure means the
//! same thing in every table of `docs/benchmarks.md`.
//!
//! # One percentile
//!
//! A [`Recorder`] keeps its values in an HDR histogram (`hdrhistogram`)
//! with 3 significant digits; durations are recorded in whole
//! microseconds. The `q` quantile ([`Recorder::quantile`]) is the
//! histogram's `value_at_quantile(q)`: the smallest recorded value that at
//! least `⌈q·n⌉` of the `n` recorded values do not exceed (nearest rank; at
//! least the first value), reported as the highest value the histogram
//! cannot tell apart from it (at most 0.1 % above it, exact below 2,048).
//! So p50 of 1, 2, 3, 4 is 2, p99 of 1..=100 is 99, and quantile 1 is the
//! maximum.
//!
//! # One median of per-run figures
//!
//! Figures that are one per run (a run's throughput, its p99, a same-run
//! ratio) are summarised by [`median`]: the middle of the finite values in
//! order, and the mean of the two middle ones when there is an even number
//! of them.
//!
//! # Load
//!
//! [`load::closed_loop`] keeps a fixed number of workers calling back to
//! back for a fixed time; [`load::open_loop`] calls on a fixed schedule,
//! whatever the answers, a fixed number of times. Both only call the
//! operation they are given: the benchmarks point them at loopback.

mod binary;
pub mod funnel;
pub mod gateway_process;
pub mod load;
mod median;
mod recorder;
pub mod reserve_script;
pub mod system;

pub use binary::release_binary;
pub use median::median;
pub use recorder::{Recorded, Recorder};

use std::time::Duration;

/// Milliseconds of `duration`, for printing.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Microseconds of `duration`, for printing.
pub fn us(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}
