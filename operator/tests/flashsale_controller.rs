//! The FlashSale controller against the real local control plane (apiserver,
//! controller-manager, scheduler, kwok nodes): an operator process per test,
//! limited to the test's namespace.

mod common;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use common::{Operator, condition, secret, setup};
use flashsale_api::{FlashSale, children::MANAGED_BY, flashsale::SalePhase};
use flashsale_e2e::{kube::TestNamespace, wait::poll_until};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        autoscaling::v2::HorizontalPodAutoscaler,
        core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount},
        events::v1::Event,
        networking::v1::NetworkPolicy,
        policy::v1::PodDisruptionBudget,
        rbac::v1::{Role, RoleBinding},
    },
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const TICK: Duration = Duration::from_millis(200);

/// A sale that is warming up now (start in 1 h, warm-up 2 h), so workloads
/// run at their spec's size.
fn sale(name: &str) -> Value {
    let start = Timestamp::now() + SignedDuration::from_hours(1);
    flashsale_e2e::sales::scheduled(name, start, start + SignedDuration::from_hours(2), "2h")
}

async fn create_sale(client: &Client, ns: &str, object: Value) -> anyhow::Result<FlashSale> {
    let sale: FlashSale = serde_json::from_value(object)?;
    Ok(Api::<FlashSale>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sale)
        .await?)
}

async fn get_sale(client: &Client, ns: &str, name: &str) -> Result<FlashSale, String> {
    Api::<FlashSale>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())
}

/// Waits until the sale's `type_` condition has `status` (and returns it).
async fn await_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
) -> anyhow::Result<FlashSale> {
    Ok(poll_until(
        &format!("{name} {type_}={status}"),
        WAIT,
        TICK,
        || async move {
            let sale = get_sale(client, ns, name).await?;
            match condition(&sale, type_) {
                Some((s, _, _)) if s == status => Ok(sale),
                other => Err(format!(
                    "{type_}: {other:?}; phase {:?}",
                    sale.status.as_ref().and_then(|s| s.phase)
                )),
            }
        },
    )
    .await?)
}

async fn deployment_replicas(client: &Client, ns: &str, name: &str) -> Result<Option<i32>, String> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map(|d| d.spec.replicas)
        .map_err(|e| e.to_string())
}

/// Checks one child: it exists, the sale controls it, and it has the labels.
async fn owned_child<K>(
    client: &Client,
    ns: &str,
    name: &str,
    sale: &FlashSale,
    component: &str,
) -> anyhow::Result<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let object: K = Api::<K>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("{} {name}: {e}", K::kind(&())))?;
    let owners = object.owner_references();
    anyhow::ensure!(
        owners.len() == 1
            && owners[0].controller == Some(true)
            && Some(&owners[0].uid) == sale.metadata.uid.as_ref()
            && owners[0].kind == "FlashSale",
        "{} {name} owner references: {owners:?}",
        K::kind(&())
    );
    let labels = object.labels();
    let sale_name = sale.name_any();
    let expect = [
        ("app.kubernetes.io/managed-by", MANAGED_BY),
        ("app.kubernetes.io/part-of", sale_name.as_str()),
        ("app.kubernetes.io/component", component),
    ];
    for (key, value) in expect {
        anyhow::ensure!(
            labels.get(key).map(String::as_str) == Some(value),
            "{} {name} label {key}: {:?}",
            K::kind(&()),
            labels.get(key)
        );
    }
    Ok(object)
}

async fn events(client: &Client, ns: &str, reason: &str) -> Result<Vec<Event>, String> {
    let list = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect())
}

#[tokio::test]
async fn a_sale_deploys_its_children_follows_its_spec_and_reverts_hand_edits() -> anyhow::Result<()>
{
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-children").await?;
    let _operator = Operator::start(&ns.name, "solo", &[])?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    let created = create_sale(&client, &ns.name, sale("d11")).await?;

    // Ready: every workload's pods are Running on the kwok nodes.
    let ready = await_condition(&client, &ns.name, "d11", "Ready", "True").await?;
    assert_warming_up_status(&ready, &created);
    assert_workload_children(&client, &ns.name, &ready).await?;
    let internal = assert_internal_tokens(&client, &ns.name, &ready).await?;
    assert_gateway_rbac(&client, &ns.name, &ready).await?;
    assert_no_switches_and_pods_running(&client, &ns.name).await?;

    let sales = Api::<FlashSale>::namespaced(client.clone(), &ns.name);
    assert_spec_change_applied(&client, &ns.name, &sales).await?;
    assert_hand_edit_reverted(&client, &ns.name).await?;
    assert_autoscaling_adds_and_prunes_the_hpa(&client, &ns.name, &sales).await?;
    assert_deleted_network_policy_comes_back(&client, &ns.name).await?;

    // Reconciled many times since: the tokens were never replaced.
    let kept = Api::<Secret>::namespaced(client.clone(), &ns.name)
        .get("d11-internal")
        .await?;
    assert_eq!(kept.metadata.uid, internal.metadata.uid);
    assert_eq!(kept.data, internal.data, "the tokens stay as first made");

    // Deleting the sale removes its children (garbage collection by owner).
    sales.delete("d11", &DeleteParams::foreground()).await?;
    poll_until("every child gone", WAIT, TICK, || async {
        let left = children_written(&client, &ns.name, "d11").await?;
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} left"))
        }
    })
    .await?;
    Ok(())
}

/// The status of the Ready sale `created`, warming up: every workload
/// ready, the generation observed, the opening next, and the stock
/// unreadable (kwok pods serve nothing), which is a condition.
fn assert_warming_up_status(ready: &FlashSale, created: &FlashSale) {
    let status = ready.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(SalePhase::WarmingUp));
    assert_eq!(status.ready_workloads.as_deref(), Some("3/3"));
    assert_eq!(
        status
            .workloads
            .get("gateway")
            .map(|w| (w.ready, w.desired)),
        Some((2, 2))
    );
    assert_eq!(
        status.observed.observed_generation,
        created.metadata.generation
    );
    assert_eq!(
        status.next_transition_time.map(|t| t.0),
        Some(created.spec.schedule.start.0),
        "the next transition is the opening"
    );
    assert_eq!(
        condition(ready, "InventoryReachable").map(|c| (c.0, c.1)),
        Some(("False".to_owned(), "InventoryUnreachable".to_owned()))
    );
}

/// Every workload's Deployment, Service, PodDisruptionBudget and
/// NetworkPolicy (selecting its own pods), and the gateway's and
/// inventory's ConfigMaps, are the sale's.
async fn assert_workload_children(
    client: &Client,
    ns: &str,
    sale: &FlashSale,
) -> anyhow::Result<()> {
    for component in ["gateway", "inventory", "order-writer"] {
        let name = format!("d11-{component}");
        owned_child::<Deployment>(client, ns, &name, sale, component).await?;
        owned_child::<Service>(client, ns, &name, sale, component).await?;
        owned_child::<PodDisruptionBudget>(client, ns, &name, sale, component).await?;
        let policy = owned_child::<NetworkPolicy>(client, ns, &name, sale, component).await?;
        let selects = policy
            .spec
            .and_then(|s| s.pod_selector)
            .and_then(|s| s.match_labels)
            .and_then(|l| l.get("app.kubernetes.io/component").cloned());
        assert_eq!(
            selects.as_deref(),
            Some(component),
            "{name} selects its pods"
        );
    }
    for name in ["d11-gateway", "d11-inventory"] {
        let component = if name == "d11-inventory" {
            "inventory"
        } else {
            "gateway"
        };
        owned_child::<ConfigMap>(client, ns, name, sale, component).await?;
    }
    Ok(())
}

/// The inventory API's tokens: made once, random, owned by the sale.
/// Returns their Secret.
async fn assert_internal_tokens(
    client: &Client,
    ns: &str,
    sale: &FlashSale,
) -> anyhow::Result<Secret> {
    let internal = owned_child::<Secret>(client, ns, "d11-internal", sale, "inventory").await?;
    let tokens = internal.data.clone().unwrap_or_default();
    let token = |key: &str| {
        let value = tokens.get(key).map(|v| v.0.clone()).unwrap_or_default();
        String::from_utf8(value).unwrap_or_default()
    };
    let (api_token, admin_token) = (token("inventory-token"), token("inventory-admin-token"));
    for value in [&api_token, &admin_token] {
        assert!(
            value.len() == 64 && value.chars().all(|c| c.is_ascii_hexdigit()),
            "a token of 32 random bytes in hex: {value:?}"
        );
    }
    assert_ne!(api_token, admin_token);
    Ok(internal)
}

/// The gateway's ServiceAccount, Role and RoleBinding are the sale's, and
/// the Role reaches the sale's switches only.
async fn assert_gateway_rbac(client: &Client, ns: &str, sale: &FlashSale) -> anyhow::Result<()> {
    owned_child::<ServiceAccount>(client, ns, "d11-gateway", sale, "gateway").await?;
    let role = owned_child::<Role>(client, ns, "d11-gateway", sale, "gateway").await?;
    owned_child::<RoleBinding>(client, ns, "d11-gateway", sale, "gateway").await?;
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].resource_names,
        Some(vec!["d11-degradation".to_owned()])
    );
    Ok(())
}

/// No switches without a policy, every pod Running, and a PhaseWarmingUp
/// Event.
async fn assert_no_switches_and_pods_running(client: &Client, ns: &str) -> anyhow::Result<()> {
    // The switches are the DegradationPolicy controller's alone: a sale
    // without a policy has none, and its gateways run at tier 0.
    let degradation = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt("d11-degradation")
        .await?;
    assert!(degradation.is_none(), "{degradation:?}");
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=d11"))
        .await?;
    let running = pods
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    assert_eq!(running, 4, "2 gateways, 1 inventory, 1 order-writer");
    assert!(
        !events(client, ns, "PhaseWarmingUp")
            .await
            .map_err(anyhow::Error::msg)?
            .is_empty(),
        "a PhaseWarmingUp Event"
    );
    Ok(())
}

/// A change of the spec is applied: the inventory scaled to 3 shows ready
/// in the status.
async fn assert_spec_change_applied(
    client: &Client,
    ns: &str,
    sales: &Api<FlashSale>,
) -> anyhow::Result<()> {
    sales
        .patch(
            "d11",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"inventory": {"replicas": 3}}})),
        )
        .await?;
    poll_until(
        "inventory at 3 ready replicas in the status",
        WAIT,
        TICK,
        || async {
            let sale = get_sale(client, ns, "d11").await?;
            let w = sale
                .status
                .as_ref()
                .and_then(|s| s.workloads.get("inventory").cloned());
            match w {
                Some(w) if w.desired == 3 && w.ready == 3 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// A hand edit of a field the operator sets is reverted.
async fn assert_hand_edit_reverted(client: &Client, ns: &str) -> anyhow::Result<()> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    deployments
        .patch(
            "d11-gateway",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 7}})),
        )
        .await?;
    let reverted = Instant::now();
    poll_until("the gateway back at 2 replicas", WAIT, TICK, || async {
        match deployment_replicas(client, ns, "d11-gateway").await? {
            Some(2) => Ok(()),
            other => Err(format!("replicas {other:?}")),
        }
    })
    .await?;
    println!("hand edit reverted in {:?}", reverted.elapsed());
    Ok(())
}

/// Autoscaling adds an HPA (and gives it the replicas); removing it prunes
/// it.
async fn assert_autoscaling_adds_and_prunes_the_hpa(
    client: &Client,
    ns: &str,
    sales: &Api<FlashSale>,
) -> anyhow::Result<()> {
    sales
        .patch(
            "d11",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"gateway": {"autoscaling": {"minReplicas": 2, "maxReplicas": 5}}}}),
            ),
        )
        .await?;
    let hpas = Api::<HorizontalPodAutoscaler>::namespaced(client.clone(), ns);
    poll_until("the gateway's HPA", WAIT, TICK, || async {
        match hpas
            .get_opt("d11-gateway")
            .await
            .map_err(|e| e.to_string())?
        {
            Some(hpa) if hpa.spec.max_replicas == 5 => Ok(()),
            other => Err(format!("{:?}", other.map(|h| h.spec))),
        }
    })
    .await?;
    sales
        .patch(
            "d11",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"gateway": {"autoscaling": null}}})),
        )
        .await?;
    poll_until("the HPA pruned", WAIT, TICK, || async {
        match hpas
            .get_opt("d11-gateway")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await?;
    Ok(())
}

/// A NetworkPolicy deleted by hand comes back.
async fn assert_deleted_network_policy_comes_back(client: &Client, ns: &str) -> anyhow::Result<()> {
    let policies = Api::<NetworkPolicy>::namespaced(client.clone(), ns);
    policies
        .delete("d11-inventory", &DeleteParams::default())
        .await?;
    poll_until("the inventory's NetworkPolicy back", WAIT, TICK, || async {
        match policies
            .get_opt("d11-inventory")
            .await
            .map_err(|e| e.to_string())?
        {
            Some(p) if p.metadata.deletion_timestamp.is_none() => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.metadata.uid))),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_phases_change_at_their_exact_times() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-phases").await?;
    // A refresh far beyond the test: only the phase timers can wake the
    // controller in time (pod changes aside).
    let _operator = Operator::start(&ns.name, "solo", &["--status-refresh", "5m"])?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    // Warm-up in 6 s, opening 2 s later, closing 2 s after that.
    // Whole seconds: a Time in the API carries no fraction.
    let start = Timestamp::from_second(Timestamp::now().as_second() + 8)?;
    let end = start + SignedDuration::from_secs(2);
    let warm_up_at = start - SignedDuration::from_secs(2);
    create_sale(
        &client,
        &ns.name,
        flashsale_e2e::sales::scheduled("tick", start, end, "2s"),
    )
    .await?;

    let (seen, gateway_replicas) = follow_phases(&client, &ns.name).await?;
    let phases: Vec<SalePhase> = seen.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        phases,
        [
            SalePhase::Pending,
            SalePhase::WarmingUp,
            SalePhase::Live,
            SalePhase::Ended
        ],
        "{seen:?}"
    );
    for ((phase, at), due) in seen.iter().skip(1).zip([warm_up_at, start, end]) {
        let late = at.duration_since(due);
        println!("{phase:?}: seen {late} after its time");
        // Never early; late by the status write and this poll only.
        assert!(late >= SignedDuration::ZERO, "{phase:?} early by {late}");
        assert!(
            late < SignedDuration::from_millis(1500),
            "{phase:?} late by {late}"
        );
    }
    // The gateway's size follows the phase: 1 before warm-up, the spec's 2
    // while warming up and live, 1 once ended.
    assert_eq!(
        gateway_replicas.get("Pending"),
        Some(&Some(1)),
        "{gateway_replicas:?}"
    );
    assert_eq!(
        gateway_replicas.get("Live"),
        Some(&Some(2)),
        "{gateway_replicas:?}"
    );
    poll_until("the ended gateway at 1 replica", WAIT, TICK, || async {
        match deployment_replicas(&client, &ns.name, "tick-gateway").await? {
            Some(1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    await_phase_events(&client, &ns.name).await?;
    // The kwok order-writer exposes no lag, so the sale does not scale to
    // zero and says why.
    let ended = get_sale(&client, &ns.name, "tick")
        .await
        .map_err(anyhow::Error::msg)?;
    let drained = condition(&ended, "Drained");
    assert_eq!(
        drained.as_ref().map(|d| (d.0.as_str(), d.1.as_str())),
        Some(("False", "Draining")),
        "{drained:?}"
    );
    Ok(())
}

/// Each phase of sale `tick` with when it was first seen, and the gateway's
/// replicas at the first reading in each phase (by the phase's name).
type PhasesSeen = (Vec<(SalePhase, Timestamp)>, BTreeMap<String, Option<i32>>);

/// Follows sale `tick` until it has Ended, within 40 s. Polled every 50 ms
/// with a deadline: the times of change are the point.
async fn follow_phases(client: &Client, ns: &str) -> anyhow::Result<PhasesSeen> {
    let mut seen: Vec<(SalePhase, Timestamp)> = Vec::new();
    let mut gateway_replicas: BTreeMap<String, Option<i32>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let sale = get_sale(client, ns, "tick")
            .await
            .map_err(anyhow::Error::msg)?;
        let phase = sale.status.as_ref().and_then(|s| s.phase);
        if let Some(phase) = phase {
            if seen.last().map(|(p, _)| *p) != Some(phase) {
                seen.push((phase, Timestamp::now()));
            }
            let replicas = deployment_replicas(client, ns, "tick-gateway")
                .await
                .ok()
                .flatten();
            // The first reading in a phase: its status is written after its
            // applies, so it shows that phase's size.
            gateway_replicas
                .entry(format!("{phase:?}"))
                .or_insert(replicas);
        }
        if phase == Some(SalePhase::Ended) {
            return Ok((seen, gateway_replicas));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the sale did not end in time: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for an Event per phase change, for `kubectl describe`.
async fn await_phase_events(client: &Client, ns: &str) -> anyhow::Result<()> {
    for (reason, note) in [
        ("PhaseWarmingUp", "Pending → WarmingUp"),
        ("PhaseLive", "WarmingUp → Live"),
        ("PhaseEnded", "Live → Ended"),
    ] {
        poll_until(&format!("a {reason} Event"), WAIT, TICK, || async {
            let found = events(client, ns, reason).await?;
            if found.iter().any(|e| e.note.as_deref() == Some(note)) {
                Ok(())
            } else {
                Err(format!(
                    "{:?}",
                    found.iter().map(|e| &e.note).collect::<Vec<_>>()
                ))
            }
        })
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_missing_secret_is_a_condition_until_it_appears() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-secret").await?;
    let _operator = Operator::start(&ns.name, "solo", &[])?;
    secret(&client, &ns.name, "db", "url").await?;
    let mut object = sale("nosecret");
    object["spec"]["gateway"]["payment"] = json!({"secretRef": {"name": "payment", "key": "hmac"}});
    create_sale(&client, &ns.name, object).await?;

    let stalled = await_condition(&client, &ns.name, "nosecret", "Stalled", "True").await?;
    let (_, reason, message) = condition(&stalled, "Stalled").unwrap_or_default();
    assert_eq!(reason, "SecretMissing");
    assert!(
        message.contains(&format!("Secret {}/jwt", ns.name))
            && message.contains("spec.gateway.auth.hs256SecretRef"),
        "{message}"
    );
    assert_eq!(
        stalled.status.as_ref().and_then(|s| s.phase),
        Some(SalePhase::Failed)
    );
    let what = "a SecretMissing Warning Event";
    await_warning_event(&client, &ns.name, "SecretMissing", what).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await?;
    assert!(
        deployments.items.is_empty(),
        "nothing is deployed without its Secret"
    );

    // The payment provider's key is gathered like the others.
    secret(&client, &ns.name, "jwt", "hs256").await?;
    poll_until(
        "the payment Secret reported missing",
        WAIT,
        TICK,
        || async {
            let sale = get_sale(&client, &ns.name, "nosecret").await?;
            match condition(&sale, "Stalled") {
                Some((status, reason, message))
                    if status == "True"
                        && reason == "SecretMissing"
                        && message.contains(&format!("Secret {}/payment", ns.name))
                        && message.contains("spec.gateway.payment.secretRef") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;

    let created = Instant::now();
    secret(&client, &ns.name, "payment", "hmac").await?;
    let recovered = await_condition(&client, &ns.name, "nosecret", "Ready", "True").await?;
    println!(
        "recovered {:?} after the Secret appeared",
        created.elapsed()
    );
    assert_eq!(
        recovered.status.as_ref().and_then(|s| s.phase),
        Some(SalePhase::WarmingUp)
    );
    assert_eq!(
        condition(&recovered, "Stalled").map(|c| c.0),
        Some("False".to_owned())
    );
    assert_payment_secret_mounted(&client, &ns.name).await
}

/// Waits for a Warning Event of `reason`; `what` names it in a timeout.
async fn await_warning_event(
    client: &Client,
    ns: &str,
    reason: &str,
    what: &str,
) -> anyhow::Result<()> {
    poll_until(what, WAIT, TICK, || async {
        let found = events(client, ns, reason).await?;
        if found.iter().any(|e| e.type_.as_deref() == Some("Warning")) {
            Ok(())
        } else {
            Err("none".into())
        }
    })
    .await?;
    Ok(())
}

/// The gateway of sale `nosecret` mounts the payment Secret and is told
/// where its file is.
async fn assert_payment_secret_mounted(client: &Client, ns: &str) -> anyhow::Result<()> {
    let gateway = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("nosecret-gateway")
        .await?;
    let pod = gateway.spec.template.spec.unwrap_or_default();
    let env: Vec<(String, Option<String>)> = pod
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    assert!(
        env.contains(&(
            "PAYMENT_SECRET_FILE".to_owned(),
            Some("/etc/flashsale/payment/secret".to_owned())
        )),
        "{env:?}"
    );
    let payment = pod.volumes.unwrap_or_default().into_iter().find_map(|v| {
        v.secret
            .filter(|s| s.secret_name.as_deref() == Some("payment"))
    });
    assert!(payment.is_some(), "the payment Secret is mounted");
    Ok(())
}

#[tokio::test]
async fn an_invalid_spec_waits_for_an_edit_instead_of_looping() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-invalid").await?;
    let operator = Operator::start(&ns.name, "solo", &[])?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    let mut object = sale("bad");
    object["spec"]["orderWriter"]["kafka"]["brokers"] = json!(["kafka"]);
    create_sale(&client, &ns.name, object).await?;

    let stalled = await_condition(&client, &ns.name, "bad", "Stalled", "True").await?;
    let (_, reason, message) = condition(&stalled, "Stalled").unwrap_or_default();
    assert_eq!(reason, "InvalidSpec");
    assert!(
        message.contains("spec.orderWriter.kafka.brokers[0]"),
        "{message}"
    );
    // No hot loop: one reconcile wrote the condition, one more saw its own
    // status write; a retry with backoff would add more within 5 s (at 1, 3
    // and 7 s). Waiting is the point here, not a readiness stand-in.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let count = operator
        .metric_sum("flashsale_operator_reconcile_total")
        .await?;
    assert!(count <= 2.0, "{count} reconciles while waiting for an edit");

    let sales = Api::<FlashSale>::namespaced(client.clone(), &ns.name);
    sales
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"orderWriter": {"kafka": {"brokers": ["kafka:9092"]}}}})),
        )
        .await?;
    await_condition(&client, &ns.name, "bad", "Ready", "True").await?;
    Ok(())
}

/// How many objects of kind `K` carry the sale's part-of label.
async fn count_children<K>(client: &Client, ns: &str, sale: &str) -> Result<usize, String>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/part-of={sale}"));
    Api::<K>::namespaced(client.clone(), ns)
        .list(&selector)
        .await
        .map(|list| list.items.len())
        .map_err(|e| format!("{}: {e}", K::kind(&())))
}

/// How many children of the sale's kinds carry its part-of label: its
/// workloads, configuration, Services, NetworkPolicies and Secrets.
async fn children_written(client: &Client, ns: &str, sale: &str) -> Result<usize, String> {
    Ok(count_children::<Deployment>(client, ns, sale).await?
        + count_children::<ConfigMap>(client, ns, sale).await?
        + count_children::<Service>(client, ns, sale).await?
        + count_children::<NetworkPolicy>(client, ns, sale).await?
        + count_children::<Secret>(client, ns, sale).await?)
}

/// The images of Deployment `name`'s containers.
async fn deployment_images(client: &Client, ns: &str, name: &str) -> anyhow::Result<Vec<String>> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await?;
    let pod = deployment.spec.template.spec.unwrap_or_default();
    Ok(pod.containers.into_iter().filter_map(|c| c.image).collect())
}

#[tokio::test]
async fn an_image_outside_the_allowlist_is_refused_and_nothing_is_applied() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-images").await?;
    // The env form of `--allowed-image`: a folder and one exact reference.
    let _operator = Operator::start_with_env(
        &ns.name,
        "solo",
        &[],
        &[(
            "FLASHSALE_ALLOWED_IMAGES",
            "registry.example.com/team/,mirror.example.com/writer:1.4",
        )],
    )?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    let mut object = sale("img");
    object["spec"]["gateway"]["image"] = json!("evil.example.com/gateway:1");
    object["spec"]["orderWriter"]["image"] = json!("mirror.example.com/writer:1.4");
    create_sale(&client, &ns.name, object).await?;

    let stalled = await_condition(&client, &ns.name, "img", "Stalled", "True").await?;
    let (_, reason, message) = condition(&stalled, "Stalled").unwrap_or_default();
    assert_eq!(reason, "ImageNotAllowed");
    assert!(
        message.contains("spec.gateway.image: \"evil.example.com/gateway:1\"")
            && !message.contains("spec.orderWriter.image"),
        "{message}"
    );
    assert_eq!(
        stalled.status.as_ref().and_then(|s| s.phase),
        Some(SalePhase::Failed)
    );
    let what = "an ImageNotAllowed Warning Event";
    await_warning_event(&client, &ns.name, "ImageNotAllowed", what).await?;
    // Nothing of the sale was written: no workload, no configuration, not
    // even its internal Secret.
    let written = children_written(&client, &ns.name, "img")
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!(written, 0, "children of a refused sale");

    // An allowed image: the sale proceeds and runs it.
    Api::<FlashSale>::namespaced(client.clone(), &ns.name)
        .patch(
            "img",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"gateway": {"image": "registry.example.com/team/gateway:2"}}}),
            ),
        )
        .await?;
    await_condition(&client, &ns.name, "img", "Ready", "True").await?;
    assert_eq!(
        deployment_images(&client, &ns.name, "img-gateway").await?,
        ["registry.example.com/team/gateway:2"]
    );
    assert_eq!(
        deployment_images(&client, &ns.name, "img-order-writer").await?,
        ["mirror.example.com/writer:1.4"]
    );
    Ok(())
}

/// Serves the real inventory API (in this process, on the stack's Redis) on
/// `listener`, with the sale's definition loaded under `sale_id`, as the
/// inventory pods would, answering only requests that carry `token` as a
/// bearer token.
async fn serve_inventory(
    listener: tokio::net::TcpListener,
    sale_id: &str,
    token: &str,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use axum::{
        extract::Request,
        http::{StatusCode, header::AUTHORIZATION},
        middleware::{self, Next},
        response::{IntoResponse, Response},
    };
    use inventory::store::{ItemDefinition, SaleDefinition, Store};
    let store = Store::connect(&flashsale_e2e::stack::redis_url()?).await?;
    let items = [("PHONE", 100, 1), ("CASE", 500, 3)]
        .map(|(sku, stock, per_user_limit)| ItemDefinition {
            sku: sku.to_owned(),
            stock,
            per_user_limit,
            shards: 1,
        })
        .to_vec();
    store
        .load(&SaleDefinition {
            sale: sale_id.to_owned(),
            opens_at_ms: None,
            reservation_ttl_ms: 60_000,
            items,
        })
        .await?;
    let metrics = inventory::metrics::Metrics::register(
        &mut prometheus_client::registry::Registry::default(),
    );
    let state = inventory::api::AppState::new(store, metrics, Duration::from_millis(200));
    let expected = format!("Bearer {token}");
    let authenticated = move |request: Request, next: Next| {
        let expected = expected.clone();
        async move {
            let sent = request.headers().get(AUTHORIZATION);
            if sent.is_some_and(|v| v.as_bytes() == expected.as_bytes()) {
                next.run(request).await
            } else {
                let refused: Response = (StatusCode::UNAUTHORIZED, "unauthorized").into_response();
                refused
            }
        }
    };
    let app = inventory::api::router(state).layer(middleware::from_fn(authenticated));
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    }))
}

/// `<namespace>.<name>.<uid8>`, as the operator renders it.
fn sale_id_of(sale: &FlashSale) -> anyhow::Result<String> {
    Ok(flashsale_controller_sale::build::sale_id(sale)?)
}

#[tokio::test]
async fn the_status_shows_the_stock_the_inventory_reports() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-stock").await?;
    // The address first: the operator is told it at start, and the
    // inventory can load the sale only once its id (with the uid) is known.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let _operator = Operator::start(&ns.name, "solo", &["--inventory-url-template", &url])?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    let name = "stock";
    let created = create_sale(&client, &ns.name, sale(name)).await?;
    let sale_id = sale_id_of(&created)?;
    assert!(
        sale_id.starts_with(&format!("{}.{name}.", ns.name)),
        "{sale_id}"
    );
    let token = await_inventory_token(&client, &ns.name, name).await?;
    // What the inventory pods run before any stock was read.
    let hash_before = poll_until("the inventory's config hash", WAIT, TICK, || {
        inventory_hash(&client, &ns.name, name)
    })
    .await?;
    let server = serve_inventory(listener, &sale_id, &token).await?;
    let http = reqwest::Client::new();
    let anonymous = http
        .get(format!("{url}/v1/sales/{sale_id}/items/PHONE/stock"))
        .send()
        .await?;
    assert_eq!(
        anonymous.status(),
        401,
        "the test inventory needs the token"
    );

    let loaded_at = assert_stock_read(&client, &ns.name, name).await?;
    // The first reading fences the load: from then on an inventory that
    // starts (after Redis lost the sale, say) creates no stock.
    let fence = u64::try_from(loaded_at.0.as_millisecond())?;
    await_fence_in_sale_json(&client, &ns.name, name, fence).await?;
    assert_eq!(
        inventory_hash(&client, &ns.name, name)
            .await
            .map_err(anyhow::Error::msg)?,
        hash_before,
        "the fence restarted the inventory"
    );

    // A reservation shows at the next refresh.
    let reserved = http
        .post(format!("{url}/v1/sales/{sale_id}/reservations"))
        .bearer_auth(&token)
        .json(&json!({"sku": "PHONE", "user": "u1", "quantity": 1, "requestId": "r1"}))
        .send()
        .await?;
    assert_eq!(reserved.status(), 201, "{:?}", reserved.text().await);
    poll_until("PHONE at 99 available, 1 reserved", WAIT, TICK, || async {
        let sale = get_sale(&client, &ns.name, name).await?;
        let items = sale.status.map(|s| s.items).unwrap_or_default();
        match items.iter().find(|i| i.sku == "PHONE") {
            Some(i) if i.available == 99 && i.reserved == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;

    assert_eq!(
        get_sale(&client, &ns.name, name)
            .await
            .map_err(anyhow::Error::msg)?
            .status
            .and_then(|s| s.stock_loaded_at),
        Some(loaded_at),
        "later readings keep the first instant"
    );
    server.abort();
    assert_inventory_loss_keeps_the_stock(&client, &ns.name, name).await?;
    flashsale_e2e::redis_keys::unlink_matching(
        &flashsale_e2e::stack::redis_url()?,
        // `fs:{<id>}:…` and the sharded `fs:{<id>#<sku>#<shard>}:…`.
        &format!("fs:{{{sale_id}*"),
    )
    .await?;
    Ok(())
}

/// Waits until sale `name` reads its inventory, and checks the stock its
/// status shows: every SKU's, untouched, and 600 left. Returns when the
/// stock was first read.
async fn assert_stock_read(client: &Client, ns: &str, name: &str) -> anyhow::Result<Time> {
    let read = await_condition(client, ns, name, "InventoryReachable", "True").await?;
    let status = read.status.clone().unwrap_or_default();
    let stock: Vec<(String, i64, i64)> = status
        .items
        .iter()
        .map(|i| (i.sku.clone(), i.available, i.reserved))
        .collect();
    assert_eq!(
        stock,
        [("PHONE".to_owned(), 100, 0), ("CASE".to_owned(), 500, 0)]
    );
    assert_eq!(status.stock_left, Some(600));
    status
        .stock_loaded_at
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no stockLoadedAt once stock was read"))
}

/// The token the operator made for sale `name`, which its probe must send,
/// once its internal Secret is there.
async fn await_inventory_token(client: &Client, ns: &str, name: &str) -> anyhow::Result<String> {
    Ok(
        poll_until("the sale's internal Secret", WAIT, TICK, || async {
            let secret = Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(&format!("{name}-internal"))
                .await
                .map_err(|e| e.to_string())?
                .ok_or("not there yet")?;
            let value = secret
                .data
                .and_then(|d| d.get("inventory-token").cloned())
                .ok_or("no inventory-token")?;
            String::from_utf8(value.0).map_err(|e| e.to_string())
        })
        .await?,
    )
}

/// The config hash on sale `name`'s inventory pods: what they run.
async fn inventory_hash(client: &Client, ns: &str, name: &str) -> Result<String, String> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(&format!("{name}-inventory"))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no inventory Deployment yet")?;
    deployment
        .spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get("flashsale.dev/config-hash").cloned())
        .ok_or_else(|| "no config hash".to_owned())
}

/// Waits until the fence reaches the inventory's mounted sale.json as
/// `opensAtMs` (without restarting running pods: the caller checks that).
async fn await_fence_in_sale_json(
    client: &Client,
    ns: &str,
    name: &str,
    fence: u64,
) -> anyhow::Result<()> {
    poll_until("sale.json to carry opensAtMs", WAIT, TICK, || async {
        let config = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get(&format!("{name}-inventory"))
            .await
            .map_err(|e| e.to_string())?;
        let text = config
            .data
            .and_then(|d| d.get("sale.json").cloned())
            .ok_or("no sale.json")?;
        let definition: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        match definition["opensAtMs"].as_u64() {
            Some(at) if at == fence => Ok(()),
            other => Err(format!("opensAtMs {other:?}, want {fence}")),
        }
    })
    .await?;
    Ok(())
}

/// Once the inventory has gone away: a condition, the last stock kept, no
/// error loop (still Ready).
async fn assert_inventory_loss_keeps_the_stock(
    client: &Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<()> {
    let cut = await_condition(client, ns, name, "InventoryReachable", "False").await?;
    let status = cut.status.unwrap_or_default();
    assert_eq!(status.stock_left, Some(599));
    assert!(
        status.observed.is_true("Ready"),
        "still Ready: the workloads run"
    );
    Ok(())
}

/// Every child of sale `sale`, counted over the kinds the operator makes.
async fn all_children(client: &Client, ns: &str, sale: &str) -> Result<usize, String> {
    Ok(count_children::<ServiceAccount>(client, ns, sale).await?
        + count_children::<Role>(client, ns, sale).await?
        + count_children::<RoleBinding>(client, ns, sale).await?
        + count_children::<ConfigMap>(client, ns, sale).await?
        + count_children::<Service>(client, ns, sale).await?
        + count_children::<PodDisruptionBudget>(client, ns, sale).await?
        + count_children::<NetworkPolicy>(client, ns, sale).await?
        + count_children::<Deployment>(client, ns, sale).await?
        + count_children::<HorizontalPodAutoscaler>(client, ns, sale).await?
        + count_children::<Secret>(client, ns, sale).await?)
}

#[tokio::test]
async fn each_child_is_written_once_and_a_ready_sale_costs_no_writes() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-writes").await?;
    // A refresh every second: a reconcile that rewrote what did not change
    // would show within a few.
    let operator = Operator::start(&ns.name, "solo", &["--status-refresh", "1s"])?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    create_sale(&client, &ns.name, sale("w1")).await?;
    await_condition(&client, &ns.name, "w1", "Ready", "True").await?;

    let children = all_children(&client, &ns.name, "w1")
        .await
        .map_err(anyhow::Error::msg)?;
    let writes = operator
        .metric_sum("flashsale_operator_writes_total")
        .await?;
    let reconciles = operator
        .metric_sum("flashsale_operator_reconcile_total")
        .await?;
    println!("{children} children, {writes} writes and {reconciles} reconciles to Ready");
    // Each child once (the internal Secret is created, the others applied),
    // and the status as the pods come up: first shown, then ready. The
    // stock reading (unreachable on kwok) may add one.
    assert!(
        writes <= children as f64 + 4.0,
        "{writes} writes for {children} children"
    );

    // Steady: refreshes read, and write nothing.
    poll_until("three more reconciles", WAIT, TICK, || async {
        let now = operator
            .metric_sum("flashsale_operator_reconcile_total")
            .await
            .map_err(|e| e.to_string())?;
        if now >= reconciles + 3.0 {
            Ok(())
        } else {
            Err(format!("{now} reconciles"))
        }
    })
    .await?;
    let after = operator
        .metric_sum("flashsale_operator_writes_total")
        .await?;
    assert_eq!(
        after, writes,
        "a ready sale with nothing changing is not written"
    );
    Ok(())
}

#[tokio::test]
async fn an_object_in_the_way_is_refused_not_taken_over() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-foreign").await?;
    let _operator = Operator::start(&ns.name, "solo", &[])?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    // Someone else's ConfigMap, with the name the sale's gateway config takes.
    let maps = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let foreign: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "f1-gateway"},
        "data": {"owner": "another team"}
    }))?;
    maps.create(&PostParams::default(), &foreign).await?;
    create_sale(&client, &ns.name, sale("f1")).await?;

    let stalled = await_condition(&client, &ns.name, "f1", "Stalled", "True").await?;
    let (_, reason, message) = condition(&stalled, "Stalled").unwrap_or_default();
    assert_eq!(reason, "ObjectNotOwned");
    assert!(
        message.contains("ConfigMap") && message.contains("f1-gateway"),
        "{message}"
    );
    let kept = maps.get("f1-gateway").await?;
    assert_eq!(kept.data, foreign.data, "its data is left alone");
    assert!(kept.metadata.owner_references.is_none(), "{kept:?}");
    assert_eq!(
        count_children::<Deployment>(&client, &ns.name, "f1")
            .await
            .map_err(anyhow::Error::msg)?,
        0,
        "nothing of the sale is applied while a name is taken"
    );

    // Once the name is free, the sale comes up.
    maps.delete("f1-gateway", &DeleteParams::default()).await?;
    await_condition(&client, &ns.name, "f1", "Ready", "True").await?;
    Ok(())
}
