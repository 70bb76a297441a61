//! Faults that chaos-daemon injects inside a pod (network delay and
//! partition, CPU and memory stress, clock skew, a killed container), each
//! run by a ChaosDrill on a real pod of the real node, seen from inside the
//! pod's namespaces rather than read from Chaos Mesh's status, aborted by
//! its guard and shown gone with nothing left on the node.

mod common;

use std::time::{Duration, Instant};

use common::real_node::{
    START, Scene, TICK, await_below, await_injected, await_ready_gateways, cluster_ip, ended_run,
    gateways_up, http, page_views, pod_ip, ready_pods, residue, run_now_drill, token_expiring,
};
use flashsale_api::{ChaosDrill, chaosdrill::RunOutcome, children::OPS_PORT_NUMBER};
use flashsale_controller_drill::{KILL_SWITCH_ANNOTATION, chaos::Kind};
use flashsale_e2e::{inside, stack, wait::poll_until};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

/// The objective a network delay on a gateway breaks for real: Prometheus's
/// scrape of the gateway waits for the delayed answer. Averaged over 10 s,
/// so the breach comes seconds after the injection and the test can look
/// inside the pod first.
fn gateway_scrape_seconds(ns: &str, sale: &str) -> String {
    format!(
        r#"max(avg_over_time(scrape_duration_seconds{{namespace="{ns}", pod=~"{sale}-gateway-.*"}}[10s]))"#
    )
}

/// A drill delaying everything one gateway sends by 150 ms ± 20 ms, the
/// seeds' figure, guarded by the gateways' scrape time.
fn delay_drill(ns: &str, sale: &str) -> anyhow::Result<ChaosDrill> {
    run_now_drill(
        "delay",
        sale,
        json!({"name": "slow", "target": "gateway", "duration": "2m",
               "networkChaos": {"action": "delay", "latency": "150ms", "jitter": "20ms"}}),
        json!({"name": "gateway-scrape", "query": gateway_scrape_seconds(ns, sale),
               "threshold": 0.1, "breachWhen": "Above"}),
    )
}

/// The connect time from `pid`'s network namespace to the inventory's
/// first pod, median of five.
fn inventory_connect(pid: u32, inventory: &Pod) -> anyhow::Result<Duration> {
    let ip = pod_ip(inventory)?;
    let mut times = (0..5)
        .map(|_| inside::connect_time(pid, &ip, 8080, Duration::from_secs(2)))
        .collect::<Result<Vec<_>, _>>()?;
    times.sort();
    Ok(times[2])
}

#[tokio::test]
async fn a_delay_on_a_real_gateway_is_seen_from_inside_and_removed_or_fails_naming_the_kernel()
-> anyhow::Result<()> {
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-delay").await?;
    let inventory = ready_pods(&client, &ns.name, &sale.name, "inventory").await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    if inside::kernel_has_netem()? {
        delay_seen_and_removed(&drills, &ns.name, &sale.name, &gateways, &inventory[0]).await?;
    } else {
        delay_not_injected(&client, &drills, &ns.name, &sale.name, &gateways).await?;
    }
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}

/// On a kernel without netem (these machines' is built without it and
/// loads no modules), chaos-daemon's `tc` fails in the pod: the run must
/// fail quoting Chaos Mesh, not pass as "the SLO held", and leave nothing.
async fn delay_not_injected(
    client: &Client,
    drills: &Api<ChaosDrill>,
    ns: &str,
    sale: &str,
    gateways: &[Pod],
) -> anyhow::Result<()> {
    drills
        .create(&PostParams::default(), &delay_drill(ns, sale)?)
        .await?;
    let ended = ended_run(drills, "delay").await?;
    eprintln!(
        "no netem in this kernel: {:?} {:?}",
        ended.reason, ended.message
    );
    assert_eq!(ended.outcome, Some(RunOutcome::Failed), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("NotInjected"), "{ended:?}");
    let message = ended.message.clone().unwrap_or_default();
    // Chaos Mesh's record keeps only its summary; chaos-daemon's log has
    // the kernel's words ("Specified qdisc kind is unknown").
    assert!(message.contains("unable to set tcs"), "{message}");
    assert!(
        message.contains(&ended.targets.join(", ")),
        "{message} {ended:?}"
    );
    for gateway in gateways {
        let qdiscs = inside::qdiscs(inside::pid_of(gateway)?)?;
        assert!(!qdiscs.contains("netem"), "{qdiscs}");
    }
    // The Workflow goes; a NetworkChaos Chaos Mesh could not inject keeps
    // its finalizer (it recovers only what it injected), and the run names it.
    let params = ListParams::default().labels(&format!("flashsale.dev/run={}", ended.id));
    let workflows: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &Kind::Workflow.resource());
    assert!(
        workflows.list(&params).await?.items.is_empty(),
        "Workflow left"
    );
    let network: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &Kind::NetworkChaos.resource());
    for left in network.list(&params).await?.items {
        let named = format!("NetworkChaos/{}", left.name_any());
        assert!(
            message.contains("Chaos Mesh still held") && message.contains(&named),
            "{message}"
        );
    }
    Ok(())
}

/// On a kernel with netem: the rule and the slower connect seen inside the
/// target while injected, the real breach aborting the run, and both gone.
async fn delay_seen_and_removed(
    drills: &Api<ChaosDrill>,
    ns: &str,
    sale: &str,
    gateways: &[Pod],
    inventory: &Pod,
) -> anyhow::Result<()> {
    let before: Vec<Duration> = gateways
        .iter()
        .map(|g| inventory_connect(inside::pid_of(g)?, inventory))
        .collect::<anyhow::Result<_>>()?;
    drills
        .create(&PostParams::default(), &delay_drill(ns, sale)?)
        .await?;
    // Inside the target while injected: the netem rule, and a connect whose
    // SYN leaves the pod 150 ms late.
    let (index, pid) = await_injected(drills, "delay", gateways, |pid| {
        Ok(inside::qdiscs(pid)?.contains("netem"))
    })
    .await?;
    let qdiscs = inside::qdiscs(pid)?;
    assert!(qdiscs.contains("delay 150ms"), "{qdiscs}");
    let during = inventory_connect(pid, inventory)?;
    eprintln!(
        "connect to the inventory: {:?} before, {during:?} injected",
        before[index]
    );
    assert!(
        during >= before[index] + Duration::from_millis(100),
        "{:?} → {during:?}",
        before[index]
    );
    let ended = ended_run(drills, "delay").await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"), "{ended:?}");
    // Gone as the pod sees it: no rule, the connect time back to normal.
    let after_qdiscs = inside::qdiscs(pid)?;
    assert!(!after_qdiscs.contains("netem"), "{after_qdiscs}");
    let after = inventory_connect(pid, inventory)?;
    assert!(
        after < before[index] + Duration::from_millis(50),
        "{after:?} after the stop"
    );
    Ok(())
}

/// Stock refreshes of `ns`'s gateways a second that the inventory did not
/// answer, averaged over 15 s: a partition from the inventory fails every
/// refresh (the page is then served stale, without waiting, so its latency
/// does not show the cut), and the average lets the breach come seconds
/// after the injection, so the test can look inside the pod first.
fn failed_refreshes(ns: &str) -> String {
    format!(
        r#"avg_over_time((sum(rate(gateway_item_refreshes_failed_total{{namespace="{ns}"}}[5s])) or vector(0))[15s:1s])"#
    )
}

/// A drill cutting one gateway off from the sale's inventory, guarded by
/// the stock refreshes that fail.
fn partition_drill(ns: &str, sale: &str) -> anyhow::Result<ChaosDrill> {
    run_now_drill(
        "partition",
        sale,
        json!({"name": "cut", "target": "gateway", "duration": "1m",
               "networkChaos": {"action": "partition", "to": "inventory"}}),
        json!({"name": "failed-refreshes", "query": failed_refreshes(ns),
               "threshold": 0.5, "breachWhen": "Above"}),
    )
}

/// Whether a TCP connect from process `pid` to `ip:port` succeeds within
/// a second.
fn connects(pid: u32, ip: &str, port: u16) -> bool {
    inside::connect_time(pid, ip, port, Duration::from_secs(1)).is_ok()
}

#[tokio::test]
async fn a_partition_cuts_a_real_gateway_off_the_inventory_alone_until_its_guard_aborts()
-> anyhow::Result<()> {
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-partition").await?;
    let inventory_pods = ready_pods(&client, &ns.name, &sale.name, "inventory").await?;
    let inventory = [
        pod_ip(&inventory_pods[0])?,
        cluster_ip(&client, &ns.name, &format!("{}-inventory", sale.name)).await?,
    ];
    let views = page_views(&gateways, "/api/v1/items/CASE")?;
    let query = failed_refreshes(&ns.name);
    await_below("the stock refreshes measured and answered", &query, 0.5).await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    drills
        .create(
            &PostParams::default(),
            &partition_drill(&ns.name, &sale.name)?,
        )
        .await?;
    let (index, pid) = await_injected(&drills, "partition", &gateways, |pid| {
        Ok(inside::iptables(pid)?.contains("-j DROP"))
    })
    .await?;
    let other = &gateways[1 - index];
    // Across the cut, to the pod and through its Service, nothing connects;
    // elsewhere everything does.
    for ip in &inventory {
        assert!(!connects(pid, ip, 8080), "the target reached {ip}");
        assert!(
            connects(inside::pid_of(other)?, ip, 8080),
            "the bystander did not reach {ip}"
        );
    }
    assert!(
        connects(pid, &pod_ip(other)?, 8080),
        "the target is cut off from the other gateway"
    );
    let ended = ended_run(&drills, "partition").await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"), "{ended:?}");
    drop(views);
    for ip in &inventory {
        assert!(
            connects(pid, ip, 8080),
            "still cut from {ip} after the stop"
        );
    }
    // Chaos Mesh unhooks the fault's chain and keeps it, inert, with its
    // ipsets (chaos-mesh issue #4336): nothing may still jump into it.
    let rules = inside::iptables(pid)?;
    assert!(!rules.contains("-A CHAOS-OUTPUT -j"), "{rules}");
    eprintln!("left inert: {:?}", inside::inert()?);
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}

/// Rate-limit decisions a second that the busiest gateway of `ns` took
/// alone, over 10 s: a gateway that cannot reach Redis decides locally.
fn local_decisions(ns: &str) -> String {
    format!(
        r#"max(sum by (pod) (rate(gateway_rate_limit_decisions_total{{namespace="{ns}", source="local"}}[10s])))"#
    )
}

#[tokio::test]
async fn a_partition_towards_redis_by_its_service_name_cuts_one_gateway_off_the_store_alone()
-> anyhow::Result<()> {
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-store-cut").await?;
    // The store as the sale names it: its Service's DNS name and port.
    let url = stack::in_cluster::redis_url()?;
    let address = url.trim_start_matches("redis://").trim_end_matches('/');
    let redis = cluster_ip(&client, "flashsale-stack", "redis").await?;
    let inventory = pod_ip(&ready_pods(&client, &ns.name, &sale.name, "inventory").await?[0])?;
    // Order histories are rate-limited under the quota shared in Redis.
    let views = page_views(&gateways, "/api/v1/orders/history")?;
    let query = local_decisions(&ns.name);
    await_below(
        "the rate-limit decisions measured, none local",
        &query,
        0.01,
    )
    .await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    let drill = run_now_drill(
        "store-cut",
        &sale.name,
        json!({"name": "cut", "target": "gateway", "duration": "1m",
               "networkChaos": {"action": "partition", "toAddresses": [address]}}),
        json!({"name": "local-decisions", "query": query, "threshold": 1, "breachWhen": "Above"}),
    )?;
    drills.create(&PostParams::default(), &drill).await?;
    let (index, pid) = await_injected(&drills, "store-cut", &gateways, |pid| {
        Ok(inside::iptables(pid)?.contains("-j DROP"))
    })
    .await?;
    // Across the cut: Redis through its Service; the inventory still
    // answers, and the other gateway still reaches Redis.
    assert!(!connects(pid, &redis, 6379), "the target reached Redis");
    assert!(
        connects(pid, &inventory, 8080),
        "the target lost the inventory"
    );
    let bystander = inside::pid_of(&gateways[1 - index])?;
    assert!(
        connects(bystander, &redis, 6379),
        "the bystander lost Redis"
    );
    let ended = ended_run(&drills, "store-cut").await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"), "{ended:?}");
    drop(views);
    assert!(
        connects(pid, &redis, 6379),
        "still cut from Redis after the stop"
    );
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}

/// Restarts of any gateway of `sale` in the last minute as Prometheus sees
/// them: every new process exports a new start time.
fn gateway_restarts(ns: &str, sale: &str) -> String {
    format!(
        r#"max(changes(process_start_time_seconds{{namespace="{ns}", pod=~"{sale}-gateway-.*"}}[1m]))"#
    )
}

/// The gateway container's (id, restart count) in `pod`.
fn gateway_container(pod: &Pod) -> Option<(String, i32)> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "gateway")
        .map(|c| (c.container_id.clone().unwrap_or_default(), c.restart_count))
}

#[tokio::test]
async fn a_container_kill_restarts_the_gateway_in_its_pod_and_the_restart_aborts_the_run()
-> anyhow::Result<()> {
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-container").await?;
    let pids = gateways
        .iter()
        .map(inside::pid_of)
        .collect::<Result<Vec<_>, _>>()?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    let drill = run_now_drill(
        "container",
        &sale.name,
        json!({"name": "kill", "target": "gateway", "duration": "1m",
               "podChaos": {"action": "container-kill"}}),
        json!({"name": "gateway-restarts", "query": gateway_restarts(&ns.name, &sale.name),
               "threshold": 0, "breachWhen": "Above"}),
    )?;
    drills.create(&PostParams::default(), &drill).await?;
    let ended = ended_run(&drills, "container").await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"), "{ended:?}");
    let [target] = ended.targets.as_slice() else {
        anyhow::bail!("one target expected: {ended:?}");
    };
    let victim = target.rsplit('/').next().unwrap_or_default();
    // The same pods: only the target's gateway process was killed, and the
    // kubelet started it again in place.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for (gateway, pid) in gateways.iter().zip(pids) {
        let now = pods.get(&gateway.name_any()).await?;
        assert_eq!(now.uid(), gateway.uid(), "a pod was replaced");
        let (id_before, restarts_before) = gateway_container(gateway).unwrap_or_default();
        let (id_now, restarts_now) = gateway_container(&now).unwrap_or_default();
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        if gateway.name_any() == victim {
            assert_eq!(restarts_now, restarts_before + 1, "{now:?}");
            assert_ne!(id_now, id_before);
            assert!(!alive, "the killed process {pid} still runs");
        } else {
            assert_eq!((id_now, restarts_now), (id_before, restarts_before));
            assert!(alive, "a bystander's process {pid} is gone");
        }
    }
    await_ready_gateways(
        &client,
        &ns.name,
        &sale.name,
        2,
        "the killed gateway ready again",
    )
    .await?;
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}

/// The CPU of the busiest gateway container of `sale`, in cores, as the
/// kubelet reports it, over 20 s: stressors run in the target container's
/// cgroup, so their work is the container's, and the long window lets the
/// breach come seconds after the injection, so the test can look inside
/// the pod first.
fn gateway_cpu(ns: &str, sale: &str) -> String {
    format!(
        r#"max(sum by (pod) (rate(container_cpu_usage_seconds_total{{namespace="{ns}", pod=~"{sale}-gateway-.*", container="gateway"}}[20s])))"#
    )
}

/// The cores the container of process `pid` used over the next second.
async fn cores_used(pid: u32) -> anyhow::Result<f64> {
    let (before, start) = (inside::cgroup_cpu(pid)?, Instant::now());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = inside::cgroup_cpu(pid)?.saturating_sub(before);
    Ok(used.as_secs_f64() / start.elapsed().as_secs_f64())
}

const STRESSORS: [&str; 2] = ["stress-ng", "memStress"];

#[tokio::test]
async fn a_stress_burns_the_asked_cpu_and_memory_in_the_gateways_container_until_its_guard_aborts()
-> anyhow::Result<()> {
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-stress").await?;
    let query = gateway_cpu(&ns.name, &sale.name);
    await_below("the gateways' CPU measured and low", &query, 0.25).await?;
    let memory_before: Vec<u64> = gateways
        .iter()
        .map(|g| Ok(inside::cgroup_memory(inside::pid_of(g)?)?))
        .collect::<anyhow::Result<_>>()?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    let drill = run_now_drill(
        "stress",
        &sale.name,
        json!({"name": "burn", "target": "gateway", "duration": "1m",
               "stressChaos": {"cpuWorkers": 1, "cpuLoadPercent": 60,
                               "memoryWorkers": 1, "memorySize": "64MB"}}),
        json!({"name": "gateway-cpu", "query": query, "threshold": 0.25, "breachWhen": "Above"}),
    )?;
    drills.create(&PostParams::default(), &drill).await?;
    let (index, pid) = await_injected(&drills, "stress", &gateways, |pid| {
        let found = inside::processes_beside(pid, &STRESSORS)?;
        Ok(STRESSORS
            .iter()
            .all(|name| found.iter().any(|(_, comm)| comm == name)))
    })
    .await?;
    // Inside the target's cgroups: the stressors' CPU and memory.
    let cores = cores_used(pid).await?;
    let grown = poll_until("the memory stressor's 64 MB", START, TICK, || async {
        let now = inside::cgroup_memory(pid).map_err(|e| e.to_string())?;
        let grown = now.saturating_sub(memory_before[index]);
        (grown >= 48 << 20)
            .then_some(grown)
            .ok_or(format!("+{grown} bytes"))
    })
    .await?;
    eprintln!("stressed gateway: {cores:.2} cores, +{} MiB", grown >> 20);
    assert!(cores >= 0.3, "{cores} cores under a 60% load");
    let bystander = inside::pid_of(&gateways[1 - index])?;
    assert_eq!(inside::processes_beside(bystander, &STRESSORS)?, vec![]);
    let ended = ended_run(&drills, "stress").await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"), "{ended:?}");
    // Gone: no stressor anywhere, the container idle again.
    assert_eq!(inside::processes_beside(pid, &STRESSORS)?, vec![]);
    let after = cores_used(pid).await?;
    assert!(after < 0.1, "{after} cores after the stop");
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}

/// The skew of the most skewed gateway of `sale`, seconds, averaged over
/// 20 s: each gateway exports its wall clock's offset to Redis's, and the
/// average lets the breach come seconds after the injection, so the test
/// can look inside the pod first.
fn gateway_skew(ns: &str, sale: &str) -> String {
    format!(
        r#"avg_over_time((max(abs(gateway_clock_skew_seconds{{namespace="{ns}", pod=~"{sale}-gateway-.*"}})))[20s:1s])"#
    )
}

/// How far `gateway`'s wall clock is from Redis's, seconds, as the process
/// itself reports it (`gateway_clock_skew_seconds` on its ops port); and
/// its answer's status to a buyer's token that expired 60 s ago.
async fn gateway_clock(gateway: &Pod) -> anyhow::Result<(f64, u16)> {
    let ip = pod_ip(gateway)?;
    let metrics = http()?
        .get(format!("http://{ip}:{OPS_PORT_NUMBER}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let skew = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gateway_clock_skew_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no gateway_clock_skew_seconds"))?;
    let expired = token_expiring("late-buyer", Timestamp::now().as_second() - 60)?;
    let status = http()?
        .get(format!("http://{ip}:8080/api/v1/items/CASE"))
        .bearer_auth(expired)
        .send()
        .await?
        .status()
        .as_u16();
    Ok((skew, status))
}

#[tokio::test]
async fn a_clock_skew_moves_the_gateways_clock_but_not_the_sales_and_its_guard_aborts()
-> anyhow::Result<()> {
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-time").await?;
    let query = gateway_skew(&ns.name, &sale.name);
    await_below("the gateways' skew measured and small", &query, 2.0).await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    let drill = run_now_drill(
        "skew",
        &sale.name,
        json!({"name": "behind", "target": "gateway", "duration": "1m",
               "timeChaos": {"offset": "-2m"}}),
        json!({"name": "gateway-skew", "query": query, "threshold": 60, "breachWhen": "Above"}),
    )?;
    drills.create(&PostParams::default(), &drill).await?;
    // Inside the target: its clock two minutes behind; yet a token that
    // expired a minute ago is refused, since expiry is read on Redis's clock.
    let (index, _) = await_injected(&drills, "skew", &gateways, |_| Ok(true)).await?;
    let (skew, status) = poll_until("the target's clock behind", START, TICK, || async {
        let (skew, status) = gateway_clock(&gateways[index])
            .await
            .map_err(|e| e.to_string())?;
        (skew < -100.0)
            .then_some((skew, status))
            .ok_or(format!("{skew} s"))
    })
    .await?;
    eprintln!("skewed gateway: clock {skew} s, an expired token gets {status}");
    assert!((-125.0..=-115.0).contains(&skew), "{skew}");
    assert_eq!(status, 401, "a token expired 60 s ago was accepted");
    let (bystander, _) = gateway_clock(&gateways[1 - index]).await?;
    assert!(
        bystander.abs() <= 2.0,
        "the bystander's clock moved: {bystander}"
    );
    let ended = ended_run(&drills, "skew").await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"), "{ended:?}");
    // The process reads its clock again within its next measurement.
    poll_until("the target's clock back", START, TICK, || async {
        let (after, _) = gateway_clock(&gateways[index])
            .await
            .map_err(|e| e.to_string())?;
        (after.abs() <= 2.0)
            .then_some(())
            .ok_or(format!("{after} s"))
    })
    .await?;
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}

#[tokio::test]
async fn the_kill_switch_ends_a_stress_and_its_stressors_leave_the_container() -> anyhow::Result<()>
{
    let Scene {
        client,
        ns,
        operator,
        sale,
        gateways,
    } = Scene::start("real-switch").await?;
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    // An objective this stress cannot break: only the switch ends the run.
    let drill = run_now_drill(
        "switched",
        &sale.name,
        json!({"name": "burn", "target": "gateway", "duration": "5m",
               "stressChaos": {"cpuWorkers": 1, "cpuLoadPercent": 30}}),
        json!({"name": "gateways-up", "query": gateways_up(&ns.name, &sale.name),
               "threshold": 1, "breachWhen": "Below"}),
    )?;
    drills.create(&PostParams::default(), &drill).await?;
    let (_, pid) = await_injected(&drills, "switched", &gateways, |pid| {
        Ok(!inside::processes_beside(pid, &STRESSORS)?.is_empty())
    })
    .await?;
    let switched = Instant::now();
    let patch = json!({"metadata": {"annotations": {KILL_SWITCH_ANNOTATION: "true"}}});
    Api::<Namespace>::all(client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    poll_until("the stressors gone", START, TICK, || async {
        let left = inside::processes_beside(pid, &STRESSORS).map_err(|e| e.to_string())?;
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await?;
    let took = switched.elapsed();
    let ended = ended_run(&drills, "switched").await?;
    eprintln!("kill switch → stressors gone from the container: {took:?}");
    assert_eq!(
        (ended.outcome, ended.reason.as_deref()),
        (Some(RunOutcome::Aborted), Some("KillSwitch")),
        "{ended:?}"
    );
    assert_eq!(residue(&client, &ns.name).await?, Vec::<String>::new());
    drop(operator);
    Ok(())
}
