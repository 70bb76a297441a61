//! Adaptive concurrency limit: how many requests the gateway lets run at
//! once, learned from their latency (a gradient controller in the style of
//! Envoy's adaptive concurrency filter and Netflix's Gradient2).
//!
//! # The algorithm
//!
//! The limit moves by comparing the latency requests see now with the latency
//! of an unloaded upstream:
//!
//! - **min RTT, measured by probes.** At startup (there is no baseline yet) and
//!   then every [`Settings::probe_interval`] (jittered ±10 % so the replicas of
//!   a gateway don't all probe at once), the limit drops to
//!   [`Settings::min_limit`] until [`Settings::probe_samples`] requests *that
//!   started after the probe began* have finished; requests from before the
//!   probe ran at the old concurrency and are not counted. With queues
//!   drained, the median of those samples is the new min RTT (the median,
//!   not the minimum: one fast outlier, say a cached answer, would set a
//!   baseline no real request meets). It replaces the old one, so the
//!   baseline can go down as well as up. Then the limit returns to its
//!   pre-probe value. A probe is short under load (25 samples of 10 ms at 8
//!   in flight: about 30 ms). A baseline measured at low concurrency cannot
//!   creep: an average of observed latency taken under overload is itself
//!   inflated, and lets the limit ratchet up.
//! - **sample windows.** Between probes, each window of
//!   [`Settings::sample_window`] (and at least 10 samples) gives a sample RTT,
//!   the median (p50, Envoy's default) of the window: robust against a few
//!   slow or fast outliers, which a mean or a max is not. Then
//!   `gradient = clamp(min_rtt × (1 + buffer) / sample_rtt, 0.5, 2)` and
//!   `limit = clamp(limit × gradient + sqrt(limit × gradient), min, max)`.
//!   Against a server of capacity C whose latency grows as `n / C` past C,
//!   this settles at about `C × (1 + buffer) + sqrt(C × (1 + buffer))`: just
//!   enough queueing to keep the server busy, latency about 1.2 × its floor.
//! - **stale baseline.** Five windows in a row at `min_limit` (the upstream
//!   got slower for good, or the last probe was unlucky) start a probe at
//!   once, as Envoy does, rather than waiting out the interval.
//!
//! The controller itself, with time passed in, is [`gradient::Gradient`];
//! [`ConcurrencyLimiter`] wraps it with the real clock behind a mutex.
//!
//! # Partitions
//!
//! A [`Partition::NonCore`] request (tier-1/2 feature routes) is admitted
//! only while all requests number fewer than the limit *and* non-core ones
//! fewer than `max(1, floor(limit × non_core_share))`. A [`Partition::Core`]
//! request (order placement, payment) only needs a free slot under the whole
//! limit. So a non-core surge leaves at least `(1 − share)` of the limit to
//! core traffic, and core traffic may use all of it.
//!
//! # Choices
//!
//! - **Retry hint.** [`Rejected::retry_after`] is the latest sample RTT
//!   (before the first window: the min RTT) rounded up to whole seconds, at
//!   least 1 s. A slot frees after about one RTT, but `Retry-After` counts
//!   whole seconds and retrying sooner into a full limit only adds load; when
//!   latency is seconds long, clients wait at least that long.
//! - **Dropped permits record nothing** (as Envoy does for a reset request):
//!   the slot is released and no sample is taken. A cancelled request's
//!   elapsed time is only a lower bound on its latency, and clients giving up
//!   early would pull the median down; counting drops as overload would let
//!   impatient clients collapse the limit. Real overload shows in the latency
//!   of the requests that do finish. A handler that times a request out
//!   itself may call [`Permit::success`] to count the timeout as a sample.
//! - **Hot path.** [`ConcurrencyLimiter::try_acquire`] is a few atomic
//!   operations; the mutex is taken only when a sample is recorded.

pub mod gradient;

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;

use std::{
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use rand::Rng;

use gradient::Gradient;

/// Probing more rarely than this is no use, and a bound keeps the
/// jittered deadline far from `Instant` overflow.
const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(24 * 60 * 60);

/// Which share of the limit a request may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// Tier 0 (order placement, payment): may use the whole limit.
    Core,
    /// Tier 1/2 feature routes: at most [`Settings::non_core_share`] of it.
    NonCore,
}

/// Bounds and timing of the adaptive limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The limit never falls below this; also the concurrency during a min-RTT
    /// probe. Raised to 1 if 0.
    pub min_limit: usize,
    /// The limit never rises above this. Raised to `min_limit` if lower.
    pub max_limit: usize,
    /// The limit restored after the startup probe (clamped to the bounds).
    pub initial_limit: usize,
    /// The share of the limit non-core requests may hold (0 to 1; at least
    /// one slot). Core requests may use the whole limit.
    pub non_core_share: f64,
    /// How long a sample window lasts (it also waits for at least 10
    /// samples).
    pub sample_window: Duration,
    /// Time between min-RTT probes, each drawn from ±10 % of this. Lowered
    /// to a day if longer.
    pub probe_interval: Duration,
    /// Samples that make one min-RTT measurement. Raised to 1 if 0.
    pub probe_samples: usize,
    /// Latency above the min RTT still taken as unloaded, as a fraction of
    /// it (0.1 = 10 %). Negative is taken as 0.
    pub buffer: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            min_limit: 8,
            max_limit: 1000,
            initial_limit: 50,
            non_core_share: 0.3,
            sample_window: Duration::from_millis(100),
            probe_interval: Duration::from_secs(30),
            probe_samples: 25,
            buffer: 0.1,
        }
    }
}

impl Settings {
    /// The settings with every bound made consistent (see each field).
    fn sanitized(self) -> Self {
        let min_limit = self.min_limit.max(1);
        let max_limit = self.max_limit.max(min_limit);
        Self {
            min_limit,
            max_limit,
            initial_limit: self.initial_limit.clamp(min_limit, max_limit),
            // NaN (no share stated) is the strictest share: one slot.
            non_core_share: if self.non_core_share.is_nan() {
                0.0
            } else {
                self.non_core_share.clamp(0.0, 1.0)
            },
            probe_interval: self.probe_interval.min(MAX_PROBE_INTERVAL),
            probe_samples: self.probe_samples.max(1),
            buffer: self.buffer.max(0.0),
            ..self
        }
    }
}

/// Over the limit: refuse at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("over the concurrency limit; retry after {}s", retry_after.as_secs())]
pub struct Rejected {
    /// When the client may retry: the latest sample RTT rounded up to whole
    /// seconds, at least 1 s (for `Retry-After`).
    pub retry_after: Duration,
}

/// The adaptive concurrency limit of one gateway process. Cheap to clone
/// (an `Arc` inside); shared by all request handlers.
#[derive(Clone)]
pub struct ConcurrencyLimiter {
    shared: Arc<Shared>,
}

/// What the limiter and its permits share.
struct Shared {
    /// The controller's limit, published for the lock-free admission check.
    limit: AtomicUsize,
    /// Requests holding a permit, both partitions.
    inflight: AtomicUsize,
    /// Non-core requests holding a permit.
    non_core_inflight: AtomicUsize,
    non_core_share: f64,
    /// The retry hint in whole seconds, published with the limit.
    retry_after_secs: AtomicU64,
    controller: Mutex<Gradient>,
}

impl ConcurrencyLimiter {
    /// A limiter that starts with a min-RTT probe (at `min_limit`), then
    /// continues from `initial_limit`.
    pub fn new(settings: Settings) -> Self {
        let settings = settings.sanitized();
        let non_core_share = settings.non_core_share;
        let controller = Gradient::new(settings, Instant::now(), rand::rng().random());
        let shared = Shared {
            limit: AtomicUsize::new(controller.limit()),
            inflight: AtomicUsize::new(0),
            non_core_inflight: AtomicUsize::new(0),
            non_core_share,
            retry_after_secs: AtomicU64::new(retry_after_secs(&controller)),
            controller: Mutex::new(controller),
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Takes a slot for one request of `partition`, or refuses at once when
    /// the limit (or the non-core share of it) is used up.
    pub fn try_acquire(&self, partition: Partition) -> Result<Permit, Rejected> {
        let shared = &self.shared;
        let limit = shared.limit.load(Ordering::Acquire);
        if partition == Partition::NonCore {
            let cap = non_core_cap(limit, shared.non_core_share);
            if !reserve(&shared.non_core_inflight, cap) {
                return Err(self.rejected());
            }
        }
        if !reserve(&shared.inflight, limit) {
            if partition == Partition::NonCore {
                shared.non_core_inflight.fetch_sub(1, Ordering::AcqRel);
            }
            return Err(self.rejected());
        }
        Ok(Permit {
            shared: Arc::clone(shared),
            partition,
            started: Instant::now(),
        })
    }

    /// The current limit (during a probe: the probe limit, `min_limit`).
    pub fn limit(&self) -> usize {
        self.shared.limit.load(Ordering::Acquire)
    }

    /// Requests holding a permit, all partitions.
    pub fn inflight(&self) -> usize {
        self.shared.inflight.load(Ordering::Acquire)
    }

    fn rejected(&self) -> Rejected {
        Rejected {
            retry_after: Duration::from_secs(self.shared.retry_after_secs.load(Ordering::Acquire)),
        }
    }
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiter")
            .field("limit", &self.limit())
            .field("inflight", &self.inflight())
            .finish_non_exhaustive()
    }
}

/// Non-core requests allowed under `limit`: the share, at least one.
fn non_core_cap(limit: usize, share: f64) -> usize {
    // Float to int casts saturate; the share is within 0..=1.
    ((limit as f64 * share).floor() as usize).max(1)
}

/// Increments `counter` if it stays within `cap`; false if it would not.
fn reserve(counter: &AtomicUsize, cap: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap).then_some(n + 1)
        })
        .is_ok()
}

/// The retry hint: the latest sample RTT (else the min RTT) rounded up to
/// whole seconds, at least 1.
fn retry_after_secs(controller: &Gradient) -> u64 {
    let rtt = controller
        .sample_rtt()
        .or(controller.min_rtt())
        .unwrap_or_default();
    let secs = rtt.as_secs() + u64::from(rtt.subsec_nanos() > 0);
    secs.max(1)
}

/// A slot under the limit, held while the request runs. Dropping it without
/// [`success`](Self::success) or [`ignore`](Self::ignore) (the request was
/// cancelled or timed out) releases the slot and records no sample.
#[must_use = "dropping a permit releases its slot at once"]
pub struct Permit {
    shared: Arc<Shared>,
    partition: Partition,
    started: Instant,
}

impl Permit {
    /// The request finished normally: its latency is a sample.
    pub fn success(self) {
        let finished = Instant::now();
        let mut controller = self
            .shared
            .controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        controller.record(self.started, finished);
        // Published under the lock so a stale value can't overwrite a newer one.
        self.shared
            .limit
            .store(controller.limit(), Ordering::Release);
        self.shared
            .retry_after_secs
            .store(retry_after_secs(&controller), Ordering::Release);
    }

    /// Finished, but its latency says nothing about capacity (e.g. a 4xx
    /// refused before any work): no sample.
    pub fn ignore(self) {
        drop(self);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.inflight.fetch_sub(1, Ordering::AcqRel);
        if self.partition == Partition::NonCore {
            self.shared.non_core_inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("partition", &self.partition)
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}
