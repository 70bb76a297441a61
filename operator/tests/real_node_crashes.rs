//! Crashes in the middle of a fault that chaos-daemon injected on the real
//! node: chaos-daemon SIGKILLed while a partition cuts a gateway off, and
//! the operator SIGKILLed during one. What the run reports, what stays on
//! the node, and what ends it, measured from inside the pod. One test at a
//! time: each takes a component away from the whole node.

mod common;

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use common::real_node::{
    START, Scene, TICK, await_injected, ended_run, gateways_up, operator, pod_ip, ready_pods,
    residue, run_now_drill,
};
use flashsale_api::{ChaosDrill, chaosdrill::RunOutcome};
use flashsale_controller_drill::chaos::Kind;
use flashsale_e2e::{
    faults::{Outage, exclusive},
    inside,
    wait::poll_until,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, PostParams},
};
use serde_json::json;

/// How long Chaos Mesh may take to recover a fault once chaos-daemon is
/// back: it retries a failed recovery with a backoff that has grown while
/// the daemon was away.
const RETURN: Duration = Duration::from_secs(300);

/// A drill cutting one gateway off from the sale's inventory for
/// `duration`, guarded by an objective the cut does not break, so only
/// the end of its time, or a crash, ends it.
fn cut(ns: &str, sale: &str, duration: &str) -> anyhow::Result<ChaosDrill> {
    run_now_drill(
        "cut",
        sale,
        json!({"name": "cut", "target": "gateway", "duration": duration,
               "networkChaos": {"action": "partition", "to": "inventory"}}),
        json!({"name": "gateways-up", "query": gateways_up(ns, sale),
               "threshold": 1, "breachWhen": "Below"}),
    )
}

/// The first ready inventory pod's serving address.
async fn inventory(client: &Client, ns: &str, sale: &str) -> anyhow::Result<SocketAddr> {
    let pods = ready_pods(client, ns, sale, "inventory").await?;
    let pod = pods
        .first()
        .ok_or_else(|| anyhow::anyhow!("no ready inventory"))?;
    Ok(format!("{}:8080", pod_ip(pod)?).parse()?)
}

/// Whether process `pid`'s pod reaches `to` (a second to connect).
fn reaches(pid: u32, to: SocketAddr) -> anyhow::Result<bool> {
    Ok(inside::connects_from(pid, to, Duration::from_secs(1))?)
}

/// The run's objects of `kind` still in the namespace.
async fn left_of(
    client: &Client,
    ns: &str,
    kind: Kind,
    run: &str,
) -> anyhow::Result<Vec<DynamicObject>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.resource());
    let params = ListParams::default().labels(&format!("flashsale.dev/run={run}"));
    Ok(api.list(&params).await?.items)
}

/// Waits until the run's NetworkChaos and Workflow are gone and the target
/// reaches the inventory again; how long that took from `since`.
async fn until_healed(
    client: &Client,
    ns: &str,
    run: &str,
    (pid, inventory): (u32, SocketAddr),
    (since, bound): (Instant, Duration),
) -> anyhow::Result<Duration> {
    poll_until("the partition removed and healed", bound, TICK, || async {
        let left: Vec<String> = left_of(client, ns, Kind::NetworkChaos, run)
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        let reached = reaches(pid, inventory).map_err(|e| e.to_string())?;
        (left.is_empty() && reached)
            .then_some(())
            .ok_or(format!("left {left:?}, reaches the inventory: {reached}"))
    })
    .await?;
    Ok(since.elapsed())
}

#[tokio::test]
async fn a_partition_outlives_a_crashed_chaos_daemon_the_run_names_what_stayed_and_its_return_ends_it()
-> anyhow::Result<()> {
    let _alone = exclusive().await;
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-daemon-crash").await?;
    let inventory = inventory(&client, &ns.name, &sale.name).await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    drills
        .create(&PostParams::default(), &cut(&ns.name, &sale.name, "20s")?)
        .await?;
    let (_, pid) = await_injected(&drills, "cut", &gateways, |pid| {
        Ok(inside::iptables(pid)?.contains("-j DROP"))
    })
    .await?;
    let daemon = Outage::crash("chaos-daemon").await?;
    // The run's time runs out with nobody to undo the cut: Chaos Mesh
    // keeps the deleted object, and the run fails naming it.
    let ended = ended_run(&drills, "cut").await?;
    eprintln!("ended without chaos-daemon: {:?}", ended.message);
    assert_eq!(ended.outcome, Some(RunOutcome::Failed), "{ended:?}");
    assert_eq!(
        ended.reason.as_deref(),
        Some("ExperimentsNotRemoved"),
        "{ended:?}"
    );
    let held = left_of(&client, &ns.name, Kind::NetworkChaos, &ended.id).await?;
    let [object] = held.as_slice() else {
        anyhow::bail!("one NetworkChaos expected: {held:?}");
    };
    let message = ended.message.clone().unwrap_or_default();
    let named = format!("NetworkChaos/{}", object.name_any());
    assert!(
        message.contains(&named) && message.contains("chaos-daemon"),
        "{message}"
    );
    assert!(
        object.metadata.deletion_timestamp.is_some() && !object.finalizers().is_empty(),
        "{object:?}"
    );
    // What stayed on the node: the cut itself.
    assert!(
        !reaches(pid, inventory)?,
        "the cut healed without chaos-daemon"
    );
    let back = Instant::now();
    daemon.end().await?;
    let healed = until_healed(
        &client,
        &ns.name,
        &ended.id,
        (pid, inventory),
        (back, RETURN),
    )
    .await?;
    eprintln!("chaos-daemon back → {named} gone and the cut healed: {healed:?}");
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}

#[tokio::test]
async fn the_operator_sigkilled_mid_partition_leaves_chaos_mesh_to_end_it_and_the_cut_heals()
-> anyhow::Result<()> {
    let _alone = exclusive().await;
    let Scene {
        client,
        ns,
        operator: mut first,
        sale,
        gateways,
    } = Scene::start("real-operator-crash").await?;
    let inventory = inventory(&client, &ns.name, &sale.name).await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    drills
        .create(&PostParams::default(), &cut(&ns.name, &sale.name, "5m")?)
        .await?;
    let (_, pid) = await_injected(&drills, "cut", &gateways, |pid| {
        Ok(inside::iptables(pid)?.contains("-j DROP"))
    })
    .await?;
    let run = drills
        .get("cut")
        .await?
        .status
        .and_then(|s| s.current_run)
        .map(|r| r.id)
        .ok_or_else(|| anyhow::anyhow!("no current run"))?;
    first.kill();
    // Nobody guards the run: Chaos Mesh's StatusCheck finds the guard's
    // endpoint silent, aborts the Workflow, and its experiments go.
    let healed = until_healed(
        &client,
        &ns.name,
        &run,
        (pid, inventory),
        (Instant::now(), START),
    )
    .await?;
    eprintln!("operator SIGKILLed → the partition removed by Chaos Mesh and healed: {healed:?}");
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    // Chaos Mesh aborted the run's Workflow but keeps it; the next
    // operator records what happened to the run and removes it.
    let aborted = left_of(&client, &ns.name, Kind::Workflow, &run).await?;
    assert_eq!(aborted.len(), 1, "{aborted:?}");
    let _next = operator(&ns.name)?;
    let ended = ended_run(&drills, "cut").await?;
    assert_eq!(ended.id, run);
    let left = left_of(&client, &ns.name, Kind::Workflow, &run).await?;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert!(
        matches!(ended.reason.as_deref(), Some("GuardLost" | "BackstopFired")),
        "{ended:?}"
    );
    Ok(())
}
