//! The operator's own Prometheus metrics: `flashsale_operator_*` for every
//! controller, `flashsale_degradation_*` for the DegradationPolicy controller,
//! `flashsale_drill_*` for the ChaosDrill controller.

use std::{
    collections::{HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_api::chaosdrill::RunOutcome;
use flashsale_runtime::metrics::Buckets;
use kube::ResourceExt;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

/// Reconcile durations: 1 ms × 2^k up to about a minute.
const RECONCILE_BUCKETS: Buckets = Buckets::exponential(0.001, 2.0, 17);
/// Propagation and abort latencies: 1 ms × 1.5^k up to about 40 s.
const LATENCY_BUCKETS: Buckets = Buckets::exponential(0.001, 1.5, 27);
/// 0.25 s to about 9 minutes: a failover's RTO.
const RTO_BUCKETS: Buckets = Buckets::exponential(0.25, 1.5, 20);
/// Orders or units: the first bucket (`le="0.5"`) counts the runs that lost
/// (or oversold) none.
const RPO_BUCKETS: Buckets = Buckets::exponential(0.5, 2.0, 12);

/// A controller, by its name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    controller: &'static str,
    /// ok or error.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    controller: &'static str,
    reason: &'static str,
}

/// A DegradationPolicy, by namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    namespace: String,
    policy: String,
}

/// A ChaosDrill, by namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DrillLabels {
    namespace: String,
    drill: String,
}

/// A ChaosDrill and how one of its runs ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    namespace: String,
    drill: String,
    outcome: &'static str,
}

/// Handles to the operator's metrics; cheap to clone.
#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: Family<OutcomeLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    duration: Family<ControllerLabels, Histogram, Buckets>,
    writes: Family<ControllerLabels, Counter>,
    watch_errors: Family<ControllerLabels, Counter>,
    invalid_objects: Family<ControllerLabels, Counter>,
    leader: Gauge,
    tier: Family<PolicyLabels, Gauge>,
    propagation: Family<PolicyLabels, Histogram, Buckets>,
    abort_latency: Family<DrillLabels, Histogram, Buckets>,
    runs: Family<RunLabels, Counter>,
    guard_blind: Family<DrillLabels, Counter>,
    standby_ready: Family<DrillLabels, Gauge>,
    failover_rto: Family<DrillLabels, Histogram, Buckets>,
    failover_rpo: Family<DrillLabels, Histogram, Buckets>,
    failover_oversold: Family<DrillLabels, Histogram, Buckets>,
    deleted: Arc<Mutex<Deleted>>,
}

/// The uids of the drills whose series were dropped, the latest
/// [`Deleted::KEPT`]: a reconcile or a run still finishing after the delete
/// must not bring a deleted drill's series back. A drill recreated under the
/// same name has another uid and gets its series again.
#[derive(Default)]
struct Deleted {
    uids: HashSet<String>,
    order: VecDeque<String>,
}

impl Deleted {
    const KEPT: usize = 4096;

    fn insert(&mut self, uid: String) {
        if self.uids.insert(uid.clone()) {
            self.order.push_back(uid);
        }
        while self.order.len() > Self::KEPT {
            if let Some(old) = self.order.pop_front() {
                self.uids.remove(&old);
            }
        }
    }
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            failures: Family::default(),
            duration: Family::new_with_constructor(RECONCILE_BUCKETS),
            writes: Family::default(),
            watch_errors: Family::default(),
            invalid_objects: Family::default(),
            leader: Gauge::default(),
            tier: Family::default(),
            propagation: Family::new_with_constructor(LATENCY_BUCKETS),
            abort_latency: Family::new_with_constructor(LATENCY_BUCKETS),
            runs: Family::default(),
            guard_blind: Family::default(),
            standby_ready: Family::default(),
            failover_rto: Family::new_with_constructor(RTO_BUCKETS),
            failover_rpo: Family::new_with_constructor(RPO_BUCKETS),
            failover_oversold: Family::new_with_constructor(RPO_BUCKETS),
            deleted: Arc::default(),
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
            "flashsale_operator_watch_errors",
            "Errors of a controller's watches (a list or watch refused or broken), by controller; \
             a watch that merely expired and is listed again is not counted",
            m.watch_errors.clone(),
        );
        registry.register(
            "flashsale_operator_invalid_objects",
            "Object versions left out of a controller because they do not match the operator's \
             types (each is named in a Warning Event InvalidObject), by controller",
            m.invalid_objects.clone(),
        );
        registry.register(
            "flashsale_operator_leader",
            "1 while this replica holds the leader lease and may write",
            m.leader.clone(),
        );
        registry.register(
            "flashsale_degradation_tier",
            "The degradation tier a DegradationPolicy has in force (0 = nothing degraded)",
            m.tier.clone(),
        );
        registry.register_with_unit(
            "flashsale_degradation_propagation",
            "Time from writing a sale's switches until every ready gateway reported their generation",
            Unit::Seconds,
            m.propagation.clone(),
        );
        m.register_drills(registry);
        m
    }

    /// Registers the ChaosDrill controller's metrics.
    fn register_drills(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "flashsale_drill_abort_latency",
            "Time from a ChaosDrill guard's decision to abort until every Chaos Mesh object of the run was gone",
            Unit::Seconds,
            self.abort_latency.clone(),
        );
        registry.register(
            "flashsale_drill_runs",
            "ChaosDrill runs ended, by outcome (Succeeded, Aborted, Skipped, Failed)",
            self.runs.clone(),
        );
        registry.register(
            "flashsale_drill_guard_blind",
            "ChaosDrill runs aborted because the guard could not read its signal \
             (Prometheus unreachable, a query failing or returning nothing)",
            self.guard_blind.clone(),
        );
        registry.register(
            "flashsale_drill_standby_ready",
            "1 while a ChaosDrill's standby region passed every readiness check at its last \
             check, 0 while one failed (the StandbyReady condition says which)",
            self.standby_ready.clone(),
        );
        registry.register_with_unit(
            "flashsale_failover_rto",
            "RTO an active failover run of a ChaosDrill measured through the global endpoint: \
             from buyers losing the primary region to another region serving them, sustained",
            Unit::Seconds,
            self.failover_rto.clone(),
        );
        registry.register(
            "flashsale_failover_rpo_orders",
            "RPO an active failover run of a ChaosDrill measured by order id: orders the primary \
             region acknowledged that the standby's database lacked once replication drained",
            self.failover_rpo.clone(),
        );
        registry.register(
            "flashsale_failover_oversold_units",
            "Stock divergence an active failover run of a ChaosDrill measured at the standby's \
             promotion: units of the drill SKU the primary had given out that the standby did \
             not know of, which it would sell again",
            self.failover_oversold.clone(),
        );
    }

    /// Counts one reconcile and its duration.
    pub fn reconciled(&self, controller: &'static str, ok: bool, took: Duration) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&OutcomeLabels { controller, result })
            .inc();
        self.duration
            .get_or_create(&ControllerLabels { controller })
            .observe(took.as_secs_f64());
    }

    /// Counts one failure under the reason its Warning Event carries.
    pub fn failed(&self, controller: &'static str, reason: &'static str) {
        self.failures
            .get_or_create(&FailureLabels { controller, reason })
            .inc();
    }

    /// Counts one write to the apiserver.
    pub fn wrote(&self, controller: &'static str) {
        self.writes
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// Counts one error of one of `controller`'s watches.
    pub fn watch_failed(&self, controller: &'static str) {
        self.watch_errors
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// Counts one object version `controller` left out as invalid.
    pub fn invalid_object(&self, controller: &'static str) {
        self.invalid_objects
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leads: bool) {
        self.leader.set(i64::from(leads));
    }

    /// Sets the tier `namespace/policy` has in force.
    pub fn set_tier(&self, namespace: &str, policy: &str, tier: i32) {
        self.tier
            .get_or_create(&policy_labels(namespace, policy))
            .set(i64::from(tier));
    }

    /// Records how long one change of `namespace/policy` took to reach every
    /// gateway.
    pub fn propagated(&self, namespace: &str, policy: &str, took: Duration) {
        self.propagation
            .get_or_create(&policy_labels(namespace, policy))
            .observe(took.as_secs_f64());
    }

    /// Runs `write` on the labels of `drill`'s series unless it was
    /// deleted; the check and the write happen under one lock, so a write
    /// racing the delete cannot bring the series back.
    fn live(&self, drill: &impl ResourceExt, write: impl FnOnce(&DrillLabels)) {
        let deleted = self.deleted.lock().unwrap_or_else(|p| p.into_inner());
        if !deleted.uids.contains(&drill.uid().unwrap_or_default()) {
            write(&drill_labels(
                &drill.namespace().unwrap_or_default(),
                &drill.name_any(),
            ));
        }
    }

    /// Records the RTO one active failover run of `drill` measured.
    pub fn drill_failover(&self, drill: &impl ResourceExt, rto: Duration) {
        self.live(drill, |labels| {
            self.failover_rto
                .get_or_create(labels)
                .observe(rto.as_secs_f64());
        });
    }

    /// Records the RPO, in orders, one active failover run of `drill`
    /// measured.
    pub fn drill_failover_rpo(&self, drill: &impl ResourceExt, orders: i64) {
        self.observe_count(&self.failover_rpo, drill, orders);
    }

    /// Records the stock divergence, in units, one active failover run of
    /// `drill` measured.
    pub fn drill_failover_oversold(&self, drill: &impl ResourceExt, units: i64) {
        self.observe_count(&self.failover_oversold, drill, units);
    }

    /// Observes a count (orders, units) in `drill`'s histogram of `family`.
    fn observe_count(
        &self,
        family: &Family<DrillLabels, Histogram, Buckets>,
        drill: &impl ResourceExt,
        count: i64,
    ) {
        self.live(drill, |labels| {
            family.get_or_create(labels).observe(count as f64);
        });
    }

    /// Records the abort latency of one run of `drill`.
    pub fn drill_aborted(&self, drill: &impl ResourceExt, took: Duration) {
        self.live(drill, |labels| {
            self.abort_latency
                .get_or_create(labels)
                .observe(took.as_secs_f64());
        });
    }

    /// Creates a drill's run and blind-guard counters at 0, so that an alert
    /// on their increase sees the first run end, not only the second.
    pub fn drill_seen(&self, drill: &impl ResourceExt) {
        self.live(drill, |labels| {
            // The guards are dropped at once: creating the series is the point.
            for outcome in RunOutcome::ALL.map(RunOutcome::name) {
                drop(self.runs.get_or_create(&run_labels(labels, outcome)));
            }
            drop(self.guard_blind.get_or_create(labels));
        });
    }

    /// Counts one run of `drill` aborted because its guard was blind.
    pub fn drill_guard_blind(&self, drill: &impl ResourceExt) {
        self.live(drill, |labels| {
            self.guard_blind.get_or_create(labels).inc();
        });
    }

    /// Counts one ended run of `drill`.
    pub fn drill_run(&self, drill: &impl ResourceExt, outcome: &'static str) {
        self.live(drill, |labels| {
            self.runs.get_or_create(&run_labels(labels, outcome)).inc();
        });
    }

    /// Records whether `drill`'s standby passed its readiness checks;
    /// `None` drops the series (the drill checks no standby any more).
    pub fn drill_standby(&self, drill: &impl ResourceExt, ready: Option<bool>) {
        self.live(drill, |labels| match ready {
            Some(ready) => {
                self.standby_ready
                    .get_or_create(labels)
                    .set(i64::from(ready));
            }
            None => {
                self.standby_ready.remove(labels);
            }
        });
    }

    /// Drops the series of a drill that no longer exists, for good: later
    /// writes for it are ignored.
    pub fn forget_drill(&self, drill: &impl ResourceExt) {
        let mut deleted = self.deleted.lock().unwrap_or_else(|p| p.into_inner());
        deleted.insert(drill.uid().unwrap_or_default());
        let labels = drill_labels(&drill.namespace().unwrap_or_default(), &drill.name_any());
        self.abort_latency.remove(&labels);
        self.guard_blind.remove(&labels);
        self.standby_ready.remove(&labels);
        self.failover_rto.remove(&labels);
        self.failover_rpo.remove(&labels);
        self.failover_oversold.remove(&labels);
        for outcome in RunOutcome::ALL.map(RunOutcome::name) {
            self.runs.remove(&run_labels(&labels, outcome));
        }
    }

    /// Drops the series of a policy that no longer exists.
    pub fn forget_policy(&self, namespace: &str, policy: &str) {
        let labels = policy_labels(namespace, policy);
        self.tier.remove(&labels);
        self.propagation.remove(&labels);
    }
}

fn policy_labels(namespace: &str, policy: &str) -> PolicyLabels {
    PolicyLabels {
        namespace: namespace.to_owned(),
        policy: policy.to_owned(),
    }
}

fn drill_labels(namespace: &str, drill: &str) -> DrillLabels {
    DrillLabels {
        namespace: namespace.to_owned(),
        drill: drill.to_owned(),
    }
}

fn run_labels(drill: &DrillLabels, outcome: &'static str) -> RunLabels {
    RunLabels {
        namespace: drill.namespace.clone(),
        drill: drill.drill.clone(),
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
    use kube::core::PartialObjectMeta;
    use prometheus_client::encoding::text::encode;

    fn exposition(registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, registry)?;
        Ok(text)
    }

    /// A drill as the metrics see it: any object with a name, namespace and uid.
    fn drill(uid: &str) -> PartialObjectMeta<ConfigMap> {
        PartialObjectMeta {
            metadata: ObjectMeta {
                name: Some("kill".into()),
                namespace: Some("shop".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..PartialObjectMeta::default()
        }
    }

    #[test]
    fn a_seen_drill_exposes_every_outcome_at_zero_and_forgetting_it_drops_them()
    -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = OperatorMetrics::register(&mut registry);
        let kill = drill("u1");
        metrics.drill_seen(&kill);
        let text = exposition(&registry)?;
        for outcome in RunOutcome::ALL.map(RunOutcome::name) {
            let line = format!(
                "flashsale_drill_runs_total{{namespace=\"shop\",drill=\"kill\",outcome=\"{outcome}\"}} 0"
            );
            assert!(text.contains(&line), "missing {line} in:\n{text}");
        }
        assert!(
            text.contains("flashsale_drill_guard_blind_total{namespace=\"shop\",drill=\"kill\"} 0")
        );

        metrics.drill_guard_blind(&kill);
        metrics.drill_seen(&kill);
        assert!(
            exposition(&registry)?
                .contains("flashsale_drill_guard_blind_total{namespace=\"shop\",drill=\"kill\"} 1")
        );

        metrics.forget_drill(&kill);
        assert!(!exposition(&registry)?.contains("drill=\"kill\""));
        Ok(())
    }

    #[test]
    fn a_deleted_drill_stays_forgotten_while_one_recreated_under_its_name_counts()
    -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = OperatorMetrics::register(&mut registry);
        let deleted = drill("u1");
        metrics.drill_seen(&deleted);
        metrics.forget_drill(&deleted);
        // What a run or a reconcile still finishing after the delete writes.
        metrics.drill_aborted(&deleted, Duration::from_millis(300));
        metrics.drill_failover(&deleted, Duration::from_secs(3));
        metrics.drill_failover_rpo(&deleted, 2);
        metrics.drill_failover_oversold(&deleted, 1);
        metrics.drill_run(&deleted, RunOutcome::Aborted.name());
        metrics.drill_seen(&deleted);
        assert!(!exposition(&registry)?.contains("drill=\"kill\""));

        metrics.drill_run(&drill("u2"), RunOutcome::Aborted.name());
        assert!(exposition(&registry)?.contains(
            "flashsale_drill_runs_total{namespace=\"shop\",drill=\"kill\",outcome=\"Aborted\"} 1"
        ));
        Ok(())
    }

    #[test]
    fn the_standby_gauge_follows_each_check_and_goes_with_the_failover_spec()
    -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = OperatorMetrics::register(&mut registry);
        let kill = drill("u1");
        let line = |v: u8| {
            format!("flashsale_drill_standby_ready{{namespace=\"shop\",drill=\"kill\"}} {v}")
        };
        metrics.drill_standby(&kill, Some(true));
        assert!(exposition(&registry)?.contains(&line(1)));
        metrics.drill_standby(&kill, Some(false));
        assert!(exposition(&registry)?.contains(&line(0)));
        metrics.drill_standby(&kill, None);
        assert!(!exposition(&registry)?.contains("flashsale_drill_standby_ready{"));
        Ok(())
    }

    #[test]
    fn each_failover_rto_is_observed_in_seconds() -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = OperatorMetrics::register(&mut registry);
        let kill = drill("u1");
        metrics.drill_failover(&kill, Duration::from_millis(2500));
        metrics.drill_failover(&kill, Duration::from_millis(4000));
        let text = exposition(&registry)?;
        let labels = "namespace=\"shop\",drill=\"kill\"";
        assert!(
            text.contains(&format!(
                "flashsale_failover_rto_seconds_sum{{{labels}}} 6.5"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "flashsale_failover_rto_seconds_count{{{labels}}} 2"
            )),
            "{text}"
        );
        Ok(())
    }
}
