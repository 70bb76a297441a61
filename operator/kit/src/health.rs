//! Whether each controller's watches work, for `/readyz` and the
//! `flashsale_operator_watch_errors_total` metric.
//!
//! A watch that fails (a list or watch the apiserver refuses, for lack of
//! permission or a missing CRD, or a broken stream) shows in the
//! controller's stream as an error and nowhere else: the controller keeps
//! running on what it last saw. [`WatchHealth`] turns those errors into a
//! readiness check per controller that fails, naming the error, from the
//! first error until [`RECOVERY`] passes without another one.
//!
//! Why a quiet period rather than the next successful event: a controller
//! has several watches (the FlashSale controller eleven) and its stream says
//! which controller failed, not which watch, so an event of a healthy watch
//! proves nothing about the failing one. The controller retries a failing
//! watch after its trigger backoff (0.8 s doubling to 30 s, plus up to as
//! much again of jitter), so a watch that still fails reports again within
//! 60 s: 90 s without an error means the retries have been succeeding.
//!
//! The health reaches [`super::report`] through a task-local set by
//! [`WatchHealth::scope`], so a controller's `run` needs no parameter for
//! it: the process scopes each controller when it starts them.

use std::{
    collections::BTreeMap,
    fmt::Display,
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::metrics::OperatorMetrics;

/// How long a controller's watches must go without an error before it
/// counts as recovered (see the module documentation for why 90 s).
pub const RECOVERY: Duration = Duration::from_secs(90);

/// The longest error text kept for `/readyz`.
const MAX_ERROR_LEN: usize = 1000;

tokio::task_local! {
    static CURRENT: WatchHealth;
}

/// The watch health of every controller of the process; cheap to clone.
#[derive(Clone)]
pub struct WatchHealth {
    failing: Arc<Mutex<BTreeMap<&'static str, Failing>>>,
    metrics: OperatorMetrics,
    recovery: Duration,
}

/// A controller whose watches have failed recently.
#[derive(Debug, Clone)]
struct Failing {
    since: Instant,
    last: Instant,
    errors: u64,
    error: String,
}

impl WatchHealth {
    /// Nothing failing yet; errors count in `metrics`.
    pub fn new(metrics: OperatorMetrics) -> Self {
        Self {
            failing: Arc::default(),
            metrics,
            recovery: RECOVERY,
        }
    }

    /// With another quiet period than [`RECOVERY`].
    pub fn with_recovery(mut self, recovery: Duration) -> Self {
        self.recovery = recovery;
        self
    }

    /// Records one watch error of `controller` and counts it.
    pub fn failed(&self, controller: &'static str, error: &dyn Display) {
        self.failed_at(controller, error, Instant::now());
    }

    fn failed_at(&self, controller: &'static str, error: &dyn Display, now: Instant) {
        self.metrics.watch_failed(controller);
        let mut error = error.to_string();
        truncate(&mut error, MAX_ERROR_LEN);
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let entry = failing.entry(controller).or_insert_with(|| Failing {
            since: now,
            last: now,
            errors: 0,
            error: String::new(),
        });
        // A failure that had already recovered starts a new episode.
        if now.duration_since(entry.last) >= self.recovery {
            entry.since = now;
            entry.errors = 0;
        }
        entry.last = now;
        entry.errors += 1;
        entry.error = error;
    }

    /// `Ok` when `controller`'s watches have had no error for the quiet
    /// period; otherwise why not, naming the controller and the last error
    /// (the text of its `/readyz` check).
    pub fn check(&self, controller: &'static str) -> Result<(), String> {
        self.check_at(controller, Instant::now())
    }

    fn check_at(&self, controller: &'static str, now: Instant) -> Result<(), String> {
        let failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        match failing.get(controller) {
            Some(f) if now.duration_since(f.last) < self.recovery => Err(format!(
                "the {controller} controller's watch is failing ({} error{} in {} s, the last {} s ago; \
                 ready again after {} s without one): {}",
                f.errors,
                if f.errors == 1 { "" } else { "s" },
                f.last.duration_since(f.since).as_secs(),
                now.duration_since(f.last).as_secs(),
                self.recovery.as_secs(),
                f.error
            )),
            _ => Ok(()),
        }
    }

    /// Forgets `controller`'s failures: it stopped (this replica stopped
    /// leading), so none of its watches is failing any more.
    pub fn forget(&self, controller: &'static str) {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(controller);
    }

    /// Runs `future` (a controller's `run`) with this as the health its
    /// [`super::report`] records into.
    pub async fn scope<F: Future>(&self, future: F) -> F::Output {
        CURRENT.scope(self.clone(), future).await
    }

    /// The health of the controller running in this task, if it was started
    /// through [`WatchHealth::scope`].
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }
}

pub(crate) use flashsale_api::common::truncate;

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> WatchHealth {
        WatchHealth::new(OperatorMetrics::default()).with_recovery(Duration::from_secs(10))
    }

    #[test]
    fn an_error_fails_the_check_until_the_quiet_period_passes() {
        let health = health();
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(health.check_at("chaosdrill", at(0)), Ok(()));
        health.failed_at(
            "chaosdrill",
            &"chaosdrills.flashsale.dev is forbidden",
            at(0),
        );
        let why = health
            .check_at("chaosdrill", at(0))
            .err()
            .unwrap_or_default();
        assert!(why.contains("chaosdrill controller"), "{why}");
        assert!(why.contains("is forbidden"), "{why}");
        assert!(why.contains("1 error in 0 s"), "{why}");
        // Other controllers are not affected.
        assert_eq!(health.check_at("flashsale", at(0)), Ok(()));

        health.failed_at("chaosdrill", &"still forbidden", at(6));
        let why = health
            .check_at("chaosdrill", at(15))
            .err()
            .unwrap_or_default();
        assert!(why.contains("2 errors in 6 s, the last 9 s ago"), "{why}");
        assert!(why.contains("still forbidden"), "{why}");
        assert_eq!(health.check_at("chaosdrill", at(16)), Ok(()));

        // A new failure after recovery counts from its own start.
        health.failed_at("chaosdrill", &"again", at(30));
        let why = health
            .check_at("chaosdrill", at(30))
            .err()
            .unwrap_or_default();
        assert!(why.contains("1 error in 0 s"), "{why}");
        health.forget("chaosdrill");
        assert_eq!(health.check_at("chaosdrill", at(30)), Ok(()));
    }

    #[tokio::test]
    async fn the_scope_makes_it_current() {
        assert!(WatchHealth::current().is_none());
        let health = health();
        let seen = health
            .scope(async { WatchHealth::current().map(|h| h.failed("flashsale", &"broken")) })
            .await;
        assert!(seen.is_some());
        assert!(health.check("flashsale").is_err());
    }

    #[tokio::test]
    async fn report_records_failed_watches_but_not_expired_ones() {
        use futures::stream;
        use kube::{
            core::Status,
            runtime::{controller, reflector::ObjectRef, watcher},
        };

        use crate::Identity;
        use flashsale_api::ChaosDrill;

        type Item = Result<
            (ObjectRef<ChaosDrill>, controller::Action),
            controller::Error<std::io::Error, watcher::Error>,
        >;
        let id = Identity {
            name: "chaosdrill",
            field_manager: "test",
        };
        let status = |code, message: &str| Status::failure(message, "Test").with_code(code);
        let health = health();
        let expired: Vec<Item> = vec![Err(controller::Error::QueueError(
            watcher::Error::WatchError(status(410, "too old resource version").boxed()),
        ))];
        health
            .scope(super::super::report(id, stream::iter(expired)))
            .await;
        assert_eq!(health.check("chaosdrill"), Ok(()));

        let refused: Vec<Item> = vec![Err(controller::Error::QueueError(
            watcher::Error::InitialListFailed(kube::Error::Api(
                status(403, "chaosdrills.flashsale.dev is forbidden").boxed(),
            )),
        ))];
        health
            .scope(super::super::report(id, stream::iter(refused)))
            .await;
        let why = health.check("chaosdrill").err().unwrap_or_default();
        assert!(
            why.contains("chaosdrills.flashsale.dev is forbidden"),
            "{why}"
        );
    }

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        let mut text = "é".repeat(600);
        truncate(&mut text, MAX_ERROR_LEN);
        assert!(text.len() <= MAX_ERROR_LEN + '…'.len_utf8());
        assert!(text.ends_with('…'));
        let mut short = "ok".to_owned();
        truncate(&mut short, 10);
        assert_eq!(short, "ok");
    }
}
