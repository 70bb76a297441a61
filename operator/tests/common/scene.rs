//! A DegradationPolicy's world for the controller's tests: a namespace with
//! a sale, a gauge the policy reads through the real Prometheus, the
//! operator, and a record of every switches state the gateways would see.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use flashsale_api::{DegradationPolicy, FlashSale, degradation::DegradationPolicyStatus};
use flashsale_degradation::Degradation;
use flashsale_e2e::{
    kube::{TestNamespace, with_fresh_client},
    stack,
    wait::poll_until,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    Operator,
    exporter::{Exporter, SCRAPE_TIME},
    setup,
};

pub const SALE: &str = "d11";
pub const POLICY: &str = "tiers";
pub const SWITCHES: &str = "d11-degradation";
/// The hold-down of every policy here: long enough to tell "after the
/// hold-down" from "at once" across a 1 s scrape interval.
pub const HOLD_DOWN: Duration = Duration::from_secs(3);

/// Two tiers as in the shipped example (enter 0.80/0.95, exit 0.70/0.85),
/// evaluated every 250 ms; on signal loss, tier `loss_tier` after 2 s.
pub fn policy(name: &str, sale: &str, query: &str, loss_tier: i32) -> Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "DegradationPolicy",
        "metadata": {"name": name},
        "spec": {
            "saleRef": {"name": sale},
            "signal": {"query": query, "interval": "250ms", "timeout": "1s", "staleAfter": "5s"},
            "tiers": [
                {"tier": 1, "enterAbove": 0.80, "exitBelow": 0.70,
                 "switches": {"recommendations": "static", "orderHistory": "last7Days"}},
                {"tier": 2, "enterAbove": 0.95, "exitBelow": 0.85,
                 "switches": {"reviews": "queued", "miniGames": "closed"}}
            ],
            "holdDown": format!("{}s", HOLD_DOWN.as_secs()),
            "onSignalLoss": {"action": "EnterTier", "tier": loss_tier, "after": "2s"}
        }
    })
}

/// Every state the switches ConfigMap went through, as the gateways see it.
pub type Log = Arc<Mutex<Vec<(Degradation, Instant)>>>;

/// One test's world: a namespace, its sale, an exporter the policy reads,
/// the operator, and a record of every switches state written.
pub struct Scene {
    /// See the type.
    pub client: Client,
    /// See the type.
    pub ns: TestNamespace,
    /// See the type.
    pub exporter: Exporter,
    /// See the type.
    pub operator: Operator,
    /// See the type.
    pub log: Log,
}

impl Scene {
    pub async fn start(prefix: &str, initial: f64) -> anyhow::Result<Self> {
        let client = setup().await?;
        let ns = TestNamespace::create(&client, prefix).await?;
        let exporter = Exporter::start(initial, SCRAPE_TIME).await?;
        let prometheus = stack::prometheus_url()?;
        // Policies start from a signal Prometheus already has: before its
        // first scrape the query is empty, a lost signal.
        super::drill::until_scraped(&prometheus, &exporter.query(), initial).await?;
        let operator = Operator::start(&ns.name, "solo", &["--prometheus-url", &prometheus])?;
        let sale: FlashSale = serde_json::from_value(flashsale_e2e::sales::warming_up(SALE))?;
        Api::<FlashSale>::namespaced(client.clone(), &ns.name)
            .create(&PostParams::default(), &sale)
            .await?;
        let log = record(&client, &ns.name);
        Ok(Self {
            client,
            ns,
            exporter,
            operator,
            log,
        })
    }

    pub fn policies(&self) -> Api<DegradationPolicy> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    pub async fn create_policy(&self, object: Value) -> anyhow::Result<()> {
        let policy: DegradationPolicy = serde_json::from_value(object)?;
        self.policies()
            .create(&PostParams::default(), &policy)
            .await?;
        Ok(())
    }

    /// Waits until the switches ConfigMap holds `tier`; returns when the
    /// record first saw it.
    pub async fn until_switches(&self, tier: u32, deadline: Duration) -> anyhow::Result<Instant> {
        let log = self.log.clone();
        Ok(poll_until(
            &format!("the switches at tier {tier}"),
            deadline,
            Duration::from_millis(20),
            || {
                let log = log.clone();
                async move {
                    let log = log.lock().map_err(|e| e.to_string())?;
                    match log.last() {
                        Some((state, at)) if state.tier == tier => Ok(*at),
                        other => Err(format!(
                            "last: {:?}",
                            other.map(|(s, _)| (s.tier, &s.reason))
                        )),
                    }
                }
            },
        )
        .await?)
    }

    /// Waits until the switches ConfigMap holds `tier` and a policy's
    /// status says so too; returns when the record first saw the switches.
    pub async fn until_tier(&self, tier: u32, deadline: Duration) -> anyhow::Result<Instant> {
        let log = self.log.clone();
        let policies = self.policies();
        Ok(poll_until(
            &format!("the switches at tier {tier}"),
            deadline,
            Duration::from_millis(20),
            || {
                let (log, policies) = (log.clone(), policies.clone());
                async move {
                    let at = {
                        let log = log.lock().map_err(|e| e.to_string())?;
                        match log.last() {
                            Some((state, at)) if state.tier == tier => *at,
                            other => {
                                return Err(format!(
                                    "last: {:?}",
                                    other.map(|(s, _)| (s.tier, &s.reason))
                                ));
                            }
                        }
                    };
                    let statuses = policies
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    let reported = statuses
                        .items
                        .iter()
                        .filter_map(|p| p.status.as_ref()?.tier)
                        .any(|t| u32::try_from(t).ok() == Some(tier));
                    reported
                        .then_some(at)
                        .ok_or_else(|| "not in the status yet".to_owned())
                }
            },
        )
        .await?)
    }

    /// Waits until policy `name` is `Ready=False`; returns the reason and
    /// the message.
    pub async fn until_refused(&self, name: &str) -> anyhow::Result<(String, String)> {
        let policies = self.policies();
        Ok(poll_until(
            &format!("{name} Ready=False"),
            Duration::from_secs(20),
            Duration::from_millis(100),
            || {
                let policies = policies.clone();
                async move {
                    let policy = policies.get(name).await.map_err(|e| e.to_string())?;
                    let ready = policy.status.and_then(|s| s.observed.get("Ready").cloned());
                    match ready {
                        Some(c) if c.status == "False" => Ok((c.reason, c.message)),
                        other => Err(format!("{other:?}")),
                    }
                }
            },
        )
        .await?)
    }

    pub async fn status(&self, name: &str) -> anyhow::Result<DegradationPolicyStatus> {
        Ok(self.policies().get(name).await?.status.unwrap_or_default())
    }

    /// The tiers the switches went through, in order, repeats folded.
    pub fn tiers(&self) -> Vec<u32> {
        let log = self.log.lock().map(|l| l.clone()).unwrap_or_default();
        let mut tiers: Vec<u32> = log.iter().map(|(s, _)| s.tier).collect();
        tiers.dedup();
        tiers
    }

    /// Deletes the policy while the operator still runs, so its finalizer
    /// is released and the namespace can go.
    pub async fn finish(&self, name: &str) -> anyhow::Result<()> {
        self.policies()
            .delete(name, &DeleteParams::default())
            .await?;
        let policies = self.policies();
        poll_until(
            "the policy gone",
            Duration::from_secs(20),
            Duration::from_millis(100),
            || {
                let policies = policies.clone();
                async move {
                    match policies.get_opt(name).await {
                        Ok(None) => Ok(()),
                        other => Err(format!(
                            "{:?}",
                            other.map(|p| p.map(|p| p.metadata.finalizers))
                        )),
                    }
                }
            },
        )
        .await?;
        Ok(())
    }
}

impl Drop for Scene {
    /// A test that failed before [`Scene::finish`] leaves policies whose
    /// finalizer no operator will release: drop it, so the namespace can go.
    fn drop(&mut self) {
        let namespace = self.ns.name.clone();
        with_fresh_client(|client| async move {
            let policies: Api<DegradationPolicy> = Api::namespaced(client, &namespace);
            let Ok(list) = policies.list(&ListParams::default()).await else {
                return;
            };
            let patch = json!({"metadata": {"finalizers": null}});
            for name in list.items.into_iter().filter_map(|p| p.metadata.name) {
                let _ = policies
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
        });
    }
}

/// Records every state of the switches ConfigMap, with when it arrived.
pub fn record(client: &Client, namespace: &str) -> Log {
    let log: Log = Arc::default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={SWITCHES}"));
    let sink = log.clone();
    tokio::spawn(async move {
        let mut maps = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(map)) = maps.next().await {
            if let Ok(state) = Degradation::from_data(&map.data.unwrap_or_default())
                && let Ok(mut log) = sink.lock()
                && log
                    .last()
                    .is_none_or(|(last, _)| last.generation != state.generation)
            {
                log.push((state, Instant::now()));
            }
        }
    });
    log
}

/// The notes of the namespace's Events of `reason`, once there is one or
/// after 10 s (then none): an Event is written after the status a test
/// waits for, so it may still be on its way when the status shows.
pub async fn events(client: &Client, ns: &str, reason: &str) -> anyhow::Result<Vec<String>> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let list = Api::<Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await?;
        let notes: Vec<String> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.message.unwrap_or_default())
            .collect();
        if !notes.is_empty() || Instant::now() >= until {
            return Ok(notes);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
