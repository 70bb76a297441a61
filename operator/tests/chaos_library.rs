//! The drill library in `chaos/`: every file is a ChaosDrill the apiserver
//! accepts as written (strict field validation and the CRD's CEL rules)
//! and the operator's own checks pass; its comment says what it proves, its
//! blast radius, its SLO and how it ends; every objective evaluates at the
//! stack's real Prometheus once the drill's namespace and sale are filled
//! in; the library covers every fault kind; the Friday-evening calendar
//! skips what it says it skips; and every other drill, run on the real
//! node, ends as its comment says: the gateway drills under page views, the
//! store and zone drills on a Live sale under orders, losing none of them.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use common::{
    real_node::{
        START, Scene, TICK, await_ready, await_scraped_and_up, cluster_ip, create_stocked_sale,
        ended_run, operator, prometheus_value, ready_pods, residue, views_of,
    },
    setup,
};
use flashsale_api::{
    ChaosDrill,
    calendar::Calendar,
    chaosdrill::{RunOutcome, RunRecord},
    validate,
};
use flashsale_e2e::{
    inside,
    kube::TestNamespace,
    order_flow::{OrderFlow, OrderTally},
    prometheus, stack,
    wait::poll_until,
};
use jiff::{
    SignedDuration, Timestamp,
    civil::{Date, Weekday},
    tz::TimeZone,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

/// Held by each test that runs drills on the real node, so they take turns:
/// the CPU stress of one would starve the other's gateways (their scrapes,
/// their answers) and turn its verdicts into the machine's.
static REAL_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every `chaos/*.yaml`, by file name, with its text.
fn library() -> anyhow::Result<Vec<(String, String)>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../chaos");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            files.push((name, std::fs::read_to_string(&path)?));
        }
    }
    files.sort();
    Ok(files)
}

/// The fault a drill's first experiment injects, as its action names it.
fn fault(drill: &ChaosDrill) -> anyhow::Result<String> {
    let experiment = serde_json::to_value(&drill.spec.experiments[0])?;
    for (kind, action) in [
        ("podChaos", "action"),
        ("networkChaos", "action"),
        ("stressChaos", ""),
        ("timeChaos", ""),
    ] {
        let block = &experiment[kind];
        if block.is_object() {
            return Ok(match block[action].as_str() {
                Some(action) => action.to_owned(),
                None => kind.to_owned(),
            });
        }
    }
    anyhow::bail!("no fault in {experiment}")
}

#[tokio::test]
async fn every_drill_in_the_library_applies_says_what_it_proves_and_its_objectives_evaluate()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "chaos-library").await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    let files = library()?;
    assert!(files.len() >= 8, "{} drills in chaos/", files.len());

    let mut faults = BTreeSet::new();
    for (file, text) in &files {
        for heading in ["Proves:", "Blast radius:", "SLO:", "Ends:"] {
            assert!(
                text.contains(&format!("\n# {heading}")),
                "{file}: its comment does not say {heading}"
            );
        }
        let mut object: Value = serde_yaml_ng::from_str(text)?;
        object["metadata"]["namespace"] = ns.name.clone().into();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(
            format!("{name}.yaml"),
            *file,
            "a drill is named as its file"
        );
        let drill = drills
            .patch(
                &name,
                &PatchParams::apply("chaos-library-test").validation_strict(),
                &Patch::Apply(&object),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        let problems = validate::chaos_drill(&drill.spec);
        assert!(problems.is_empty(), "{file}: {problems:?}");
        faults.insert(fault(&drill)?);

        for objective in &drill.spec.slo_guard.objectives {
            let query = objective.query_in(&ns.name, &drill.spec.sale_ref.name);
            assert!(!query.contains('$'), "{file}: {query}");
            prometheus::evaluates(&query)
                .await
                .map_err(|e| anyhow::anyhow!("{file}, {}: {e}", objective.name))?;
        }
    }
    let every: BTreeSet<String> = [
        "pod-kill",
        "container-kill",
        "delay",
        "partition",
        "stressChaos",
        "timeChaos",
    ]
    .map(str::to_owned)
    .into();
    assert!(faults.is_superset(&every), "faults covered: {faults:?}");
    Ok(())
}

#[test]
fn the_friday_evening_drill_never_runs_on_a_friday_evening_nor_in_a_sale_week() -> anyhow::Result<()>
{
    let (_, text) = library()?
        .into_iter()
        .find(|(file, _)| file == "friday-evening-blackout.yaml")
        .ok_or_else(|| anyhow::anyhow!("no friday-evening-blackout.yaml"))?;
    let drill: ChaosDrill = serde_yaml_ng::from_str(&text)?;
    let calendar = Calendar::new(&drill.spec)?;
    let zone = TimeZone::get("Asia/Shanghai")?;

    // Every run for a year from a Thursday: weekday evenings, Monday to
    // Thursday only, none in a blackout.
    let mut after: Timestamp = "2026-10-01T00:00:00+08:00".parse()?;
    let end: Timestamp = "2027-10-01T00:00:00+08:00".parse()?;
    let freezes: [(Date, Date); 2] = [
        ("2026-11-04".parse()?, "2026-11-13".parse()?),
        ("2026-12-05".parse()?, "2026-12-14".parse()?),
    ];
    let mut runs = 0;
    let mut thursdays = 0;
    while let Some(run) = calendar.next_run(after) {
        if run > end {
            break;
        }
        let local = run.to_zoned(zone.clone());
        assert_ne!(local.weekday(), Weekday::Friday, "a run on {local}");
        assert_eq!((local.hour(), local.minute()), (18, 0), "{local}");
        let day = local.date();
        assert!(
            !freezes.iter().any(|(from, to)| day >= *from && day < *to),
            "a run in a sale week: {local}"
        );
        thursdays += usize::from(local.weekday() == Weekday::Thursday);
        runs += 1;
        after = run;
    }
    // Four evenings a week for a year, less the two blacked-out weeks.
    assert!(runs > 190, "{runs} runs in a year");
    assert!(thursdays > 45, "{thursdays} Thursday runs");
    // A Friday 18:00 tick exists, and is not allowed.
    let friday: Timestamp = "2026-10-02T18:00:00+08:00".parse()?;
    let before: Timestamp = "2026-10-02T17:00:00+08:00".parse()?;
    assert_eq!(calendar.next_tick(before), Some(friday));
    assert_ne!(
        calendar.allowance(friday),
        flashsale_api::calendar::Allowance::Allowed
    );
    Ok(())
}

/// The library's drill `file` for `sale`, made to run now: its calendar
/// lifted (a run-now request, no windows or blackouts, a sale that may be
/// anything but Live), its experiment cut to `duration` and its steady
/// state to 5 s, so the test need not wait for Tuesday. Its fault, blast
/// radius, objectives and thresholds stay as written.
fn run_now(file: &str, sale: &str, duration: &str) -> anyhow::Result<Value> {
    let (_, text) = library()?
        .into_iter()
        .find(|(name, _)| name == file)
        .ok_or_else(|| anyhow::anyhow!("no {file}"))?;
    let mut drill: Value = serde_yaml_ng::from_str(&text)?;
    drill["metadata"]["annotations"] = json!({"flashsale.dev/run-now": "test"});
    let spec = &mut drill["spec"];
    spec["saleRef"]["name"] = sale.into();
    spec["windows"] = json!([]);
    spec["blackouts"] = json!([]);
    spec["experiments"][0]["duration"] = duration.into();
    spec["sloGuard"]["steadyState"] = "5s".into();
    Ok(drill)
}

/// Waits until every objective of the library's `file`, as `drill` has it,
/// holds for `sale`: the state an SRE starts a drill from. Their windows
/// still hold the drill before's errors for a while, and a busy machine's
/// first page views can fail; a drill started then is rightly skipped
/// (SteadyStateNotReached), which is not what these tests run it for.
async fn await_objectives_hold(
    file: &str,
    drill: &Value,
    ns: &str,
    sale: &str,
) -> anyhow::Result<()> {
    let typed: ChaosDrill = serde_json::from_value(drill.clone())?;
    for objective in &typed.spec.slo_guard.objectives {
        let query = objective.query_in(ns, sale);
        let what = format!("{file}: {} holds", objective.name);
        poll_until(&what, START, TICK, || async {
            match prometheus_value(&query).await? {
                Some(value) if objective.holds(value) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await?;
    }
    Ok(())
}

/// Runs `drill` in `ns` to its end, then deletes it.
async fn run(client: &Client, ns: &str, drill: Value) -> anyhow::Result<(ChaosDrill, RunRecord)> {
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    let drill = drills
        .create(&PostParams::default(), &serde_json::from_value(drill)?)
        .await?;
    let ended = ended_run(&drills, &drill.name_any()).await?;
    drills
        .delete(&drill.name_any(), &DeleteParams::default())
        .await?;
    Ok((drill, ended))
}

#[tokio::test]
async fn the_librarys_gateway_drills_run_on_the_real_node_and_end_as_their_comments_say()
-> anyhow::Result<()> {
    let _turn = REAL_NODE.lock().await;
    let scene = Scene::start("chaos-library-run").await?;
    let (client, ns, sale) = (&scene.client, &scene.ns.name, &scene.sale.name);
    // Shoppers view the item page through the gateways' Service, as buyers
    // would, so the error-rate objectives read real traffic.
    let service = cluster_ip(client, ns, &format!("{sale}-gateway")).await?;
    let _views = views_of(vec![format!("http://{service}/api/v1/items/CASE")])?;

    for file in [
        "gateway-pod-kill.yaml",
        "gateway-container-kill.yaml",
        "gateway-clock-skew.yaml",
    ] {
        let drill = run_now(file, sale, "20s")?;
        await_objectives_hold(file, &drill, ns, sale).await?;
        let (drill, ended) = run(client, ns, drill).await?;
        assert_eq!(
            ended.outcome,
            Some(RunOutcome::Succeeded),
            "{file} ends Succeeded: {ended:?}"
        );
        assert_eq!(ended.targets.len(), 1, "{file}: one gateway: {ended:?}");
        // Every objective was read from Prometheus with the drill's
        // namespace and sale filled in: none was blind.
        for objective in &drill.spec.slo_guard.objectives {
            assert!(
                ended.slo_extremes.contains_key(&objective.name),
                "{file}: no value of {}: {ended:?}",
                objective.name
            );
        }
        eprintln!(
            "chaos library: {file} {:?} on {:?}, worst {:?}",
            ended.outcome, ended.targets, ended.slo_extremes
        );
        // The next drill starts from two gateways scraped and up.
        let gateways = ready_pods(client, ns, sale, "gateway").await?;
        await_scraped_and_up(ns, &gateways).await?;
    }
    let left = residue(client, ns).await?;
    assert!(left.is_empty(), "chaos left in the pods: {left:?}");
    Ok(())
}

/// Where the library's files name the stores (the example shop's), and
/// where the stack's are: each address a network drill names, made the
/// stack's. The brokers' advertised address is the `kafka` Service's
/// endpoint, where pods' Kafka clients connect after bootstrapping.
async fn stack_addresses(client: &Client) -> anyhow::Result<BTreeMap<&'static str, String>> {
    let host_port = |url: &str| {
        url.trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned()
    };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "flashsale-stack");
    let kafka = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=kafka"))
        .await?;
    let advertised = kafka
        .items
        .iter()
        .find_map(|slice| {
            let port = slice.ports.as_ref()?.first()?.port?;
            let ip = slice
                .endpoints
                .as_ref()?
                .first()?
                .addresses
                .first()?
                .clone();
            Some(format!("{ip}:{port}"))
        })
        .ok_or_else(|| anyhow::anyhow!("the kafka Service has no endpoint"))?;
    Ok([
        (
            "redis.shop.svc.cluster.local:6379",
            host_port(&stack::in_cluster::redis_url()?),
        ),
        (
            "kafka.shop.svc.cluster.local:9092",
            stack::in_cluster::kafka_brokers()?,
        ),
        (
            "kafka-0.kafka-headless.shop.svc.cluster.local:9092",
            advertised,
        ),
    ]
    .into())
}

/// [`run_now`] on a Live sale (the files keep off Live sales; the buyers'
/// orders that threaten these SLOs flow only while one is), with the
/// stores' addresses the stack's.
fn run_now_live(
    file: &str,
    sale: &str,
    addresses: &BTreeMap<&str, String>,
) -> anyhow::Result<Value> {
    let mut drill = run_now(file, sale, "20s")?;
    drill["spec"]["avoidLiveSale"] = false.into();
    let to = drill.pointer_mut("/spec/experiments/0/networkChaos/toAddresses");
    if let Some(list) = to.and_then(Value::as_array_mut) {
        for address in list {
            let named = address.as_str().unwrap_or_default();
            let stack = addresses
                .get(named)
                .ok_or_else(|| anyhow::anyhow!("{file} names {named}, not a store of the shop"))?;
            *address = stack.clone().into();
        }
    }
    Ok(drill)
}

/// Every one of `acknowledged` is exactly one row of the database, once the
/// order-writer caught up; the rows, and the longest an order waited from
/// its acknowledgement (`created_at`, the gateway's) to its row
/// (`updated_at`, the database's clock at the insert; unpaid orders are
/// never updated again).
async fn every_acknowledged_order_stored(
    acknowledged: &BTreeSet<String>,
) -> anyhow::Result<(i64, f64)> {
    let db = sqlx::PgPool::connect(&stack::postgres_url()?).await?;
    let ids: Vec<String> = acknowledged.iter().cloned().collect();
    let want = i64::try_from(ids.len())?;
    let (rows, waited) = poll_until(
        "every acknowledged order in the database",
        START,
        TICK,
        || async {
            let (rows, distinct, waited): (i64, i64, f64) = sqlx::query_as(
                "SELECT count(*), count(DISTINCT order_id), \
                 COALESCE(EXTRACT(EPOCH FROM max(updated_at - created_at)), 0)::float8 \
                 FROM orders WHERE order_id = ANY($1)",
            )
            .bind(&ids)
            .fetch_one(&db)
            .await
            .map_err(|e| e.to_string())?;
            // A row twice ends the wait at once: the assertion below says so.
            if rows != distinct || distinct == want {
                Ok((rows, waited))
            } else {
                Err(format!("{distinct} of {want} stored"))
            }
        },
    )
    .await?;
    assert_eq!(rows, want, "an acknowledged order stored twice");
    Ok((rows, waited))
}

/// One library drill run under orders, and what the buyers and the
/// database saw.
struct UnderOrders {
    drill: ChaosDrill,
    ended: RunRecord,
    tally: OrderTally,
    /// The longest an acknowledged order waited for its row, in seconds.
    waited: f64,
}

/// Runs the library's `file` on the Live `sale` while buyers order ten
/// units a second through `gateway`; then waits until every order they
/// were acknowledged is stored.
async fn run_under_orders(
    client: &Client,
    ns: &str,
    sale: &str,
    gateway: &str,
    file: &str,
    addresses: &BTreeMap<&str, String>,
) -> anyhow::Result<UnderOrders> {
    let flow = OrderFlow::start(gateway, file.trim_end_matches(".yaml"), "CASE", 10)?;
    // The sale is open once orders are acknowledged.
    poll_until("the first acknowledged order", START, TICK, || async {
        let tally = flow.tally();
        if tally.acknowledged.is_empty() {
            Err(format!("{tally:?}"))
        } else {
            Ok(())
        }
    })
    .await?;
    let drill = run_now_live(file, sale, addresses)?;
    await_objectives_hold(file, &drill, ns, sale).await?;
    let (drill, ended) = run(client, ns, drill).await?;
    let tally = flow.stop().await;
    let (stored, waited) = every_acknowledged_order_stored(&tally.acknowledged).await?;
    eprintln!(
        "chaos library under orders: {file} {:?} ({:?}) on {:?}, worst {:?}, detection {:?}, \
         abort {:?}; answers {:?}, {} unanswered, {stored} acknowledged orders stored, the \
         longest after {waited:.1} s",
        ended.outcome,
        ended.reason,
        ended.targets,
        ended.slo_extremes,
        ended.detection_latency,
        ended.abort_latency,
        tally.answers,
        tally.unanswered,
    );
    Ok(UnderOrders {
        drill,
        ended,
        tally,
        waited,
    })
}

#[tokio::test]
async fn the_librarys_store_and_zone_drills_run_under_orders_lose_none_and_end_as_their_comments_say()
-> anyhow::Result<()> {
    let _turn = REAL_NODE.lock().await;
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "chaos-library-orders").await?;
    let ns = &ns.name;
    let operator = operator(ns)?;
    // Live in 20 s, with stock for every order the runs place.
    let sale = create_stocked_sale(&client, ns, SignedDuration::from_secs(20), 100_000).await?;
    let sale = &sale.name;
    await_ready(&client, ns, sale).await?;
    let gateways = ready_pods(&client, ns, sale, "gateway").await?;
    await_scraped_and_up(ns, &gateways).await?;
    let gateway = format!(
        "http://{}",
        cluster_ip(&client, ns, &format!("{sale}-gateway")).await?
    );
    let addresses = stack_addresses(&client).await?;
    // As the delay drill's comment says: without netem in the node's kernel
    // Chaos Mesh cannot delay a packet, and the run says so. It goes last:
    // Chaos Mesh keeps retrying a delay it could not apply for as long as
    // the pod lives, and fails every other network fault on that pod too.
    let (delay, delay_reason) = if inside::kernel_has_netem()? {
        (RunOutcome::Succeeded, "SloHeld")
    } else {
        (RunOutcome::Failed, "NotInjected")
    };

    for (file, expected, reason) in [
        (
            "order-writer-kafka-partition.yaml",
            RunOutcome::Succeeded,
            "SloHeld",
        ),
        (
            "order-writer-cpu-stress.yaml",
            RunOutcome::Succeeded,
            "SloHeld",
        ),
        ("zone-partition.yaml", RunOutcome::Aborted, "SloBreached"),
        ("inventory-redis-delay.yaml", delay, delay_reason),
    ] {
        let UnderOrders {
            drill,
            ended,
            tally,
            waited,
        } = run_under_orders(&client, ns, sale, &gateway, file, &addresses).await?;
        assert_eq!(ended.outcome, Some(expected), "{file}: {ended:?}");
        assert_eq!(ended.reason.as_deref(), Some(reason), "{file}: {ended:?}");
        // Every objective was read, with orders flowing.
        for objective in &drill.spec.slo_guard.objectives {
            assert!(
                ended.slo_extremes.contains_key(&objective.name),
                "{file}: no value of {}: {ended:?}",
                objective.name
            );
        }
        if reason != "NotInjected" {
            assert!(ended.injected_at.is_some(), "{file}: {ended:?}");
        }
        if file == "order-writer-kafka-partition.yaml" {
            // Orders acknowledged while the order-writer was cut off waited
            // in Kafka for the 20 s partition to end.
            assert!(waited > 10.0, "{file}: the longest wait {waited:.1} s");
        }
        if expected == RunOutcome::Aborted {
            assert!(ended.abort_latency.is_some(), "{ended:?}");
            assert!(tally.server_errors() > 0, "{file}: no order refused");
        }
        let gateways = ready_pods(&client, ns, sale, "gateway").await?;
        await_scraped_and_up(ns, &gateways).await?;
    }
    let left = residue(&client, ns).await?;
    assert!(left.is_empty(), "chaos left in the pods: {left:?}");
    drop(operator);
    Ok(())
}
