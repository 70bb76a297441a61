//! FlashSale objects that tests and benchmarks create when the sale itself
//! is not what they look at.

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

/// A FlashSale named `name` that opens in an hour and warms up until then,
/// one replica per workload, naming Secrets `jwt` and `db` and placeholder
/// stores: on kwok nodes (or with no Secrets) nothing connects to them.
pub fn warming_up(name: &str) -> Value {
    let start = Timestamp::now() + SignedDuration::from_hours(1);
    let end = start + SignedDuration::from_hours(2);
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "FlashSale",
        "metadata": {"name": name},
        "spec": {
            "schedule": {"start": start.to_string(), "end": end.to_string(), "warmUp": "2h"},
            "region": "local",
            "items": [{"sku": "PHONE", "stock": 100, "perUserLimit": 1, "priceMinor": 100}],
            "gateway": {"replicas": 1, "auth": {"hs256SecretRef": {"name": "jwt", "key": "hs256"}}},
            "inventory": {"replicas": 1, "redis": {"url": "redis://redis:6379"}},
            "orderWriter": {
                "replicas": 1,
                "kafka": {"brokers": ["kafka:9092"]},
                "database": {"driver": "postgres", "urlSecretRef": {"name": "db", "key": "url"}}
            }
        }
    })
}

/// A FlashSale named `name` that opens at `start`, closes at `end` and warms
/// up for `warm_up` before: two gateways, one inventory and one order-writer,
/// two SKUs, a one-second reservation TTL, and the same Secrets and
/// placeholder stores as [`warming_up`].
pub fn scheduled(name: &str, start: Timestamp, end: Timestamp, warm_up: &str) -> Value {
    json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "FlashSale",
        "metadata": {"name": name},
        "spec": {
            "schedule": {"start": start.to_string(), "end": end.to_string(), "warmUp": warm_up},
            "region": "local",
            "reservationTTL": "1s",
            "items": [
                {"sku": "PHONE", "stock": 100, "perUserLimit": 1, "priceMinor": 100},
                {"sku": "CASE", "stock": 500, "perUserLimit": 3, "priceMinor": 10}
            ],
            "gateway": {
                "replicas": 2,
                "auth": {"hs256SecretRef": {"name": "jwt", "key": "hs256"}}
            },
            "inventory": {"replicas": 1, "redis": {"url": "redis://redis:6379"}},
            "orderWriter": {
                "replicas": 1,
                "kafka": {"brokers": ["kafka:9092"]},
                "database": {"driver": "postgres", "urlSecretRef": {"name": "db", "key": "url"}}
            }
        }
    })
}

/// The sale's `type_` condition as (status, reason, message), if set.
pub fn condition(sale: &flashsale_api::FlashSale, type_: &str) -> Option<(String, String, String)> {
    sale.status
        .as_ref()?
        .observed
        .get(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}
