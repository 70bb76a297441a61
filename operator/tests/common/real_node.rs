//! A sale on the local stack's real node, from the test kit, and the
//! operator the tests run it with.

pub use flashsale_e2e::real_node::*;

use super::{Operator, setup};
use flashsale_api::{ChaosDrill, DegradationPolicy};
use flashsale_e2e::{inside, kube::TestNamespace, wait::poll_until};
use jiff::SignedDuration;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// The operator for the test's namespace, with the real node's flags.
pub fn operator(ns: &str) -> anyhow::Result<Operator> {
    let flags = operator_flags()?;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Operator::start(ns, "real-node", &flags)
}

/// Where every fault test starts: a sale on the real node opening in an
/// hour, ready, with its operator, and its gateways scraped by Prometheus.
pub struct Scene {
    pub client: Client,
    pub ns: TestNamespace,
    pub operator: Operator,
    pub sale: Sale,
    pub gateways: Vec<Pod>,
}

impl Scene {
    pub async fn start(prefix: &str) -> anyhow::Result<Self> {
        Self::start_in(prefix, &SaleStores::stack()?).await
    }

    /// [`Scene::start`] with the sale in `stores`.
    pub async fn start_in(prefix: &str, stores: &SaleStores) -> anyhow::Result<Self> {
        let client = setup().await?;
        let ns = TestNamespace::create(&client, prefix).await?;
        let operator = operator(&ns.name)?;
        let sale = create_sale_in(&client, &ns.name, SignedDuration::from_hours(1), stores).await?;
        await_ready(&client, &ns.name, &sale.name).await?;
        let gateways = ready_pods(&client, &ns.name, &sale.name, "gateway").await?;
        await_scraped_and_up(&ns.name, &gateways).await?;
        Ok(Self {
            client,
            ns,
            operator,
            sale,
            gateways,
        })
    }
}

/// Waits until the drill `name`'s running experiment is seen inside its
/// target (one of `gateways`) by `seen`; the target's index and process.
pub async fn await_injected(
    drills: &Api<ChaosDrill>,
    name: &str,
    gateways: &[Pod],
    seen: impl Fn(u32) -> anyhow::Result<bool>,
) -> anyhow::Result<(usize, u32)> {
    let seen = &seen;
    // A run that ends before its fault is seen ends the wait with its record.
    let found = poll_until(
        "the fault seen inside its target",
        START,
        TICK,
        || async move {
            let drill = drills.get(name).await.map_err(|e| e.to_string())?;
            let status = drill.status.unwrap_or_default();
            let Some(run) = status.current_run else {
                return match status.history.first() {
                    Some(ended) => Ok(Err(format!("the run ended first: {ended:?}"))),
                    None => Err("no run yet".to_owned()),
                };
            };
            let target = run
                .targets
                .first()
                .and_then(|t| t.rsplit('/').next())
                .ok_or("no target")?;
            let index = gateways
                .iter()
                .position(|g| g.name_any() == target)
                .ok_or("unknown target")?;
            let pid = inside::pid_of(&gateways[index]).map_err(|e| e.to_string())?;
            match seen(pid) {
                Ok(true) => Ok(Ok((index, pid))),
                Ok(false) => Err(format!("not yet inside {target}")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    found.map_err(|ended| anyhow::anyhow!(ended))
}

/// The shipped example policy, pointed at the test's sale and namespace.
pub fn example_policy(ns: &str, sale: &str) -> anyhow::Result<DegradationPolicy> {
    let path = flashsale_e2e::checkout::path("crds/examples/degradationpolicy-two-tier.yaml")?;
    let text = std::fs::read_to_string(path)?
        .replace("namespace=\"default\"", &format!("namespace=\"{ns}\""))
        .replace("singles-day-gateway-", &format!("{sale}-gateway-"));
    let mut policy: DegradationPolicy = serde_yaml_ng::from_str(&text)?;
    policy.metadata.namespace = None;
    policy.spec.sale_ref.name = sale.to_owned();
    policy.spec.signal.interval = "1s".parse()?;
    Ok(policy)
}

/// A drill of the sale, asked to run now, whose SLO is both gateways up.
/// Killing one (half the fleet, the cap) breaks it for real: the killed
/// process stops answering its scrape.
pub fn gateway_drill(ns: &str, sale: &str) -> anyhow::Result<ChaosDrill> {
    gateway_drill_of(ns, sale, "kill", "pod-kill")
}

/// As [`gateway_drill`], but the gateway's process is stopped
/// (pod-failure) rather than its pod killed: it stays down until the guard
/// aborts, so the breach is seen every time, where a killed pod may be
/// replaced between two scrapes.
pub fn gateway_failure_drill(ns: &str, sale: &str) -> anyhow::Result<ChaosDrill> {
    gateway_drill_of(ns, sale, "fail", "pod-failure")
}

/// A run-now drill `real` whose experiment `name`, pod fault `action`, hits
/// one gateway under the SLO "both gateways up".
fn gateway_drill_of(ns: &str, sale: &str, name: &str, action: &str) -> anyhow::Result<ChaosDrill> {
    run_now_drill(
        "real",
        sale,
        json!({"name": name, "target": "gateway", "duration": "2m",
               "podChaos": {"action": action}}),
        json!({"name": "gateways-up", "query": gateways_up(ns, sale),
               "threshold": 2, "breachWhen": "Below"}),
    )
}
