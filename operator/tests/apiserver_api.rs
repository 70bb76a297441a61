//! The CRDs against the real local kube-apiserver: they install, the examples
//! apply, invalid objects are rejected with the field named, protected fields
//! stay put on a Live sale, and kubectl shows the columns.

use std::process::Command;

mod common;

use common::setup;
use flashsale_api::{ChaosDrill, DegradationPolicy, FlashSale, duration::DURATION_MESSAGE};
use flashsale_e2e::kube::TestNamespace;
use kube::{
    Api, Client, Resource,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::ApiResource,
};
use serde_json::{Value, json};

fn dynamic_api<K: Resource<DynamicType = ()>>(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<K>(&()))
}

fn api_for(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    match kind {
        "FlashSale" => dynamic_api::<FlashSale>(client, ns),
        "DegradationPolicy" => dynamic_api::<DegradationPolicy>(client, ns),
        _ => dynamic_api::<ChaosDrill>(client, ns),
    }
}

fn example(file: &str) -> anyhow::Result<Value> {
    let path = flashsale_e2e::checkout::path("crds/examples")?.join(file);
    Ok(serde_yaml_ng::from_str(&std::fs::read_to_string(path)?)?)
}

/// Sets `value` at a JSON pointer, creating objects on the way; `Value::Null`
/// removes the field.
fn with(mut object: Value, pointer: &str, value: Value) -> Value {
    let mut parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    let last = parts.pop().unwrap_or_default();
    let mut target = &mut object;
    for part in parts {
        target = match target {
            Value::Array(items) => {
                match part.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(item) => item,
                    None => return object_with_error(pointer),
                }
            }
            Value::Object(map) => map.entry(part).or_insert_with(|| json!({})),
            _ => return object_with_error(pointer),
        };
    }
    match target {
        Value::Object(map) if value.is_null() => {
            map.remove(last);
        }
        Value::Object(map) => {
            map.insert(last.to_owned(), value);
        }
        Value::Array(items) => match last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
            Some(item) => *item = value,
            None => return object_with_error(pointer),
        },
        _ => return object_with_error(pointer),
    }
    object
}

/// A value the apiserver can never accept, so a wrong pointer fails the test loudly.
fn object_with_error(pointer: &str) -> Value {
    json!({"bad pointer in test": pointer})
}

/// Creates like `kubectl create` does.
async fn create(api: &Api<DynamicObject>, object: Value) -> Result<DynamicObject, kube::Error> {
    let object: DynamicObject = serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &object).await
}

/// Applies like `kubectl apply --server-side` does, with strict field
/// validation, so a misspelt field fails instead of being pruned.
async fn apply_strict(
    api: &Api<DynamicObject>,
    object: Value,
) -> Result<DynamicObject, kube::Error> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let params = PatchParams::apply("flashsale-operator-tests").validation_strict();
    api.patch(&name, &params, &Patch::Apply(&object)).await
}

#[tokio::test]
async fn every_example_applies() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "api-examples").await?;
    for (file, kind) in [
        ("flashsale-singles-day.yaml", "FlashSale"),
        ("degradationpolicy-two-tier.yaml", "DegradationPolicy"),
        ("chaosdrill-pod-kill.yaml", "ChaosDrill"),
        ("chaosdrill-failover.yaml", "ChaosDrill"),
    ] {
        let object = with(example(file)?, "/metadata/namespace", json!(ns.name));
        let created = apply_strict(&api_for(&client, &ns.name, kind), object)
            .await
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        assert_eq!(created.types.as_ref().map(|t| t.kind.as_str()), Some(kind));
    }
    // The apiserver filled in the schema defaults.
    let sale = Api::<FlashSale>::namespaced(client.clone(), &ns.name)
        .get("singles-day")
        .await?;
    assert_eq!(sale.spec.items[2].shards, 1);
    assert_eq!(sale.spec.order_writer.kafka.topic, "flashsale.orders");
    Ok(())
}

fn valid_sale(name: &str) -> Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "FlashSale",
        "metadata": {"name": name},
        "spec": {
            "schedule": {"start": "2026-11-11T00:00:00Z", "end": "2026-11-11T02:00:00Z", "warmUp": "10m"},
            "region": "local",
            "items": [
                {"sku": "PHONE", "stock": 100, "perUserLimit": 1, "priceMinor": 100},
                {"sku": "CASE", "stock": 500, "perUserLimit": 3, "priceMinor": 10}
            ],
            "reservationTTL": "15m",
            "gateway": {
                "auth": {"hs256SecretRef": {"name": "jwt", "key": "hs256"}},
                "autoscaling": {"minReplicas": 2, "maxReplicas": 4},
                "concurrency": {"minLimit": 10, "maxLimit": 100},
                "waitingRoom": {"enabled": true, "ticketSecretRef": {"name": "wr", "key": "k"}}
            },
            "inventory": {"redis": {"url": "redis://redis:6379"}},
            "orderWriter": {
                "kafka": {"brokers": ["kafka:9092"]},
                "database": {"driver": "postgres", "urlSecretRef": {"name": "db", "key": "url"}}
            }
        }
    })
}

fn valid_policy(name: &str) -> Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "DegradationPolicy",
        "metadata": {"name": name},
        "spec": {
            "saleRef": {"name": "sale"},
            "signal": {"query": "vector(0.5)", "interval": "5s"},
            "tiers": [
                {"tier": 1, "enterAbove": 0.8, "exitBelow": 0.7, "switches": {"recommendations": "static"}},
                {"tier": 2, "enterAbove": 0.95, "exitBelow": 0.85, "switches": {"miniGames": "closed"}}
            ],
            "override": {"tier": 2, "reason": "incident", "expires": "2026-11-11T01:00:00Z"}
        }
    })
}

fn valid_drill(name: &str) -> Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "ChaosDrill",
        "metadata": {"name": name},
        "spec": {
            "saleRef": {"name": "sale"},
            "schedule": {"cron": "30 14 * * 2,4", "timeZone": "Asia/Tokyo"},
            "windows": [{"days": ["Tue", "Thu"], "start": "14:00", "end": "16:00"}],
            "experiments": [{"name": "kill", "target": "gateway", "duration": "2m", "podChaos": {"action": "pod-kill"}}],
            "blastRadius": {"maxPercent": 2, "maxPods": 1},
            "sloGuard": {
                "objectives": [{"name": "errors", "query": "vector(0)", "threshold": 0.0001}],
                "interval": "250ms",
                "staleAfter": "2s"
            }
        }
    })
}

#[tokio::test]
async fn invalid_objects_are_rejected_naming_the_field() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "api-invalid").await?;
    let sale = || valid_sale("bad");
    let policy = || valid_policy("bad");
    let drill = || valid_drill("bad");
    let cases = [
        invalid_schedules_and_items(),
        invalid_gateways_and_names(),
        invalid_bot_shields(),
        invalid_stores(),
        invalid_policies(),
        invalid_drills(),
        invalid_durability(),
    ]
    .concat();
    assert!(cases.len() >= 15);
    let cases = cases
        .into_iter()
        .map(|(case, object, field)| (case, object, vec![field]));
    let failures = rejections(&client, &ns.name, cases).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The valid bases really are valid, so each case failed for its own reason.
    let active = with(failover_drill(), "/spec/failover/mode", json!("Active"));
    for object in [sale(), policy(), drill(), failover_drill(), active] {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        apply_strict(&api_for(&client, &ns.name, &kind), object)
            .await
            .map_err(|e| anyhow::anyhow!("{kind}: {e}"))?;
    }
    Ok(())
}

/// An invalid object: (case, object, text the error must contain: the
/// field path).
type Invalid = (&'static str, Value, &'static str);

/// Cases of a sale's schedule, items and reservation TTL.
fn invalid_schedules_and_items() -> Vec<Invalid> {
    let sale = || valid_sale("bad");
    vec![
        (
            "end before start",
            with(sale(), "/spec/schedule/end", json!("2026-11-10T00:00:00Z")),
            "spec.schedule",
        ),
        (
            "negative stock",
            with(sale(), "/spec/items/0/stock", json!(-1)),
            "spec.items[0].stock",
        ),
        (
            "per-user limit 0",
            with(sale(), "/spec/items/1/perUserLimit", json!(0)),
            "spec.items[1].perUserLimit",
        ),
        (
            "no items",
            with(sale(), "/spec/items", json!([])),
            "spec.items",
        ),
        (
            "duplicate SKU",
            with(sale(), "/spec/items/1/sku", json!("PHONE")),
            "spec.items[1]",
        ),
        (
            "SKU with spaces",
            with(sale(), "/spec/items/0/sku", json!("big phone")),
            "spec.items[0].sku",
        ),
        (
            "zero shards",
            with(sale(), "/spec/items/0/shards", json!(0)),
            "spec.items[0].shards",
        ),
        (
            "zero reservation TTL",
            with(sale(), "/spec/reservationTTL", json!("0s")),
            "spec.reservationTTL",
        ),
        (
            "TTL in words",
            with(sale(), "/spec/reservationTTL", json!("15 minutes")),
            "spec.reservationTTL",
        ),
    ]
}

/// Cases of a sale's bot shield.
fn invalid_bot_shields() -> Vec<Invalid> {
    let sale = || valid_sale("bad");
    vec![
        (
            "a bot shield without a key",
            with(
                sale(),
                "/spec/gateway/waitingRoom",
                json!({"enabled": false, "botShield": {"difficultyBits": [16]}}),
            ),
            "waitingRoom.ticketSecretRef is required by botShield",
        ),
        (
            "a bot shield asking 33 bits",
            with(
                sale(),
                "/spec/gateway/waitingRoom/botShield",
                json!({"difficultyBits": [16, 33]}),
            ),
            "botShield.difficultyBits entries must be 0-32",
        ),
        (
            "a bot shield without difficulties",
            with(
                sale(),
                "/spec/gateway/waitingRoom/botShield",
                json!({"difficultyBits": []}),
            ),
            "spec.gateway.waitingRoom.botShield.difficultyBits",
        ),
        (
            "a trusted proxy that is a host name",
            with(
                sale(),
                "/spec/gateway/waitingRoom/botShield",
                json!({"difficultyBits": [16],
                       "perSource": {"joinsPerSecond": 1, "burst": 5, "trustedProxies": ["edge.example.com"]}}),
            ),
            "perSource.trustedProxies entries must be IP addresses or CIDRs",
        ),
    ]
}

/// Cases of a sale's gateway, and a sale name too long for its children.
fn invalid_gateways_and_names() -> Vec<Invalid> {
    let sale = || valid_sale("bad");
    vec![
        (
            "waiting room without ticket secret",
            with(
                sale(),
                "/spec/gateway/waitingRoom/ticketSecretRef",
                Value::Null,
            ),
            "spec.gateway.waitingRoom",
        ),
        (
            "two token keys",
            with(
                sale(),
                "/spec/gateway/auth/rs256PublicKeySecretRef",
                json!({"name": "jwt-pub", "key": "pem"}),
            ),
            "spec.gateway.auth",
        ),
        (
            "no token key",
            with(sale(), "/spec/gateway/auth", json!({})),
            "spec.gateway.auth",
        ),
        (
            "a sale id the workloads cannot key by",
            with(sale(), "/spec/saleID", json!("shop/weekend deal")),
            "spec.saleID",
        ),
        (
            "a region no header can carry",
            with(sale(), "/spec/region", json!("east 1")),
            "spec.region",
        ),
        (
            "name too long for its children",
            with(sale(), "/metadata/name", json!("a".repeat(51))),
            "metadata.name",
        ),
        (
            "rate limit of 0/s",
            with(
                sale(),
                "/spec/gateway/rateLimit",
                json!({"perUserPerSecond": 0, "burst": 5}),
            ),
            "spec.gateway.rateLimit.perUserPerSecond",
        ),
        (
            "concurrency max < min",
            with(sale(), "/spec/gateway/concurrency/maxLimit", json!(5)),
            "spec.gateway.concurrency",
        ),
        (
            "autoscaling max < min",
            with(sale(), "/spec/gateway/autoscaling/maxReplicas", json!(1)),
            "spec.gateway.autoscaling",
        ),
    ]
}

/// Cases of a sale's inventory store and order-writer.
fn invalid_stores() -> Vec<Invalid> {
    let sale = || valid_sale("bad");
    vec![
        (
            "redis url and secret",
            with(
                sale(),
                "/spec/inventory/redis/urlSecretRef",
                json!({"name": "r", "key": "url"}),
            ),
            "spec.inventory.redis",
        ),
        (
            "unknown database",
            with(sale(), "/spec/orderWriter/database/driver", json!("oracle")),
            "spec.orderWriter.database.driver",
        ),
        (
            "batch size 0",
            with(sale(), "/spec/orderWriter/database/batchSize", json!(0)),
            "spec.orderWriter.database.batchSize",
        ),
        (
            "DLQ is the main topic",
            with(
                sale(),
                "/spec/orderWriter/kafka/dlqTopic",
                json!("flashsale.orders"),
            ),
            "spec.orderWriter.kafka",
        ),
    ]
}

/// Cases of a DegradationPolicy: tiers, override and signal.
fn invalid_policies() -> Vec<Invalid> {
    let policy = || valid_policy("bad");
    vec![
        (
            "exit above enter",
            with(policy(), "/spec/tiers/0/exitBelow", json!(0.9)),
            "spec.tiers[0]",
        ),
        (
            "tier 2 below tier 1",
            with(policy(), "/spec/tiers/1/enterAbove", json!(0.5)),
            "spec.tiers",
        ),
        (
            "override without expiry",
            with(policy(), "/spec/override/expires", Value::Null),
            "spec.override.expires",
        ),
        (
            "unknown switch mode",
            with(
                policy(),
                "/spec/tiers/0/switches/recommendations",
                json!("off"),
            ),
            "spec.tiers[0].switches.recommendations",
        ),
        (
            "EnterTier without tier",
            with(
                policy(),
                "/spec/onSignalLoss",
                json!({"action": "EnterTier"}),
            ),
            "spec.onSignalLoss",
        ),
        (
            "zero signal interval",
            with(policy(), "/spec/signal/interval", json!("0s")),
            "spec.signal.interval",
        ),
    ]
}

/// Cases of a ChaosDrill: blast radius, windows, experiments, SLO guard
/// and name.
fn invalid_drills() -> Vec<Invalid> {
    let drill = || valid_drill("bad");
    vec![
        (
            "blast radius 0%",
            with(drill(), "/spec/blastRadius/maxPercent", json!(0)),
            "spec.blastRadius.maxPercent",
        ),
        (
            "blast radius 150%",
            with(drill(), "/spec/blastRadius/maxPercent", json!(150)),
            "spec.blastRadius.maxPercent",
        ),
        (
            "window ends before it starts",
            with(drill(), "/spec/windows/0/end", json!("13:00")),
            "spec.windows[0]",
        ),
        (
            "window at 25:00",
            with(drill(), "/spec/windows/0/start", json!("25:00")),
            "spec.windows[0].start",
        ),
        (
            "unknown weekday",
            with(drill(), "/spec/windows/0/days/0", json!("Funday")),
            "spec.windows[0].days[0]",
        ),
        (
            "dead-man shorter than interval",
            with(drill(), "/spec/sloGuard/staleAfter", json!("100ms")),
            "spec.sloGuard",
        ),
        (
            "guard blind for 31s before it aborts",
            with(drill(), "/spec/sloGuard/staleAfter", json!("31s")),
            "spec.sloGuard.staleAfter",
        ),
        (
            "guard looking every 11s",
            with(
                with(drill(), "/spec/sloGuard/interval", json!("11s")),
                "/spec/sloGuard/staleAfter",
                json!("30s"),
            ),
            "spec.sloGuard.interval",
        ),
        (
            "drill name of 64 characters",
            with(drill(), "/metadata/name", json!("d".repeat(64))),
            "at most 63 characters",
        ),
    ]
    .into_iter()
    .chain(invalid_experiments())
    .chain(invalid_failover())
    .chain(invalid_failover_orders())
    .collect()
}

/// A drill with a valid failover check of every kind.
fn failover_drill() -> Value {
    with(
        valid_drill("bad"),
        "/spec/failover",
        json!({
            "mode": "ReadinessOnly",
            "maxRTO": "30s",
            "standby": {"namespace": "region-b", "name": "sale"},
            "capacity": {"perGatewayRPS": 500, "load": "vector(1)"},
            "replication": [
                {"name": "inventory", "redisURLSecretRef": {"name": "a", "key": "url"},
                 "promoteRedisURLSecretRef": {"name": "b", "key": "url"}, "maxLag": "1s"},
                {"name": "orders", "query": "vector(0)", "maxLag": "5s"}
            ],
            "endpoint": {
                "haproxyStatsURL": "http://edge:8404/;csv",
                "server": "sale/region-b",
                "url": "https://shop.example.com"
            },
            "orders": {
                "primaryDatabaseURLSecretRef": {"name": "a-db", "key": "url"},
                "standbyDatabaseURLSecretRef": {"name": "b-db", "key": "url"}
            }
        }),
    )
}

/// A failover's order lookup the apiserver refuses.
fn invalid_failover_orders() -> Vec<Invalid> {
    let drill = failover_drill;
    vec![
        (
            "orders that may never drain",
            with(drill(), "/spec/failover/orders/drainWithin", json!("0s")),
            "failover.orders.drainWithin must be positive and at most 10m",
        ),
        (
            "a negative RPO",
            with(drill(), "/spec/failover/maxRPO", json!(-1)),
            "spec.failover.maxRPO",
        ),
        (
            "an RPO as a duration",
            with(drill(), "/spec/failover/maxRPO", json!("0s")),
            "spec.failover.maxRPO",
        ),
        (
            "a standby gateway that is no HTTP URL",
            with(
                drill(),
                "/spec/failover/standby/gatewayURL",
                json!("region-b-gateway:8080"),
            ),
            "spec.failover.standby.gatewayURL",
        ),
    ]
}

/// Drills whose failover check is invalid.
fn invalid_failover() -> Vec<Invalid> {
    let drill = failover_drill;
    vec![
        (
            "failover without a standby",
            with(drill(), "/spec/failover/standby", Value::Null),
            "spec.failover.standby",
        ),
        (
            "a gateway carrying nothing",
            with(drill(), "/spec/failover/capacity/perGatewayRPS", json!(0)),
            "perGatewayRPS must be positive",
        ),
        (
            "headroom under 1",
            with(drill(), "/spec/failover/capacity/headroom", json!(0.8)),
            "headroom must be at least 1",
        ),
        (
            "a lag read two ways",
            with(
                drill(),
                "/spec/failover/replication/1/redisURLSecretRef",
                json!({"name": "a", "key": "url"}),
            ),
            "exactly one of query and redisURLSecretRef",
        ),
        (
            "a lag read no way",
            with(drill(), "/spec/failover/replication/1/query", Value::Null),
            "exactly one of query and redisURLSecretRef",
        ),
        (
            "a promotion of a replica of no Redis",
            with(
                drill(),
                "/spec/failover/replication/1/promoteRedisURLSecretRef",
                json!({"name": "b", "key": "url"}),
            ),
            "promoteRedisURLSecretRef names the replica of the Redis in redisURLSecretRef",
        ),
        (
            "two replications of one name",
            with(
                drill(),
                "/spec/failover/replication/1/name",
                json!("inventory"),
            ),
            "spec.failover.replication[1]",
        ),
        (
            "readiness checked every 0s",
            with(drill(), "/spec/failover/checkEvery", json!("0s")),
            "checkEvery must be between 1s and 10m",
        ),
        (
            "readiness checked every 11m",
            with(drill(), "/spec/failover/checkEvery", json!("11m")),
            "checkEvery must be between 1s and 10m",
        ),
        (
            "a grace that switches the lag check off",
            with(drill(), "/spec/failover/lagGrace", json!("9999h")),
            "lagGrace must be at most 10m",
        ),
        (
            "a lag bound of 0s",
            with(drill(), "/spec/failover/replication/0/maxLag", json!("0s")),
            "maxLag must be positive and at most 1h",
        ),
    ]
    .into_iter()
    .chain(invalid_endpoint())
    .collect()
}

/// Drills whose failover endpoint is invalid.
fn invalid_endpoint() -> Vec<Invalid> {
    let drill = failover_drill;
    vec![
        (
            "HAProxy statistics without the server",
            with(drill(), "/spec/failover/endpoint/server", Value::Null),
            "server is required with haproxyStatsURL",
        ),
        (
            "an active failover with no endpoint url to measure it through",
            with(
                with(drill(), "/spec/failover/mode", json!("Active")),
                "/spec/failover/endpoint/url",
                Value::Null,
            ),
            "failover.endpoint.url is required in mode Active",
        ),
        (
            "endpoint url without a scheme",
            with(
                drill(),
                "/spec/failover/endpoint/url",
                json!("shop.example.com"),
            ),
            "spec.failover.endpoint.url",
        ),
    ]
}

/// Drills whose one experiment is invalid.
fn invalid_experiments() -> Vec<Invalid> {
    let drill = || valid_drill("bad");
    vec![
        (
            "two fault kinds in one experiment",
            with(
                drill(),
                "/spec/experiments/0/stressChaos",
                json!({"cpuWorkers": 1}),
            ),
            "spec.experiments[0]",
        ),
        (
            "a container named for a pod-kill",
            with(
                drill(),
                "/spec/experiments/0/podChaos/container",
                json!("gateway"),
            ),
            "spec.experiments[0].podChaos",
        ),
        (
            "a clock offset in words",
            with(
                with(drill(), "/spec/experiments/0/podChaos", json!(null)),
                "/spec/experiments/0/timeChaos",
                json!({"offset": "30 seconds"}),
            ),
            "spec.experiments[0].timeChaos.offset",
        ),
        (
            "a store's address as a URL",
            with(
                with(drill(), "/spec/experiments/0/podChaos", json!(null)),
                "/spec/experiments/0/networkChaos",
                json!({"action": "partition", "toAddresses": ["redis://redis.shop.svc:6379"]}),
            ),
            "spec.experiments[0].networkChaos.toAddresses[0]",
        ),
        (
            "experiment of 2h",
            with(drill(), "/spec/experiments/0/duration", json!("2h")),
            "spec.experiments[0].duration",
        ),
    ]
}

/// Cases of a sale's inventory durability.
fn invalid_durability() -> Vec<Invalid> {
    let sale = || valid_sale("bad");
    vec![
        (
            "durability timeout of 2s",
            with(
                sale(),
                "/spec/inventory/durability",
                json!({"timeout": "2s"}),
            ),
            "spec.inventory.durability.timeout",
        ),
        (
            "unknown durability mode",
            with(
                sale(),
                "/spec/inventory/durability",
                json!({"mode": "Eventually"}),
            ),
            "spec.inventory.durability.mode",
        ),
    ]
}

/// Words of CEL failing at run time (a rule applied to a value it cannot
/// handle); a rejection must say what is wrong instead.
const CEL_ERRORS: [&str; 3] = ["type conversion", "no such overload", "evaluating rule"];

/// Creates each case's object (all named `bad`) and returns what went wrong:
/// a case must be refused with 422, its message holding every fragment and
/// no CEL run-time error.
async fn rejections<C: std::fmt::Display>(
    client: &Client,
    ns: &str,
    cases: impl IntoIterator<Item = (C, Value, Vec<&str>)>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (case, object, fragments) in cases {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        match create(&api_for(client, ns, &kind), object).await {
            Err(kube::Error::Api(status)) => {
                let missing: Vec<&str> = fragments
                    .iter()
                    .copied()
                    .filter(|f| !status.message.contains(f))
                    .collect();
                let cel: Vec<&str> = CEL_ERRORS
                    .into_iter()
                    .filter(|e| status.message.contains(e))
                    .collect();
                if status.code != 422 || !missing.is_empty() || !cel.is_empty() {
                    failures.push(format!(
                        "{case}: rejected ({}) without {missing:?} or with CEL errors {cel:?}: {}",
                        status.code, status.message
                    ));
                }
            }
            Err(other) => failures.push(format!("{case}: unexpected error {other}")),
            Ok(_) => {
                failures.push(format!("{case}: accepted"));
                // Free the name for the next case.
                let _ = api_for(client, ns, &kind)
                    .delete("bad", &Default::default())
                    .await;
            }
        }
    }
    failures
}

#[tokio::test]
async fn policies_only_name_tiers_they_define() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "api-tiers").await?;
    let policy = || valid_policy("bad");
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "tiers 1 and 3",
            with(
                with(policy(), "/spec/tiers/1/tier", json!(3)),
                "/spec/override/tier",
                json!(1),
            ),
            vec!["spec.tiers", "tiers must be numbered 1, 2, … without gaps"],
        ),
        (
            "tiers 2 and 3",
            with(
                with(policy(), "/spec/tiers/0/tier", json!(3)),
                "/spec/override",
                Value::Null,
            ),
            vec!["spec.tiers", "without gaps"],
        ),
        (
            "tier that switches nothing",
            with(policy(), "/spec/tiers/1/switches", json!({})),
            vec![
                "spec.tiers[1].switches",
                "switches must switch at least one feature",
            ],
        ),
        (
            "override of tier 3 with tiers 1 and 2",
            with(policy(), "/spec/override/tier", json!(3)),
            vec![
                "spec.override.tier",
                "override.tier must be 0 or a tier defined in spec.tiers",
            ],
        ),
        (
            "signal loss enters an undefined tier",
            with(
                policy(),
                "/spec/onSignalLoss",
                json!({"action": "EnterTier", "tier": 3}),
            ),
            vec![
                "spec.onSignalLoss.tier",
                "onSignalLoss.tier must be 0 (lift everything) or a tier defined in spec.tiers",
            ],
        ),
        (
            "staleAfter below interval",
            with(policy(), "/spec/signal/staleAfter", json!("2s")),
            vec![
                "spec.signal.staleAfter",
                "signal.staleAfter must be at least signal.interval",
            ],
        ),
        (
            "zero query timeout",
            with(policy(), "/spec/signal/timeout", json!("0s")),
            vec!["spec.signal.timeout", "signal.timeout must be positive"],
        ),
    ];
    let failures = rejections(&client, &ns.name, cases).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Tier 0 lifts everything: allowed for the override and on signal loss.
    let api = api_for(&client, &ns.name, "DegradationPolicy");
    let lift = with(
        with(valid_policy("lift"), "/spec/override/tier", json!(0)),
        "/spec/onSignalLoss",
        json!({"action": "EnterTier", "tier": 0}),
    );
    create(&api, lift).await?;
    // Tiers may be listed in any order.
    let mut tiers = valid_policy("any")["spec"]["tiers"].clone();
    if let Value::Array(list) = &mut tiers {
        list.reverse();
    }
    create(&api, with(valid_policy("reversed"), "/spec/tiers", tiers)).await?;
    Ok(())
}

#[tokio::test]
async fn malformed_durations_say_what_a_duration_looks_like() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "api-durations").await?;
    let cases = malformed_durations()
        .into_iter()
        .map(|(object, pointer, field, bad)| {
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            (
                format!("{kind} {field}: {bad:?}"),
                with(object, pointer, json!(bad)),
                vec![field, DURATION_MESSAGE],
            )
        });
    let failures = rejections(&client, &ns.name, cases).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_every_spelling_accepted(&client, &ns.name).await?;
    assert_signal_defaults(&client, &ns.name).await
}

/// (object, JSON pointer, field path, malformed value): fields with and
/// without rules of their own, and fields compared with another duration.
fn malformed_durations() -> Vec<(Value, &'static str, &'static str, &'static str)> {
    vec![
        (
            valid_sale("bad"),
            "/spec/reservationTTL",
            "spec.reservationTTL",
            "15 minutes",
        ),
        (
            valid_sale("bad"),
            "/spec/schedule/warmUp",
            "spec.schedule.warmUp",
            "10 minutes",
        ),
        (
            valid_sale("bad"),
            "/spec/orderWriter/database/flushInterval",
            "spec.orderWriter.database.flushInterval",
            "0.1s",
        ),
        (
            valid_policy("bad"),
            "/spec/holdDown",
            "spec.holdDown",
            "15 minutes",
        ),
        (
            valid_policy("bad"),
            "/spec/signal/interval",
            "spec.signal.interval",
            "5 seconds",
        ),
        (
            valid_policy("bad"),
            "/spec/signal/staleAfter",
            "spec.signal.staleAfter",
            "1 minute",
        ),
        (
            valid_policy("bad"),
            "/spec/signal/timeout",
            "spec.signal.timeout",
            "2",
        ),
        (
            with(
                valid_policy("bad"),
                "/spec/onSignalLoss",
                json!({"action": "Hold"}),
            ),
            "/spec/onSignalLoss/after",
            "spec.onSignalLoss.after",
            "30S",
        ),
        // Well-formed for Go, but past what a duration can hold: CEL's
        // duration() would fail on it.
        (
            valid_policy("bad"),
            "/spec/signal/interval",
            "spec.signal.interval",
            "999999999h",
        ),
        (
            valid_drill("bad"),
            "/spec/sloGuard/interval",
            "spec.sloGuard.interval",
            "5 seconds",
        ),
        (
            valid_drill("bad"),
            "/spec/sloGuard/staleAfter",
            "spec.sloGuard.staleAfter",
            "2 s",
        ),
        (
            valid_drill("bad"),
            "/spec/experiments/0/duration",
            "spec.experiments[0].duration",
            "2 minutes",
        ),
    ]
}

/// Well-formed durations in every spelling are accepted, and read back as
/// the duration they spell.
async fn assert_every_spelling_accepted(client: &Client, ns: &str) -> anyhow::Result<()> {
    let policy = with(
        with(
            with(valid_policy("durations"), "/spec/holdDown", json!("1h30m")),
            "/spec/signal",
            json!({"query": "vector(0.5)", "interval": "1m30s", "timeout": "1500ms", "staleAfter": "90s"}),
        ),
        "/spec/onSignalLoss",
        json!({"action": "Hold", "after": "99999ms"}),
    );
    let created = apply_strict(&api_for(client, ns, "DegradationPolicy"), policy).await?;
    assert_eq!(created.data["spec"]["signal"]["staleAfter"], json!("90s"));
    let policy = Api::<DegradationPolicy>::namespaced(client.clone(), ns)
        .get("durations")
        .await?;
    assert_eq!(
        policy.spec.signal.stale_after,
        flashsale_api::Duration::from_secs(90)
    );
    Ok(())
}

/// Defaults of the signal's timeout and staleAfter.
async fn assert_signal_defaults(client: &Client, ns: &str) -> anyhow::Result<()> {
    create(
        &api_for(client, ns, "DegradationPolicy"),
        with(
            valid_policy("defaults"),
            "/spec/signal",
            json!({"query": "vector(0.5)"}),
        ),
    )
    .await?;
    let policy = Api::<DegradationPolicy>::namespaced(client.clone(), ns)
        .get("defaults")
        .await?;
    assert_eq!(
        (
            policy.spec.signal.timeout.to_string(),
            policy.spec.signal.stale_after.to_string()
        ),
        ("2s".to_owned(), "1m".to_owned())
    );
    Ok(())
}

async fn set_phase(api: &Api<DynamicObject>, name: &str, phase: &str) -> anyhow::Result<()> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn start_time_and_skus_are_protected_once_live() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "api-live").await?;
    let api = api_for(&client, &ns.name, "FlashSale");
    create(&api, valid_sale("sale")).await?;
    let params = PatchParams::default();
    let new_start = json!({"spec": {"schedule": {"start": "2026-11-10T23:00:00Z"}}});

    // Before the sale is Live, the start may move.
    api.patch("sale", &params, &Patch::Merge(&new_start))
        .await?;

    set_phase(&api, "sale", "Live").await?;
    let moved = api
        .patch(
            "sale",
            &params,
            &Patch::Merge(json!({"spec": {"schedule": {"start": "2026-11-10T22:00:00Z"}}})),
        )
        .await;
    assert!(
        matches!(&moved, Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("spec.schedule.start")),
        "start moved on a Live sale: {moved:?}"
    );

    let mut items = valid_sale("sale")["spec"]["items"].clone();
    items[1]["sku"] = json!("CASE-2");
    let renamed = api
        .patch(
            "sale",
            &params,
            &Patch::Merge(json!({"spec": {"items": items}})),
        )
        .await;
    assert!(
        matches!(&renamed, Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("spec.items[*].sku")),
        "SKU renamed on a Live sale: {renamed:?}"
    );

    // Stock is not protected: adjusting it is a normal operation.
    let mut items = valid_sale("sale")["spec"]["items"].clone();
    items[0]["stock"] = json!(150);
    api.patch(
        "sale",
        &params,
        &Patch::Merge(json!({"spec": {"items": items}})),
    )
    .await?;
    let sale = Api::<FlashSale>::namespaced(client.clone(), &ns.name)
        .get("sale")
        .await?;
    assert_eq!(sale.spec.items[0].stock, 150);
    assert_eq!(
        sale.spec.schedule.start.0.to_string(),
        "2026-11-10T23:00:00Z"
    );
    Ok(())
}

#[tokio::test]
async fn the_sale_id_is_fixed_at_creation() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "api-id").await?;
    let api = api_for(&client, &ns.name, "FlashSale");
    create(
        &api,
        with(valid_sale("named"), "/spec/saleID", json!("shop:one")),
    )
    .await?;
    create(&api, valid_sale("derived")).await?;
    let params = PatchParams::default();
    let changes = [
        ("named", json!({"spec": {"saleID": "shop:two"}})),
        ("named", json!({"spec": {"saleID": null}})),
        ("derived", json!({"spec": {"saleID": "shop:three"}})),
    ];
    for (name, patch) in changes {
        let changed = api.patch(name, &params, &Patch::Merge(&patch)).await;
        assert!(
            matches!(&changed, Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("spec.saleID cannot be set, changed or removed")),
            "{name} took {patch}: {changed:?}"
        );
    }
    // Anything else may change as before.
    api.patch(
        "named",
        &params,
        &Patch::Merge(json!({"spec": {"schedule": {"start": "2026-11-10T23:00:00Z"}}})),
    )
    .await?;
    let sale = Api::<FlashSale>::namespaced(client.clone(), &ns.name)
        .get("named")
        .await?;
    assert_eq!(sale.spec.sale_id.as_deref(), Some("shop:one"));
    Ok(())
}

fn kubectl(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("kubectl").args(args).output()?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "kubectl {args:?} failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

#[tokio::test]
async fn kubectl_shows_columns_categories_and_waits_for_ready() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "api-kubectl").await?;
    let sales = api_for(&client, &ns.name, "FlashSale");
    create(&sales, valid_sale("sale")).await?;
    create(
        &api_for(&client, &ns.name, "DegradationPolicy"),
        valid_policy("policy"),
    )
    .await?;
    create(
        &api_for(&client, &ns.name, "ChaosDrill"),
        valid_drill("drill"),
    )
    .await?;
    sales
        .patch_status(
            "sale",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Live", "stockLeft": 573, "readyWorkloads": "3/3"}}),
            ),
        )
        .await?;
    assert_columns(&ns.name)?;
    assert_policy_wide_columns(&client, &ns.name).await?;
    assert_category(&ns.name)?;

    let ready = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "AllWorkloadsReady", "message": "3/3 workloads ready",
        "lastTransitionTime": "2026-11-11T00:00:00Z", "observedGeneration": 1
    }]}});
    sales
        .patch_status("sale", &PatchParams::default(), &Patch::Merge(ready))
        .await?;
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "fs/sale",
        "-n",
        &ns.name,
        "--timeout=20s",
    ])?;
    Ok(())
}

/// `kubectl get` of the three kinds shows every printer column, and the
/// Live sale's row its phase, stock left and ready workloads.
fn assert_columns(ns: &str) -> anyhow::Result<()> {
    let table = kubectl(&["get", "fs,dp,drill", "-n", ns])?;
    for header in [
        "PHASE",
        "START",
        "END",
        "STOCK LEFT",
        "READY",
        "TIER",
        "SOURCE",
        "SIGNAL",
        "OVERRIDE",
        "NEXT RUN",
        "LAST OUTCOME",
        "ABORT LATENCY",
    ] {
        assert!(table.contains(header), "no {header} column in:\n{table}");
    }
    let sale_row = table
        .lines()
        .find(|l| l.starts_with("flashsale.flashsale.dev/sale"))
        .unwrap_or_default();
    for cell in ["Live", "573", "3/3"] {
        assert!(sale_row.contains(cell), "no {cell} in {sale_row:?}");
    }
    Ok(())
}

/// With a status set, `kubectl get dp -o wide` shows the policy's wide
/// columns: where its tier comes from, what is applied, and why.
async fn assert_policy_wide_columns(client: &Client, ns: &str) -> anyhow::Result<()> {
    api_for(client, ns, "DegradationPolicy")
        .patch_status(
            "policy",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "tier": 1, "tierReason": "Signal", "tierMessage": "signal 0.85 is above tier 1's enterAbove 0.8",
                "since": "2026-11-11T00:00:00Z", "lastValue": 0.85, "lastSampleTime": "2026-11-11T00:00:00Z",
                "propagation": {"generation": 3, "appliedReplicas": 2, "desiredReplicas": 3,
                                "laggards": ["sale-gateway-x: applies generation 2"]},
                "activeOverride": {"tier": 2, "reason": "incident", "expires": "2026-11-11T01:00:00Z",
                                   "setBy": "kubectl-patch"}
            }})),
        )
        .await?;
    let wide = kubectl(&["get", "dp", "-n", ns, "-o", "wide"])?;
    for header in ["SOURCE", "APPLIED", "REASON"] {
        assert!(wide.contains(header), "no {header} column in:\n{wide}");
    }
    let policy_row = wide
        .lines()
        .find(|l| l.starts_with("policy"))
        .unwrap_or_default();
    for cell in [
        "Signal",
        "0.85",
        "signal 0.85 is above tier 1's enterAbove 0.8",
    ] {
        assert!(policy_row.contains(cell), "no {cell} in {policy_row:?}");
    }
    Ok(())
}

/// `kubectl get flashsale` lists the objects of all three kinds.
fn assert_category(ns: &str) -> anyhow::Result<()> {
    let category = kubectl(&["get", "flashsale", "-n", ns, "-o", "name"])?;
    for name in [
        "flashsale.flashsale.dev/sale",
        "degradationpolicy.flashsale.dev/policy",
        "chaosdrill.flashsale.dev/drill",
    ] {
        assert!(
            category.contains(name),
            "category flashsale misses {name}:\n{category}"
        );
    }
    Ok(())
}
