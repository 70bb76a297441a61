//! A ChaosDrill's world for the operator's tests and benchmarks: a namespace
//! with a sale whose gateway pods are bare pods on kwok nodes (as many as
//! asked), a gauge the drill's SLO guard reads through the real Prometheus,
//! the operator, and the real Chaos Mesh controller of the stack.
//!
//! The operator runs with the rights the Helm chart gives it in namespaced
//! mode (its Role, through a ServiceAccount token), never as admin, so
//! every stop driven here (abort, end of run, kill switch, deletion,
//! takeover) is proven under the chart's RBAC.

use std::{collections::BTreeSet, time::Duration};

use flashsale_api::{
    ChaosDrill, FlashSale, chaosdrill::ChaosDrillStatus, chaosdrill::DrillPhase,
    chaosdrill::RunRecord,
};
use flashsale_observe::{pods, signal::Reading, signal::SignalReader};
use futures::{StreamExt, TryStreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use crate::{
    chart::{self, KubeconfigFile},
    exporter::{Exporter, SCRAPE_TIME},
    kube::TestNamespace,
    operator::{Launcher, Operator, setup},
    stack,
    wait::poll_until,
};

/// The sale every drill here targets.
pub const SALE: &str = "d11";
/// The objective's threshold: the gauge breaches above it.
pub const THRESHOLD: f64 = 0.5;

/// A pod's name out of a run's `namespace/pod` target.
pub fn pod_of(target: &str) -> &str {
    target.rsplit('/').next().unwrap_or_default()
}

/// The name of the first pod a run targeted.
pub fn first_target(run: &RunRecord) -> anyhow::Result<String> {
    run.targets
        .first()
        .map(|t| pod_of(t).to_owned())
        .ok_or_else(|| anyhow::anyhow!("no target in {run:?}"))
}

/// One test's world.
pub struct DrillScene {
    /// See the type.
    pub client: Client,
    /// See the type.
    pub ns: TestNamespace,
    /// See the type.
    pub exporter: Exporter,
    /// See the type.
    pub operator: Operator,
    /// The stack's Prometheus.
    pub prometheus: String,
    /// The chart's ServiceAccount, as the operators here run.
    kubeconfig: KubeconfigFile,
    /// How the scene's operators start.
    launcher: Launcher,
}

impl DrillScene {
    /// A namespace, a sale with no pods of its own, a gauge at `initial`
    /// that Prometheus already scraped, and an operator of `launcher` with
    /// `extra` flags.
    pub async fn start(
        launcher: &Launcher,
        prefix: &str,
        initial: f64,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let client = setup().await?;
        let ns = TestNamespace::create(&client, prefix).await?;
        let exporter = Exporter::start(initial, SCRAPE_TIME).await?;
        let prometheus = stack::prometheus_url()?;
        until_scraped(&prometheus, &exporter.query(), initial).await?;
        let kubeconfig = chart::install(&client, &ns.name, |_| {}).await?;
        let mut flags = vec!["--prometheus-url", prometheus.as_str()];
        flags.extend_from_slice(extra);
        let operator = launcher.start(
            &ns.name,
            "one",
            &flags,
            &[("KUBECONFIG", &kubeconfig.env())],
        )?;
        let mut sale = crate::sales::warming_up(SALE);
        for workload in ["gateway", "inventory", "orderWriter"] {
            sale["spec"][workload]["replicas"] = json!(0);
        }
        let sale: FlashSale = serde_json::from_value(sale)?;
        Api::<FlashSale>::namespaced(client.clone(), &ns.name)
            .create(&PostParams::default(), &sale)
            .await?;
        Ok(Self {
            client,
            ns,
            exporter,
            operator,
            prometheus,
            kubeconfig,
            launcher: launcher.clone(),
        })
    }

    /// Starts another operator for the namespace (a standby, or the one
    /// after a crash), with the chart's rights.
    pub fn another_operator(&self, identity: &str) -> anyhow::Result<Operator> {
        self.launcher.start(
            &self.ns.name,
            identity,
            &["--prometheus-url", &self.prometheus],
            &[("KUBECONFIG", &self.kubeconfig.env())],
        )
    }

    /// `count` gateway pods of the sale on kwok nodes, Ready; their names.
    pub async fn gateway_pods(&self, count: usize) -> anyhow::Result<BTreeSet<String>> {
        let names: Vec<String> = (0..count).map(|i| format!("gateway-{i:04}")).collect();
        self.add_gateway_pods(&names, true).await
    }

    /// Gateway pods named `names` on kwok nodes, with the labels the
    /// operator gives its pods; `owned`: the sale is their controller (a pod
    /// that only copies the labels is not). Waits until they are Ready and
    /// returns the names of every Ready pod.
    pub async fn add_gateway_pods(
        &self,
        names: &[String],
        owned: bool,
    ) -> anyhow::Result<BTreeSet<String>> {
        // A drill targets only pods whose owners lead to the sale.
        let sale = Api::<FlashSale>::namespaced(self.client.clone(), &self.ns.name)
            .get(SALE)
            .await?;
        let owners = if owned {
            json!([{
                "apiVersion": "flashsale.dev/v1alpha1",
                "kind": "FlashSale",
                "name": SALE,
                "uid": sale.uid(),
                "controller": true,
            }])
        } else {
            json!([])
        };
        let metadata = json!({
            "labels": {
                "app.kubernetes.io/part-of": SALE,
                "app.kubernetes.io/component": "gateway",
                "app.kubernetes.io/managed-by": "flashsale-operator",
            },
            "ownerReferences": owners,
        });
        create_kwok_pods(&self.pods(), names, &metadata, ("gateway", "gateway:drill")).await?;
        let wanted: BTreeSet<String> = names.iter().cloned().collect();
        poll_until(
            &format!("{} gateway pods Ready", names.len()),
            Duration::from_secs(120),
            Duration::from_millis(250),
            || async {
                let ready = self.ready_pods().await.map_err(|e| e.to_string())?;
                let missing = wanted.difference(&ready).count();
                if missing == 0 {
                    Ok(ready)
                } else {
                    Err(format!("{missing} of {} not ready", wanted.len()))
                }
            },
        )
        .await
        .map_err(Into::into)
    }

    /// The namespace's pods.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    /// The names of the pods that exist and are Ready.
    pub async fn ready_pods(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(self
            .pods()
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none() && pods::is_ready(pod))
            .map(ResourceExt::name_any)
            .collect())
    }

    /// The names of the pods that exist (whatever their state).
    pub async fn pod_names(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(self
            .pods()
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect())
    }

    /// The namespace's drills.
    pub fn drills(&self) -> Api<ChaosDrill> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    /// Creates the drill `object`.
    pub async fn create(&self, object: Value) -> anyhow::Result<()> {
        let drill: ChaosDrill = serde_json::from_value(object)?;
        self.drills().create(&PostParams::default(), &drill).await?;
        Ok(())
    }

    /// Asks for a run of `name` now, as the kubectl plugin will; `force`
    /// lifts the windows with a reason.
    pub async fn run_now(
        &self,
        name: &str,
        request: &str,
        force: Option<&str>,
    ) -> anyhow::Result<()> {
        let mut annotations = json!({"flashsale.dev/run-now": request});
        if let Some(reason) = force {
            annotations["flashsale.dev/force-reason"] = json!(reason);
        }
        self.drills()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await?;
        Ok(())
    }

    /// The drill's status once `done` holds.
    pub async fn until_status(
        &self,
        name: &str,
        what: &str,
        deadline: Duration,
        done: impl Fn(&ChaosDrillStatus) -> bool,
    ) -> anyhow::Result<ChaosDrillStatus> {
        let drills = self.drills();
        poll_until(what, deadline, Duration::from_millis(50), || {
            let (drills, done) = (&drills, &done);
            async move {
                let drill = drills.get(name).await.map_err(|e| e.to_string())?;
                let status = drill.status.unwrap_or_default();
                if done(&status) {
                    Ok(status)
                } else {
                    Err(format!("{status:?}"))
                }
            }
        })
        .await
        .map_err(Into::into)
    }

    /// The run in progress once its experiments are injected.
    pub async fn until_injected(&self, name: &str) -> anyhow::Result<RunRecord> {
        let status = self
            .until_status(name, "the run injected", Duration::from_secs(60), |s| {
                s.current_run
                    .as_ref()
                    .is_some_and(|r| r.injected_at.is_some())
            })
            .await?;
        status
            .current_run
            .ok_or_else(|| anyhow::anyhow!("no current run"))
    }

    /// The finished run with id `run` once there is one (or the newest,
    /// when `run` is `None`).
    pub async fn until_ended(
        &self,
        name: &str,
        run: Option<&str>,
        deadline: Duration,
    ) -> anyhow::Result<RunRecord> {
        // The run asked for may already sit below a later record (a request
        // refused right after it), so it is looked for anywhere.
        let wanted = |r: &RunRecord| run.is_none_or(|id| r.id == id);
        let status = self
            .until_status(name, "the run ended", deadline, |s| {
                s.history.iter().any(wanted)
            })
            .await?;
        status
            .history
            .into_iter()
            .find(wanted)
            .ok_or_else(|| anyhow::anyhow!("no history"))
    }

    /// The namespace's objects of `resource` (a Chaos Mesh kind, say) that
    /// `selector` selects.
    pub async fn objects(
        &self,
        resource: &ApiResource,
        selector: &str,
    ) -> anyhow::Result<Vec<DynamicObject>> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns.name, resource);
        Ok(api
            .list(&ListParams::default().labels(selector))
            .await?
            .items)
    }

    /// Injects a minute-long pod-failure on one of four pods with the drill
    /// `name` and returns the run and its target.
    pub async fn failing_one_pod(&self, name: &str) -> anyhow::Result<(RunRecord, String)> {
        self.gateway_pods(4).await?;
        self.create(drill(
            name,
            &self.exporter.query(),
            pod_failure("60s"),
            (25.0, 1),
        ))
        .await?;
        self.run_now(name, "r1", None).await?;
        let run = self.until_injected(name).await?;
        let target = first_target(&run)?;
        // Chaos Mesh swapped the target's image for its pause image.
        self.until_image(&target, false).await?;
        Ok((run, target))
    }

    /// Waits until Chaos Mesh restored the target's image.
    pub async fn until_restored(&self, target: &str) -> anyhow::Result<()> {
        self.until_image(target, true).await
    }

    /// Waits until the target runs its own image (`restored`) or Chaos
    /// Mesh's pause image (not `restored`).
    async fn until_image(&self, target: &str, restored: bool) -> anyhow::Result<()> {
        let pods = self.pods();
        let what = if restored {
            "the target recovered"
        } else {
            "the target failed by Chaos Mesh"
        };
        poll_until(
            what,
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async {
                let image = image(&pods, target).await.map_err(|e| e.to_string())?;
                if (image == "gateway:drill") == restored {
                    Ok(())
                } else {
                    Err(image)
                }
            },
        )
        .await
        .map_err(Into::into)
    }

    /// Turns the namespace's kill switch on or off.
    pub async fn kill_switch(&self, on: bool) -> anyhow::Result<()> {
        let value = if on { json!("true") } else { Value::Null };
        Api::<Namespace>::all(self.client.clone())
            .patch(
                &self.ns.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "flashsale.dev/chaos-kill-switch": value}}})),
            )
            .await?;
        Ok(())
    }

    /// Merge-patches the drill `name` with `patch`, as it is (not through
    /// the Rust type, so a test can write what the type would refuse).
    pub async fn patch_drill(&self, name: &str, patch: Value) -> anyhow::Result<()> {
        let resource = kube::api::ApiResource::erase::<ChaosDrill>(&());
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.ns.name, &resource);
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }

    /// The run in progress once it is in steady state (nothing injected
    /// yet).
    pub async fn until_steady_state(&self, name: &str) -> anyhow::Result<RunRecord> {
        let status = self
            .until_status(
                name,
                "a run in steady state",
                Duration::from_secs(30),
                |s| s.phase == Some(DrillPhase::SteadyState) && s.current_run.is_some(),
            )
            .await?;
        status
            .current_run
            .ok_or_else(|| anyhow::anyhow!("no current run"))
    }

    /// GET the operator's guard endpoint for `drill`'s run `run`: the
    /// status code.
    pub async fn guard(&self, drill: &str, run: &str) -> anyhow::Result<u16> {
        let url = format!(
            "http://{}/guard/{}/{drill}/{run}",
            self.operator.ops, self.ns.name
        );
        Ok(reqwest::get(url).await?.status().as_u16())
    }
}

/// Waits until Prometheus answers `query` with `value`.
pub async fn until_scraped(prometheus: &str, query: &str, value: f64) -> anyhow::Result<()> {
    let reader = SignalReader::new()?;
    poll_until(
        "the exporter scraped",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let reader = &reader;
            async move {
                match reader
                    .read(
                        prometheus,
                        query,
                        Duration::from_secs(1),
                        Duration::from_secs(30),
                        Timestamp::now(),
                    )
                    .await
                {
                    Reading::Value(sample) if sample.value == value => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .map_err(Into::into)
}

/// A drill of `experiment` on the sale's gateways under `radius`
/// (`maxPercent`, `maxPods`), guarded by the scene's gauge (every 250 ms,
/// blind after 2 s, steady for 1 s), scheduled never (runs come from
/// run-now requests).
pub fn drill(name: &str, query: &str, experiment: Value, radius: (f64, i32)) -> Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "ChaosDrill",
        "metadata": {"name": name},
        "spec": {
            "saleRef": {"name": SALE},
            "schedule": {"cron": "0 0 1 1 *", "timeZone": "UTC"},
            "experiments": [experiment],
            "blastRadius": {"maxPercent": radius.0, "maxPods": radius.1},
            "sloGuard": {
                "objectives": [{"name": "error-rate", "query": query, "threshold": THRESHOLD}],
                "interval": "250ms",
                "staleAfter": "2s",
                "steadyState": "1s",
            },
        }
    })
}

/// A pod-kill of the gateway (one-shot) lasting `duration`.
pub fn pod_kill(duration: &str) -> Value {
    json!({"name": "kill", "target": "gateway", "duration": duration, "podChaos": {"action": "pod-kill"}})
}

/// A pod-failure of the gateway lasting `duration` (the fault stays until
/// then, or until the run stops it).
pub fn pod_failure(duration: &str) -> Value {
    json!({"name": "fail", "target": "gateway", "duration": duration, "podChaos": {"action": "pod-failure"}})
}

/// The image a pod's gateway container runs (Chaos Mesh's pod-failure
/// swaps it for a pause image).
pub async fn image(pods: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    let pod = pods.get(name).await?;
    Ok(pod
        .spec
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .unwrap_or_default())
}

/// Creates bare pods named `names` in the namespace of `pods`, bound
/// round-robin to the stack's kwok nodes (a thousand pods need no
/// scheduler), each with `metadata` (labels, owners; the name is set here)
/// and one container `(name, image)`; 32 creates in flight.
pub async fn create_kwok_pods(
    pods: &Api<Pod>,
    names: &[String],
    metadata: &Value,
    (container, image): (&str, &str),
) -> anyhow::Result<()> {
    let nodes: Vec<String> = Api::<Node>::all(pods.clone().into_client())
        .list(&ListParams::default().labels("type=kwok"))
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    anyhow::ensure!(!nodes.is_empty(), "no kwok node");
    stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let mut metadata = metadata.clone();
            metadata["name"] = json!(name);
            let pod: Result<Pod, _> = serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "spec": {
                    "nodeName": nodes[i % nodes.len()],
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": container, "image": image}],
                },
            }));
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &pod?)
                    .await
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}
