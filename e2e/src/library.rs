//! The drill library in `chaos/` as the suite and the tests run it: every
//! file (compiled in, so the suite runs from any folder), the endings its
//! comment promises, and the file made to run now against a sale and the
//! cluster's stores.

use std::collections::BTreeMap;

use anyhow::Context as _;
use flashsale_api::{
    ChaosDrill,
    chaosdrill::{RunOutcome, RunRecord},
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};

use crate::{
    real_node::{START, TICK, ended_run},
    stores::Urls,
    wait::poll_until,
};

/// Every drill of `chaos/`, by file name, in the order the suite runs
/// them: the gateway drills first, then the store and zone drills, the
/// delay last (without netem, Chaos Mesh keeps retrying the delay as long
/// as the pod lives and fails every other network fault on it).
pub const FILES: [(&str, &str); 9] = [
    (
        "gateway-guard-check.yaml",
        include_str!("../../chaos/gateway-guard-check.yaml"),
    ),
    (
        "gateway-pod-kill.yaml",
        include_str!("../../chaos/gateway-pod-kill.yaml"),
    ),
    (
        "gateway-container-kill.yaml",
        include_str!("../../chaos/gateway-container-kill.yaml"),
    ),
    (
        "gateway-clock-skew.yaml",
        include_str!("../../chaos/gateway-clock-skew.yaml"),
    ),
    (
        "friday-evening-blackout.yaml",
        include_str!("../../chaos/friday-evening-blackout.yaml"),
    ),
    (
        "order-writer-kafka-partition.yaml",
        include_str!("../../chaos/order-writer-kafka-partition.yaml"),
    ),
    (
        "order-writer-cpu-stress.yaml",
        include_str!("../../chaos/order-writer-cpu-stress.yaml"),
    ),
    (
        "zone-partition.yaml",
        include_str!("../../chaos/zone-partition.yaml"),
    ),
    (
        "inventory-redis-delay.yaml",
        include_str!("../../chaos/inventory-redis-delay.yaml"),
    ),
];

/// The text of the library's `file`.
pub fn text(file: &str) -> anyhow::Result<&'static str> {
    FILES
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, text)| *text)
        .with_context(|| format!("no {file} in the library"))
}

/// How a run of `file` ends, as its comment says, when it runs now under
/// orders on a Live sale of two gateways: (outcome, reason). The delay
/// drill has two: it holds its SLO, or, on a node whose kernel has no
/// netem, it is not injected, and says so.
pub fn endings(file: &str) -> &'static [(RunOutcome, &'static str)] {
    match file {
        "gateway-guard-check.yaml" | "zone-partition.yaml" => {
            &[(RunOutcome::Aborted, "SloBreached")]
        }
        "inventory-redis-delay.yaml" => &[
            (RunOutcome::Succeeded, "SloHeld"),
            (RunOutcome::Failed, "NotInjected"),
        ],
        _ => &[(RunOutcome::Succeeded, "SloHeld")],
    }
}

/// The one of [`endings`] of `file` on a node whose kernel has netem
/// (`netem`) or has not.
pub fn ending(file: &str, netem: bool) -> (RunOutcome, &'static str) {
    let endings = endings(file);
    endings
        .iter()
        .find(|(_, reason)| netem != (*reason == "NotInjected"))
        .or(endings.first())
        .copied()
        .unwrap_or((RunOutcome::Succeeded, "SloHeld"))
}

/// The library's `file` for `sale`, made to run now: its calendar lifted
/// (the run-now request `request`, no windows or blackouts, a Live sale
/// allowed), its experiment cut to `duration` and its steady state to 5 s,
/// and each store address it names (the example shop's) replaced by the
/// cluster's from `addresses`. Its fault, blast radius, objectives and
/// thresholds stay as written.
pub fn run_now(
    file: &str,
    sale: &str,
    request: &str,
    duration: &str,
    addresses: &BTreeMap<String, String>,
) -> anyhow::Result<Value> {
    let mut drill: Value = serde_yaml_ng::from_str(text(file)?)?;
    drill["metadata"]["annotations"] = json!({"flashsale.dev/run-now": request});
    let spec = &mut drill["spec"];
    spec["saleRef"]["name"] = sale.into();
    spec["windows"] = json!([]);
    spec["blackouts"] = json!([]);
    spec["avoidLiveSale"] = false.into();
    spec["experiments"][0]["duration"] = duration.into();
    spec["sloGuard"]["steadyState"] = "5s".into();
    let to = drill.pointer_mut("/spec/experiments/0/networkChaos/toAddresses");
    if let Some(list) = to.and_then(Value::as_array_mut) {
        for address in list {
            let named = address.as_str().unwrap_or_default();
            let here = addresses
                .get(named)
                .with_context(|| format!("{file} names {named}, not a store of the shop"))?;
            *address = here.clone().into();
        }
    }
    Ok(drill)
}

/// The cluster's store addresses for each the library's files name: Redis,
/// Kafka's bootstrap, and the broker's advertised address (Kafka clients
/// connect there after bootstrapping), read from the endpoints of the
/// bootstrap's Service when it is named `<service>.<namespace>.svc…`.
pub async fn addresses(
    client: &Client,
    in_cluster: &Urls,
) -> anyhow::Result<BTreeMap<String, String>> {
    let redis = in_cluster
        .redis
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let bootstrap = in_cluster
        .kafka_brokers
        .split(',')
        .next()
        .unwrap_or_default()
        .to_owned();
    let advertised = advertised(client, &bootstrap)
        .await?
        .unwrap_or_else(|| bootstrap.clone());
    Ok([
        ("redis.shop.svc.cluster.local:6379", redis),
        ("kafka.shop.svc.cluster.local:9092", bootstrap),
        (
            "kafka-0.kafka-headless.shop.svc.cluster.local:9092",
            advertised,
        ),
    ]
    .map(|(named, here)| (named.to_owned(), here))
    .into())
}

/// The first endpoint (`ip:port`) of the Service `bootstrap` names, when it
/// names one by its DNS name.
async fn advertised(client: &Client, bootstrap: &str) -> anyhow::Result<Option<String>> {
    let host = bootstrap.split(':').next().unwrap_or_default();
    let Some((service, namespace)) = crate::stores::service_of(host) else {
        return Ok(None);
    };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let listed = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .with_context(|| format!("listing the endpoints of {namespace}/{service}"))?;
    Ok(listed.items.iter().find_map(|slice| {
        let port = slice.ports.as_ref()?.first()?.port?;
        let ip = slice
            .endpoints
            .as_ref()?
            .first()?
            .addresses
            .first()?
            .clone();
        Some(format!("{ip}:{port}"))
    }))
}

/// Waits until every objective of `drill` holds for `sale` in `ns` at the
/// Prometheus of base URL `prometheus`: the state an SRE starts a drill
/// from. Windows still hold the drill before's errors for a while, and a
/// busy machine's first requests can fail; a drill started then is rightly
/// skipped (SteadyStateNotReached), which is not what it runs for.
pub async fn await_objectives_hold(
    drill: &Value,
    ns: &str,
    sale: &str,
    prometheus: &str,
) -> anyhow::Result<()> {
    let typed: ChaosDrill = serde_json::from_value(drill.clone())?;
    for objective in &typed.spec.slo_guard.objectives {
        let query = objective.query_in(ns, sale);
        let what = format!("{}: {} holds", typed.name_any(), objective.name);
        poll_until(&what, START, TICK, || async {
            match crate::prometheus::value_at(prometheus, &query).await? {
                Some(value) if objective.holds(value) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await?;
    }
    Ok(())
}

/// Creates `drill` in `ns`, waits for its run to end, then deletes it.
pub async fn run(
    client: &Client,
    ns: &str,
    drill: Value,
) -> anyhow::Result<(ChaosDrill, RunRecord)> {
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    let drill = drills
        .create(&PostParams::default(), &serde_json::from_value(drill)?)
        .await
        .context("creating the drill")?;
    let ended = ended_run(&drills, &drill.name_any()).await?;
    drills
        .delete(&drill.name_any(), &DeleteParams::default())
        .await?;
    Ok((drill, ended))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_folder_is_compiled_in_and_runs_now() -> anyhow::Result<()> {
        let mut folder: Vec<String> = std::fs::read_dir(crate::checkout::path("chaos")?)?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".yaml"))
            .collect();
        folder.sort();
        let mut compiled: Vec<String> = FILES.iter().map(|(f, _)| (*f).to_owned()).collect();
        compiled.sort();
        assert_eq!(compiled, folder);
        let stores = [
            ("redis.shop.svc.cluster.local:6379", "10.0.0.1:6379"),
            ("kafka.shop.svc.cluster.local:9092", "10.0.0.2:9092"),
            (
                "kafka-0.kafka-headless.shop.svc.cluster.local:9092",
                "10.0.0.3:9092",
            ),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .into();
        for (file, _) in FILES {
            let drill: ChaosDrill =
                serde_json::from_value(run_now(file, "play", "r1", "20s", &stores)?)?;
            assert!(
                drill.spec.windows.is_empty() && drill.spec.blackouts.is_empty(),
                "{file}"
            );
            assert!(!drill.spec.avoid_live_sale, "{file}");
            assert_eq!(drill.spec.sale_ref.name, "play");
            assert!(!endings(file).is_empty(), "{file}");
            assert!(endings(file).contains(&ending(file, false)), "{file}");
        }
        let partition = run_now(
            "order-writer-kafka-partition.yaml",
            "play",
            "r1",
            "20s",
            &stores,
        )?;
        assert_eq!(
            partition.pointer("/spec/experiments/0/networkChaos/toAddresses"),
            Some(&json!(["10.0.0.2:9092", "10.0.0.3:9092"]))
        );
        assert_eq!(
            ending("inventory-redis-delay.yaml", false),
            (RunOutcome::Failed, "NotInjected")
        );
        assert_eq!(
            ending("inventory-redis-delay.yaml", true),
            (RunOutcome::Succeeded, "SloHeld")
        );
        assert_eq!(
            ending("zone-partition.yaml", false),
            (RunOutcome::Aborted, "SloBreached")
        );
        Ok(())
    }
}
