//! Part 2: on-call's override through the real DegradationPolicy
//! controller: an operator process, the sale, and a policy whose signal is
//! a constant (so only the override moves the tier); each step
//! merge-patches `spec.override` as `kubectl patch` does and is timed from
//! the patch's answer until every gateway reports the tier. A bare watch of
//! the ConfigMap in this process splits the time into the operator's share
//! (until the ConfigMap changed) and the fan-out to the gateways.
//!
//! Tier 0 is reached by an override to tier 0, not by removing the override:
//! after an override lapses the signal steps down one tier per hold-down
//! (by design), which would time the hold-down, not the propagation.
//!
//! A ResourceQuota of zero pods keeps the sale's own workloads from being
//! created: the gateways measured are the benchmark's processes, and pods
//! on simulated nodes, which never answer, would only keep the controller
//! waiting for them after each write.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use flashsale_api::{DegradationPolicy, FlashSale};
use flashsale_bench::{Recorder, ms};
use flashsale_e2e::{
    kube::create_secret,
    metrics::sum_samples,
    operator::{Launcher, Operator},
    stack,
    wait::poll_until,
};
use flashsale_observe::probe::Probe;
use futures::future::join_all;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::{Cpu, CpuMark, MANAGER, SALE, fleet::Fleet, follow::Follower};

/// The gauge of the tier each gateway has in force.
const TIER_GAUGE: &str = "gateway_degradation_tier";
/// The policy's name.
const POLICY: &str = "bench";

/// One run's steps with one gateway count.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Gateway processes.
    pub gateways: usize,
    /// Each step, ms from the patch's answer until every gateway had the tier.
    pub steps: Vec<f64>,
    /// Each step, ms from the patch's answer until this process's bare watch
    /// saw the ConfigMap at the tier: the operator's share.
    pub written: Vec<f64>,
    /// CPU while the steps ran.
    pub cpu: Cpu,
    /// The controller's work from the first step to the last.
    pub counters: Counters,
}

impl Measured {
    /// A progress line.
    pub fn line(&self) -> String {
        let steps = Recorder::of_ms(self.steps.iter().copied());
        format!(
            "{} gateways: override p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms | ConfigMap changed p50 {:.1} ms",
            self.gateways,
            steps.quantile_ms(0.5),
            steps.quantile_ms(0.99),
            steps.quantile_ms(1.0),
            Recorder::of_ms(self.written.iter().copied()).quantile_ms(0.5)
        )
    }
}

/// The label of the DegradationPolicy controller's series.
const CONTROLLER: &str = "controller=\"degradationpolicy\"";

/// What the DegradationPolicy controller counts, from the operator's metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    /// Reconciles.
    pub reconciles: f64,
    /// Seconds the reconciles took together.
    pub seconds: f64,
    /// Objects written (applies, status, finalizers).
    pub writes: f64,
}

impl Counters {
    fn since(self, before: Self) -> Self {
        Self {
            reconciles: self.reconciles - before.reconciles,
            seconds: self.seconds - before.seconds,
            writes: self.writes - before.writes,
        }
    }

    /// Per step: reconciles, their mean duration, writes.
    pub fn per_step(&self, steps: usize) -> String {
        format!(
            "{:.1} reconciles of {:.1} ms on average and {:.1} writes per step",
            self.reconciles / steps as f64,
            self.seconds * 1e3 / self.reconciles.max(1.0),
            self.writes / steps as f64
        )
    }
}

/// The DegradationPolicy controller's counters in `operator`'s metrics
/// (zero while it does not answer).
async fn counters(operator: &Operator) -> Counters {
    let text = operator.metrics().await.unwrap_or_default();
    let of = |name: &str| sum_samples(&text, name, CONTROLLER);
    Counters {
        reconciles: of("flashsale_operator_reconcile_duration_seconds_count"),
        seconds: of("flashsale_operator_reconcile_duration_seconds_sum"),
        writes: of("flashsale_operator_writes_total"),
    }
}

/// Fails when `operator` has exited.
fn ensure_running(operator: &Operator) -> anyhow::Result<()> {
    if let Some(status) = operator.exited()? {
        anyhow::bail!(
            "the operator exited with {status}; see {}",
            operator.log.display()
        );
    }
    Ok(())
}

/// Lets go of the policy when the benchmark ends before [`Scene::finish`]:
/// removes the finalizer itself (the operator may be gone) and deletes the
/// policy, so the namespace can be deleted.
struct Release {
    namespace: String,
    armed: bool,
}

impl Drop for Release {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let namespace = self.namespace.clone();
        // The benchmark's runtime may be shutting down: a runtime of its own.
        flashsale_e2e::kube::with_fresh_client(|client| async move {
            let policies: Api<DegradationPolicy> = Api::namespaced(client, &namespace);
            let unfinalized = json!({"metadata": {"finalizers": null}});
            let _ = policies
                .patch(POLICY, &PatchParams::default(), &Patch::Merge(&unfinalized))
                .await;
            let _ = policies.delete(POLICY, &DeleteParams::default()).await;
        });
    }
}

/// The operator, the sale and its policy.
pub struct Scene {
    // Dropped in this order: the policy let go of, then the operator.
    release: Release,
    operator: Operator,
    policies: Api<DegradationPolicy>,
    follower: Follower,
}

/// Two tiers as in the shipped example, a signal that never moves
/// (0.1, below every threshold) read every second.
fn policy() -> serde_json::Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "DegradationPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "saleRef": {"name": SALE},
            "signal": {"query": "vector(0.1)", "interval": "1s"},
            "tiers": [
                {"tier": 1, "enterAbove": 0.80, "exitBelow": 0.70,
                 "switches": {"recommendations": "static", "orderHistory": "last7Days",
                              "voucherPush": "deferred"}},
                {"tier": 2, "enterAbove": 0.95, "exitBelow": 0.85,
                 "switches": {"reviews": "queued", "shopChat": "throttled", "miniGames": "closed"}}
            ],
            "holdDown": "2m",
            "onSignalLoss": {"action": "EnterTier", "tier": 1, "after": "30s"}
        }
    })
}

impl Scene {
    /// Installs the CRDs, creates the sale, starts the operator and creates
    /// the policy; returns once the policy holds tier 0.
    pub async fn start(
        client: &Client,
        namespace: &str,
        operator_bin: &Path,
        bound: Duration,
    ) -> anyhow::Result<Self> {
        eprintln!("installing the CRDs, the sale, the operator and the policy");
        flashsale_e2e::kube::install_crds(client, &flashsale_api::crds(), MANAGER).await?;
        let quota: ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": "no-pods"},
            "spec": {"hard": {"pods": "0"}}
        }))?;
        Api::<ResourceQuota>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &quota)
            .await?;
        create_secret(client, namespace, "jwt", "hs256").await?;
        create_secret(client, namespace, "db", "url").await?;
        // Part 1's writes go: the controller is the ConfigMap's only writer.
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let switches = format!("{SALE}-degradation");
        if maps.get_opt(&switches).await?.is_some() {
            maps.delete(&switches, &DeleteParams::default()).await?;
        }
        let follower = Follower::start(maps, &switches);
        let sale: FlashSale = serde_json::from_value(flashsale_e2e::sales::warming_up(SALE))?;
        Api::<FlashSale>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &sale)
            .await?;
        let prometheus = stack::prometheus_url()?;
        let operator = Launcher::new(operator_bin).start(
            namespace,
            "operator",
            &[
                "--prometheus-url",
                &prometheus,
                "--leader-elect",
                "false",
                "--log-filter",
                "info",
            ],
            &[],
        )?;
        eprintln!(
            "operator pid {} (log {})",
            operator.pid(),
            operator.log.display()
        );
        operator.until_leads().await?;
        let policies: Api<DegradationPolicy> = Api::namespaced(client.clone(), namespace);
        let release = Release {
            namespace: namespace.to_owned(),
            armed: true,
        };
        let policy: DegradationPolicy = serde_json::from_value(policy())?;
        policies.create(&PostParams::default(), &policy).await?;
        let scene = Self {
            release,
            operator,
            policies,
            follower,
        };
        scene.await_status_tier(0, bound).await?;
        scene
            .follower
            .wait_for("the policy's first write", |s| s.generation > 0, bound)
            .await?;
        Ok(scene)
    }

    /// Waits until the policy's status reports `tier`, so a step starts
    /// with the controller done with the one before.
    async fn await_status_tier(&self, tier: i32, bound: Duration) -> anyhow::Result<()> {
        let policies = self.policies.clone();
        poll_until(
            &format!("policy status at tier {tier}"),
            bound,
            Duration::from_millis(20),
            || {
                let policies = policies.clone();
                async move {
                    let policy = policies.get(POLICY).await.map_err(|e| e.to_string())?;
                    let status = policy.status.unwrap_or_default();
                    if status.tier == Some(tier) {
                        Ok(())
                    } else {
                        Err(format!("tier {:?}, {:?}", status.tier, status.observed))
                    }
                }
            },
        )
        .await?;
        Ok(())
    }

    /// `steps` overrides, tier 2 and 0 alternating, each timed until every
    /// gateway of `fleet` reports the tier.
    pub async fn measure(
        &self,
        fleet: &Fleet,
        probe: &Probe,
        steps: usize,
        poll: Duration,
        bound: Duration,
    ) -> anyhow::Result<Measured> {
        // Every gateway holds the policy's tier 0 before the first step.
        all_at_tier(probe, fleet, 0, Instant::now(), bound, poll).await?;
        let pids = fleet.pids();
        let operator = Some(self.operator.pid());
        let mut cpu = Cpu::default();
        let counted = counters(&self.operator).await;
        let mut measured = Vec::with_capacity(steps);
        let mut written = Vec::with_capacity(steps);
        for step in 0..steps {
            let tier = if step % 2 == 0 { 2 } else { 0 };
            let expires = Timestamp::now() + SignedDuration::from_hours(1);
            let patch = json!({"spec": {"override": {
                "tier": tier,
                "reason": format!("benchmark step {step}"),
                "expires": expires.to_string(),
            }}});
            let previous = self.follower.latest().generation;
            let before = CpuMark::take(&pids, operator);
            self.policies
                .patch(POLICY, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let answered = Instant::now();
            // The gateways are asked once the ConfigMap carries the tier, so
            // the polls do not take the CPU from the operator while it works.
            let seen = self
                .follower
                .wait_for(
                    &format!("the ConfigMap at tier {tier}"),
                    |s| s.generation > previous && i64::from(s.tier) == i64::from(tier),
                    bound,
                )
                .await?;
            let took = all_at_tier(probe, fleet, tier, answered, bound, poll).await?;
            cpu.add(&before, &CpuMark::take(&pids, operator));
            measured.push(ms(took));
            written.push(ms(seen.at.saturating_duration_since(answered)));
            self.await_status_tier(tier, bound).await?;
        }
        Ok(Measured {
            gateways: fleet.replicas.len(),
            steps: measured,
            written,
            cpu,
            counters: counters(&self.operator).await.since(counted),
        })
    }

    /// Deletes the policy while the operator still runs, so its finalizer
    /// lifts the degradation and lets go; then stops the operator.
    pub async fn finish(mut self) -> anyhow::Result<()> {
        ensure_running(&self.operator)?;
        self.policies
            .delete(POLICY, &DeleteParams::default())
            .await?;
        let policies = self.policies.clone();
        poll_until(
            "the policy gone",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let policies = policies.clone();
                async move {
                    match policies.get_opt(POLICY).await {
                        Ok(None) => Ok(()),
                        Ok(Some(policy)) => {
                            Err(format!("finalizers {:?}", policy.metadata.finalizers))
                        }
                        Err(err) => Err(err.to_string()),
                    }
                }
            },
        )
        .await?;
        self.release.armed = false;
        Ok(())
    }
}

/// From `since` until every gateway reports `tier`; each gateway is asked on
/// its own every `poll`, and not again once it has.
async fn all_at_tier(
    probe: &Probe,
    fleet: &Fleet,
    tier: i32,
    since: Instant,
    bound: Duration,
    poll: Duration,
) -> anyhow::Result<Duration> {
    let deadline = since + bound;
    let asks = fleet.replicas.iter().map(|replica| async move {
        loop {
            let reading = probe
                .replica_gauges(std::slice::from_ref(replica), TIER_GAUGE)
                .await
                .into_iter()
                .next()
                .map(|(_, reading)| reading);
            if let Some(Ok(Some(value))) = reading
                && value == f64::from(tier)
            {
                return Ok(since.elapsed());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} not at tier {tier} within {bound:?}: {reading:?}",
                replica.0
            );
            tokio::time::sleep(poll).await;
        }
    });
    let times = join_all(asks)
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(times.into_iter().max().unwrap_or_default())
}
