//! The inventory of a standby region, whose Redis is a read-only replica
//! of the primary region's, as the binary runs: it starts with its sale
//! file and stands by (ready, refusing sales with `standby`, saying so in
//! `inventory_standby`), sells once the replica is promoted, from the
//! primary's replicated counts rather than a fresh load, and stands by
//! again once its Redis follows the primary again.

mod common;

use std::time::{Duration, Instant};

use flashsale_e2e::{
    private_redis::PrivateRedis,
    region,
    stack::unique_name,
    wait::{Timeout, poll_until},
};
use inventory::store::{ItemDefinition, ReserveOutcome, SaleDefinition, Store};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// How long a change of the replica's role may take to show: many of the
/// binary's checks (every 100 ms here).
const SEEN: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_millis(20);

/// The port of a private Redis.
fn port(redis: &PrivateRedis) -> &str {
    redis.url.rsplit(':').next().unwrap_or_default()
}

/// Sends `REPLICAOF args` to the Redis at `url`.
async fn replicaof(url: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _: String = redis::cmd("REPLICAOF")
        .arg(args)
        .query_async(&mut conn)
        .await?;
    Ok(())
}

/// The inventory binary, checking every 100 ms whether its Redis takes writes.
type Inventory = common::InventoryProcess;

fn start(redis_url: &str, def: &SaleDefinition) -> anyhow::Result<Inventory> {
    common::InventoryProcess::start(redis_url, def, &["--standby-check-ms", "100"])
}

impl common::InventoryProcess {
    /// Reserves one unit of `HOT` as `user`: the status and the body.
    async fn reserve(&self, sale: &str, user: &str) -> Result<(StatusCode, Value), String> {
        let response = self
            .http
            .post(format!("{}/v1/sales/{sale}/reservations", self.api))
            .json(&json!({"sku": "HOT", "quantity": 1, "user": user, "requestId": user}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.json().await.map_err(|e| e.to_string())?;
        Ok((status, body))
    }

    /// The value of the gauge `inventory_standby`.
    async fn standby_gauge(&self) -> Result<String, String> {
        let text = self
            .http
            .get(format!("{}/metrics", self.ops))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        text.lines()
            .find_map(|l| l.strip_prefix("inventory_standby "))
            .map(str::to_owned)
            .ok_or_else(|| "no inventory_standby".to_owned())
    }

    /// Polls until a reservation as `user` is answered `status`; its body.
    async fn until_answered(
        &self,
        what: &str,
        (sale, user): (&str, &str),
        status: StatusCode,
    ) -> Result<Value, Timeout> {
        poll_until(what, SEEN, TICK, || async {
            match self.reserve(sale, user).await? {
                (s, body) if s == status => Ok(body),
                (s, body) => Err(format!("{s} {body}")),
            }
        })
        .await
    }

    /// The stock of `HOT` as the inventory reads it.
    async fn stock(&self, sale: &str) -> anyhow::Result<Value> {
        let url = format!("{}/v1/sales/{sale}/items/HOT/stock", self.api);
        Ok(self.http.get(url).send().await?.json().await?)
    }
}

/// Region A's Redis and region B's, its replica, once it follows; A
/// holds a sale of 5 units of `HOT`, of which it sold two.
async fn region_a_sold_two() -> anyhow::Result<(PrivateRedis, PrivateRedis, SaleDefinition)> {
    // Syncing a replica at once, not after the default 5 s.
    let primary = PrivateRedis::start(&["--repl-diskless-sync-delay", "0"]).await?;
    // Loading each sync from the socket: a replica would otherwise save
    // it as dump.rdb in the test's directory.
    let replica = PrivateRedis::start(&[
        "--replicaof",
        "127.0.0.1",
        port(&primary),
        "--repl-diskless-load",
        "swapdb",
    ])
    .await?;
    let sale = unique_name("standby");
    let def = SaleDefinition {
        sale: sale.clone(),
        reservation_ttl_ms: 600_000,
        items: vec![ItemDefinition {
            sku: "HOT".into(),
            stock: 5,
            per_user_limit: 1,
            shards: 1,
        }],
        opens_at_ms: None,
    };
    // Region A loads the sale and sells two units.
    let a = Store::connect(&primary.url).await?;
    a.load(&def).await?;
    for user in ["a1", "a2"] {
        let outcome = common::reserve(&a, &sale, user, 1, user).await?;
        anyhow::ensure!(
            matches!(outcome, ReserveOutcome::Reserved(_)),
            "{outcome:?}"
        );
    }
    region::until_caught_up(&primary.url, &replica.url, SEEN).await?;
    Ok((primary, replica, def))
}

#[tokio::test]
async fn a_standby_inventory_sells_once_its_replica_is_promoted_and_stands_by_when_demoted()
-> anyhow::Result<()> {
    let (primary, replica, def) = region_a_sold_two().await?;
    let sale = def.sale.clone();
    let b = start(&replica.url, &def)?;
    let body = b
        .until_answered(
            "the standby to refuse sales",
            (&sale, "b1"),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}; its log:\n{}", b.log()))?;
    assert_eq!(body["error"], "standby", "{body}");
    let ready = b.http.get(format!("{}/readyz", b.ops)).send().await?;
    assert_eq!(ready.status(), StatusCode::OK, "a standby is ready");
    assert_eq!(b.standby_gauge().await.map_err(anyhow::Error::msg)?, "1");

    replicaof(&replica.url, &["NO", "ONE"]).await?;
    let promoted = Instant::now();
    b.until_answered(
        "the promoted standby to sell",
        (&sale, "b1"),
        StatusCode::CREATED,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}; its log:\n{}", b.log()))?;
    println!(
        "promotion to the first unit sold: {} ms",
        promoted.elapsed().as_millis()
    );
    assert_eq!(b.standby_gauge().await.map_err(anyhow::Error::msg)?, "0");
    // It sells what A left, not a fresh stock: A's two units and its own
    // one are reserved.
    let level = b.stock(&sale).await?;
    assert_eq!(
        (&level["available"], &level["reserved"]),
        (&json!(2), &json!(3)),
        "{level}"
    );

    // Region A takes buyers back: B's Redis follows A again.
    replicaof(&replica.url, &["127.0.0.1", port(&primary)]).await?;
    let body = b
        .until_answered(
            "the demoted inventory to stand by again",
            (&sale, "b2"),
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .await?;
    assert_eq!(body["error"], "standby", "{body}");
    // The refused write answers at once; the next check stands it by.
    poll_until("inventory_standby to be 1", SEEN, TICK, || async {
        match b.standby_gauge().await? {
            one if one == "1" => Ok(()),
            other => Err(other),
        }
    })
    .await?;
    Ok(())
}
