//! The gateway's funnel as tests, benchmarks and the play build it: a sale
//! with SKUs `A` (1999) and `B` (500), its topic, the gateway's
//! configuration, and the secrets and tokens both services are started
//! with; then what a client of the funnel does (tokens, orders, queue
//! passes, the stock, the published events) and the cleanup.
//!
//! Starting the gateway and the inventory in process needs their crates,
//! which test with this one: that part is `flashsale-bench`'s funnel, from a
//! [`Plan`], used by the gateway's tests, the benchmarks and the play.

use std::time::Duration;

use flashsale_orders::{OrderEvent, ProducerSettings};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};

use crate::{kafka, redis_keys, stack, wait::poll_until};

/// The bearer-token secret of the funnel's gateway.
pub const JWT_SECRET: &[u8] = b"test-secret-test-secret-test-secret!";
/// The waiting-room key of the funnel's gateway.
pub const ROOM_KEY: &[u8] = b"room-key-room-key-room-key-room-key!";
/// The token the funnel's inventory requires of the gateway.
pub const INVENTORY_TOKEN: &str = "inventory-token-of-the-tests";
/// The funnel's inventory's admin token (stock adjustments).
pub const INVENTORY_ADMIN_TOKEN: &str = "inventory-admin-token-of-the-tests";
/// The secret the funnel's payment provider signs callbacks with.
pub const PAYMENT_SECRET: &[u8] = b"payment-secret-of-the-tests-0123456789";
/// The drill key of the funnel's sale: tokens signed with it are drill
/// buyers' ([`drill_order`]).
pub const DRILL_KEY: &[u8] = b"drill-key-of-the-tests-0123456789abcdef";
/// The sale's SKUs and their prices (minor units).
pub const ITEMS: [(&str, u64); 2] = [("A", 1999), ("B", 500)];

/// An order topic on brokers of the caller's choice (one partition).
#[derive(Debug, Clone)]
pub struct TopicSpec {
    /// Bootstrap servers.
    pub brokers: String,
    /// Replicas of the partition.
    pub replication: i32,
    /// The topic's `min.insync.replicas`.
    pub min_insync_replicas: u32,
}

/// What a funnel is made of before its services start.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sale's name (unique).
    pub sale: String,
    /// Its order topic, created.
    pub topic: String,
    /// The brokers holding the topic.
    pub brokers: String,
    /// The gateway's configuration (JSON, as its `--config` file).
    pub config: Value,
    /// The producer of the gateway and of the inventory's outbox relay.
    pub producer: ProducerSettings,
}

impl Plan {
    /// Names a sale, creates its topic (as `topic` says, or one replica on
    /// the stack's broker) and writes the gateway's configuration: the
    /// funnel's, with the keys of `config` over it. The producer sends to
    /// `producer_brokers` (the topic's by default) with `linger`, when
    /// given.
    pub async fn prepare(
        config: &Value,
        topic: Option<&TopicSpec>,
        producer_brokers: Option<String>,
        linger: Option<Duration>,
    ) -> anyhow::Result<Self> {
        let sale = stack::unique_name("gw");
        let name = stack::unique_name("gw-orders");
        let brokers = match topic {
            Some(spec) => {
                let min_insync = i32::try_from(spec.min_insync_replicas)?;
                kafka::create_replicated_topics(
                    &spec.brokers,
                    &[(&name, 1)],
                    spec.replication,
                    min_insync,
                )
                .await?;
                spec.brokers.clone()
            }
            None => {
                let brokers = stack::kafka_brokers()?;
                kafka::create_topic(&brokers, &name, 1).await?;
                brokers
            }
        };
        let mut producer =
            ProducerSettings::new(producer_brokers.unwrap_or_else(|| brokers.clone()));
        producer.topic = name.clone();
        if let Some(linger) = linger {
            producer.linger = linger;
        }
        Ok(Self {
            config: gateway_config(&sale, config),
            sale,
            topic: name,
            brokers,
            producer,
        })
    }
}

/// The gateway's configuration of `sale`: its items and currency, a high
/// rate limit, then the keys of `extra` over them.
pub fn gateway_config(sale: &str, extra: &Value) -> Value {
    let items: Vec<Value> = ITEMS
        .iter()
        .map(|(sku, price)| json!({"sku": sku, "priceMinor": price}))
        .collect();
    let mut config = json!({
        "sale": sale,
        "currency": "CNY",
        "items": items,
        "rateLimit": {"perUserPerSecond": 1000, "burst": 1000},
        "requestTimeoutMs": 1500,
        "itemCacheMs": 300,
    });
    if let (Some(base), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    config
}

/// The stock of `sku` of `sale`, straight from the inventory at
/// `inventory_url`.
pub async fn available(inventory_url: &str, sale: &str, sku: &str) -> anyhow::Result<u64> {
    let url = format!("{inventory_url}/v1/sales/{sale}/items/{sku}/stock");
    let level: Value = http()
        .get(url)
        .bearer_auth(INVENTORY_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    level["available"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no available in {level}"))
}

/// Removes `sale`'s keys from the stack's Redis.
pub async fn cleanup(sale: &str) -> anyhow::Result<()> {
    redis_keys::unlink_matching(&stack::redis_url()?, &format!("fs:{{{sale}}}:*")).await?;
    Ok(())
}

/// Every event in `topic`.
pub async fn events(brokers: &str, topic: &str) -> anyhow::Result<Vec<OrderEvent>> {
    Ok(kafka::events(brokers, topic).await?)
}

/// A fresh one-partition topic.
pub async fn create_topic(brokers: &str, topic: &str) -> anyhow::Result<()> {
    Ok(kafka::create_topic(brokers, topic, 1).await?)
}

/// A bearer token for `user`, valid for an hour.
pub fn token(user: &str) -> String {
    let exp = jiff::Timestamp::now().as_second() + 3600;
    EncodingKey::from_secret(JWT_SECRET)
        .and_then(|key| {
            jsonwebtoken::encode(&Header::default(), &json!({"sub": user, "exp": exp}), &key)
        })
        .unwrap_or_default()
}

/// An HTTP client for the funnel.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// Now, in Unix seconds.
pub fn now_s() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Waits, within `within`, until this machine's clock (the gateway's and
/// Redis's) is past `deadline_ms` (Unix ms), such as an order's `payBeforeMs`.
pub async fn wait_past(deadline_ms: i64, within: Duration) -> anyhow::Result<()> {
    poll_until(
        "the deadline to pass",
        within,
        Duration::from_millis(20),
        || async {
            let to_go = deadline_ms - jiff::Timestamp::now().as_millisecond();
            if to_go < 0 {
                Ok(())
            } else {
                Err(format!("{to_go} ms to go"))
            }
        },
    )
    .await?;
    Ok(())
}

/// Places an order; returns status, body and headers.
pub async fn order(
    gateway: &str,
    user: &str,
    sku: &str,
    key: &str,
    pass: Option<&str>,
) -> anyhow::Result<(u16, Value, reqwest::header::HeaderMap)> {
    let mut request = http()
        .post(format!("{gateway}/api/v1/orders"))
        .bearer_auth(token(user))
        .json(&json!({"sku": sku, "quantity": 1, "idempotencyKey": key}));
    if let Some(pass) = pass {
        request = request.header("x-queue-pass", pass);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    Ok((status, body, headers))
}

/// A drill buyer's order of `sku` in sale `sale`, its token signed with
/// `key` for an hour; returns status and body.
pub async fn drill_order(
    gateway: &str,
    (sale, key): (&str, &[u8]),
    buyer: &str,
    sku: &str,
) -> anyhow::Result<(u16, Value)> {
    let expires = u64::try_from(jiff::Timestamp::now().as_second() + 3600)?;
    let token = flashsale_drill_buyer::sign(key, sale, buyer, expires)?;
    let response = http()
        .post(format!("{gateway}/api/v1/orders"))
        .bearer_auth(token)
        .json(&json!({"sku": sku, "quantity": 1, "idempotencyKey": buyer}))
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

/// The user a queue ticket was issued to: its payload is readable JSON
/// (only the MAC is secret).
pub fn ticket_user(ticket: &str) -> anyhow::Result<String> {
    use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
    let payload = ticket
        .split_once('.')
        .ok_or_else(|| anyhow::anyhow!("not a ticket: {ticket}"))?
        .0;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload)?)?;
    claims["u"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no user in {claims}"))
}

/// Polls `GET /api/v1/queue/status` with `ticket` (and its user's token)
/// until admitted; returns the pass.
pub async fn wait_for_pass(
    gateway: &str,
    ticket: &str,
    within: Duration,
) -> anyhow::Result<String> {
    let url = format!("{gateway}/api/v1/queue/status");
    let bearer = token(&ticket_user(ticket)?);
    let pass = poll_until("admission", within, Duration::from_millis(50), || async {
        let response = http()
            .get(&url)
            .header("x-queue-ticket", ticket)
            .bearer_auth(&bearer)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = response.json().await.map_err(|e| e.to_string())?;
        match body["pass"].as_str() {
            Some(pass) => Ok(pass.to_owned()),
            None => Err(body.to_string()),
        }
    })
    .await?;
    Ok(pass)
}
