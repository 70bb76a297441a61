//! The operator as users install it: `helm install` of the chart puts two
//! replicas on the real node, in a namespace where Pod Security
//! `restricted` is enforced, running under the chart's ServiceAccount and
//! rights only. They elect a leader, run a sale, hand over when the leader
//! goes; and every request the operator makes while it runs a sale, a
//! DegradationPolicy and a ChaosDrill (read back from the apiserver's audit
//! log, not listed by hand) is one the chart allows, while rights it must
//! not hold are refused. An upgrade (CRDs by server-side apply, a new image
//! tag and a changed value) leaves a sale Ready and untouched and no drill's
//! chaos behind; bad values are refused naming the value.

mod common;

use std::time::{Duration, Instant};

use common::{
    chart::{self, Release},
    condition,
    real_node::{
        self, START, TICK, await_ready, await_scraped_and_up, create_sale, example_policy,
        gateway_failure_drill, placement, ready_pods, run_now_drill,
    },
    setup,
};
use flashsale_api::{
    ChaosDrill, DegradationPolicy, FlashSale,
    chaosdrill::{RunOutcome, RunRecord},
};
use flashsale_controller_drill::chaos::Kind;
use flashsale_e2e::{
    audit::{self, Request},
    kube::{TestNamespace, await_pods},
    prometheus, stack,
    wait::poll_until,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::{
    apps::v1::Deployment, coordination::v1::Lease, core::v1::Pod, policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

/// Pod Security `restricted`, enforced.
const RESTRICTED: [(&str, &str); 1] = [("pod-security.kubernetes.io/enforce", "restricted")];

/// The release's name: the chart then names its objects after it alone.
const RELEASE: &str = "flashsale-operator";

/// The chart's values for an operator of namespace `watched` on the real
/// node, reading the stack's Prometheus as pods reach it.
fn values(watched: &str) -> anyhow::Result<Value> {
    let placement = placement();
    Ok(json!({
        "watchNamespace": watched,
        "prometheusURL": stack::in_cluster::prometheus_url()?,
        "allowedImages": ["ghcr.io/flashsale-dev/"],
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
        "nodeSelector": placement["nodeSelector"],
        "tolerations": placement["tolerations"],
    }))
}

/// The release's pods, once `want` of them are ready.
async fn ready_operator_pods(client: &Client, ns: &str, want: usize) -> anyhow::Result<Vec<Pod>> {
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    Ok(await_pods(
        client,
        (ns, &selector),
        want,
        ("ready operator pods", START),
        |p| p.metadata.deletion_timestamp.is_none() && flashsale_observe::pods::is_ready(p),
    )
    .await?)
}

/// A test's install: the release (uninstalled first when dropped), the
/// namespace it runs in, with Pod Security `restricted` enforced, the shop
/// namespace it watches, the values it was installed with, and its two
/// ready pods.
struct Installed {
    release: Release,
    home: TestNamespace,
    shop: TestNamespace,
    values: Value,
    pods: Vec<Pod>,
}

/// Installs the chart into namespaces named after `prefix`, once the home
/// namespace is seen to refuse a privileged pod, and waits for both pods.
async fn install(client: &Client, prefix: &str) -> anyhow::Result<Installed> {
    let home = TestNamespace::create_labelled(client, prefix, &RESTRICTED).await?;
    let shop = TestNamespace::create(client, &format!("{prefix}-shop")).await?;
    assert_restricted(client, &home.name).await?;
    let values = values(&shop.name)?;
    let release = Release::install(&chart::dir()?, RELEASE, &home.name, &values)?;
    let pods = ready_operator_pods(client, &home.name, 2).await?;
    Ok(Installed {
        release,
        home,
        shop,
        values,
        pods,
    })
}

/// The release's pod holding the operator's Lease in `ns`, other than
/// `not` (a pod that went).
async fn leader(client: &Client, ns: &str, not: Option<&str>) -> anyhow::Result<Pod> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    Ok(
        poll_until("a leader among the pods", START, TICK, || async {
            let lease = leases
                .get_opt("flashsale-operator")
                .await
                .map_err(|e| e.to_string())?;
            let holder = lease
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            let pods = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            // The identity is the pod's name and a suffix per process.
            pods.items
                .into_iter()
                .filter(|p| Some(p.name_any().as_str()) != not)
                .find(|p| holder.starts_with(&format!("{}-", p.name_any())))
                .ok_or(format!("holder {holder:?}"))
        })
        .await?,
    )
}

/// A privileged pod is refused in `ns`: its `restricted` level is enforced.
async fn assert_restricted(client: &Client, ns: &str) -> anyhow::Result<()> {
    let root: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "c", "image": "ghcr.io/flashsale-dev/operator:0.1.0",
                                 "securityContext": {"privileged": true}}]}
    }))?;
    let refused = Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &root)
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("PodSecurity")),
        "a privileged pod in a restricted namespace: {refused:?}"
    );
    Ok(())
}

/// Each pod runs on the real node as the chart's ServiceAccount, with no
/// credentials but that account's projected token.
fn assert_pods_as_installed(pods: &[Pod], release: &Release) -> anyhow::Result<()> {
    let node = stack::real_node()?;
    for pod in pods {
        let spec = pod.spec.clone().unwrap_or_default();
        assert_eq!(spec.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some(release.full_name().as_str())
        );
        for container in &spec.containers {
            let env = container.env.clone().unwrap_or_default();
            assert!(env.iter().all(|e| e.name != "KUBECONFIG"), "{env:?}");
        }
        for volume in spec.volumes.clone().unwrap_or_default() {
            assert!(
                volume.projected.is_some() && volume.name.starts_with("kube-api-access"),
                "a volume besides the token: {volume:?}"
            );
        }
    }
    Ok(())
}

/// Waits until the release's PodDisruptionBudget allows one disruption.
async fn await_pdb(client: &Client, release: &Release) -> anyhow::Result<()> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &release.namespace);
    poll_until("the PDB allows one disruption", START, TICK, || async {
        let pdb = pdbs
            .get(&release.full_name())
            .await
            .map_err(|e| e.to_string())?;
        match pdb.status.and_then(|s| s.disruptions_allowed) {
            Some(1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

/// Scales the sale's gateways by hand and waits until the operator puts
/// them back at 2; how long that took.
async fn hand_edit_reverted(client: &Client, ns: &str, sale: &str) -> anyhow::Result<Duration> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let gateway = format!("{sale}-gateway");
    deployments
        .patch(
            &gateway,
            &PatchParams::apply("hand-edit").force(),
            &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": gateway}, "spec": {"replicas": 3}
            })),
        )
        .await?;
    let edited = Instant::now();
    poll_until("the hand edit reverted", START, TICK, || async {
        let d = deployments.get(&gateway).await.map_err(|e| e.to_string())?;
        match d.spec.replicas {
            Some(2) => Ok(()),
            other => Err(format!("replicas {other:?}")),
        }
    })
    .await?;
    Ok(edited.elapsed())
}

#[tokio::test]
async fn the_chart_runs_two_restricted_replicas_that_lead_run_a_sale_and_hand_over()
-> anyhow::Result<()> {
    let client = setup().await?;
    let Installed {
        release,
        home,
        shop,
        pods,
        ..
    } = install(&client, "fs-chart").await?;
    assert_pods_as_installed(&pods, &release)?;
    await_pdb(&client, &release).await?;
    let leading = leader(&client, &home.name, None).await?;
    let sale = create_sale(&client, &shop.name, SignedDuration::from_hours(1)).await?;
    await_ready(&client, &shop.name, &sale.name).await?;

    // The leader goes, as in a node drain: the standby takes the Lease and
    // reconciles, reverting a hand edit of the sale's gateways.
    let gone = Instant::now();
    Api::<Pod>::namespaced(client.clone(), &home.name)
        .delete(&leading.name_any(), &DeleteParams::default())
        .await?;
    let new_leader = leader(&client, &home.name, Some(&leading.name_any())).await?;
    let handover = gone.elapsed();
    let reverted = hand_edit_reverted(&client, &shop.name, &sale.name).await?;
    eprintln!(
        "chart: leader {} went, {} led {:.1} s later; a hand edit reverted in {:.1} s",
        leading.name_any(),
        new_leader.name_any(),
        handover.as_secs_f64(),
        reverted.as_secs_f64()
    );
    // The Deployment brings the second replica back.
    ready_operator_pods(&client, &home.name, 2).await?;
    drop(release);
    Ok(())
}

/// What the operator must never be able to do, installed for namespace
/// `watched` from namespace `home`.
fn forbidden(home: &str, watched: &str) -> Vec<Request> {
    vec![
        Request::new("get", "secrets", "default"),
        Request::new("list", "secrets", "kube-system"),
        Request::new("get", "secrets", home),
        Request::new("create", "pods/exec", watched),
        Request::new("create", "pods", watched),
        Request::new("get", "nodes", ""),
        Request::new("patch", "nodes", ""),
        Request::new("list", "namespaces", ""),
        Request::new("list", "flashsales.flashsale.dev", ""),
        Request::new("create", "deployments.apps", "default"),
        Request::new("patch", "configmaps", "kube-system"),
        Request::new("create", "clusterroles.rbac.authorization.k8s.io", ""),
        Request::new(
            "create",
            "clusterrolebindings.rbac.authorization.k8s.io",
            "",
        ),
        Request::new("bind", "roles.rbac.authorization.k8s.io", watched),
        Request::new("escalate", "roles.rbac.authorization.k8s.io", watched),
        Request::new(
            "patch",
            "customresourcedefinitions.apiextensions.k8s.io",
            "",
        ),
        Request::new("impersonate", "serviceaccounts", watched),
        Request::new("create", "podchaos.chaos-mesh.org", "default"),
    ]
}

/// The objects [`force_a_tier_and_an_abort`] made in its namespace.
struct Worked {
    sale: String,
    policy: String,
    drill: String,
}

/// Puts every controller to work in `ns`: a sale on the real node, its
/// policy forced to tier 1 by on-call, a drill that kills a gateway until
/// its guard aborts it.
async fn force_a_tier_and_an_abort(client: &Client, ns: &str) -> anyhow::Result<Worked> {
    let sale = create_sale(client, ns, SignedDuration::from_hours(1)).await?;
    await_ready(client, ns, &sale.name).await?;
    let gateways = ready_pods(client, ns, &sale.name, "gateway").await?;
    await_scraped_and_up(ns, &gateways).await?;

    let policies: Api<DegradationPolicy> = Api::namespaced(client.clone(), ns);
    let mut policy = example_policy(ns, &sale.name)?;
    policy.spec.r#override = serde_json::from_value(json!({
        "tier": 1, "reason": "on-call test",
        "expires": (Timestamp::now() + SignedDuration::from_mins(10)).to_string()
    }))?;
    let policy = policies
        .create(&PostParams::default(), &policy)
        .await?
        .name_any();
    poll_until("tier 1 applied by both gateways", START, TICK, || async {
        let status = policies
            .get(&policy)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        match (&status.propagation, status.tier) {
            (Some(p), Some(1)) if p.applied_replicas == 2 => Ok(()),
            _ => Err(format!("{:?} {:?}", status.tier, status.propagation)),
        }
    })
    .await?;

    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    let drill = drills
        .create(
            &PostParams::default(),
            &gateway_failure_drill(ns, &sale.name)?,
        )
        .await?
        .name_any();
    let ended = poll_until("the drill's run ended", START, TICK, || async {
        let status = drills
            .get(&drill)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        status
            .history
            .first()
            .cloned()
            .ok_or(format!("{:?}", status.phase))
    })
    .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    Ok(Worked {
        sale: sale.name,
        policy,
        drill,
    })
}

impl Worked {
    /// Deletes the drill, the policy and the sale, and waits until they
    /// are gone (the operator's finalizers done).
    async fn delete(self, client: &Client, ns: &str) -> anyhow::Result<()> {
        let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
        let policies: Api<DegradationPolicy> = Api::namespaced(client.clone(), ns);
        let sales: Api<FlashSale> = Api::namespaced(client.clone(), ns);
        drills.delete(&self.drill, &DeleteParams::default()).await?;
        policies
            .delete(&self.policy, &DeleteParams::default())
            .await?;
        sales.delete(&self.sale, &DeleteParams::default()).await?;
        poll_until(
            "the drill, the policy and the sale gone",
            START,
            TICK,
            || async {
                let left = (
                    drills.get_opt(&self.drill).await,
                    policies.get_opt(&self.policy).await,
                    sales.get_opt(&self.sale).await,
                );
                match left {
                    (Ok(None), Ok(None), Ok(None)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await?;
        Ok(())
    }
}

/// The requests `user` made, once the audit log holds its drill's.
async fn audited_requests(user: &str) -> anyhow::Result<Vec<audit::Audited>> {
    Ok(poll_until(
        "the audit log written",
        Duration::from_secs(10),
        TICK,
        || async {
            let found = audit::requests_of(user).map_err(|e| e.to_string())?;
            if found.iter().any(|a| a.request.resource == "chaosdrills") {
                Ok(found)
            } else {
                Err(format!("{} requests so far", found.len()))
            }
        },
    )
    .await?)
}

#[tokio::test]
async fn every_request_the_operator_makes_is_allowed_and_no_more_than_that() -> anyhow::Result<()> {
    let client = setup().await?;
    let Installed {
        release,
        home,
        shop,
        ..
    } = install(&client, "fs-rights").await?;
    let user = release.service_account_user();
    force_a_tier_and_an_abort(&client, &shop.name)
        .await?
        .delete(&client, &shop.name)
        .await?;

    // What the operator did, from the audit log: none of it refused, every
    // kind of request allowed by the chart's rights.
    let requests = audited_requests(&user).await?;
    let refused: Vec<_> = requests.iter().filter(|a| a.code == 403).collect();
    assert!(refused.is_empty(), "refused requests: {refused:#?}");
    let used = audit::distinct(&requests);
    let mut not_allowed = Vec::new();
    for request in &used {
        if !request.allowed_for(&user)? {
            not_allowed.push(request.to_string());
        }
    }
    assert!(
        not_allowed.is_empty(),
        "can-i says no to requests the operator made: {not_allowed:#?}"
    );
    eprintln!(
        "chart rights: the operator made {} requests of {} kinds:",
        requests.len(),
        used.len()
    );
    for request in &used {
        eprintln!("  {request}");
    }
    // The log holds what matters: each controller's own kinds and children.
    for resource in [
        "flashsales",
        "degradationpolicies",
        "chaosdrills",
        "deployments",
        "podchaos",
        "leases",
        "events",
    ] {
        assert!(
            used.iter().any(|r| r.resource == resource),
            "no request on {resource} in the audit log"
        );
    }

    let mut granted = Vec::new();
    for request in forbidden(&home.name, &shop.name) {
        if request.allowed_for(&user)? {
            granted.push(request.to_string());
        }
    }
    assert!(granted.is_empty(), "rights it must not hold: {granted:#?}");
    drop(release);
    Ok(())
}

/// The generation of each of the sale's Deployments, by name.
async fn generations(
    client: &Client,
    ns: &str,
    sale: &str,
) -> anyhow::Result<Vec<(String, Option<i64>)>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut found = Vec::new();
    for component in ["gateway", "inventory", "order-writer"] {
        let name = format!("{sale}-{component}");
        let d = deployments.get(&name).await?;
        found.push((name, d.metadata.generation));
    }
    Ok(found)
}

/// The sale's `Ready` condition: status and last transition.
async fn ready_since(client: &Client, ns: &str, sale: &str) -> anyhow::Result<(String, String)> {
    let sale = Api::<FlashSale>::namespaced(client.clone(), ns)
        .get(sale)
        .await?;
    let (status, _, since) = condition(&sale, "Ready").unwrap_or_default();
    Ok((status, since))
}

/// Starts drill `across` of `sale`, whose run lasts two minutes (a light
/// CPU stress on one gateway, under an objective it cannot break); its
/// run's id once injected.
async fn start_a_long_run(drills: &Api<ChaosDrill>, sale: &str) -> anyhow::Result<String> {
    let drill = run_now_drill(
        "across",
        sale,
        json!({"name": "busy", "target": "gateway", "duration": "2m",
               "stressChaos": {"cpuWorkers": 1, "cpuLoadPercent": 10}}),
        json!({"name": "never", "query": "vector(0)", "threshold": 1, "breachWhen": "Above"}),
    )?;
    drills.create(&PostParams::default(), &drill).await?;
    Ok(poll_until("the drill injecting", START, TICK, || async {
        let status = drills
            .get("across")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        match status.current_run {
            Some(run) if run.injected_at.is_some() => Ok(run.id),
            other => Err(format!("{:?} {other:?}", status.phase)),
        }
    })
    .await?)
}

/// Waits until drill `across` records run `run`, and checks that none of
/// the run's Chaos Mesh objects is left; the record.
async fn ended_without_chaos(
    client: &Client,
    drills: &Api<ChaosDrill>,
    run: &str,
) -> anyhow::Result<RunRecord> {
    let ended = poll_until("the run ended", START, TICK, || async {
        let status = drills
            .get("across")
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        status
            .history
            .iter()
            .find(|r| r.id == run)
            .cloned()
            .ok_or(format!("{:?}", status.current_run.map(|r| r.id)))
    })
    .await?;
    let ns = drills.namespace().unwrap_or_default();
    for kind in [Kind::StressChaos, Kind::Workflow] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.resource());
        let left = api
            .list(&ListParams::default().labels(&format!("flashsale.dev/run={run}")))
            .await?;
        assert!(left.items.is_empty(), "{kind:?} left after run {run}");
    }
    Ok(ended)
}

#[tokio::test]
async fn an_upgrade_keeps_the_sale_ready_and_untouched_and_leaves_no_drill_orphaned()
-> anyhow::Result<()> {
    let client = setup().await?;
    let Installed {
        release,
        home,
        shop,
        mut values,
        pods: before,
    } = install(&client, "fs-upgrade").await?;
    let sale = create_sale(&client, &shop.name, SignedDuration::from_hours(1)).await?;
    await_ready(&client, &shop.name, &sale.name).await?;
    let gateways = ready_pods(&client, &shop.name, &sale.name, "gateway").await?;
    await_scraped_and_up(&shop.name, &gateways).await?;

    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &shop.name);
    let run = start_a_long_run(&drills, &sale.name).await?;
    let generations_before = generations(&client, &shop.name, &sale.name).await?;
    let ready_before = ready_since(&client, &shop.name, &sale.name).await?;

    // The upgrade as the chart documents it: CRDs by server-side apply,
    // then the release with a new image tag and a changed value.
    chart::apply_crds()?;
    let image = real_node::image("operator");
    let next = format!("{image}-next");
    real_node::tag_image(&image, &next)?;
    let tag = next.rsplit(':').next().unwrap_or_default().to_owned();
    values["image"] = json!({"tag": tag});
    values["logFilter"] = json!("info,flashsale=debug");
    release.upgrade(&chart::dir()?, &values)?;

    let after = ready_operator_pods(&client, &home.name, 2).await?;
    for pod in &after {
        assert!(
            before.iter().all(|b| b.name_any() != pod.name_any()),
            "{} was not replaced",
            pod.name_any()
        );
        let spec = pod.spec.clone().unwrap_or_default();
        assert_eq!(spec.containers[0].image.as_deref(), Some(next.as_str()));
    }
    let leading = poll_until("a new pod leads", START, TICK, || async {
        let pod = leader(&client, &home.name, None)
            .await
            .map_err(|e| e.to_string())?;
        if after.iter().any(|p| p.name_any() == pod.name_any()) {
            Ok(pod)
        } else {
            Err(format!("{} of the old release leads", pod.name_any()))
        }
    })
    .await?;

    // The run the old leader drove is not left behind: the new leader ends
    // it (its guard went with the old replica) and removes its chaos.
    let ended = ended_without_chaos(&client, &drills, &run).await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("GuardLost"), "{ended:?}");

    // The sale stayed Ready throughout and none of its workloads was
    // rewritten.
    assert_eq!(
        ready_since(&client, &shop.name, &sale.name).await?,
        ready_before
    );
    assert_eq!(
        generations(&client, &shop.name, &sale.name).await?,
        generations_before
    );
    eprintln!(
        "upgrade: {} leads on {next}; the run across it ended {:?} ({:?})",
        leading.name_any(),
        ended.outcome,
        ended.reason
    );
    drop(release);
    Ok(())
}

#[test]
fn the_values_schema_refuses_bad_values_naming_each() -> anyhow::Result<()> {
    let dir = chart::dir()?;
    for (set, named) in [
        ("replicas=0", "/replicas"),
        ("logFormat=xml", "/logFormat"),
        ("watchNamespace=Not_A_Namespace", "/watchNamespace"),
        (
            "podDisruptionBudget.minAvailable=half",
            "/podDisruptionBudget/minAvailable",
        ),
        (
            "prometheusRule.tierHeldFor=30",
            "/prometheusRule/tierHeldFor",
        ),
        (
            "serviceMonitor.labels.team=null",
            "/serviceMonitor/labels/team",
        ),
        ("prometheusURL=prometheus:9090", "/prometheusURL"),
        ("replica=2", "'replica' not allowed"),
    ] {
        let refused = chart::helm(&["template", "t", &dir.to_string_lossy(), "--set", set]);
        let message = format!("{:#}", refused.err().unwrap_or_else(|| anyhow::anyhow!("")));
        assert!(
            message.contains(named),
            "--set {set}: the error does not name {named}: {message}"
        );
    }
    Ok(())
}

/// The release's namespace the rules are rendered for when no release runs.
const RULES_NAMESPACE: &str = "flashsale-system";

#[tokio::test]
async fn the_charts_rules_pass_promtool_and_every_dashboard_query_parses() -> anyhow::Result<()> {
    let groups = chart::alert_groups(RELEASE, RULES_NAMESPACE, &json!({}))?;
    let said = prometheus::promtool_check(&groups)?;
    assert!(said.contains("SUCCESS: 8 rules found"), "promtool: {said}");

    // Every expression, the rules' and the dashboard's, evaluates at the
    // stack's Prometheus (of the same version as promtool).
    let rules: Vec<String> = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["expr"].as_str().map(str::to_owned))
        .collect();
    let queries = chart::dashboard_queries()?;
    assert_eq!(rules.len(), 8);
    assert!(queries.len() >= 20, "{} dashboard queries", queries.len());
    let mut refused = Vec::new();
    for query in rules.iter().chain(&queries) {
        if let Err(e) = prometheus::evaluates(query).await {
            refused.push(format!("{query}: {e}"));
        }
    }
    assert!(
        refused.is_empty(),
        "queries Prometheus refuses: {refused:#?}"
    );

    // The ServiceMonitor selects the metrics Service and scrapes its port.
    let objects = chart::render_with(
        RELEASE,
        RULES_NAMESPACE,
        &json!({"serviceMonitor": {"enabled": true, "labels": {"release": "kube-prometheus"}}}),
    )?;
    let monitor = chart::only(&objects, "ServiceMonitor")?;
    let service = chart::only(&objects, "Service")?;
    let selected = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(!selected.is_empty());
    for (key, value) in &selected {
        assert_eq!(&service["metadata"]["labels"][key], value, "label {key}");
    }
    assert_eq!(monitor["metadata"]["labels"]["release"], "kube-prometheus");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    eprintln!(
        "chart monitoring: {} rules and {} dashboard queries evaluate",
        rules.len(),
        queries.len()
    );
    Ok(())
}

/// Waits until Prometheus scrapes `replicas` operator replicas in `ns`,
/// one of them leading.
async fn await_operator_scraped(ns: &str, replicas: usize) -> anyhow::Result<()> {
    let query = format!(
        "count(flashsale_operator_leader{{namespace=\"{ns}\"}}) * 10 + sum(flashsale_operator_leader{{namespace=\"{ns}\"}})"
    );
    let want = (replicas * 10 + 1) as f64;
    poll_until(
        "the operator's replicas scraped, one leading",
        START,
        TICK,
        || async {
            match real_node::prometheus_value(&query).await? {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{query} = {other:?}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// Waits until the alert `name` fires with `labels`.
async fn await_firing(name: &str, labels: &[(&str, &str)]) -> anyhow::Result<Value> {
    Ok(poll_until(
        &format!("{name} firing with {labels:?}"),
        Duration::from_secs(60),
        TICK,
        || async {
            prometheus::firing(name, labels)
                .await?
                .ok_or_else(|| "not firing".to_owned())
        },
    )
    .await?)
}

#[tokio::test]
async fn the_charts_alerts_fire_on_a_real_tier_and_a_real_abort() -> anyhow::Result<()> {
    let client = setup().await?;
    let Installed {
        release,
        home,
        shop,
        values,
        ..
    } = install(&client, "fs-alerts").await?;
    await_operator_scraped(&home.name, 2).await?;

    // The rules as the release's PrometheusRule holds them, a tier held
    // for no time at all so that the test need not wait 30 minutes.
    let mut alerting = values.clone();
    alerting["prometheusRule"] = json!({"tierHeldFor": "0s"});
    let rules = prometheus::RuleFile::load(
        &home.name,
        &chart::alert_groups(RELEASE, &home.name, &alerting)?,
    )
    .await?;

    let worked = force_a_tier_and_an_abort(&client, &shop.name).await?;
    let tier = await_firing(
        "FlashSaleDegradationTierHeld",
        &[
            ("exported_namespace", &shop.name),
            ("policy", &worked.policy),
        ],
    )
    .await?;
    assert_eq!(
        tier["value"].as_str().and_then(|v| v.parse::<f64>().ok()),
        Some(1.0)
    );
    await_firing(
        "FlashSaleDrillAborted",
        &[("exported_namespace", &shop.name), ("drill", &worked.drill)],
    )
    .await?;
    // The operator runs and leads: its own alerts, whose selectors must
    // match what Prometheus scraped, are not even pending; nor is a blind
    // guard reported for a run whose guard read its signal.
    let raised: Vec<String> = prometheus::alerts()
        .await
        .map_err(anyhow::Error::msg)?
        .iter()
        .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_owned))
        .collect();
    for quiet in [
        "FlashSaleOperatorDown",
        "FlashSaleOperatorNoLeader",
        "FlashSaleDrillGuardBlind",
    ] {
        assert!(
            !raised.iter().any(|a| a == quiet),
            "{quiet} raised: {raised:?}"
        );
    }
    eprintln!("chart alerts: raised {raised:?}");

    worked.delete(&client, &shop.name).await?;
    drop(rules);
    drop(release);
    Ok(())
}
