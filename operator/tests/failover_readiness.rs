//! A drill's standby-region readiness on the real components: region A's
//! sale and region B's sale each on the real node in their own namespace,
//! region A's Redis replicated to region B's, and the global endpoint
//! (HAProxy) in front of both gateways. Readiness passes with its numbers,
//! then fails for each reason on a real cause (capacity short, replication
//! paused past its grace, the endpoint seeing B down, the endpoint sending
//! buyers to B while A is Ready, B's sale gone), a
//! shorter pause is reported without flipping it, and a not-ready standby
//! refuses an active run. And a standby in another cluster (the stack's
//! second apiserver) read through a kubeconfig Secret.

mod common;

use std::time::Duration;

use common::real_node::{Scene, TICK, await_ready, create_sale, ended_run, pod_ip, ready_pods};
use flashsale_api::{
    ChaosDrill, FlashSale,
    chaosdrill::{ChaosDrillStatus, FailoverStatus, RunOutcome},
    conditions::STANDBY_READY,
};
use flashsale_e2e::{
    faults::{Outage, exclusive},
    kube::TestNamespace,
    region::{self, Checks, Regions},
    wait::poll_until,
};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

/// How long a readiness change may take to show: a few `checkEvery`s and
/// the endpoint's own checks.
const SEEN: Duration = Duration::from_secs(45);

/// The drill: readiness only, checked every second, against region B's
/// sale `b_ns/sale`, with a constant load of 40 rps per region (so the
/// arithmetic is the test's), region A's Redis and the global endpoint
/// (its statistics at `stats`, buyers' answers at `url`).
fn drill(
    sale: &str,
    b_ns: &str,
    (stats, url): (&str, &str),
    per_gateway: f64,
) -> anyhow::Result<ChaosDrill> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "ChaosDrill",
        "metadata": {"name": "failover"},
        "spec": {
            "saleRef": {"name": sale},
            "schedule": {"cron": "0 0 1 1 *", "timeZone": "UTC"},
            "experiments": [{
                "name": "kill-gateway", "target": "gateway", "duration": "5s",
                "podChaos": {"action": "pod-kill"}
            }],
            "blastRadius": {"maxPercent": 50, "maxPods": 1},
            "sloGuard": {
                "objectives": [{"name": "always", "query": "vector(0)", "threshold": 1}],
                "interval": "250ms", "staleAfter": "10s", "steadyState": "2s"
            },
            "failover": {
                "mode": "ReadinessOnly",
                "maxRTO": "30s",
                "standby": {"namespace": b_ns, "name": sale},
                "capacity": {"perGatewayRPS": per_gateway, "headroom": 1.25, "load": "vector(40)"},
                "replication": [{
                    "name": "inventory",
                    "redisURLSecretRef": {"name": "region-a-redis", "key": "url"},
                    "maxLag": "1s"
                }],
                "endpoint": {"haproxyStatsURL": stats, "server": "sale/region-b", "url": url},
                "checkEvery": "1s",
                "lagGrace": "6s"
            }
        }
    }))?)
}

/// The drill's status once `StandbyReady` is `status` with a reason
/// `reason` accepts.
async fn until_standby(
    drills: &Api<ChaosDrill>,
    status: &str,
    reason: impl Fn(&str) -> bool,
) -> anyhow::Result<ChaosDrillStatus> {
    let reason = &reason;
    Ok(poll_until(
        &format!("StandbyReady={status}"),
        SEEN,
        TICK,
        || async move {
            let drill = drills.get("failover").await.map_err(|e| e.to_string())?;
            let status_now = drill.status.unwrap_or_default();
            match status_now.observed.get(STANDBY_READY) {
                Some(c) if c.status == status && reason(&c.reason) => Ok(status_now),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?)
}

fn check<'a>(
    failover: Option<&'a FailoverStatus>,
    name: &str,
) -> anyhow::Result<&'a flashsale_api::chaosdrill::ReadinessCheck> {
    failover
        .and_then(|f| f.checks.iter().find(|c| c.name == name))
        .ok_or_else(|| anyhow::anyhow!("no {name} check in {failover:?}"))
}

/// Both regions on the real node, the endpoint in front of them, and the
/// drill created.
struct Pair {
    scene: Scene,
    b: TestNamespace,
    _b_operator: common::Operator,
    b_sale: String,
    b_ready: i32,
    drills: Api<ChaosDrill>,
    a_gw: String,
    b_gw: String,
    checks: Checks,
}

impl Pair {
    async fn start() -> anyhow::Result<Self> {
        let regions = Regions::from_env()?;
        let scene = Scene::start("fo-a").await?;
        let client = scene.client.clone();
        // Region B: its own namespace, operator and sale on the real node.
        let b = TestNamespace::create(&client, "fo-b").await?;
        let b_operator = common::real_node::operator(&b.name)?;
        let b_sale = create_sale(&client, &b.name, jiff::SignedDuration::from_hours(1)).await?;
        await_ready(&client, &b.name, &b_sale.name).await?;
        let b_gateways = ready_pods(&client, &b.name, &b_sale.name, "gateway").await?;
        // The global endpoint: A's gateway primary, B's the backup.
        let checks = Checks {
            interval: Duration::from_millis(200),
            fall: 2,
            rise: 2,
            health_port: flashsale_api::children::OPS_PORT_NUMBER,
        };
        let a_gw = format!("{}:8080", pod_ip(&scene.gateways[0])?);
        let b_gw = format!("{}:8080", pod_ip(&b_gateways[0])?);
        region::point_endpoint(&a_gw, &b_gw, checks).await?;
        region::until_answered_by(&regions.endpoint, &scene.ns.name, SEEN).await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &scene.ns.name);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "region-a-redis"},
            "stringData": {"url": regions.a_redis}
        }))?;
        secrets.create(&PostParams::default(), &secret).await?;
        let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &scene.ns.name);
        // 100 rps per gateway covers (40 + 40) × 1.25 = 100 rps with one.
        let endpoint = (regions.endpoint_stats.as_str(), regions.endpoint.as_str());
        let spec = drill(&scene.sale.name, &b.name, endpoint, 100.0)?;
        drills.create(&PostParams::default(), &spec).await?;
        Ok(Self {
            b_ready: i32::try_from(b_gateways.len())?,
            b_sale: b_sale.name,
            scene,
            b,
            _b_operator: b_operator,
            drills,
            a_gw,
            b_gw,
            checks,
        })
    }

    async fn patch(&self, patch: serde_json::Value) -> anyhow::Result<()> {
        self.drills
            .patch("failover", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn until(&self, status: &str, reason: &str) -> anyhow::Result<ChaosDrillStatus> {
        until_standby(&self.drills, status, |r| r == reason).await
    }
}

/// Readiness, checked while nothing moves, holding only while the lag
/// stays under its bound (`spike` true: the standby stays ready the whole
/// time, `aboveSince` is reported, and the lag returns under its bound).
async fn steady_while(drills: &Api<ChaosDrill>, what: &str, above: bool) -> anyhow::Result<String> {
    poll_until(what, SEEN, TICK, || async {
        let drill = drills.get("failover").await.map_err(|e| e.to_string())?;
        let status = drill.status.unwrap_or_default();
        if !status.observed.is_true(STANDBY_READY) {
            return Ok(Err(format!(
                "flipped: {:?}",
                status.observed.get(STANDBY_READY)
            )));
        }
        match check(status.failover.as_ref(), "replication/inventory") {
            Ok(c) if c.above_since.is_some() == above => Ok(Ok(c.message.clone())),
            other => Err(format!("{other:?}")),
        }
    })
    .await?
    .map_err(anyhow::Error::msg)
}

#[tokio::test]
async fn the_standby_is_ready_then_fails_for_each_reason_and_refuses_an_active_run()
-> anyhow::Result<()> {
    let _stack = exclusive().await;
    let mut pair = Pair::start().await?;

    // Ready, each check with its numbers.
    let ready = pair.until("True", "StandbyReady").await?;
    let failover = ready.failover.as_ref();
    let capacity = check(failover, "capacity")?;
    let covered = format!("{} rps", pair.b_ready * 100);
    assert_eq!(capacity.value.as_deref(), Some(covered.as_str()));
    assert_eq!(capacity.bound.as_deref(), Some(">= 100.0 rps"));
    let lag = check(failover, "replication/inventory")?;
    assert!(lag.passed && lag.value.is_some(), "{lag:?}");
    let endpoint = check(failover, "endpoint")?;
    assert!(
        endpoint
            .value
            .as_deref()
            .is_some_and(|v| v.starts_with("UP")),
        "{endpoint:?}"
    );

    // Capacity short: a gateway now carries 10 rps; the edit is checked at once.
    pair.patch(json!({"spec": {"failover": {"capacity": {"perGatewayRPS": 10.0}}}}))
        .await?;
    let short = pair.until("False", "CapacityShort").await?;
    let message = &check(short.failover.as_ref(), "capacity")?.message;
    assert!(message.contains("is short of"), "{message}");
    pair.patch(json!({"spec": {"failover": {"capacity": {"perGatewayRPS": 100.0}}}}))
        .await?;
    pair.until("True", "StandbyReady").await?;

    lags(&mut pair).await?;
    endpoint_down(&pair).await?;
    false_failover(&pair).await?;
    missing_refuses_an_active_run(&pair).await
}

/// A spike under the grace is reported and never flips readiness; a pause
/// past it does, and readiness returns once replication resumes.
async fn lags(pair: &mut Pair) -> anyhow::Result<()> {
    // B's Redis paused just until the lag shows above its bound.
    let paused = Outage::pause("redis-b").await?;
    let seen = steady_while(&pair.drills, "the lag reported above its bound", true).await;
    paused.end().await?;
    let seen = seen?;
    assert!(seen.contains("a spike so far"), "{seen}");
    steady_while(&pair.drills, "the lag back under its bound", false).await?;

    // Paused past the grace, with the operator SIGKILLed and replaced
    // while the lag is above its bound: the next operator counts the
    // grace from when the lag rose, not from its own start.
    let paused = Outage::pause("redis-b").await?;
    let rose = poll_until("the lag above its bound", SEEN, TICK, || async {
        let drill = pair
            .drills
            .get("failover")
            .await
            .map_err(|e| e.to_string())?;
        let status = drill.status.unwrap_or_default();
        let lag =
            check(status.failover.as_ref(), "replication/inventory").map_err(|e| e.to_string())?;
        lag.above_since.clone().ok_or_else(|| lag.message.clone())
    })
    .await;
    let restarted = match rose {
        Ok(rose) => {
            pair.scene.operator.kill();
            pair.scene.operator = common::real_node::operator(&pair.scene.ns.name)?;
            pair.until("False", "ReplicationLagging")
                .await
                .map(|s| (rose, s))
        }
        Err(e) => Err(e.into()),
    };
    paused.end().await?;
    let (rose, lagging) = restarted?;
    let lag = check(lagging.failover.as_ref(), "replication/inventory")?;
    assert!(lag.message.contains("above its bound"), "{}", lag.message);
    assert_eq!(lag.above_since.as_ref(), Some(&rose), "{}", lag.message);
    pair.until("True", "StandbyReady").await?;
    Ok(())
}

/// The endpoint sees B down (its server pointed where nothing answers),
/// then up again.
async fn endpoint_down(pair: &Pair) -> anyhow::Result<()> {
    region::point_endpoint(&pair.a_gw, "127.0.0.1:9", pair.checks).await?;
    let down = pair.until("False", "EndpointStandbyDown").await?;
    let endpoint = check(down.failover.as_ref(), "endpoint")?;
    assert!(
        endpoint
            .value
            .as_deref()
            .is_some_and(|v| v.starts_with("DOWN")),
        "{endpoint:?}"
    );
    region::point_endpoint(&pair.a_gw, &pair.b_gw, pair.checks).await?;
    pair.until("True", "StandbyReady").await?;
    Ok(())
}

/// A false failover as users would see it: with A's server where nothing
/// answers, answers come from B's gateways (the region they stamp) while
/// A's sale is Ready, which the drill reports; then from A's again once it
/// is back, and the standby is ready again.
async fn false_failover(pair: &Pair) -> anyhow::Result<()> {
    let endpoint = Regions::from_env()?.endpoint;
    region::point_endpoint("127.0.0.1:9", &pair.b_gw, pair.checks).await?;
    region::until_answered_by(&endpoint, &pair.b.name, SEEN).await?;
    let status = pair.until("False", "FalseFailover").await?;
    let serving = check(status.failover.as_ref(), "serving")?;
    assert_eq!(serving.value.as_deref(), Some(pair.b.name.as_str()));
    assert_eq!(serving.bound.as_deref(), Some(pair.scene.ns.name.as_str()));
    assert!(
        serving.message.contains("a false failover"),
        "{}",
        serving.message
    );
    region::point_endpoint(&pair.a_gw, &pair.b_gw, pair.checks).await?;
    region::until_answered_by(&endpoint, &pair.scene.ns.name, SEEN).await?;
    pair.until("True", "StandbyReady").await?;
    Ok(())
}

/// An active drill checked rarely (every 10m) and ready; B's sale then
/// deleted. The status still says ready (not due), yet the run asked for
/// next is refused: readiness is checked afresh when a run is due, and the
/// run is skipped with that reason, nothing injected.
async fn missing_refuses_an_active_run(pair: &Pair) -> anyhow::Result<()> {
    pair.patch(json!({"spec": {"failover": {"mode": "Active", "checkEvery": "10m"}}}))
        .await?;
    // Ready as checked after the edit (the status describes this generation).
    let ready = poll_until("ready after the edit", SEEN, TICK, || async {
        let drill = pair
            .drills
            .get("failover")
            .await
            .map_err(|e| e.to_string())?;
        let status = drill.status.clone().unwrap_or_default();
        let current = status.observed.observed_generation == drill.metadata.generation;
        if current && status.observed.is_true(STANDBY_READY) {
            Ok(status)
        } else {
            Err(format!("{:?}", status.observed))
        }
    })
    .await?;
    let b_sales: Api<FlashSale> = Api::namespaced(pair.scene.client.clone(), &pair.b.name);
    b_sales
        .delete(&pair.b_sale, &DeleteParams::default())
        .await?;
    let stale = pair
        .drills
        .get("failover")
        .await?
        .status
        .unwrap_or_default();
    assert!(
        stale.observed.is_true(STANDBY_READY),
        "{:?}",
        stale.observed
    );
    assert_eq!(
        stale.failover, ready.failover,
        "checked again before it was due"
    );
    pair.patch(json!({"metadata": {"annotations": {"flashsale.dev/run-now": "active-1"}}}))
        .await?;
    let refused = ended_run(&pair.drills, "failover").await?;
    assert_eq!(refused.outcome, Some(RunOutcome::Skipped), "{refused:?}");
    assert_eq!(
        refused.reason.as_deref(),
        Some("StandbyMissing"),
        "{refused:?}"
    );
    assert!(refused.objects.is_empty(), "{refused:?}");
    let message = refused.message.unwrap_or_default();
    assert!(
        message.contains("not ready for an active failover"),
        "{message}"
    );
    pair.until("False", "StandbyMissing").await?;
    Ok(())
}

/// A drill whose only check is the standby `ns/real` in the cluster of the
/// kubeconfig in Secret `region-b/kubeconfig`.
fn remote_drill(ns: &str) -> anyhow::Result<ChaosDrill> {
    let nowhere = ("http://127.0.0.1:9/;csv", "http://127.0.0.1:9");
    let mut drill = drill("real", ns, nowhere, 100.0)?;
    if let Some(failover) = drill.spec.failover.as_mut() {
        failover.capacity = None;
        failover.replication.clear();
        failover.endpoint = None;
        failover.standby.kubeconfig_secret_ref = Some(flashsale_api::common::SecretKeyRef {
            name: "region-b".into(),
            key: "kubeconfig".into(),
        });
    }
    Ok(drill)
}

#[tokio::test]
async fn a_standby_in_another_cluster_is_read_through_its_kubeconfig() -> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    let client = common::setup().await?;
    let a = TestNamespace::create(&client, "fo-remote-a").await?;
    let _a_operator = common::Operator::start(&a.name, "failover", &[])?;
    // Region B's cluster: its own apiserver, its own operator.
    let kubeconfig = std::fs::read_to_string(&regions.b_kubeconfig)?;
    let b_client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?,
    )?;
    let b_ns = flashsale_e2e::stack::unique_name("fo-remote-b");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(b_client.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": b_ns}}))?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &a.name);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "region-b"},
        "stringData": {"kubeconfig": kubeconfig}
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &a.name);
    drills
        .create(&PostParams::default(), &remote_drill(&b_ns)?)
        .await?;

    // Nothing in B yet (nor anywhere in A's cluster under that name).
    let missing = until_standby(&drills, "False", |r| r == "StandbyMissing").await?;
    let message = &check(missing.failover.as_ref(), "standby")?.message;
    assert!(message.contains("it does not exist"), "{message}");

    // B's sale, reconciled by B's operator: a cluster without nodes runs no
    // pod, so B's operator says it is not Ready, and the drill says why.
    let flags = common::real_node::operator_flags()?;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let env = [("KUBECONFIG", regions.b_kubeconfig.as_str())];
    let _b_operator = common::Operator::start_with_env(&b_ns, "region-b", &flags, &env)?;
    create_sale(&b_client, &b_ns, jiff::SignedDuration::from_hours(1)).await?;
    let b_sales: Api<FlashSale> = Api::namespaced(b_client.clone(), &b_ns);
    let b_reason = poll_until("B's operator's verdict on its sale", SEEN, TICK, || async {
        let sale = b_sales.get("real").await.map_err(|e| e.to_string())?;
        let status = sale.status.unwrap_or_default();
        match status.observed.get(flashsale_api::conditions::READY) {
            Some(ready) if ready.status == "False" => Ok(ready.reason.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let b_reason = &b_reason;
    poll_until("the drill quoting B's verdict", SEEN, TICK, || async {
        let drill = drills.get("failover").await.map_err(|e| e.to_string())?;
        let status = drill.status.unwrap_or_default();
        let ready = status.observed.get(STANDBY_READY);
        let message = check(status.failover.as_ref(), "standby").map_err(|e| e.to_string())?;
        match ready {
            Some(c) if c.reason == "StandbyNotReady" && message.message.contains(b_reason) => {
                Ok(())
            }
            other => Err(format!("{other:?}: {}", message.message)),
        }
    })
    .await?;

    // A kubeconfig that is not one: the standby cannot be reached, and says so.
    let patch = json!({"stringData": {"kubeconfig": "not: [a kubeconfig"}});
    secrets
        .patch("region-b", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let unreadable = until_standby(&drills, "False", |r| r == "StandbyMissing").await?;
    let message = &check(unreadable.failover.as_ref(), "standby")?.message;
    assert!(
        message.contains("the kubeconfig in Secret region-b"),
        "{message}"
    );
    namespaces
        .delete(&b_ns, &DeleteParams::background())
        .await?;
    Ok(())
}
