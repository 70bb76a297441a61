//! Objects the apiserver accepts but the operator's types reject (here a
//! `date-time` that the apiserver's pattern lets through: `…T10:00:00_5Z`):
//! one of them must not stop the watch of every other object of its kind.
//! The good object is reconciled, the bad one is named in a Warning Event
//! `InvalidObject` and counted, and reconciled once an edit fixes it.

mod common;

use std::time::Duration;

use common::{Operator, secret, setup};
use flashsale_api::{DegradationPolicy, FlashSale};
use flashsale_e2e::{kube::TestNamespace, wait::poll_until};
use k8s_openapi::api::events::v1::Event;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const TICK: Duration = Duration::from_millis(200);

/// Accepted by the apiserver's `date-time` check (its pattern has an
/// unescaped `.` before the fraction), refused by every RFC 3339 parser.
const LOOSE_TIME: &str = "2030-01-01T10:00:00_5Z";

/// A policy of a sale that does not exist: reconciling it writes a status
/// (`SaleNotFound`) without needing Prometheus or gateways.
fn policy(name: &str, expires: &str) -> Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "DegradationPolicy",
        "metadata": {"name": name},
        "spec": {
            "saleRef": {"name": format!("{name}-sale")},
            "signal": {"query": "vector(0.1)", "interval": "1s"},
            "tiers": [{"tier": 1, "enterAbove": 0.8, "exitBelow": 0.7,
                       "switches": {"recommendations": "static"}}],
            "override": {"tier": 1, "reason": "invalid-object test", "expires": expires}
        }
    })
}

/// Creates `object` as it is, without going through the Rust type (which
/// would refuse the loose time).
async fn create_raw<K>(client: &Client, ns: &str, object: &Value) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    let resource = kube::api::ApiResource::erase::<K>(&());
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object.clone())?,
    )
    .await?;
    Ok(())
}

/// The notes of the Warning Events `InvalidObject` on `name`.
async fn invalid_object_events(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Vec<String>, String> {
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("InvalidObject")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| e.note.unwrap_or_default())
        .collect())
}

async fn until_event(client: &Client, ns: &str, name: &str) -> anyhow::Result<Vec<String>> {
    Ok(poll_until(
        &format!("a Warning Event InvalidObject on {name}"),
        WAIT,
        TICK,
        || async {
            match invalid_object_events(client, ns, name).await? {
                notes if notes.is_empty() => Err("none yet".to_owned()),
                notes => Ok(notes),
            }
        },
    )
    .await?)
}

/// Waits until `name`'s status was written for its current generation.
async fn until_policy_reconciled(client: &Client, ns: &str, name: &str) -> anyhow::Result<String> {
    let policies = Api::<DegradationPolicy>::namespaced(client.clone(), ns);
    Ok(
        poll_until(&format!("policy {name} reconciled"), WAIT, TICK, || async {
            let policy = policies.get(name).await.map_err(|e| e.to_string())?;
            let status = policy.status.as_ref().ok_or("no status")?;
            let ready = status.observed.get("Ready").ok_or("no Ready condition")?;
            if status.observed.observed_generation == policy.metadata.generation {
                Ok(ready.reason.clone())
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await?,
    )
}

#[tokio::test]
async fn an_unreadable_policy_is_named_and_left_out_while_the_others_are_reconciled()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-invalid-dp").await?;
    // Both exist before the operator starts: its first list meets the bad one.
    create_raw::<DegradationPolicy>(&client, &ns.name, &policy("bad", LOOSE_TIME)).await?;
    create_raw::<DegradationPolicy>(&client, &ns.name, &policy("good", "2030-01-01T10:00:00Z"))
        .await?;
    let operator = Operator::start(&ns.name, "invalid", &[])?;

    let reason = until_policy_reconciled(&client, &ns.name, "good").await?;
    assert_eq!(reason, "SaleNotFound");
    let notes = until_event(&client, &ns.name, "bad").await?;
    assert!(
        notes.iter().any(|n| n.contains(&format!("{}/bad", ns.name))
            && n.contains("spec.override.expires")),
        "{notes:?}"
    );
    assert!(
        invalid_object_events(&client, &ns.name, "good")
            .await
            .map_err(anyhow::Error::msg)?
            .is_empty()
    );
    assert!(
        operator
            .metric_sum("flashsale_operator_invalid_objects_total")
            .await?
            >= 1.0
    );
    let log = std::fs::read_to_string(&operator.log)?;
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains(&format!("{}/bad", ns.name))
            && l.contains("spec.override.expires")),
        "no warning naming the object in the log:\n{log}"
    );
    // Left out: the bad one was never written to.
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &kube::api::ApiResource::erase::<DegradationPolicy>(&()),
    );
    let bad = raw.get("bad").await?;
    assert!(bad.data.get("status").is_none(), "{bad:?}");
    assert!(bad.metadata.finalizers.unwrap_or_default().is_empty());

    // An edit that fixes it brings it in.
    raw.patch(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"override": {"expires": "2030-01-01T10:00:00Z"}}})),
    )
    .await?;
    let reason = until_policy_reconciled(&client, &ns.name, "bad").await?;
    assert_eq!(reason, "SaleNotFound");

    // Deleted while the operator runs, so their finalizers go with them.
    let policies = Api::<DegradationPolicy>::namespaced(client.clone(), &ns.name);
    for name in ["good", "bad"] {
        policies.delete(name, &DeleteParams::default()).await?;
    }
    poll_until("the policies gone", WAIT, TICK, || async {
        let left = policies
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.items.len()))
        }
    })
    .await?;
    Ok(())
}

/// The same for FlashSales. The bad sale carries a `status.stockLoadedAt`
/// an earlier writer left in the loose form: the status subresource takes
/// it, the Rust type does not.
#[tokio::test]
async fn an_unreadable_sale_is_named_and_left_out_while_the_others_are_reconciled()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-invalid-sale").await?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    let sales = Api::<FlashSale>::namespaced(client.clone(), &ns.name);
    for name in ["bad", "good"] {
        let sale: FlashSale = serde_json::from_value(flashsale_e2e::sales::warming_up(name))?;
        sales.create(&PostParams::default(), &sale).await?;
    }
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &kube::api::ApiResource::erase::<FlashSale>(&()),
    );
    raw.patch_status(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"stockLoadedAt": LOOSE_TIME}})),
    )
    .await?;
    let operator = Operator::start(&ns.name, "invalid", &[])?;

    poll_until("sale good Ready", WAIT, TICK, || async {
        let sale = sales.get("good").await.map_err(|e| e.to_string())?;
        match &sale.status {
            Some(status) if status.observed.is_true("Ready") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    let notes = until_event(&client, &ns.name, "bad").await?;
    assert!(
        notes.iter().any(|n| n.contains("status.stockLoadedAt")),
        "{notes:?}"
    );
    assert!(
        operator
            .metric_sum("flashsale_operator_invalid_objects_total")
            .await?
            >= 1.0
    );
    Ok(())
}
