//! A drill's standby-region readiness on the real components: region A's
//! sale and region B's sale each on the real node in their own namespace,
//! region A's Redis replicated to region B's, and the global endpoint
//! (HAProxy) in front of both gateways. Readiness passes with its numbers,
//! then fails for each reason on a real cause (capacity short, replication
//! paused past its grace, the endpoint seeing B down, the endpoint sending
//! buyers to B while A is Ready, B's sale gone, a standby of another sale
//! id), a
//! shorter pause is reported without flipping it, and a not-ready standby
//! refuses an active run. An active run fails buyers over to B by failing
//! every A gateway through Chaos Mesh, measures the RTO (checked against
//! the test's own view of the endpoint) and the failback, hands B's Redis
//! back with every unit B sold reserved in A's (checked by the test from
//! both databases and A's Redis), and is aborted past its maxRTO; the kill
//! switch and an operator SIGKILLed mid-failover both leave A serving
//! buyers again with A's Redis primary. And a standby in another cluster
//! (the stack's second apiserver) read through a kubeconfig Secret.

mod common;

use std::{collections::BTreeSet, time::Duration};

use common::real_node::{
    SaleStores, Scene, TICK, await_ready, create_sale, create_standby_sale, ended_run, pod_ip,
    ready_pods,
};
use flashsale_api::{
    ChaosDrill, FlashSale,
    chaosdrill::{ChaosDrillStatus, DrillPhase, FailoverStatus, RunOutcome, RunRecord},
    conditions::STANDBY_READY,
};
use flashsale_e2e::{
    faults::{Outage, exclusive},
    kube::TestNamespace,
    region::{self, Checks, Regions},
    stack::unique_name,
    wait::poll_until,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

/// How long a readiness change may take to show: a few `checkEvery`s and
/// the endpoint's own checks.
const SEEN: Duration = Duration::from_secs(45);

/// How long A's gateways may take to serve again after a fault: the
/// kubelet backs off restarting a container that restarted recently, and
/// each pod-failure restarts it twice.
const BACK: Duration = common::real_node::START;

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
                    "promoteRedisURLSecretRef": {"name": "region-b-redis", "key": "url"},
                    "maxLag": "1s"
                }],
                "endpoint": {"haproxyStatsURL": stats, "server": "sale/region-b", "url": url},
                "orders": {
                    "primaryDatabaseURLSecretRef": {"name": "region-a-db", "key": "url"},
                    "standbyDatabaseURLSecretRef": {"name": "region-b-db", "key": "url"}
                },
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

/// Which stores the regions' sales keep their stock and orders in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stock {
    /// Both in the stack's stores: region B's Redis is replicated, and
    /// paused by the readiness test, but no sale's.
    Shared,
    /// Each region in its own (`flashsale-region-<a|b>`'s `stores`):
    /// region A's stock in its Redis of the pair, region B's in its
    /// replica, which B's inventory stands by on until a run promotes it;
    /// A's orders in the stack's Kafka and PostgreSQL, B's in kafka-b,
    /// which MirrorMaker feeds A's orders topic into, and postgres-b.
    Replicated,
}

/// Both regions on the real node, the endpoint in front of them, and the
/// drill created.
struct Pair {
    scene: Scene,
    b: TestNamespace,
    _b_operator: common::Operator,
    b_sale: String,
    b_ready: i32,
    /// The sale id both regions' FlashSales share.
    sale_id: String,
    drills: Api<ChaosDrill>,
    a_gw: String,
    b_gw: String,
    checks: Checks,
}

impl Pair {
    async fn start(stock: Stock) -> anyhow::Result<Self> {
        let regions = Regions::from_env()?;
        let (a_stores, b_stores, databases) = match stock {
            Stock::Shared => {
                let db = flashsale_e2e::stack::postgres_url()?;
                (SaleStores::stack()?, SaleStores::stack()?, (db.clone(), db))
            }
            Stock::Replicated => {
                let client = common::setup().await?;
                // One topic name in both Kafkas: A's is mirrored into B's.
                let topic = format!("failover.{}", unique_name("orders"));
                let a = SaleStores::region(&client, "a", (&regions.a_kafka, &topic)).await?;
                let mut b = SaleStores::region(&client, "b", (&regions.b_kafka, &topic)).await?;
                // B's topics first: MirrorMaker makes them once it sees A's.
                flashsale_e2e::kafka::create_topic(&regions.b_kafka, &topic, 3).await?;
                flashsale_e2e::kafka::create_topic(&regions.b_kafka, &format!("{topic}.dlq"), 1)
                    .await?;
                b.create_topics = false;
                let db = flashsale_e2e::stack::postgres_url()?;
                (a, b, (db, regions.b_database.clone()))
            }
        };
        let scene = Scene::start_in("fo-a", &a_stores).await?;
        let client = scene.client.clone();
        // Region B: its own namespace, operator and FlashSale on the real
        // node, of the same sale (A's sale id).
        let a_sale: FlashSale = Api::namespaced(client.clone(), &scene.ns.name)
            .get(&scene.sale.name)
            .await?;
        let sale_id = flashsale_api::children::Owner::new(&a_sale)?.sale_id();
        let b = TestNamespace::create(&client, "fo-b").await?;
        let b_operator = common::real_node::operator(&b.name)?;
        let opens_in = jiff::SignedDuration::from_hours(1);
        let key = drill_key(&client, &scene.ns.name, &scene.sale.name).await?;
        let b_sale =
            create_standby_sale(&client, &b.name, (opens_in, &b_stores), (&sale_id, &key)).await?;
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
        for (name, url) in [
            ("region-a-redis", &regions.a_redis),
            ("region-b-redis", &regions.b_redis),
            ("region-a-db", &databases.0),
            ("region-b-db", &databases.1),
        ] {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": name},
                "stringData": {"url": url}
            }))?;
            secrets.create(&PostParams::default(), &secret).await?;
        }
        let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &scene.ns.name);
        // 100 rps per gateway covers (40 + 40) × 1.25 = 100 rps with one.
        let endpoint = (regions.endpoint_stats.as_str(), regions.endpoint.as_str());
        let spec = drill(&scene.sale.name, &b.name, endpoint, 100.0)?;
        drills.create(&PostParams::default(), &spec).await?;
        Ok(Self {
            sale_id,
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

    /// The drill's status as read now.
    async fn status(&self) -> Result<ChaosDrillStatus, String> {
        let drill = self
            .drills
            .get("failover")
            .await
            .map_err(|e| e.to_string())?;
        Ok(drill.status.unwrap_or_default())
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
    let mut pair = Pair::start(Stock::Shared).await?;

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

    another_sale(&pair).await?;
    lags(&mut pair).await?;
    endpoint_down(&pair).await?;
    false_failover(&pair).await?;
    missing_refuses_an_active_run(&pair).await
}

/// A standby FlashSale of another sale (its own sale id) is not ready, and
/// says why: it would sell stock of its own. No pods needed: the check
/// comes before the sale's readiness.
async fn another_sale(pair: &Pair) -> anyhow::Result<()> {
    let other = TestNamespace::create(&pair.scene.client, "fo-other").await?;
    create_sale(
        &pair.scene.client,
        &other.name,
        jiff::SignedDuration::from_hours(1),
    )
    .await?;
    let standby = |ns: &str| json!({"spec": {"failover": {"standby": {"namespace": ns}}}});
    pair.patch(standby(&other.name)).await?;
    let refused = pair.until("False", "StandbyOtherSale").await?;
    let message = &check(refused.failover.as_ref(), "standby")?.message;
    assert!(
        message.contains("give both FlashSales the same spec.saleID"),
        "{message}"
    );
    pair.patch(standby(&pair.b.name)).await?;
    pair.until("True", "StandbyReady").await?;
    Ok(())
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
        let status = pair.status().await?;
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

/// Which region served each answer of the endpoint, as the test itself
/// sees it: asked every 50 ms on schedule (whatever earlier requests take,
/// each bounded at 2 s) until stopped, in the order asked, `None` for an
/// answer no gateway gave (a 5xx, the endpoint's own error page, nothing).
struct Answers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(tokio::time::Instant, Option<String>)>>,
}

impl Answers {
    fn start(endpoint: String) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut asked = Vec::new();
            // Bounded: a test that fails before `rto` still ends it.
            let until = tokio::time::Instant::now() + Duration::from_secs(300);
            while !stopped.load(std::sync::atomic::Ordering::Relaxed)
                && tokio::time::Instant::now() < until
            {
                let endpoint = endpoint.clone();
                let at = tokio::time::Instant::now();
                asked.push(tokio::spawn(async move {
                    let answer = flashsale_observe::standby::answering_region(
                        &endpoint,
                        "/",
                        Duration::from_secs(2),
                    )
                    .await;
                    match answer {
                        Ok((status, region)) if status < 500 => (at, region),
                        _ => (at, None),
                    }
                }));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut seen = Vec::new();
            for answer in asked {
                if let Ok(answer) = answer.await {
                    seen.push(answer);
                }
            }
            seen
        });
        Self { stop, task }
    }

    /// The RTO as the test saw it: from the first answer not from
    /// `primary` to the first of ten in a row (half a second) from
    /// `standby`.
    async fn rto(self, primary: &str, standby: &str) -> anyhow::Result<Duration> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen = self.task.await?;
        let outage = seen
            .iter()
            .find(|(_, r)| r.as_deref() != Some(primary))
            .map(|(at, _)| *at)
            .ok_or_else(|| anyhow::anyhow!("every answer came from {primary}"))?;
        let served = seen
            .windows(10)
            .find(|w| w.iter().all(|(_, r)| r.as_deref() == Some(standby)))
            .map(|w| w[0].0)
            .ok_or_else(|| anyhow::anyhow!("no half second of answers from {standby}"))?;
        Ok(served.saturating_duration_since(outage))
    }
}

/// The drill's newest run once it is another than `before` (the newest
/// when the run was asked for).
async fn run_after(pair: &Pair, before: Option<String>) -> anyhow::Result<RunRecord> {
    // By id: the history keeps only the last `historyLimit` runs, so its
    // length stops growing.
    let before = &before;
    Ok(
        poll_until("the run ended", common::real_node::START, TICK, || async {
            let status = pair.status().await?;
            match status.history.first() {
                Some(newest) if Some(&newest.id) != before.as_ref() => Ok(newest.clone()),
                _ => Err(format!("{:?}: {:?}", status.phase, status.current_run)),
            }
        })
        .await?,
    )
}

/// The drill made active: region A down by a pod-failure of every A
/// gateway (the pause image replaces it) for `duration`.
fn active(duration: &str) -> serde_json::Value {
    active_with(duration, &json!({"podChaos": {"action": "pod-failure"}}))
}

/// Every A gateway cut off from the endpoint's address (the stack's
/// `HOST_POD_IP`, where HAProxy runs): a partition between the endpoint
/// and region A, as a NetworkChaos of the drill.
fn partition_from_endpoint() -> anyhow::Result<serde_json::Value> {
    let host = std::env::var("HOST_POD_IP")
        .map_err(|_| anyhow::anyhow!("HOST_POD_IP is not set: eval \"$(e2e/local/stack env)\""))?;
    Ok(json!({"networkChaos": {"action": "partition", "toAddresses": [host]}}))
}

/// The drill made active: `fault` on every A gateway for `duration`.
fn active_with(duration: &str, fault: &serde_json::Value) -> serde_json::Value {
    let mut experiment =
        json!({"name": "region-a-down", "target": "gateway", "duration": duration});
    if let (Some(experiment), Some(fault)) = (experiment.as_object_mut(), fault.as_object()) {
        experiment.extend(fault.clone());
    }
    json!({"spec": {
        "experiments": [experiment],
        "blastRadius": {"maxPercent": 100, "maxPods": 4},
        "failover": {"mode": "Active"}
    }})
}

/// Asks the drill for a run now, once A's sale is Ready again (every
/// gateway back from the last run's fault) and A's Redis has its replica
/// again (the last run gave back B's, which then syncs); the id of its
/// newest run before.
async fn run_now(pair: &Pair, request: &str) -> anyhow::Result<Option<String>> {
    await_ready(
        &pair.scene.client,
        &pair.scene.ns.name,
        &pair.scene.sale.name,
    )
    .await?;
    region::until_followed(&Regions::from_env()?.a_redis, SEEN).await?;
    let before = pair
        .status()
        .await
        .map_err(anyhow::Error::msg)?
        .history
        .first()
        .map(|newest| newest.id.clone());
    pair.patch(json!({"metadata": {"annotations": {"flashsale.dev/run-now": request}}}))
        .await?;
    Ok(before)
}

/// The run in progress once its record names the region buyers failed
/// over to.
async fn until_failed_over(pair: &Pair) -> anyhow::Result<RunRecord> {
    Ok(
        poll_until("the run to fail buyers over", SEEN, TICK, || async {
            let status = pair.status().await?;
            match status.current_run {
                Some(run) if run.failed_over_to.is_some() => Ok(run),
                other => Err(format!("{:?}: {other:?}", status.phase)),
            }
        })
        .await?,
    )
}

#[tokio::test]
async fn an_active_run_fails_buyers_over_to_the_standby_and_gives_them_back() -> anyhow::Result<()>
{
    let _stack = exclusive().await;
    let mut pair = Pair::start(Stock::Replicated).await?;
    pair.until("True", "StandbyReady").await?;
    a_drill_buyer_orders_before_the_opening(&pair).await?;
    // Region A cut off from the endpoint at once (its gateways drop what
    // they send to the endpoint's address): buyers see the outage.
    let cut = partition_from_endpoint()?;
    pair.patch(active_with("12s", &cut)).await?;
    fails_over_and_back(&pair).await?;
    rpo_while_mirroring_stops(&pair).await?;
    oversold_while_replication_stalls(&pair).await?;
    orders_not_taken(&mut pair).await?;
    aborted_past_max_rto(&pair).await?;
    // A pod-failure from here on (its gateways restart when it goes), for
    // longer than the test needs.
    pair.patch(active("2m")).await?;
    pair.patch(json!({"spec": {"failover": {"maxRTO": "30s"}}}))
        .await?;
    kill_switch_mid_failover(&pair).await?;
    pair.patch(active_with("2m", &cut)).await?;
    sigkill_mid_failover(&mut pair).await
}

/// The drill key in the internal Secret of the sale `ns/sale`.
async fn drill_key(client: &kube::Client, ns: &str, sale: &str) -> anyhow::Result<Vec<u8>> {
    let internal: Secret = Api::namespaced(client.clone(), ns)
        .get(&format!("{sale}-internal"))
        .await?;
    internal
        .data
        .and_then(|mut d| d.remove(flashsale_controller_sale::build::DRILL_KEY))
        .map(|key| key.0)
        .ok_or_else(|| anyhow::anyhow!("no drill key in {sale}-internal"))
}

/// The drill buyer (`flashsale_drill_buyer`) orders through the global
/// endpoint an hour before the sale opens, with a token signed with the
/// drill key of the sale's internal Secret: region A's gateway pod takes
/// it, and the order-writer pod stores it as a row of the drill SKU at no
/// price.
async fn a_drill_buyer_orders_before_the_opening(pair: &Pair) -> anyhow::Result<()> {
    let (client, ns, sale) = (
        &pair.scene.client,
        &pair.scene.ns.name,
        &pair.scene.sale.name,
    );
    let key = drill_key(client, ns, sale).await?;
    let endpoint = Regions::from_env()?.endpoint;
    let drill = flashsale_drill_buyer::SKU;
    let (status, body) =
        flashsale_e2e::funnel::drill_order(&endpoint, (&pair.sale_id, &key), "drill:fo:1", drill)
            .await?;
    assert_eq!(status, 201, "{body}");
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    let db = sqlx::PgPool::connect(&flashsale_e2e::stack::postgres_url()?).await?;
    let row: (String, i64, String) = poll_until("the drill order's row", SEEN, TICK, || async {
        sqlx::query_as("SELECT sku, amount_minor, user_id FROM orders WHERE order_id = $1")
            .bind(&order_id)
            .fetch_optional(&db)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no row of {order_id} yet"))
    })
    .await?;
    assert_eq!(row, (drill.to_owned(), 0, "drill:fo:1".to_owned()));
    Ok(())
}

/// Fails over and back, measured; the test's own view agrees. The record,
/// the Event and the histogram say so.
async fn fails_over_and_back(pair: &Pair) -> anyhow::Result<()> {
    let endpoint = Regions::from_env()?.endpoint;
    let (a, b) = (&pair.scene.ns.name, &pair.b.name);
    // The buyer orders at B's gateway directly too, for this run.
    let direct =
        |url: Option<String>| json!({"spec": {"failover": {"standby": {"gatewayURL": url}}}});
    pair.patch(direct(Some(format!("http://{}", pair.b_gw))))
        .await?;
    let answers = Answers::start(endpoint.clone());
    let before = run_now(pair, "fail-over").await?;
    let run = run_after(pair, before).await;
    pair.patch(direct(None)).await?;
    let run = run?;
    let seen = answers.rto(a, b).await;
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded), "{run:?}");
    assert_eq!(run.reason.as_deref(), Some("FailedOver"), "{run:?}");
    ordered_at_b_directly(&run, b)?;
    assert!(
        run.objects.iter().any(|o| o.starts_with("NetworkChaos/")),
        "{run:?}"
    );
    assert_eq!(run.failed_over_to.as_deref(), Some(b.as_str()), "{run:?}");
    assert_eq!(run.targeted_pods, Some(2), "{run:?}");
    let rto = run
        .failover_rto
        .map(|d| d.0)
        .ok_or_else(|| anyhow::anyhow!("no RTO: {run:?}"))?;
    let seen = seen?;
    assert!(rto < Duration::from_secs(30), "{run:?}");
    let apart = rto.abs_diff(seen);
    assert!(
        apart <= Duration::from_secs(1),
        "the drill's RTO {rto:?}, the test's {seen:?}"
    );
    assert!(run.failback.is_some(), "{run:?}");
    let order_rto = run
        .order_rto
        .map(|d| d.0)
        .ok_or_else(|| anyhow::anyhow!("no order RTO: {run:?}"))?;
    assert!(order_rto < Duration::from_secs(30), "{run:?}");
    let message = run.message.clone().unwrap_or_default();
    assert!(
        message.contains(&format!("region {b} served buyers")),
        "{message}"
    );
    assert!(
        message.contains(&format!("region {b} acknowledged their orders")),
        "{message}"
    );
    region::until_answered_by(&endpoint, a, Duration::from_secs(5)).await?;
    let events = common::scene::events(&pair.scene.client, a, "RunSucceeded").await?;
    assert!(
        events
            .iter()
            .any(|e| e.contains(&format!("region {b} served buyers"))),
        "{events:?}"
    );
    let measured = pair
        .scene
        .operator
        .metric_sum("flashsale_failover_rto_seconds_count")
        .await?;
    assert_eq!(measured, 1.0);
    promoted_and_given_back(&run).await?;
    drill_orders_landed(&run, (a, b), &pair.sale_id).await?;
    // B's sales came back to A with the switchback: A's stock holds every
    // order both regions stored, B's included.
    assert_eq!(run.unreserved_orders, Some(0), "{run:?}");
    assert!(
        message.contains("the primary's stock holds all"),
        "{message}"
    );
    let unreserved = unreserved_in_a(&run, &pair.sale_id).await?;
    assert!(unreserved.is_empty(), "A's Redis lacks {unreserved:?}");
    // The run lost no order: its RPO is in the histogram's first bucket.
    let lossless = flashsale_e2e::metrics::sum_samples(
        &pair.scene.operator.metrics().await?,
        "flashsale_failover_rpo_orders_bucket",
        r#"le="0.5""#,
    );
    assert_eq!(lossless, 1.0);
    Ok(())
}

/// The ids of the run's drill orders each region's database holds:
/// region A's (the stack's PostgreSQL) and region B's (postgres-b).
async fn stored_ids(run: &RunRecord, sale_id: &str) -> anyhow::Result<[BTreeSet<String>; 2]> {
    let buyers = format!("drill:failover:{}:", run.id);
    let mut found = [BTreeSet::new(), BTreeSet::new()];
    let urls = [
        flashsale_e2e::stack::postgres_url()?,
        Regions::from_env()?.b_database,
    ];
    for (ids, url) in found.iter_mut().zip(urls) {
        let db = sqlx::PgPool::connect(&url).await?;
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT order_id FROM orders WHERE sale = $1 AND user_id LIKE $2 AND sku = $3",
        )
        .bind(sale_id)
        .bind(format!("{buyers}%"))
        .bind(flashsale_drill_buyer::SKU)
        .fetch_all(&db)
        .await?;
        db.close().await;
        ids.extend(rows);
    }
    Ok(found)
}

/// The buyer's orders at B's gateway directly: B acknowledged them once
/// promoted, A none (the endpoint is not in the way), and the record dates
/// when B took them after buyers lost A. (Whether B refused any first
/// depends on timing: B's gateway holds an order while it retries the
/// standing-by inventory, so a promotion within that time serves them.)
fn ordered_at_b_directly(run: &RunRecord, b: &str) -> anyhow::Result<()> {
    let direct = run
        .direct_orders
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no direct orders: {run:?}"))?;
    let acknowledged = direct.acknowledged.get(b).copied().unwrap_or(0);
    assert!(acknowledged > 0, "{run:?}");
    assert_eq!(direct.acknowledged.len(), 1, "{run:?}");
    let taken = run
        .direct_order_rto
        .map(|d| d.0)
        .ok_or_else(|| anyhow::anyhow!("no direct order RTO: {run:?}"))?;
    assert!(taken < Duration::from_secs(30), "{run:?}");
    let message = run.message.clone().unwrap_or_default();
    assert!(
        message.contains("orders at the standby's gateways directly: acknowledged"),
        "{message}"
    );
    Ok(())
}

/// Of the run's orders either region's database holds, those whose
/// reservation region A's Redis does not hold, read by the test itself
/// through the inventory's key schema (an order is named after its
/// reservation): units A's stock would sell again.
async fn unreserved_in_a(run: &RunRecord, sale_id: &str) -> anyhow::Result<BTreeSet<String>> {
    let [in_a, in_b] = stored_ids(run, sale_id).await?;
    let keys = inventory::keys::SaleKeys::new(sale_id);
    let mut conn = redis::Client::open(Regions::from_env()?.a_redis)?
        .get_multiplexed_async_connection()
        .await?;
    let mut missing = BTreeSet::new();
    for id in in_a.union(&in_b) {
        let reservation = flashsale_inventory_api::reservation_id(id)
            .ok_or_else(|| anyhow::anyhow!("{id} is not an order id"))?;
        let held: bool = redis::cmd("EXISTS")
            .arg(keys.reservation(reservation))
            .query_async(&mut conn)
            .await?;
        if !held {
            missing.insert(id.clone());
        }
    }
    Ok(missing)
}

/// Region A's Redis is primary again and region B's follows it: the run's
/// switchback, as both Redis servers say.
async fn a_primary_again() -> anyhow::Result<()> {
    use flashsale_observe::standby::{RedisRole, redis_role};
    let regions = Regions::from_env()?;
    let a = regions.a_redis.trim_start_matches("redis://");
    let bound = Duration::from_secs(2);
    assert!(
        matches!(
            redis_role(&regions.a_redis, bound).await?,
            RedisRole::Primary { .. }
        ),
        "A's Redis is not primary"
    );
    match redis_role(&regions.b_redis, bound).await? {
        RedisRole::Replica { of, .. } => assert_eq!(of, a),
        other => anyhow::bail!("B's Redis is {other:?}"),
    }
    Ok(())
}

/// The run's buyer ordered through the endpoint throughout, both regions'
/// gateways acknowledged orders, and the databases agree with the record,
/// as the test reads them itself: once mirroring drained, region B's holds
/// every order region A's holds (RPO 0, the record's too), and the two
/// together hold every order a gateway acknowledged and at most the
/// unanswered ones besides (a gateway may store an order whose answer the
/// fault then lost): none lost, as the record says.
async fn drill_orders_landed(
    run: &RunRecord,
    (a, b): (&str, &str),
    sale_id: &str,
) -> anyhow::Result<()> {
    let orders = run
        .drill_orders
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no drill orders: {run:?}"))?;
    let acked = |region: &str| orders.acknowledged.get(region).copied().unwrap_or(0);
    let refused: i64 = orders.refused.values().sum();
    assert_eq!(
        orders.placed,
        acked(a) + acked(b) + refused + orders.unanswered,
        "{orders:?}"
    );
    assert!(acked(a) > 0 && acked(b) > 0, "{orders:?}");
    assert_eq!(
        (run.failover_rpo, orders.lost),
        (Some(0), Some(0)),
        "{run:?}"
    );
    let message = run.message.clone().unwrap_or_default();
    assert!(
        message.contains(&format!("the drill buyer's {} orders", orders.placed)),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "the standby's database held all {} orders the primary region acknowledged",
            acked(a)
        )),
        "{message}"
    );
    // With the orders placed at B directly: every one B acknowledged is
    // stored too, and some unanswered ones may be.
    let direct = run.direct_orders.clone().unwrap_or_default();
    let acknowledged = acked(a) + acked(b) + direct.acknowledged.values().sum::<i64>();
    let unanswered = orders.unanswered + direct.unanswered;
    poll_until(
        "both databases to hold the drill orders",
        SEEN,
        TICK,
        || async {
            let [in_a, in_b] = stored_ids(run, sale_id).await.map_err(|e| e.to_string())?;
            let union = i64::try_from(in_a.union(&in_b).count()).map_err(|e| e.to_string())?;
            let lacking = in_a.difference(&in_b).count();
            if lacking == 0 && (acknowledged..=acknowledged + unanswered).contains(&union) {
                Ok(())
            } else {
                Err(format!(
                    "{} in A, {} in B, {lacking} of A's not in B, for {orders:?}",
                    in_a.len(),
                    in_b.len()
                ))
            }
        },
    )
    .await?;
    Ok(())
}

/// With MirrorMaker paused through a run, none of the orders region A
/// acknowledged reaches region B's database: the run fails `RpoExceeded`
/// with an RPO of every order A acknowledged, which the test counts itself
/// in both databases; once MirrorMaker resumes they arrive, so the RPO
/// was replication behind, not orders lost.
async fn rpo_while_mirroring_stops(pair: &Pair) -> anyhow::Result<()> {
    let (a, b) = (&pair.scene.ns.name, &pair.b.name);
    pair.patch(json!({"spec": {"failover": {"orders": {"drainWithin": "2s"}}}}))
        .await?;
    let paused = Outage::pause("mirror-maker").await?;
    let ran = async {
        let before = run_now(pair, "rpo").await?;
        let run = run_after(pair, before).await?;
        let [in_a, in_b] = stored_ids(&run, &pair.sale_id).await?;
        anyhow::Ok((run, in_a, in_b))
    }
    .await;
    paused.end().await?;
    let (run, in_a, in_b) = ran?;
    assert_eq!(run.outcome, Some(RunOutcome::Failed), "{run:?}");
    assert_eq!(run.reason.as_deref(), Some("RpoExceeded"), "{run:?}");
    let orders = run
        .drill_orders
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no drill orders: {run:?}"))?;
    let acked_a = orders.acknowledged.get(a.as_str()).copied().unwrap_or(0);
    assert!(acked_a > 0, "{orders:?}");
    assert_eq!(run.failover_rpo, Some(acked_a), "{run:?}");
    assert_eq!(orders.lost, Some(0), "{run:?}");
    // The test's own count: A's rows B lacked when the run ended, at least
    // the orders A acknowledged and at most those and the unanswered ones.
    let lacking = i64::try_from(in_a.difference(&in_b).count())?;
    assert!(
        (acked_a..=acked_a + orders.unanswered).contains(&lacking),
        "{lacking} of A's rows not in B; {orders:?}"
    );
    let message = run.message.clone().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "the standby's database lacked {acked_a} of the {acked_a} orders"
        )),
        "{message}"
    );
    assert!(
        message.contains(&format!("region {b} served buyers")),
        "{message}"
    );
    poll_until(
        "B's database to catch up once mirroring resumes",
        BACK,
        TICK,
        || async {
            let [in_a, in_b] = stored_ids(&run, &pair.sale_id)
                .await
                .map_err(|e| e.to_string())?;
            match in_a.difference(&in_b).count() {
                0 => Ok(()),
                n => Err(format!("{n} of A's orders not in B yet")),
            }
        },
    )
    .await?;
    pair.patch(json!({"spec": {"failover": {"orders": {"drainWithin": "30s"}}}}))
        .await
}

/// The run promoted region B's Redis once buyers lost A, and had it
/// follow A's again, as its record and message say and B's Redis itself
/// shows.
async fn promoted_and_given_back(run: &RunRecord) -> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    let a = regions.a_redis.trim_start_matches("redis://");
    let [promotion] = run.promoted.as_slice() else {
        anyhow::bail!("not one promotion: {run:?}");
    };
    assert_eq!(
        (promotion.name.as_str(), promotion.follows.as_str()),
        ("inventory", a),
        "{promotion:?}"
    );
    assert!(
        promotion.promoted_at.is_some()
            && promotion.fenced_at.is_some()
            && promotion.restored_at.is_some(),
        "{promotion:?}"
    );
    let message = run.message.clone().unwrap_or_default();
    assert!(message.contains(&format!("follows {a} again")), "{message}");
    a_primary_again().await
}

/// The drill SKU's units the Redis at `url` has given out, read by the
/// test itself from the inventory's key schema (the drill SKU has one
/// shard).
async fn held(url: &str, sale_id: &str) -> anyhow::Result<i64> {
    let key = inventory::keys::SaleKeys::new(sale_id)
        .shard(flashsale_drill_buyer::SKU, 1, 0)
        .held();
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let units: Option<i64> = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
    Ok(units.unwrap_or(0))
}

/// Cuts region B's Redis off from A's (`cut`), or lets it sync again:
/// B keeps following A's address, as a replica whose primary's region went
/// dark does, but authenticates with a password A does not know, so each
/// attempt to sync fails until the password is cleared.
async fn b_cut_from_a(cut: bool) -> anyhow::Result<()> {
    let b = Regions::from_env()?.b_redis;
    let mut conn = redis::Client::open(b)?
        .get_multiplexed_async_connection()
        .await?;
    let password = if cut { "cut-off-by-the-test" } else { "" };
    let _: String = redis::cmd("CONFIG")
        .arg("SET")
        .arg("masterauth")
        .arg(password)
        .query_async(&mut conn)
        .await?;
    if cut {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("master")
            .query_async(&mut conn)
            .await?;
    }
    Ok(())
}

/// Sets region A's inventory durability policy and waits until its
/// inventory pods run with it (each ready, none other left).
async fn a_durability(pair: &Pair, mode: &str, flag: &str) -> anyhow::Result<()> {
    let (client, ns, sale) = (
        &pair.scene.client,
        &pair.scene.ns.name,
        &pair.scene.sale.name,
    );
    Api::<FlashSale>::namespaced(client.clone(), ns)
        .patch(
            sale,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"inventory": {"durability": {"mode": mode}}}})),
        )
        .await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let selector =
        format!("app.kubernetes.io/part-of={sale},app.kubernetes.io/component=inventory");
    poll_until(&format!("A's inventory {flag}"), BACK, TICK, || async {
        let all = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())?;
        let with = |pod: &k8s_openapi::api::core::v1::Pod| {
            pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
                c.env
                    .iter()
                    .flatten()
                    .any(|e| e.name == "INVENTORY_DURABILITY" && e.value.as_deref() == Some(flag))
            })
        };
        let ready = ready_pods(client, ns, sale, "inventory")
            .await
            .map_err(|e| e.to_string())?;
        if !all.items.is_empty() && all.items.iter().all(with) && ready.len() == all.items.len() {
            Ok(())
        } else {
            Err(format!("{} pods, {} ready", all.items.len(), ready.len()))
        }
    })
    .await?;
    Ok(())
}

/// Stock divergence as the run measures it when it promotes B's Redis,
/// checked from both Redis servers by the test: B's Redis is cut off from
/// A's once the run started and before its buyer orders, so every unit
/// A's inventory gives out from then on is one B does not know of. The
/// record's counts are the test's own: B's held units as it froze, A's
/// once A lost buyers (its gateways down, its count still), under A's
/// `fast` policy and its `replicated` one. The switchback then makes A's
/// Redis B's copy, so A's acknowledged orders among those units lose their
/// reservations: the run fails `StockInconsistent` with as many as the
/// test finds itself, none under `replicated` (A acknowledged none of
/// them). (How many of the buyer's orders fall after the cut depends on
/// when the test sees the run start, so the counts are compared, not
/// predicted.)
async fn oversold_while_replication_stalls(pair: &Pair) -> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    // Time to cut B off between the run's start and its buyer's first order.
    pair.patch(json!({"spec": {"sloGuard": {"steadyState": "6s"}}}))
        .await?;
    for (mode, flag) in [("Fast", "fast"), ("Replicated", "replicated")] {
        a_durability(pair, mode, flag).await?;
        let before = run_now(pair, &format!("oversold-{flag}")).await?;
        let measured = async {
            poll_until("the run's steady state", SEEN, TICK, || async {
                match pair.status().await?.phase {
                    Some(DrillPhase::SteadyState) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await?;
            b_cut_from_a(true).await?;
            let frozen = held(&regions.b_redis, &pair.sale_id).await?;
            let promoted = poll_until("B's promotion", SEEN, TICK, || async {
                let run = pair.status().await?.current_run.ok_or("no run")?;
                match run.promoted.first() {
                    Some(p) if p.primary_held.is_some() => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            let a_held = held(&regions.a_redis, &pair.sale_id).await?;
            // Promoted: B may sync with A again once it follows A.
            b_cut_from_a(false).await?;
            promoted?;
            let run = run_after(pair, before).await?;
            anyhow::Ok((run, frozen, a_held))
        }
        .await;
        b_cut_from_a(false).await?;
        let (run, frozen, a_held) = measured?;
        a_primary_again().await?;
        let [promotion] = run.promoted.as_slice() else {
            anyhow::bail!("{mode}: not one promotion: {run:?}");
        };
        assert_eq!(
            (promotion.standby_held, promotion.primary_held),
            (Some(frozen), Some(a_held)),
            "{mode}: {run:?}"
        );
        let diverged = a_held - frozen;
        // What A gave out after the cut is in the bytes B had not received.
        if diverged > 0 {
            assert!(promotion.behind_bytes > Some(0), "{mode}: {promotion:?}");
        }
        assert_eq!(run.oversold_units, Some(diverged.max(0)), "{mode}: {run:?}");
        let orders = run
            .drill_orders
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no drill orders: {run:?}"))?;
        // Each run's divergence is observed once.
        let observed = flashsale_e2e::metrics::sum_samples(
            &pair.scene.operator.metrics().await?,
            "flashsale_failover_oversold_units_count",
            "",
        );
        assert!(observed >= 1.0, "{observed}");
        let message = run.message.clone().unwrap_or_default();
        assert!(
            message.contains(&format!("{} would be sold again", diverged.max(0))),
            "{mode}: {message}"
        );
        let count = unreserved_after_divergence(pair, &run, (flag, diverged)).await?;
        println!("{mode}: {diverged} units diverged, {count} acknowledged, {orders:?}");
    }
    pair.patch(json!({"spec": {"sloGuard": {"steadyState": "2s"}}}))
        .await?;
    a_durability(pair, "Auto", "auto").await
}

/// The run's orders whose reservation A's Redis lacks after the
/// switchback, as the run counted them and the test finds them: no more
/// than the units that diverged, none under `replicated`, and any at all
/// fail the run `StockInconsistent`.
async fn unreserved_after_divergence(
    pair: &Pair,
    run: &RunRecord,
    (flag, diverged): (&str, i64),
) -> anyhow::Result<i64> {
    let unreserved = unreserved_in_a(run, &pair.sale_id).await?;
    let count = i64::try_from(unreserved.len())?;
    assert_eq!(
        run.unreserved_orders,
        Some(count),
        "{flag}: {unreserved:?} {run:?}"
    );
    assert!(count <= diverged.max(0), "{flag}: {unreserved:?} {run:?}");
    if flag == "replicated" {
        assert_eq!(count, 0, "{unreserved:?}");
    }
    if count > 0 {
        assert_eq!(run.reason.as_deref(), Some("StockInconsistent"), "{run:?}");
    }
    Ok(count)
}

/// Region B's gateways restarted with another drill key than A's (its
/// Secret `drill` changed): B serves buyers' pages but refuses every
/// order of the drill's buyer, so the run fails `OrdersNotTaken`, its
/// record counting B's refusals. B keeps that key for the phases after
/// this one, which judge pages only.
async fn orders_not_taken(pair: &mut Pair) -> anyhow::Result<()> {
    let client = pair.scene.client.clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &pair.b.name);
    let other = json!({"data": {"key": k8s_openapi::ByteString(vec![b'k'; 32])}});
    secrets
        .patch("drill", &PatchParams::default(), &Patch::Merge(&other))
        .await?;
    let fresh = renew_gateways(&client, &pair.b.name, &pair.b_sale).await?;
    pair.b_gw = format!("{}:8080", pod_ip(&fresh[0])?);
    region::point_endpoint(&pair.a_gw, &pair.b_gw, pair.checks).await?;
    await_ready(&client, &pair.b.name, &pair.b_sale).await?;
    pair.until("True", "StandbyReady").await?;
    let before = run_now(pair, "no-orders").await?;
    let run = run_after(pair, before).await?;
    assert_eq!(run.outcome, Some(RunOutcome::Failed), "{run:?}");
    assert_eq!(run.reason.as_deref(), Some("OrdersNotTaken"), "{run:?}");
    assert!(
        run.failover_rto.is_some() && run.order_rto.is_none(),
        "{run:?}"
    );
    let orders = run
        .drill_orders
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no drill orders: {run:?}"))?;
    let b = &pair.b.name;
    assert!(!orders.acknowledged.contains_key(b), "{orders:?}");
    assert!(orders.refused.contains_key(b), "{orders:?}");
    let message = run.message.unwrap_or_default();
    assert!(message.contains(&format!("by {b} (401 ×")), "{message}");
    Ok(())
}

/// The endpoint slow to give up on A (8 failed checks a second apart) and
/// a maxRTO of 2s: the run is aborted, and A serves again.
async fn aborted_past_max_rto(pair: &Pair) -> anyhow::Result<()> {
    let endpoint = Regions::from_env()?.endpoint;
    let slow = region::Checks {
        interval: Duration::from_secs(1),
        fall: 8,
        ..pair.checks
    };
    region::point_endpoint(&pair.a_gw, &pair.b_gw, slow).await?;
    pair.patch(json!({"spec": {"failover": {"maxRTO": "2s"}}}))
        .await?;
    let before = run_now(pair, "too-slow").await?;
    let run = run_after(pair, before).await?;
    assert_eq!(run.outcome, Some(RunOutcome::Aborted), "{run:?}");
    assert_eq!(run.reason.as_deref(), Some("RtoExceeded"), "{run:?}");
    assert_eq!(run.failover_rto, None, "{run:?}");
    region::until_answered_by(&endpoint, &pair.scene.ns.name, BACK).await?;
    region::point_endpoint(&pair.a_gw, &pair.b_gw, pair.checks).await?;
    Ok(())
}

/// The kill switch, once buyers failed over: the run ends, saying A can
/// take buyers back, and A does.
async fn kill_switch_mid_failover(pair: &Pair) -> anyhow::Result<()> {
    let endpoint = Regions::from_env()?.endpoint;
    let a = &pair.scene.ns.name;
    let namespaces: Api<Namespace> = Api::all(pair.scene.client.clone());
    let switch = |on: bool| {
        json!({"metadata": {"annotations": {
            "flashsale.dev/chaos-kill-switch": if on { Some("true") } else { None }
        }}})
    };
    let before = run_now(pair, "killed").await?;
    until_failed_over(pair).await?;
    namespaces
        .patch(a, &PatchParams::default(), &Patch::Merge(&switch(true)))
        .await?;
    let run = run_after(pair, before).await;
    let back = region::until_answered_by(&endpoint, a, BACK).await;
    namespaces
        .patch(a, &PatchParams::default(), &Patch::Merge(&switch(false)))
        .await?;
    let run = run?;
    back?;
    assert_eq!(run.reason.as_deref(), Some("KillSwitch"), "{run:?}");
    let message = run.message.clone().unwrap_or_default();
    assert!(message.contains("can take buyers back"), "{message}");
    promoted_and_given_back(&run).await
}

/// The operator SIGKILLed once buyers failed over: the next one stops the
/// run, says A can take buyers back, and A does.
async fn sigkill_mid_failover(pair: &mut Pair) -> anyhow::Result<()> {
    let endpoint = Regions::from_env()?.endpoint;
    let a = pair.scene.ns.name.clone();
    let before = run_now(pair, "sigkilled").await?;
    until_failed_over(pair).await?;
    pair.scene.operator.kill();
    pair.scene.operator = common::real_node::operator(&a)?;
    let run = run_after(pair, before).await?;
    assert_eq!(run.reason.as_deref(), Some("GuardLost"), "{run:?}");
    let message = run.message.clone().unwrap_or_default();
    assert!(message.contains("can take buyers back"), "{message}");
    region::until_answered_by(&endpoint, &a, BACK).await?;
    promoted_and_given_back(&run).await
}

/// A's gateways replaced by new pods, and the endpoint pointed at one of
/// them: a pod-failure restarts a container twice, and the kubelet backs
/// off restarting it again, so each run of a benchmark starts from pods
/// without that history.
async fn fresh_gateways(pair: &mut Pair) -> anyhow::Result<()> {
    let (client, ns, sale) = (
        &pair.scene.client,
        &pair.scene.ns.name,
        &pair.scene.sale.name,
    );
    let fresh = renew_gateways(client, ns, sale).await?;
    pair.a_gw = format!("{}:8080", pod_ip(&fresh[0])?);
    region::point_endpoint(&pair.a_gw, &pair.b_gw, pair.checks).await?;
    let endpoint = Regions::from_env()?.endpoint;
    region::until_answered_by(&endpoint, ns, BACK).await?;
    await_ready(client, ns, sale).await?;
    Ok(())
}

/// The gateways of sale `ns/sale` deleted; their replacements, once as
/// many are ready.
async fn renew_gateways(
    client: &kube::Client,
    ns: &str,
    sale: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    let old = ready_pods(client, ns, sale, "gateway").await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    for pod in &old {
        pods.delete(&kube::ResourceExt::name_any(pod), &DeleteParams::default())
            .await?;
    }
    let gone = common::real_node::uids(&old);
    Ok(poll_until("new gateways", BACK, TICK, || async {
        let now = ready_pods(client, ns, sale, "gateway")
            .await
            .map_err(|e| e.to_string())?;
        let new = now
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none());
        let new: Vec<_> = new
            .filter(|p| !gone.contains(&p.metadata.uid.clone().unwrap_or_default()))
            .cloned()
            .collect();
        if new.len() == old.len() {
            Ok(new)
        } else {
            Err(format!("{} of {} new ones ready", new.len(), old.len()))
        }
    })
    .await?)
}

/// Five active runs per way of taking region A down, on one pair of
/// regions, the endpoint checking every 200 ms and giving a region up
/// after 2 failed checks: each run's RTO beside that floor, the longest
/// time buyers went unserved, and the failback; fresh A gateways before
/// each run. A pod-failure stops the gateways gracefully (they fail their
/// readiness and drain); a partition of A's gateways from the endpoint's
/// address (the stack's `HOST_POD_IP`) takes them away abruptly.
#[tokio::test]
#[ignore = "benchmark, run by hand: cargo test -p flashsale-operator --test failover_readiness \
            -- --ignored --nocapture five_active_runs"]
async fn five_active_runs() -> anyhow::Result<()> {
    let _stack = exclusive().await;
    let mut pair = Pair::start(Stock::Replicated).await?;
    pair.until("True", "StandbyReady").await?;
    let host = std::env::var("HOST_POD_IP")?;
    let faults = [
        (
            "pod-failure",
            json!({"podChaos": {"action": "pod-failure"}}),
        ),
        (
            "partition from the endpoint",
            json!({"networkChaos": {"action": "partition", "toAddresses": [host]}}),
        ),
    ];
    let floor = pair.checks.interval * pair.checks.fall;
    // Each way of taking A down under A's default policy (`replicated`:
    // B's Redis is its replica), then the partition again under `fast`.
    let blocks = [
        (&faults[0], ("Auto", "auto")),
        (&faults[1], ("Auto", "auto")),
        (&faults[1], ("Fast", "fast")),
    ];
    for ((name, fault), (mode, flag)) in blocks {
        a_durability(&pair, mode, flag).await?;
        pair.patch(active_with("10s", fault)).await?;
        let mut rtos = Vec::new();
        let mut failbacks = Vec::new();
        let mut figures = Vec::new();
        for i in 0..5 {
            // Each request id once: a drill takes a request it has seen as
            // already served.
            let request = format!("bench-{}-{flag}-{i}", name.replace(' ', "-"));
            let before = run_now(&pair, &request).await?;
            let run = run_after(&pair, before).await?;
            let (Some(rto), Some(back)) = (run.failover_rto, run.failback) else {
                anyhow::bail!("{name} ({flag}), run {i}: no failover measured: {run:?}");
            };
            let behind: Vec<i64> = run.promoted.iter().filter_map(|p| p.behind_bytes).collect();
            println!(
                "{name} ({flag}), run {i}: RTO {rto} = {:.2}x the endpoint's floor {}; B's \
                 Redis {behind:?} bytes behind at the promotion; {}",
                rto.0.as_secs_f64() / floor.as_secs_f64(),
                flashsale_api::Duration(floor),
                run.message.clone().unwrap_or_default()
            );
            rtos.push(rto.0);
            failbacks.push(back.0);
            figures.push((
                run.failover_rpo.unwrap_or(-1),
                run.oversold_units.unwrap_or(-1),
                run.unreserved_orders.unwrap_or(-1),
                behind.iter().sum::<i64>(),
            ));
            fresh_gateways(&mut pair).await?;
        }
        let median = |values: &[Duration]| {
            flashsale_bench::median(values.iter().map(Duration::as_secs_f64))
                .map(Duration::from_secs_f64)
                .unwrap_or_default()
        };
        let rto = median(&rtos);
        let slowest = rtos.iter().max().copied().unwrap_or_default();
        println!(
            "{name} ({flag}): median of 5: RTO {} ({:.2}x the floor; slowest {}), failback {}; \
             per run (RPO orders, oversold units, unreserved orders, bytes behind) {figures:?}",
            flashsale_api::Duration(rto),
            rto.as_secs_f64() / floor.as_secs_f64(),
            flashsale_api::Duration(slowest),
            flashsale_api::Duration(median(&failbacks))
        );
    }
    a_durability(&pair, "Auto", "auto").await
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
