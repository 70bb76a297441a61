//! Two operator replicas on the real local control plane: only the holder of
//! the Lease reconciles and writes, and when it dies the standby takes over
//! within the lease duration.

mod common;

use std::time::{Duration, Instant};

use common::{LEASE_DURATION, Operator, secret, setup};
use flashsale_api::FlashSale;
use flashsale_e2e::{kube::TestNamespace, wait::poll_until};
use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const TICK: Duration = Duration::from_millis(100);

async fn holder(client: &Client, ns: &str) -> Result<String, String> {
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt("flashsale-operator")
        .await
        .map_err(|e| e.to_string())?;
    Ok(lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default())
}

#[tokio::test]
async fn only_the_leader_writes_and_a_standby_takes_over_within_the_lease() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-ha").await?;
    secret(&client, &ns.name, "jwt", "hs256").await?;
    secret(&client, &ns.name, "db", "url").await?;
    let mut alpha = Operator::start(&ns.name, "alpha", &[])?;
    poll_until("alpha to hold the lease", WAIT, TICK, || async {
        match holder(&client, &ns.name).await? {
            h if h.starts_with("alpha-") => Ok(()),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await?;
    let bravo = Operator::start(&ns.name, "bravo", &[])?;
    bravo.until_serves().await?;

    let sale: FlashSale = serde_json::from_value(flashsale_e2e::sales::warming_up("ha"))?;
    let sales = Api::<FlashSale>::namespaced(client.clone(), &ns.name);
    sales.create(&PostParams::default(), &sale).await?;
    poll_until("the sale Ready", WAIT, TICK, || async {
        let sale = sales.get("ha").await.map_err(|e| e.to_string())?;
        let ready = sale
            .status
            .as_ref()
            .is_some_and(|s| s.observed.is_true("Ready"));
        if ready {
            Ok(())
        } else {
            Err(format!("{:?}", sale.status))
        }
    })
    .await?;
    assert_only_the_leader_wrote(&client, &ns.name, &alpha, &bravo).await?;

    // The leader dies without giving the lease back.
    alpha.kill();
    assert_takeover_within_the_lease(&client, &ns.name, &bravo).await?;

    // And it reconciles: a spec change is applied by the new leader.
    sales
        .patch(
            "ha",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"inventory": {"replicas": 2}}})),
        )
        .await?;
    poll_until("the new leader applies the change", WAIT, TICK, || async {
        let d = Api::<Deployment>::namespaced(client.clone(), &ns.name)
            .get("ha-inventory")
            .await
            .map_err(|e| e.to_string())?;
        match d.spec.replicas {
            Some(2) => Ok(()),
            other => Err(format!("replicas {other:?}")),
        }
    })
    .await?;
    assert!(bravo.metric_sum("flashsale_operator_writes_total").await? > 0.0);
    Ok(())
}

/// Only the leader `alpha` reconciled and wrote, the standby `bravo`
/// nothing, and one field manager applies the children.
async fn assert_only_the_leader_wrote(
    client: &Client,
    ns: &str,
    alpha: &Operator,
    bravo: &Operator,
) -> anyhow::Result<()> {
    let alpha_writes = alpha.metric_sum("flashsale_operator_writes_total").await?;
    assert!(alpha_writes > 0.0, "the leader wrote nothing");
    assert_eq!(alpha.metric_sum("flashsale_operator_leader").await?, 1.0);
    assert_eq!(bravo.metric_sum("flashsale_operator_leader").await?, 0.0);
    assert_eq!(
        bravo.metric_sum("flashsale_operator_writes_total").await?,
        0.0
    );
    assert_eq!(
        bravo
            .metric_sum("flashsale_operator_reconcile_total")
            .await?,
        0.0
    );
    let gateway = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("ha-gateway")
        .await?;
    let appliers: Vec<String> = gateway
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.operation.as_deref() == Some("Apply"))
        .filter_map(|f| f.manager)
        .collect();
    assert_eq!(appliers, ["flashsale-operator"]);
    Ok(())
}

/// The leader was just killed: `bravo` holds the lease and leads within
/// the lease duration (plus a little for the polls).
async fn assert_takeover_within_the_lease(
    client: &Client,
    ns: &str,
    bravo: &Operator,
) -> anyhow::Result<()> {
    let killed = Instant::now();
    poll_until("bravo to lead", WAIT, Duration::from_millis(50), || async {
        let holder = holder(client, ns).await?;
        let leads = bravo
            .metric_sum("flashsale_operator_leader")
            .await
            .map_err(|e| e.to_string())?;
        if holder.starts_with("bravo-") && leads == 1.0 {
            Ok(())
        } else {
            Err(format!("holder {holder:?}, bravo leader gauge {leads}"))
        }
    })
    .await?;
    let handover = killed.elapsed();
    println!("standby took over {handover:?} after the leader was killed");
    assert!(
        handover <= LEASE_DURATION + Duration::from_millis(1500),
        "took {handover:?} for a {LEASE_DURATION:?} lease"
    );
    Ok(())
}
