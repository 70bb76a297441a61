//! Least trust in Redis: the gateway and the inventory each run as a Redis
//! ACL user that reaches only its own keys (the rules of
//! `inventory redis-acl`), tested against the real Redis's ACLs.

mod common;

use std::time::Duration;

use common::{Funnel, Options, acl_user, order, wait_for_pass};
use inventory::keys::{SaleKeys, Workload};
use serde_json::json;

async fn get(url: &str, key: &str) -> redis::RedisResult<Option<String>> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("GET").arg(key).query_async(&mut conn).await
}

#[tokio::test]
async fn each_workload_reaches_only_its_own_keys() -> anyhow::Result<()> {
    // The whole funnel works on its own users: rate limit, waiting room,
    // reservation, publication.
    let funnel = Funnel::start(Options {
        acl: true,
        config: json!({"waitingRoom": {"enabled": true, "admitPerSecond": 50}}),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let (_, queued, _) = order(gw, "ida", "A", "join", None).await?;
    let ticket = queued["ticket"].as_str().unwrap_or_default();
    let pass = wait_for_pass(gw, ticket, Duration::from_secs(5)).await?;
    let (status, body, _) = order(gw, "ida", "A", "k1", Some(&pass)).await?;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_rate_limit_decisions_total{source="local"}"#),
        Some(0.0)
    );

    let keys = SaleKeys::new(&funnel.sale);
    let gateway = acl_user(&funnel.sale, Workload::Gateway).await?;
    let inventory = acl_user(&funnel.sale, Workload::Inventory).await?;
    let stock = keys.sku("A");
    let room = format!("fs:{{{}}}:wr:seq", funnel.sale);
    let refused =
        |r: redis::RedisResult<Option<String>>| r.err().is_some_and(|e| e.code() == Some("NOPERM"));
    assert!(
        refused(get(&gateway, &stock).await),
        "the gateway cannot read stock"
    );
    assert!(
        refused(get(&inventory, &room).await),
        "the inventory cannot read the waiting room"
    );
    assert!(
        get(&gateway, &room).await?.is_some(),
        "the gateway reads its own keys"
    );
    // Nor another sale's keys.
    let other = SaleKeys::new(&format!("{}x", funnel.sale)).sku("A");
    assert!(refused(get(&inventory, &other).await));
    funnel.cleanup().await
}
