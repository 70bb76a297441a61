//! The operator's API, group `flashsale.dev/v1alpha1`: the Rust types are the
//! single source of truth for the CRDs in `crds/`, with what every reader of
//! them needs to agree on: the children's names and labels, a sale's
//! timeline, a drill's calendar and the checks CEL cannot express. No
//! controller runtime: tools that only read or write these objects depend on
//! this crate alone.
//!
//! Validation happens at the apiserver wherever the schema or CEL can express
//! it (every rule's message names the field); what they cannot express (cron
//! syntax, time-zone names, PromQL) is checked by the operator and reported in
//! a status condition.

pub mod calendar;
pub mod chaosdrill;
pub mod children;
pub mod common;
pub mod conditions;
pub mod degradation;
pub mod duration;
pub mod flashsale;
pub mod reasons;
pub mod timeline;
pub mod validate;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use chaosdrill::{ChaosDrill, ChaosDrillSpec, ChaosDrillStatus};
pub use degradation::{DegradationPolicy, DegradationPolicySpec, DegradationPolicyStatus};
pub use duration::Duration;
pub use flashsale::{BotShield, FlashSale, FlashSaleSpec, FlashSaleStatus, PerSourceBudget};

/// The API group of every kind here.
pub const GROUP: &str = "flashsale.dev";

/// Every CRD the operator serves, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        FlashSale::crd(),
        DegradationPolicy::crd(),
        ChaosDrill::crd(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;

    fn parse<T: DeserializeOwned>(yaml: &str) -> T {
        match serde_yaml_ng::from_str(yaml) {
            Ok(value) => value,
            Err(err) => panic!("example does not parse: {err}"),
        }
    }

    fn round_trip<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(value: &T) {
        let json = serde_json::to_value(value).unwrap_or_default();
        let back: T =
            serde_json::from_value(json).unwrap_or_else(|err| panic!("round trip: {err}"));
        assert_eq!(&back, value);
    }

    use serde::Serialize;

    #[test]
    fn examples_parse_and_round_trip() {
        let sale: FlashSale = parse(include_str!(
            "../../../crds/examples/flashsale-singles-day.yaml"
        ));
        assert_eq!(sale.spec.items.len(), 3);
        assert_eq!(sale.spec.items[0].shards, 8);
        assert_eq!(sale.spec.items[2].shards, 1, "shards defaults to 1");
        assert_eq!(sale.spec.schedule.warm_up, Duration::from_secs(30 * 60));
        round_trip(&sale);

        let policy: DegradationPolicy = parse(include_str!(
            "../../../crds/examples/degradationpolicy-two-tier.yaml"
        ));
        assert_eq!(policy.spec.tiers.len(), 2);
        assert_eq!(
            policy.spec.tiers[1].switches.mini_games,
            Some(degradation::MiniGamesMode::Closed)
        );
        assert!(policy.spec.r#override.is_none());
        round_trip(&policy);

        let drill: ChaosDrill = parse(include_str!(
            "../../../crds/examples/chaosdrill-pod-kill.yaml"
        ));
        assert_eq!(drill.spec.schedule.time_zone, "Asia/Tokyo");
        assert_eq!(drill.spec.slo_guard.stale_after, Duration::from_secs(2));
        round_trip(&drill);
    }

    #[test]
    fn minimal_flashsale_gets_defaults() {
        let sale: FlashSale = parse(
            r#"
apiVersion: flashsale.dev/v1alpha1
kind: FlashSale
metadata: {name: tiny}
spec:
  schedule: {start: "2026-11-11T00:00:00Z", end: "2026-11-11T01:00:00Z"}
  region: local
  items: [{sku: A, stock: 1, priceMinor: 100}]
  gateway: {auth: {hs256SecretRef: {name: jwt, key: hs256}}}
  inventory: {redis: {url: "redis://127.0.0.1:6379"}}
  orderWriter:
    kafka: {brokers: ["127.0.0.1:9092"]}
    database: {driver: postgres, urlSecretRef: {name: db, key: url}}
"#,
        );
        let spec = &sale.spec;
        assert_eq!(spec.currency, "USD");
        assert_eq!(spec.reservation_ttl, Duration::from_secs(900));
        assert_eq!(spec.schedule.warm_up, Duration::from_secs(600));
        assert_eq!(spec.items[0].per_user_limit, 1);
        assert_eq!(spec.gateway.rate_limit.burst, 10);
        assert!(!spec.gateway.waiting_room.enabled);
        assert_eq!(spec.gateway.concurrency.min_limit, 20);
        assert_eq!(spec.order_writer.kafka.topic, "flashsale.orders");
        assert_eq!(spec.order_writer.kafka.dlq_topic, "flashsale.orders.dlq");
        assert_eq!(spec.order_writer.database.batch_size, 200);
        assert_eq!(
            spec.order_writer.database.flush_interval,
            Duration::from_millis(100)
        );
        assert!(sale.status.is_none());
        round_trip(&sale);
    }

    #[test]
    fn minimal_policy_gets_signal_defaults() {
        let policy: DegradationPolicy = parse(
            r#"
apiVersion: flashsale.dev/v1alpha1
kind: DegradationPolicy
metadata: {name: tiny}
spec:
  saleRef: {name: tiny}
  signal: {query: "vector(0)"}
  tiers: [{tier: 1, enterAbove: 0.8, exitBelow: 0.7, switches: {miniGames: closed}}]
"#,
        );
        let signal = &policy.spec.signal;
        assert_eq!(signal.interval, Duration::from_secs(5));
        assert_eq!(signal.timeout, Duration::from_secs(2));
        assert_eq!(signal.stale_after, Duration::from_secs(60));
        assert_eq!(policy.spec.hold_down, Duration::from_secs(120));
        round_trip(&policy);
    }

    #[test]
    fn policy_status_serialises_in_camel_case_without_empty_fields() {
        let time = |s: &str| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                s.parse().unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            )
        };
        let status = DegradationPolicyStatus {
            tier: Some(2),
            tier_reason: Some(degradation::TierReason::Override),
            tier_message: Some("forced by on-call".to_owned()),
            since: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                time("2026-11-11T00:00:00Z").0,
            )),
            active_override: Some(degradation::ActiveOverride {
                tier: 2,
                reason: "INC-4711".to_owned(),
                expires: time("2026-11-11T01:00:00Z"),
                set_by: "kubectl-patch".to_owned(),
            }),
            propagation: Some(degradation::Propagation {
                generation: 7,
                applied_replicas: 2,
                desired_replicas: 3,
                seconds: None,
                laggards: vec!["singles-day-gateway-abc: generation 6".to_owned()],
            }),
            ..Default::default()
        };
        let json = serde_json::to_value(&status).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({
                "tier": 2,
                "tierReason": "Override",
                "tierMessage": "forced by on-call",
                "since": "2026-11-11T00:00:00.000000Z",
                "activeOverride": {
                    "tier": 2, "reason": "INC-4711",
                    "expires": "2026-11-11T01:00:00Z", "setBy": "kubectl-patch"
                },
                "propagation": {
                    "generation": 7, "appliedReplicas": 2, "desiredReplicas": 3,
                    "laggards": ["singles-day-gateway-abc: generation 6"]
                }
            })
        );
        round_trip(&status);
    }

    #[test]
    fn status_serialises_in_camel_case_without_empty_fields() {
        let status = flashsale::FlashSaleStatus {
            phase: Some(flashsale::SalePhase::WarmingUp),
            stock_left: Some(42),
            ready_workloads: Some("2/3".to_owned()),
            ..Default::default()
        };
        let json = serde_json::to_value(&status).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"phase": "WarmingUp", "stockLeft": 42, "readyWorkloads": "2/3"})
        );
        round_trip(&status);
    }

    #[test]
    fn crds_carry_names_short_names_and_category() {
        let crds = crds();
        let names: Vec<_> = crds
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        assert_eq!(
            names,
            [
                "flashsales.flashsale.dev",
                "degradationpolicies.flashsale.dev",
                "chaosdrills.flashsale.dev"
            ]
        );
        for (crd, short) in crds.iter().zip(["fs", "dp", "drill"]) {
            assert_eq!(
                crd.spec.names.short_names.as_deref(),
                Some(&[short.to_owned()][..])
            );
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&["flashsale".to_owned()][..])
            );
            let version = &crd.spec.versions[0];
            assert!(
                version
                    .subresources
                    .as_ref()
                    .is_some_and(|s| s.status.is_some()),
                "status subresource"
            );
        }
    }
}
