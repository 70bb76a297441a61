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

use std::collections::{BTreeMap, BTreeSet};

use common::{
    real_node::{
        START, Scene, TICK, await_ready, await_scraped_and_up, cluster_ip, create_stocked_sale,
        operator, ready_pods, residue, views_of,
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
    library,
    order_flow::{OrderFlow, OrderTally},
    prometheus,
    reach::Reach,
    stack,
    stores::Stores,
    wait::poll_until,
};
use jiff::{
    SignedDuration, Timestamp,
    civil::{Date, Weekday},
    tz::TimeZone,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::Value;

/// Held by each test that runs drills on the real node, so they take turns:
/// the CPU stress of one would starve the other's gateways (their scrapes,
/// their answers) and turn its verdicts into the machine's.
static REAL_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let files = library::FILES;
    assert!(files.len() >= 8, "{} drills in chaos/", files.len());

    let mut faults = BTreeSet::new();
    for (file, text) in files {
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
        assert_eq!(format!("{name}.yaml"), file, "a drill is named as its file");
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
    let drill: ChaosDrill =
        serde_yaml_ng::from_str(library::text("friday-evening-blackout.yaml")?)?;
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
        "friday-evening-blackout.yaml",
    ] {
        let drill = library::run_now(file, sale, "test", "20s", &BTreeMap::new())?;
        library::await_objectives_hold(&drill, ns, sale, &stack::prometheus_url()?).await?;
        let (drill, ended) = library::run(client, ns, drill).await?;
        let (outcome, reason) = library::ending(file, true);
        assert_eq!(ended.outcome, Some(outcome), "{file}: {ended:?}");
        assert_eq!(ended.reason.as_deref(), Some(reason), "{file}: {ended:?}");
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
    addresses: &BTreeMap<String, String>,
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
    let drill = library::run_now(file, sale, "test", "20s", addresses)?;
    library::await_objectives_hold(&drill, ns, sale, &stack::prometheus_url()?).await?;
    let (drill, ended) = library::run(client, ns, drill).await?;
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
    // The stores as the stack's Secret names them, as a user's suite finds
    // them.
    let stores = Stores::discover(&client, Reach::ServiceIp).await?;
    let addresses = library::addresses(&client, &stores.in_cluster).await?;
    // As the delay drill's comment says: without netem in the node's kernel
    // Chaos Mesh cannot delay a packet, and the run says so.
    let netem = inside::kernel_has_netem()?;

    for file in [
        "order-writer-kafka-partition.yaml",
        "order-writer-cpu-stress.yaml",
        "zone-partition.yaml",
        "inventory-redis-delay.yaml",
    ] {
        let (expected, reason) = library::ending(file, netem);
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
