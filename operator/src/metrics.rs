//! The operator's own Prometheus metrics (`flashsale_operator_*`).

use std::time::Duration;

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

type Labels = Vec<(&'static str, String)>;

/// Reconcile durations: 1 ms × 2^k up to about a minute.
#[derive(Clone, Copy)]
struct ReconcileBuckets;

impl MetricConstructor<Histogram> for ReconcileBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(0.001, 2.0, 17))
    }
}

/// Handles to the operator's metrics; cheap to clone.
#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, ReconcileBuckets>,
    writes: Family<Labels, Counter>,
    leader: Gauge,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            failures: Family::default(),
            duration: Family::new_with_constructor(ReconcileBuckets),
            writes: Family::default(),
            leader: Gauge::default(),
        }
    }
}

impl OperatorMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "flashsale_operator_reconcile",
            "Reconciles run, by controller and result (ok, error)",
            m.reconciles.clone(),
        );
        registry.register(
            "flashsale_operator_reconcile_failures",
            "Reconciles that failed, by controller and reason (the Warning Event's reason)",
            m.failures.clone(),
        );
        registry.register_with_unit(
            "flashsale_operator_reconcile_duration",
            "Time one reconcile took, by controller",
            Unit::Seconds,
            m.duration.clone(),
        );
        registry.register(
            "flashsale_operator_writes",
            "Objects written to the apiserver (server-side applies, creates, deletes, status), by controller",
            m.writes.clone(),
        );
        registry.register(
            "flashsale_operator_leader",
            "1 while this replica holds the leader lease and may write",
            m.leader.clone(),
        );
        m
    }

    /// Counts one reconcile and its duration.
    pub fn reconciled(&self, controller: &'static str, ok: bool, took: Duration) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&vec![
                ("controller", controller.to_owned()),
                ("result", result.to_owned()),
            ])
            .inc();
        self.duration
            .get_or_create(&vec![("controller", controller.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// Counts one failure under the reason its Warning Event carries.
    pub fn failed(&self, controller: &'static str, reason: &str) {
        self.failures
            .get_or_create(&vec![
                ("controller", controller.to_owned()),
                ("reason", reason.to_owned()),
            ])
            .inc();
    }

    /// Counts one write to the apiserver.
    pub fn wrote(&self, controller: &'static str) {
        self.writes
            .get_or_create(&vec![("controller", controller.to_owned())])
            .inc();
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leads: bool) {
        self.leader.set(i64::from(leads));
    }
}
