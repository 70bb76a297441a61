//! The operator's sale on the local stack's real node (kubelet, containerd,
//! CNI, kube-proxy, cluster DNS): pods that really run from the project's
//! images, probes that really probe, an order that really becomes a row, and
//! the real Chaos Mesh controller killing a real pod. kwok is not involved.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use common::{
    condition,
    real_node::{
        REAL_NODE_KEY, START, Scene, TICK, await_condition, await_ready, await_ready_gateways,
        await_scraped_and_up, cluster_ip, create_sale, example_policy, gateway_drill, http,
        http_per_request, image, operator, ready_pods, scraped, token, uids,
    },
    setup,
};
use flashsale_api::{
    ChaosDrill, DegradationPolicy, FlashSale,
    chaosdrill::{RunOutcome, RunRecord},
    degradation::DegradationPolicyStatus,
};
use flashsale_controller_drill::chaos::Kind;
use flashsale_e2e::{forward::Forward, kafka, kube::TestNamespace, stack, wait::poll_until};
use flashsale_observe::pods::is_ready;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod, events::v1::Event};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};

/// Runs a one-shot pod on the real node (from the gateway image, which has
/// a shell) and returns its phase at the end: `Succeeded` when `script`
/// exited 0.
async fn run_pod(client: &Client, ns: &str, name: &str, script: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {REAL_NODE_KEY: "true"},
            "tolerations": [{"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "probe",
                "image": image("gateway"),
                "command": ["/bin/bash", "-c", script],
                "securityContext": {"runAsUser": 65532, "runAsNonRoot": true,
                                    "allowPrivilegeEscalation": false}
            }]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    Ok(
        poll_until(&format!("pod {name} to finish"), START, TICK, || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            match pod.status.and_then(|s| s.phase).as_deref() {
                Some(phase @ ("Succeeded" | "Failed")) => Ok(phase.to_owned()),
                other => Err(format!("phase {other:?}")),
            }
        })
        .await?,
    )
}

#[tokio::test]
async fn a_sale_runs_on_the_real_node_and_an_order_becomes_one_row() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "real-order").await?;
    let _operator = operator(&ns.name)?;
    // Opens soon, so the order below lands while the sale is live.
    let sale = create_sale(&client, &ns.name, SignedDuration::from_secs(20)).await?;

    // Ready by the pods' own readiness probes, which check Redis, Kafka and
    // the database through the stack's Services.
    await_ready(&client, &ns.name, &sale.name).await?;
    assert_pods_on_the_real_node(&client, &ns.name, &sale.name).await?;

    // Through the gateway Service: from another pod by its DNS name, and
    // from the host by its cluster IP (kube-proxy's rules).
    let service = format!("{}-gateway", sale.name);
    let fqdn = format!("{service}.{}.svc.cluster.local", ns.name);
    let script = format!(
        "exec 3<>/dev/tcp/{fqdn}/9090 && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && \
         head -n 1 <&3 | grep -q ' 200 '"
    );
    assert_eq!(
        run_pod(&client, &ns.name, "dns-probe", &script).await?,
        "Succeeded"
    );
    let gateway = format!("http://{}", cluster_ip(&client, &ns.name, &service).await?);
    let unauthenticated = http()?
        .post(format!("{gateway}/api/v1/orders"))
        .json(&json!({"sku": "CASE", "quantity": 1, "idempotencyKey": "k"}))
        .send()
        .await?;
    assert_eq!(unauthenticated.status(), 401);

    let order = place_order(&gateway).await?;
    let order_id = order["orderId"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no orderId in {order}"))?
        .to_owned();
    assert_one_row_and_one_event(&order_id, &sale.topic).await
}

/// Every workload of the sale has ready pods, all on the real node, each
/// with an IP of the node's bridge.
async fn assert_pods_on_the_real_node(client: &Client, ns: &str, sale: &str) -> anyhow::Result<()> {
    for component in ["gateway", "inventory", "order-writer"] {
        let pods = ready_pods(client, ns, sale, component).await?;
        assert!(!pods.is_empty(), "no ready {component} pod");
        for pod in &pods {
            let spec = pod.spec.as_ref();
            assert_eq!(
                spec.and_then(|s| s.node_name.as_deref()),
                Some(stack::real_node()?.as_str()),
                "{} runs elsewhere",
                pod.name_any()
            );
            let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
            assert!(
                ip.as_deref().is_some_and(|ip| ip.starts_with("10.89.0.")),
                "{} has IP {ip:?}, not one of the node's bridge",
                pod.name_any()
            );
        }
    }
    Ok(())
}

/// An order through `gateway`: reserved by the inventory pod, published,
/// persisted by the order-writer pod. Retried while the sale is not open
/// yet. Returns the gateway's answer.
async fn place_order(gateway: &str) -> anyhow::Result<Value> {
    let buyer = token("alice")?;
    Ok(poll_until(
        "an order to be accepted",
        START,
        Duration::from_secs(1),
        || {
            let (gateway, buyer) = (gateway.to_owned(), buyer.clone());
            async move {
                let response = http()
                    .map_err(|e| e.to_string())?
                    .post(format!("{gateway}/api/v1/orders"))
                    .bearer_auth(buyer)
                    .json(&json!({"sku": "CASE", "quantity": 2, "idempotencyKey": "real-node-1"}))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = response.status();
                let body: Value = response.json().await.map_err(|e| e.to_string())?;
                if status == 201 {
                    Ok(body)
                } else {
                    Err(format!("{status}: {body}"))
                }
            }
        },
    )
    .await?)
}

/// Order `order_id` became exactly one row, of what was ordered, and
/// exactly one event on `topic`.
async fn assert_one_row_and_one_event(order_id: &str, topic: &str) -> anyhow::Result<()> {
    let db = sqlx::PgPool::connect(&stack::postgres_url()?).await?;
    let rows: i64 = poll_until("the order's row", START, TICK, || async {
        let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM orders WHERE order_id = $1")
            .bind(order_id)
            .fetch_one(&db)
            .await
            .map_err(|e| e.to_string())?;
        if count > 0 {
            Ok(count)
        } else {
            Err("no row yet".into())
        }
    })
    .await?;
    assert_eq!(rows, 1);
    let (sku, quantity): (String, i32) =
        sqlx::query_as("SELECT sku, quantity FROM orders WHERE order_id = $1")
            .bind(order_id)
            .fetch_one(&db)
            .await?;
    assert_eq!((sku.as_str(), quantity), ("CASE", 2));
    let events = kafka::events(&stack::kafka_brokers()?, topic).await?;
    let published: Vec<_> = events.iter().filter(|e| e.order_id == order_id).collect();
    assert_eq!(published.len(), 1, "events of {order_id}: {published:?}");
    Ok(())
}

fn pod_chaos_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("chaos-mesh.org", "v1alpha1", "PodChaos"),
        "podchaos",
    )
}

/// A PodChaos `action` on exactly one pod: it names the pod and the
/// namespace explicitly, since without Chaos Mesh's webhook an empty
/// namespace list would match every pod.
async fn pod_chaos(
    client: &Client,
    ns: &str,
    name: &str,
    action: &str,
    pod: &str,
) -> anyhow::Result<Api<DynamicObject>> {
    let chaos: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &pod_chaos_resource());
    let experiment: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "chaos-mesh.org/v1alpha1",
        "kind": "PodChaos",
        "metadata": {"name": name},
        "spec": {
            "action": action,
            "mode": "all",
            "selector": {"namespaces": [ns], "pods": {ns: [pod]}}
        }
    }))?;
    chaos.create(&PostParams::default(), &experiment).await?;
    Ok(chaos)
}

#[tokio::test]
async fn chaos_mesh_kills_exactly_the_named_pod_and_prometheus_sees_it_go_and_come_back()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "real-chaos").await?;
    let _operator = operator(&ns.name)?;
    let sale = create_sale(&client, &ns.name, SignedDuration::from_hours(1)).await?;
    await_ready(&client, &ns.name, &sale.name).await?;
    let gateways = ready_pods(&client, &ns.name, &sale.name, "gateway").await?;
    assert_eq!(gateways.len(), 2);
    let (victim, bystander) = (&gateways[0], &gateways[1]);
    let victim_name = victim.name_any();

    // Prometheus scrapes both before anything happens.
    await_scraped_and_up(&ns.name, &gateways).await?;

    let chaos = pod_chaos(
        &client,
        &ns.name,
        "kill-one-gateway",
        "pod-kill",
        &victim_name,
    )
    .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let victim_uid = victim.uid();
    poll_until("the named pod to be gone", START, TICK, || async {
        match pods
            .get_opt(&victim_name)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(pod) if pod.uid() == victim_uid => Err("still there".into()),
            _ => Ok(()),
        }
    })
    .await?;
    // Only that pod: the other gateway and the other workloads' pods keep
    // their uids.
    let after = ready_pods(&client, &ns.name, &sale.name, "gateway").await?;
    assert!(uids(&after).contains(&bystander.uid().unwrap_or_default()));
    let replaced = poll_until("the Deployment to replace it", START, TICK, || async {
        let now = ready_pods(&client, &ns.name, &sale.name, "gateway")
            .await
            .map_err(|e| e.to_string())?;
        let fresh: Vec<Pod> = now
            .into_iter()
            .filter(|p| p.uid() != bystander.uid())
            .collect();
        match fresh.as_slice() {
            [pod] if pod.uid() != victim_uid => Ok(pod.clone()),
            other => Err(format!("{} fresh ready pods", other.len())),
        }
    })
    .await?;

    // Prometheus dropped the killed pod's target and scrapes the new one.
    poll_until("Prometheus to follow the pods", START, TICK, || async {
        let targets = scraped(&ns.name).await?;
        let gone = !targets.iter().any(|(pod, _)| pod == &victim_name);
        let back = targets.contains(&(replaced.name_any(), "up".to_owned()));
        if gone && back {
            Ok(())
        } else {
            Err(format!("{targets:?}"))
        }
    })
    .await?;
    chaos
        .delete("kill-one-gateway", &DeleteParams::default())
        .await?;
    Ok(())
}

async fn patch_sale(client: &Client, ns: &str, name: &str, patch: Value) -> anyhow::Result<()> {
    Api::<FlashSale>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Waits for a Warning Event on the sale with one of `reasons`.
async fn await_warning(
    client: &Client,
    ns: &str,
    sale: &str,
    reasons: &[&str],
) -> anyhow::Result<()> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    poll_until(
        &format!("a Warning Event {reasons:?}"),
        START,
        TICK,
        || async {
            let listed = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let found = listed.items.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(sale)
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref().is_some_and(|r| reasons.contains(&r))
            });
            if found {
                Ok(())
            } else {
                Err("none yet".into())
            }
        },
    )
    .await?;
    Ok(())
}

/// Waits until the gateway has rolled: two ready pods, none of the
/// `before` ones (by uid), both of the updated template.
async fn await_rolled_gateways(
    client: &Client,
    ns: &str,
    sale: &str,
    before: &BTreeSet<String>,
) -> anyhow::Result<()> {
    poll_until("new gateway pods ready", START, TICK, || async {
        let now = uids(
            &ready_pods(client, ns, sale, "gateway")
                .await
                .map_err(|e| e.to_string())?,
        );
        let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
            .get(&format!("{sale}-gateway"))
            .await
            .map_err(|e| e.to_string())?;
        let updated = deployment
            .status
            .and_then(|s| s.updated_replicas)
            .unwrap_or(0);
        if now.len() == 2 && now.is_disjoint(before) && updated == 2 {
            Ok(())
        } else {
            Err(format!(
                "ready {now:?}, before {before:?}, updated {updated}"
            ))
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_config_change_rolls_the_pods_and_failing_pods_show_their_reason() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "real-roll").await?;
    let _operator = operator(&ns.name)?;
    let sale = create_sale(&client, &ns.name, SignedDuration::from_hours(1)).await?;
    await_ready(&client, &ns.name, &sale.name).await?;
    let before = uids(&ready_pods(&client, &ns.name, &sale.name, "gateway").await?);

    // The gateway's configuration changes: its config hash rolls every pod,
    // and the new ones pass their probes.
    patch_sale(
        &client,
        &ns.name,
        &sale.name,
        json!({"spec": {"gateway": {"rateLimit": {"perUserPerSecond": 7, "burst": 9}}}}),
    )
    .await?;
    await_rolled_gateways(&client, &ns.name, &sale.name, &before).await?;
    await_ready(&client, &ns.name, &sale.name).await?;

    // A container that crashes: the order-writer started from the gateway's
    // image exits at once on the order-writer's settings.
    patch_sale(
        &client,
        &ns.name,
        &sale.name,
        json!({"spec": {"orderWriter": {"image": image("gateway")}}}),
    )
    .await?;
    let stalled = await_condition(&client, &ns.name, &sale.name, "Stalled", "True", |r| {
        r == "CrashLoopBackOff"
    })
    .await?;
    let message = condition(&stalled, "Stalled")
        .map(|c| c.2)
        .unwrap_or_default();
    assert!(message.contains("order-writer pod"), "{message}");
    assert!(message.contains("last exit code"), "{message}");
    await_warning(&client, &ns.name, &sale.name, &["CrashLoopBackOff"]).await?;

    // An image that does not exist anywhere this node can reach.
    patch_sale(
        &client,
        &ns.name,
        &sale.name,
        json!({"spec": {"orderWriter": {"image": image("order-writer-does-not-exist")}}}),
    )
    .await?;
    await_condition(&client, &ns.name, &sale.name, "Stalled", "True", |r| {
        r == "ErrImagePull" || r == "ImagePullBackOff"
    })
    .await?;
    await_warning(
        &client,
        &ns.name,
        &sale.name,
        &["ErrImagePull", "ImagePullBackOff"],
    )
    .await?;

    // Fixed: back to the default image, the stall clears.
    patch_sale(
        &client,
        &ns.name,
        &sale.name,
        json!({"spec": {"orderWriter": {"image": null}}}),
    )
    .await?;
    await_condition(&client, &ns.name, &sale.name, "Stalled", "False", |_| true).await?;
    Ok(())
}

/// The container image the pod's first container runs now, as the kubelet
/// reports it.
fn running_image(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()
        .map(|c| c.image.clone())
}

#[tokio::test]
async fn chaos_mesh_pod_failure_stops_a_real_gateway_until_the_experiment_is_deleted()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "real-failure").await?;
    let _operator = operator(&ns.name)?;
    let sale = create_sale(&client, &ns.name, SignedDuration::from_hours(1)).await?;
    await_ready(&client, &ns.name, &sale.name).await?;
    let gateways = ready_pods(&client, &ns.name, &sale.name, "gateway").await?;
    let victim = gateways
        .first()
        .ok_or_else(|| anyhow::anyhow!("no ready gateway"))?;
    let (victim_name, victim_uid) = (victim.name_any(), victim.uid());
    let pause = stack::chaos_mesh_pause_image()?;

    let chaos = pod_chaos(
        &client,
        &ns.name,
        "fail-one-gateway",
        "pod-failure",
        &victim_name,
    )
    .await?;

    // The same pod keeps running, but its gateway process is replaced by
    // the pause image: readiness fails, and the sale is short a gateway.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    poll_until(
        "the gateway container to become pause",
        START,
        TICK,
        || async {
            let pod = pods.get(&victim_name).await.map_err(|e| e.to_string())?;
            let image = running_image(&pod);
            if pod.uid() == victim_uid
                && image.as_deref().is_some_and(|i| i.contains(&pause))
                && !is_ready(&pod)
            {
                Ok(())
            } else {
                Err(format!("image {image:?}, ready {}", is_ready(&pod)))
            }
        },
    )
    .await?;
    let short = await_condition(&client, &ns.name, &sale.name, "Ready", "False", |_| true).await?;
    let message = condition(&short, "Ready").map(|c| c.2).unwrap_or_default();
    assert!(message.contains("gateway 1/2 ready"), "{message}");

    // Deleting the experiment gives the pod its own image back.
    chaos
        .delete("fail-one-gateway", &DeleteParams::default())
        .await?;
    poll_until("the gateway to come back", START, TICK, || async {
        let pod = pods.get(&victim_name).await.map_err(|e| e.to_string())?;
        let image = running_image(&pod);
        if pod.uid() == victim_uid
            && image.as_deref().is_some_and(|i| i.contains("gateway"))
            && is_ready(&pod)
        {
            Ok(())
        } else {
            Err(format!("image {image:?}, ready {}", is_ready(&pod)))
        }
    })
    .await?;
    await_ready(&client, &ns.name, &sale.name).await?;
    Ok(())
}

#[tokio::test]
async fn the_example_policy_reads_the_real_gateways_and_every_gateway_applies_its_switches()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "real-degradation").await?;
    let operator = operator(&ns.name)?;
    let sale = create_sale(&client, &ns.name, SignedDuration::from_hours(1)).await?;
    patch_sale(
        &client,
        &ns.name,
        &sale.name,
        json!({"spec": {"gateway": {"replicas": 3}}}),
    )
    .await?;
    await_ready_gateways(&client, &ns.name, &sale.name, 3, "3 ready gateways").await?;

    // The example's signal, as written, over the gateways' own metrics as
    // Prometheus scrapes them from the pods: a finite load ratio.
    let policies: Api<DegradationPolicy> = Api::namespaced(client.clone(), &ns.name);
    let created = policies
        .create(
            &PostParams::default(),
            &example_policy(&ns.name, &sale.name)?,
        )
        .await?;
    let name = created.name_any();
    let read = await_signal_read(&policies, &name).await?;
    assert!(
        read.is_finite() && (0.0..1.0).contains(&read),
        "load ratio {read} of idle gateways"
    );

    // On-call forces tier 2: every one of the three real gateways applies
    // it, and the operator measured how long that took.
    let expires = Timestamp::now() + SignedDuration::from_mins(10);
    let patch = json!({"spec": {"override": {
        "tier": 2, "reason": "drill: force tier 2", "expires": expires.to_string()
    }}});
    policies
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let status = await_tier_2_everywhere(&policies, &name).await?;
    let propagation = status.propagation.clone().unwrap_or_default();
    assert_eq!(propagation.desired_replicas, 3);
    let seconds = propagation.seconds.unwrap_or(f64::NAN);
    assert!(seconds.is_finite() && seconds < 5.0, "{seconds}");
    let switches =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns.name)
            .get(&format!("{}-degradation", sale.name))
            .await?;
    let state = flashsale_degradation::Degradation::from_data(&switches.data.unwrap_or_default())?;
    assert_eq!(i64::try_from(state.generation)?, propagation.generation);
    assert_eq!(state.tier, 2);
    let measured = operator
        .metric_sum("flashsale_degradation_propagation_seconds_count")
        .await?;
    assert!(measured >= 1.0, "{measured}");

    policies.delete(&name, &DeleteParams::default()).await?;
    poll_until("the policy gone", START, TICK, || {
        let policies = policies.clone();
        let name = name.clone();
        async move {
            match policies.get_opt(&name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|p| p.is_some()))),
            }
        }
    })
    .await?;
    Ok(())
}

/// Waits until policy `name` has read its signal, and returns the value.
async fn await_signal_read(policies: &Api<DegradationPolicy>, name: &str) -> anyhow::Result<f64> {
    Ok(
        poll_until("the example signal read", START, TICK, || async {
            let status = policies
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let signal = status.observed.get("SignalAvailable").cloned();
            match (status.last_value, signal) {
                (Some(value), Some(c)) if c.status == "True" => Ok(value),
                (value, c) => Err(format!("{value:?} {c:?}")),
            }
        })
        .await?,
    )
}

/// Waits until policy `name` is at tier 2 and its switches are applied by
/// all three gateways, with the time that took measured; returns the
/// status.
async fn await_tier_2_everywhere(
    policies: &Api<DegradationPolicy>,
    name: &str,
) -> anyhow::Result<DegradationPolicyStatus> {
    Ok(poll_until(
        "the switches applied by every gateway",
        START,
        TICK,
        || async {
            let status = policies
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let propagated = status.observed.get("Propagated").cloned();
            match (&status.propagation, status.tier) {
                (Some(p), Some(2))
                    if p.applied_replicas == 3
                        && p.seconds.is_some()
                        && propagated.as_ref().is_some_and(|c| c.status == "True") =>
                {
                    Ok(status)
                }
                _ => Err(format!("{:?} {propagated:?}", status.propagation)),
            }
        },
    )
    .await?)
}

#[tokio::test]
async fn a_drill_kills_a_real_gateway_and_the_real_slo_breach_aborts_the_run() -> anyhow::Result<()>
{
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "real-drill").await?;
    let operator = operator(&ns.name)?;
    let sale = create_sale(&client, &ns.name, SignedDuration::from_hours(1)).await?;
    await_ready(&client, &ns.name, &sale.name).await?;
    let gateways = ready_pods(&client, &ns.name, &sale.name, "gateway").await?;
    assert_eq!(gateways.len(), 2);
    await_scraped_and_up(&ns.name, &gateways).await?;

    // The objective counts these two gateways by name: the killed one stays
    // missing from it however fast its successor serves, where counting the
    // Deployment's pods could miss a kill replaced between two scrapes.
    let mut drill = gateway_drill(&ns.name, &sale.name)?;
    let names: Vec<String> = gateways.iter().map(ResourceExt::name_any).collect();
    drill.spec.slo_guard.objectives[0].query = format!(
        r#"count(up{{namespace="{}", pod=~"{}"}} == 1)"#,
        ns.name,
        names.join("|")
    );
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), &ns.name);
    drills.create(&PostParams::default(), &drill).await?;
    let ended = poll_until("the run ended", START, TICK, || async {
        let drill = drills.get("real").await.map_err(|e| e.to_string())?;
        let status = drill.status.unwrap_or_default();
        match status.history.first() {
            Some(run) => Ok(run.clone()),
            None => Err(format!("{:?} {:?}", status.phase, status.current_run)),
        }
    })
    .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"), "{ended:?}");
    assert_eq!(
        ended.slo_extremes.get("gateways-up"),
        Some(&1.0),
        "{ended:?}"
    );
    assert!(ended.abort_latency.is_some(), "{ended:?}");
    eprintln!(
        "real node: injected {:?}, decided {:?}, detection {:?}, decision → gone {:?}",
        ended.injected_at, ended.decided_at, ended.detection_latency, ended.abort_latency
    );
    assert_only_the_target_killed(&client, &ns.name, &gateways, &ended).await?;
    for kind in [Kind::PodChaos, Kind::Workflow] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns.name, &kind.resource());
        let left = api
            .list(&ListParams::default().labels(&format!("flashsale.dev/run={}", ended.id)))
            .await?;
        assert!(left.items.is_empty(), "{kind:?} left after the abort");
    }
    // The Deployment replaces the killed gateway.
    let what = "two ready gateways again";
    await_ready_gateways(&client, &ns.name, &sale.name, 2, what).await?;
    drop(operator);
    Ok(())
}

/// Exactly the gateway the run `ended` named was killed; the others kept
/// running.
async fn assert_only_the_target_killed(
    client: &Client,
    ns: &str,
    gateways: &[Pod],
    ended: &RunRecord,
) -> anyhow::Result<()> {
    let [target] = ended.targets.as_slice() else {
        anyhow::bail!("one target expected: {ended:?}");
    };
    let victim = target.rsplit('/').next().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for gateway in gateways {
        let now = pods.get_opt(&gateway.name_any()).await?;
        if gateway.name_any() == victim {
            assert!(
                now.is_none_or(|p| p.uid() != gateway.uid()),
                "{victim} not killed"
            );
        } else {
            assert_eq!(
                now.and_then(|p| p.uid()),
                gateway.uid(),
                "a bystander was killed"
            );
        }
    }
    Ok(())
}

/// `count` GETs of `url`, each on a new connection as each of many buyers
/// makes one; the first answer that is not 200 as an error.
async fn gets_on_new_connections(url: &str, count: usize) -> Result<(), String> {
    let fresh = http_per_request().map_err(|e| e.to_string())?;
    for _ in 0..count {
        let answer = fresh.get(url).send().await.map_err(|e| e.to_string())?;
        if answer.status() != 200 {
            return Err(format!("answered {}", answer.status()));
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_forward_through_the_apiserver_spreads_connections_over_ready_gateways_and_skips_a_deleted_one()
-> anyhow::Result<()> {
    let scene = Scene::start("real-forward").await?;
    let Scene {
        client,
        ns,
        sale,
        gateways,
        ..
    } = &scene;
    assert_eq!(gateways.len(), 2);

    // The gateways' Service with nothing but the kubeconfig, as a run from
    // a CI runner reaches a kind cluster: its ops port (named, like every
    // port of the sale's Services), where a ready gateway answers 200.
    let service = format!("{}-gateway", sale.name);
    let forward = Forward::to_service(client, &ns.name, &service, 9090).await?;
    let ready = format!("{}/readyz", forward.url());
    gets_on_new_connections(&ready, 20)
        .await
        .map_err(anyhow::Error::msg)?;
    let each: BTreeMap<String, u64> = gateways.iter().map(|g| (g.name_any(), 10)).collect();
    assert_eq!(forward.forwarded(), each, "connections by gateway");

    // A gateway deleted: once its endpoint is gone, no new connection
    // goes to it.
    let gone = gateways[0].name_any();
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .delete(
            &gone,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
    poll_until(
        "ten answers in a row, none from the deleted gateway",
        START,
        TICK,
        || async {
            let before = forward.forwarded().get(&gone).copied();
            gets_on_new_connections(&ready, 10).await?;
            let after = forward.forwarded().get(&gone).copied();
            if before == after {
                Ok(())
            } else {
                Err(format!("{gone} still took connections"))
            }
        },
    )
    .await?;
    let spread = forward.forwarded();
    eprintln!(
        "forward: {spread:?}, {} refused while the gateway went",
        forward.refused()
    );
    let others: u64 = spread
        .iter()
        .filter(|(pod, _)| **pod != gone)
        .map(|(_, n)| n)
        .sum();
    assert!(
        others >= 20,
        "the other gateways took the connections: {spread:?}"
    );
    Ok(())
}
