//! `kubectl flashsale` against the local apiserver and the real node, with
//! the operator running: each command's effect read back from the objects
//! and the gateways, its output, its exit code and its Event, as on-call,
//! as a user who may only read, and as the chart's on-call role.

mod common;

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use common::real_node::{Scene, TICK, example_policy, pod_ip, residue};
use flashsale_api::{
    ChaosDrill, DegradationPolicy, chaosdrill::KILL_SWITCH_ANNOTATION, degradation::TierReason,
};
use flashsale_e2e::{chart, wait::poll_until};
use k8s_openapi::api::{
    core::v1::Namespace,
    events::v1::Event,
    rbac::v1::{ClusterRole, Role, RoleBinding},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};

/// Long enough for the operator and the gateways, short of a hang.
const BOUND: Duration = Duration::from_secs(90);

/// The plugin's exit code, standard output and standard error for `args`.
async fn plugin(args: &[&str]) -> (u8, String, String) {
    let mut argv = vec!["kubectl-flashsale".into()];
    argv.extend(args.iter().map(Into::into));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = flashsale_cli::run(argv, &mut out, &mut err).await;
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (code, text(out), text(err))
}

/// Output a running `--watch` writes, read while it runs.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl Write for Shared {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The tier a gateway pod reports it applied, from its own metrics.
async fn gateway_tier(pod: &k8s_openapi::api::core::v1::Pod) -> anyhow::Result<f64> {
    let url = format!(
        "http://{}:{}/metrics",
        pod_ip(pod)?,
        flashsale_api::children::OPS_PORT_NUMBER
    );
    let text = reqwest::get(url).await?.text().await?;
    text.lines()
        .find_map(|l| l.strip_prefix("gateway_degradation_tier "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no gateway_degradation_tier in {}", pod.name_any()))
}

/// The Events of `reason` in `ns`, as (reporting instance, note).
async fn events(client: &Client, ns: &str, reason: &str) -> anyhow::Result<Vec<(String, String)>> {
    let listed = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            (
                e.reporting_instance.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect())
}

/// A user who may read the sale's objects in `ns` and write nothing.
async fn reader(client: &Client, ns: &str, user: &str) -> anyhow::Result<()> {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "flashsale-reader"},
        "rules": [{"apiGroups": ["flashsale.dev"],
                   "resources": ["flashsales", "degradationpolicies", "chaosdrills"],
                   "verbs": ["get", "list", "watch"]}]
    }))?;
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await?;
    bind(client, ns, user, "Role", "flashsale-reader").await
}

/// The chart's on-call ClusterRole, created under `name`, bound to `user`
/// in `ns`.
async fn on_call(client: &Client, ns: &str, user: &str, name: &str) -> anyhow::Result<()> {
    let rendered = chart::render_with("flashsale-operator", "flashsale-system", &json!({}))?;
    let mut role = rendered
        .into_iter()
        .find(|o| {
            o["kind"] == "ClusterRole" && o["metadata"]["name"] == "flashsale-operator-oncall"
        })
        .ok_or_else(|| {
            anyhow::anyhow!("the chart renders no flashsale-operator-oncall ClusterRole")
        })?;
    role["metadata"] = json!({"name": name});
    let role: ClusterRole = serde_json::from_value(role)?;
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    bind(client, ns, user, "ClusterRole", name).await
}

async fn bind(client: &Client, ns: &str, user: &str, kind: &str, role: &str) -> anyhow::Result<()> {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{user}-{}", role.len())},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Waits until `check` passes on the policy `name`.
async fn policy_until(
    policies: &Api<DegradationPolicy>,
    name: &str,
    what: &str,
    check: impl Fn(&DegradationPolicy) -> bool,
) -> anyhow::Result<DegradationPolicy> {
    let check = &check;
    Ok(poll_until(what, BOUND, TICK, || async move {
        let policy = policies.get(name).await.map_err(|e| e.to_string())?;
        if check(&policy) {
            Ok(policy)
        } else {
            Err(format!("{:?}", policy.status))
        }
    })
    .await?)
}

#[tokio::test]
async fn on_call_forces_a_tier_every_gateway_applies_and_status_shows_it() -> anyhow::Result<()> {
    let scene = Scene::start("plugin-tier").await?;
    let (client, ns, sale) = (
        &scene.client,
        scene.ns.name.as_str(),
        scene.sale.name.as_str(),
    );
    let policies: Api<DegradationPolicy> = Api::namespaced(client.clone(), ns);
    let created = policies
        .create(&PostParams::default(), &example_policy(ns, sale)?)
        .await?;
    let name = created.name_any();
    policy_until(&policies, &name, "tier 0 propagated", |p| {
        p.status.as_ref().is_some_and(|s| {
            s.tier == Some(0) && s.propagation.as_ref().is_some_and(|p| p.seconds.is_some())
        })
    })
    .await?;

    // A watch started before the change must redraw with it.
    let watched = Shared::default();
    let watch = {
        let argv = [
            "kubectl-flashsale",
            "status",
            sale,
            "-n",
            ns,
            "--watch",
            "--color",
            "never",
        ];
        let argv = argv.iter().map(Into::into).collect();
        tokio::spawn(flashsale_cli::run(argv, watched.clone(), std::io::sink()))
    };

    refusals(client, ns, sale, &policies, &name).await?;

    let role = format!("oncall-{ns}");
    force_tier_2(&scene, &policies, &name, &role).await?;

    poll_until("the watch redrawn at tier 2", BOUND, TICK, || {
        let text = watched.text();
        async move {
            let last = text.rsplit("\n--- ").next().unwrap_or_default().to_owned();
            (last.contains("tier 2") && last.contains("override by kubectl-flashsale"))
                .then_some(())
                .ok_or(text)
        }
    })
    .await?;
    watch.abort();

    status_as_json_then_clear(client, ns, sale, &policies, &name).await?;

    failover_check(client, ns, sale).await?;
    Api::<ClusterRole>::all(client.clone())
        .delete(&role, &DeleteParams::default())
        .await?;
    Ok(())
}

/// On-call, bound to the chart's role, forces tier 2: the plugin prints
/// the propagation, the policy obeys under the plugin's field manager,
/// every gateway reports tier 2, and the Event names the user.
async fn force_tier_2(
    scene: &Scene,
    policies: &Api<DegradationPolicy>,
    name: &str,
    role: &str,
) -> anyhow::Result<()> {
    let (client, ns, sale) = (
        &scene.client,
        scene.ns.name.as_str(),
        scene.sale.name.as_str(),
    );
    on_call(client, ns, "oncall", role).await?;
    let (code, out, err) = plugin(&[
        "degrade",
        sale,
        "-n",
        ns,
        "--as",
        "oncall",
        "--tier",
        "2",
        "--for",
        "10m",
        "--reason",
        "payments slow, INC-4211",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("tier 2 in force") && out.contains("applied by 2/2 gateways in"),
        "{out}"
    );

    // Read back from the objects and from the gateways themselves.
    let status = policies.get(name).await?.status.unwrap_or_default();
    let active = status
        .active_override
        .ok_or_else(|| anyhow::anyhow!("no override in force"))?;
    assert_eq!(
        (active.tier, active.set_by.as_str()),
        (2, flashsale_cli::FIELD_MANAGER)
    );
    for gateway in &scene.gateways {
        assert_eq!(gateway_tier(gateway).await?, 2.0, "{}", gateway.name_any());
    }
    let set = events(client, ns, "OverrideSet").await?;
    assert!(
        set.iter()
            .any(|(who, note)| who == "oncall" && note.contains("payments slow, INC-4211")),
        "{set:?}"
    );
    Ok(())
}

/// `-o json` parsed back, then the override cleared.
async fn status_as_json_then_clear(
    client: &Client,
    ns: &str,
    sale: &str,
    policies: &Api<DegradationPolicy>,
    name: &str,
) -> anyhow::Result<()> {
    let (code, json, err) = plugin(&["status", sale, "-n", ns, "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let parsed: Value = serde_json::from_str(&json)?;
    assert_eq!(parsed[0]["name"], sale);
    assert_eq!(parsed[0]["degradation"][0]["tier"], 2);
    assert_eq!(
        parsed[0]["degradation"][0]["override"]["reason"],
        "payments slow, INC-4211"
    );
    assert_eq!(parsed[0]["degradation"][0]["propagation"]["applied"], 2);

    let (code, out, err) = plugin(&[
        "degrade",
        sale,
        "-n",
        ns,
        "--as",
        "oncall",
        "--clear",
        "--reason",
        "payments recovered",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("override cleared"), "{out}");
    let status = policies.get(name).await?.status.unwrap_or_default();
    assert!(
        status.active_override.is_none() && status.tier_reason == Some(TierReason::Signal),
        "{status:?}"
    );
    assert!(!events(client, ns, "OverrideCleared").await?.is_empty());
    Ok(())
}

/// Refused commands change nothing and say why, with their exit codes.
async fn refusals(
    client: &Client,
    ns: &str,
    sale: &str,
    policies: &Api<DegradationPolicy>,
    name: &str,
) -> anyhow::Result<()> {
    let degrade = |extra: &[&'static str]| {
        let mut args = vec!["degrade", sale, "-n", ns];
        args.extend_from_slice(extra);
        args
    };
    let (code, _, err) = plugin(&degrade(&["--tier", "5", "--for", "10m", "--reason", "r"])).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("does not define tier 5: it defines 1, 2"),
        "{err}"
    );
    let (code, _, err) = plugin(&[
        "degrade",
        "no-such-sale",
        "-n",
        ns,
        "--tier",
        "1",
        "--for",
        "1m",
        "--reason",
        "r",
    ])
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no-such-sale not found in namespace"), "{err}");
    let (code, _, err) = plugin(&degrade(&["--tier", "2", "--for", "10m"])).await;
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = plugin(&degrade(&[
        "--tier",
        "2",
        "--for",
        "10m",
        "--reason",
        "r",
        "--dry-run",
    ]))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dry run"), "{out}");

    reader(client, ns, "viewer").await?;
    let (code, out, err) = plugin(&["status", sale, "-n", ns, "--as", "viewer"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("tier 0"), "{out}");
    let (code, _, err) = plugin(&degrade(&[
        "--as", "viewer", "--tier", "2", "--for", "10m", "--reason", "r",
    ]))
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "You need `patch` on degradationpolicies.flashsale.dev in namespace {ns}"
        )),
        "{err}"
    );
    let spec = policies.get(name).await?.spec;
    assert!(
        spec.r#override.is_none(),
        "a refused command changed the policy: {spec:?}"
    );
    Ok(())
}

/// A drill of `sale` that only checks the readiness of `standby` (a sale
/// of `ns`), every ten minutes, and never runs on its own.
fn readiness_drill(ns: &str, sale: &str, name: &str, standby: &str) -> anyhow::Result<ChaosDrill> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flashsale.dev/v1alpha1", "kind": "ChaosDrill",
        "metadata": {"name": name},
        "spec": {
            "saleRef": {"name": sale},
            "schedule": {"cron": "0 0 1 1 *"},
            "experiments": [{"name": "fail", "target": "gateway", "duration": "1m", "podChaos": {"action": "pod-failure"}}],
            "blastRadius": {"maxPercent": 50, "maxPods": 1},
            "sloGuard": {"objectives": [{"name": "up", "query": "vector(1)", "threshold": 0, "breachWhen": "Below"}]},
            "failover": {"mode": "ReadinessOnly", "maxRTO": "30s", "checkEvery": "10m",
                         "standby": {"namespace": ns, "name": standby}}
        }
    }))?)
}

/// `failover check` makes the operator check now (the drill's own period
/// is ten minutes), and prints the checks: the sale itself as the standby
/// is ready, a missing one is not (exit 1). The operator's answer names the
/// request, so no clock is compared.
async fn failover_check(client: &Client, ns: &str, sale: &str) -> anyhow::Result<()> {
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    for (name, standby) in [("standby", sale), ("no-standby", "missing-sale")] {
        let drill = readiness_drill(ns, sale, name, standby)?;
        drills.create(&PostParams::default(), &drill).await?;
    }
    let first = |name: &'static str| {
        let drills = drills.clone();
        async move {
            let drill = drills.get(name).await.map_err(|e| e.to_string())?;
            drill
                .status
                .and_then(|s| s.failover)
                .and_then(|f| f.checked_at)
                .map(|t| t.0)
                .ok_or_else(|| "not checked".to_owned())
        }
    };
    poll_until("the first readiness check", BOUND, TICK, || {
        first("standby")
    })
    .await?;
    poll_until("the other first check", BOUND, TICK, || first("no-standby")).await?;
    let check = |drill: &'static str| async move {
        let why = "pre-sale check";
        plugin(&[
            "failover", "check", drill, "-n", ns, "--reason", why, "--color", "never",
        ])
        .await
    };
    let (code, out, err) = check("standby").await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("failover ready") && out.contains("standby ✓"),
        "{out}"
    );
    let asked = events(client, ns, "ReadinessCheckRequested").await?;
    assert!(
        asked
            .iter()
            .any(|(_, note)| note.contains("pre-sale check")),
        "{asked:?}"
    );
    // The check that answered is the plugin's, not the first one.
    let failover = drills.get("standby").await?.status.and_then(|s| s.failover);
    let answered = failover.and_then(|f| f.request).unwrap_or_default();
    assert!(
        answered.starts_with(flashsale_cli::FIELD_MANAGER),
        "{answered:?}"
    );
    let (code, out, err) = check("no-standby").await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("NOT ready") && out.contains("standby ✗"),
        "{out}"
    );
    assert!(err.contains("is not ready"), "{err}");
    Ok(())
}

/// A drill that fails one pod of `target` for two minutes under an
/// objective that holds throughout (the namespace has pods up), so only a
/// stop ends it. Each workload has its own blast-radius budget, so drills
/// of two workloads run at once.
fn long_drill(ns: &str, sale: &str, name: &str, target: &str) -> anyhow::Result<ChaosDrill> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flashsale.dev/v1alpha1", "kind": "ChaosDrill",
        "metadata": {"name": name, "annotations": {"flashsale.dev/run-now": "first"}},
        "spec": {
            "saleRef": {"name": sale},
            "schedule": {"cron": "0 0 1 1 *"},
            "experiments": [{"name": "fail", "target": target, "duration": "2m", "podChaos": {"action": "pod-failure"}}],
            "blastRadius": {"maxPercent": 100, "maxPods": 1},
            "sloGuard": {
                "objectives": [{"name": "pods-up", "query": format!("sum(up{{namespace=\"{ns}\"}})"),
                                "threshold": 0.5, "breachWhen": "Below"}],
                "interval": "250ms", "staleAfter": "10s", "steadyState": "2s"
            }
        }
    }))?)
}

async fn await_injecting(drills: &Api<ChaosDrill>, name: &str) -> anyhow::Result<()> {
    poll_until("the run injecting", BOUND, TICK, || async move {
        let drill = drills.get(name).await.map_err(|e| e.to_string())?;
        let status = drill.status.unwrap_or_default();
        match (status.phase, &status.current_run) {
            (Some(flashsale_api::chaosdrill::DrillPhase::Injecting), Some(_)) => Ok(()),
            (phase, _) => Err(format!("{phase:?}; last {:?}", status.history.first())),
        }
    })
    .await?;
    Ok(())
}

/// The newest finished run of `name`: (outcome, reason, message).
async fn newest(drills: &Api<ChaosDrill>, name: &str) -> anyhow::Result<(String, String, String)> {
    let run = drills
        .get(name)
        .await?
        .status
        .unwrap_or_default()
        .history
        .into_iter()
        .next();
    let run = run.ok_or_else(|| anyhow::anyhow!("{name} has no finished run"))?;
    Ok((
        run.outcome.map(|o| o.name().to_owned()).unwrap_or_default(),
        run.reason.unwrap_or_default(),
        run.message.unwrap_or_default(),
    ))
}

#[tokio::test]
async fn the_kill_switch_ends_two_running_drills_and_abort_ends_the_one_it_names()
-> anyhow::Result<()> {
    let scene = Scene::start("plugin-drill").await?;
    let (client, ns, sale) = (
        &scene.client,
        scene.ns.name.as_str(),
        scene.sale.name.as_str(),
    );
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    for (name, target) in [("left", "gateway"), ("right", "inventory")] {
        drills
            .create(&PostParams::default(), &long_drill(ns, sale, name, target)?)
            .await?;
    }
    await_injecting(&drills, "left").await?;
    await_injecting(&drills, "right").await?;

    abort_all(client, ns, &drills).await?;
    refused_then_resumed(client, ns).await?;
    abort_one(ns, &drills).await
}

/// The kill switch with two runs injecting: both end, with their figures
/// printed, their faults gone and an Event on each drill.
async fn abort_all(client: &Client, ns: &str, drills: &Api<ChaosDrill>) -> anyhow::Result<()> {
    let (code, out, err) = plugin(&[
        "drill",
        "abort-all",
        "-n",
        ns,
        "--reason",
        "sale traffic above plan",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    for name in ["left", "right"] {
        assert!(
            out.contains(&format!("drill {ns}/{name}: run "))
                && out.contains("Aborted (KillSwitch)"),
            "{out}"
        );
        assert_eq!(newest(drills, name).await?.1, "KillSwitch");
    }
    assert!(out.contains("every fault gone"), "{out}");
    let namespace = Api::<Namespace>::all(client.clone()).get(ns).await?;
    assert_eq!(
        namespace
            .annotations()
            .get(KILL_SWITCH_ANNOTATION)
            .map(String::as_str),
        Some("true")
    );
    let switched = events(client, ns, "KillSwitchOn").await?;
    assert_eq!(switched.len(), 2, "{switched:?}");
    poll_until("no chaos left in the pods", BOUND, TICK, || async {
        let left = residue(client, ns).await.map_err(|e| e.to_string())?;
        left.is_empty().then_some(()).ok_or(format!("{left:?}"))
    })
    .await?;
    Ok(())
}

/// Under the switch the operator refuses a run, and the plugin says so;
/// `resume-all` lifts the switch.
async fn refused_then_resumed(client: &Client, ns: &str) -> anyhow::Result<()> {
    // Nothing starts under the switch: the operator refuses, and says so.
    let (code, out, err) = plugin(&[
        "drill",
        "run-now",
        "left",
        "-n",
        ns,
        "--reason",
        "try anyway",
    ])
    .await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("refused") && err.contains("KillSwitch"),
        "{out}{err}"
    );

    let (code, out, err) = plugin(&[
        "drill",
        "resume-all",
        "-n",
        ns,
        "--reason",
        "incident closed",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let namespace = Api::<Namespace>::all(client.clone()).get(ns).await?;
    assert!(!namespace.annotations().contains_key(KILL_SWITCH_ANNOTATION));
    Ok(())
}

/// A run started by the plugin and aborted by it: only that run ends, and
/// the history says so.
async fn abort_one(ns: &str, drills: &Api<ChaosDrill>) -> anyhow::Result<()> {
    let (code, out, err) = plugin(&[
        "drill",
        "run-now",
        "left",
        "-n",
        ns,
        "--reason",
        "second rehearsal",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("started"), "{out}");
    await_injecting(drills, "left").await?;
    let (code, out, err) = plugin(&[
        "drill",
        "abort",
        "left",
        "-n",
        ns,
        "--reason",
        "checkout errors rising",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Aborted (AbortRequested)"), "{out}");
    let (outcome, reason, message) = newest(drills, "left").await?;
    assert_eq!(
        (outcome.as_str(), reason.as_str()),
        ("Aborted", "AbortRequested")
    );
    assert!(message.contains("checkout errors rising"), "{message}");
    // The other drill's history is untouched by an abort naming this one.
    assert_eq!(newest(drills, "right").await?.1, "KillSwitch");

    let (code, _, err) = plugin(&["drill", "abort", "left", "-n", ns, "--reason", "again"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("has no run in progress"), "{err}");

    let (code, out, _) = plugin(&["drill", "history", "left", "-n", ns]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("AbortRequested") && out.contains("KillSwitch"),
        "{out}"
    );
    let (_, json, _) = plugin(&["drill", "history", "left", "-n", ns, "-o", "json"]).await;
    let runs: Vec<Value> = serde_json::from_str(&json)?;
    assert!(runs.len() >= 3, "{runs:?}");
    assert_eq!(runs[0]["reason"], "AbortRequested");
    Ok(())
}
