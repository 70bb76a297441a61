//! A whole funnel for one test: a real inventory (in this process, on the
//! stack's Redis) with a freshly loaded sale, a fresh Kafka topic, and a
//! gateway in front of them, all on loopback.

#![allow(dead_code)] // each test binary uses its own subset

use std::{net::SocketAddr, time::Duration};

use flashsale_e2e::{redis_keys, stack, wait::poll_until};
use flashsale_orders::{OrderEvent, ProducerSettings};
use flashsale_runtime::Shutdown;
use gateway::{
    app::AppState,
    auth::Verifier,
    config::GatewayConfig,
    server::{Gateway, Settings, SwitchSource},
};
use inventory::{
    keys::{SaleKeys, Workload},
    store::{ItemDefinition, SaleDefinition, Store},
};
use jsonwebtoken::{EncodingKey, Header};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

/// The bearer-token secret of the tests.
pub const JWT_SECRET: &[u8] = b"test-secret-test-secret-test-secret!";
/// The waiting-room key of the tests.
pub const ROOM_KEY: &[u8] = b"room-key-room-key-room-key-room-key!";
/// The token the tests' inventory requires of the gateway.
pub const INVENTORY_TOKEN: &str = "inventory-token-of-the-tests";
/// The secret the tests' payment provider signs callbacks with.
pub const PAYMENT_SECRET: &[u8] = b"payment-secret-of-the-tests-0123456789";

/// A running inventory over the stack's Redis.
pub struct Inventory {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Inventory {
    /// Serves the inventory API on a free port; `sale` is loaded first.
    pub async fn start(sale: &SaleDefinition) -> anyhow::Result<Self> {
        Self::start_on(&stack::redis_url()?, sale).await
    }

    /// The same, on the Redis at `redis_url`.
    pub async fn start_on(redis_url: &str, sale: &SaleDefinition) -> anyhow::Result<Self> {
        let store = Store::connect(redis_url).await?;
        store.load(sale).await?;
        let metrics = inventory::metrics::Metrics::register(&mut Registry::default());
        let state = inventory::api::AppState::new(store, metrics, Duration::from_millis(200))
            .with_tokens(inventory::auth::Tokens::new(Some(INVENTORY_TOKEN), None));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, inventory::api::router(state)).await;
        });
        Ok(Self { url, task })
    }

    /// Stops serving: connections are refused from now on.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Inventory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a test changes from the defaults.
pub struct Options {
    pub stock: u64,
    pub per_user_limit: u64,
    pub config: Value,
    pub brokers: Option<String>,
    pub switches: SwitchSource,
    /// The gateway's Redis, when not the stack's (the inventory keeps the stack's).
    pub redis_url: Option<String>,
    /// Each workload on a Redis ACL user of its own, with the rules
    /// `inventory redis-acl` prints.
    pub acl: bool,
    /// Where the order topic is created and how it is replicated, when not
    /// on the stack's single broker with one replica.
    pub topic: Option<TopicSpec>,
    /// The producer's linger, when not its default.
    pub linger: Option<Duration>,
    /// How long a reservation holds its units unpaid. The tests' inventory
    /// runs no sweeper, so a lapsed reservation stays `reserved` until
    /// a test sweeps it.
    pub reservation_ttl: Duration,
}

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

impl Default for Options {
    fn default() -> Self {
        Self {
            stock: 100,
            per_user_limit: 5,
            config: json!({}),
            brokers: None,
            switches: SwitchSource::None,
            redis_url: None,
            acl: false,
            topic: None,
            linger: None,
            reservation_ttl: Duration::from_secs(60),
        }
    }
}

/// One sale's funnel.
pub struct Funnel {
    pub sale: String,
    pub topic: String,
    pub brokers: String,
    pub inventory: Inventory,
    pub gateway: Running,
    pub config: GatewayConfig,
}

/// A gateway serving on a free port.
pub struct Running {
    pub url: String,
    pub state: AppState,
    pub registry: std::sync::Arc<Registry>,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Builds and serves a gateway over `config`, on the stack's Redis.
    pub async fn start(
        config: GatewayConfig,
        inventory_url: &str,
        brokers: &str,
        topic: &str,
        switches: SwitchSource,
    ) -> anyhow::Result<Self> {
        let redis_url = stack::redis_url()?;
        Self::start_on(&redis_url, config, inventory_url, brokers, topic, switches).await
    }

    /// Builds and serves a gateway over `config`, on the Redis at `redis_url`.
    pub async fn start_on(
        redis_url: &str,
        config: GatewayConfig,
        inventory_url: &str,
        brokers: &str,
        topic: &str,
        switches: SwitchSource,
    ) -> anyhow::Result<Self> {
        let mut producer = ProducerSettings::new(brokers);
        producer.topic = topic.to_owned();
        Self::start_producing(redis_url, config, inventory_url, producer, switches).await
    }

    /// The same, with the producer's settings given whole.
    pub async fn start_producing(
        redis_url: &str,
        config: GatewayConfig,
        inventory_url: &str,
        producer: ProducerSettings,
        switches: SwitchSource,
    ) -> anyhow::Result<Self> {
        let settings = Settings {
            config,
            redis_url: Some(redis_url.to_owned()),
            inventory_url: inventory_url.to_owned(),
            inventory_token: Some(INVENTORY_TOKEN.to_owned()),
            payment_secret: Some(PAYMENT_SECRET.to_vec()),
            producer,
            verifier: Verifier::hs256(JWT_SECRET)?,
            ticket_key: Some(ROOM_KEY.to_vec()),
            switches,
        };
        let mut registry = Registry::default();
        let addr: SocketAddr = "127.0.0.1:0".parse()?;
        let gateway = Gateway::build(settings, addr, &mut registry).await?;
        let url = format!("http://{}", gateway.local_addr()?);
        let state = gateway.state.clone();
        let shutdown = Shutdown::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let _ = gateway.serve(stop).await;
        });
        Ok(Self {
            url,
            state,
            registry: std::sync::Arc::new(registry),
            shutdown,
            task,
        })
    }

    /// The metrics text, as `/metrics` would serve it.
    pub fn metrics(&self) -> String {
        flashsale_runtime::metrics::render(&self.registry).unwrap_or_default()
    }

    /// The value of one sample line (`name{labels}`), if present.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.trigger();
        self.task.abort();
    }
}

impl Funnel {
    /// Loads a sale with SKUs `A` (price 1999) and `B` (price 500), creates
    /// its topic and starts the inventory and the gateway.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        let sale = stack::unique_name("gw");
        let definition = SaleDefinition {
            sale: sale.clone(),
            opens_at_ms: None,
            reservation_ttl_ms: u64::try_from(options.reservation_ttl.as_millis())?,
            items: ["A", "B"]
                .into_iter()
                .map(|sku| ItemDefinition {
                    sku: sku.to_owned(),
                    stock: options.stock,
                    per_user_limit: options.per_user_limit,
                    shards: 1,
                })
                .collect(),
        };
        let (inventory_redis, gateway_redis) = if options.acl {
            (
                acl_user(&sale, Workload::Inventory).await?,
                Some(acl_user(&sale, Workload::Gateway).await?),
            )
        } else {
            (stack::redis_url()?, options.redis_url)
        };
        let inventory = Inventory::start_on(&inventory_redis, &definition).await?;
        let topic = stack::unique_name("gw-orders");
        let brokers = match &options.topic {
            Some(spec) => {
                create_replicated_topic(spec, &topic).await?;
                spec.brokers.clone()
            }
            None => {
                let brokers = stack::kafka_brokers()?;
                create_topic(&brokers, &topic).await?;
                brokers
            }
        };
        let mut config = json!({
            "sale": sale,
            "currency": "CNY",
            "items": [{"sku": "A", "priceMinor": 1999}, {"sku": "B", "priceMinor": 500}],
            "rateLimit": {"perUserPerSecond": 1000, "burst": 1000},
            "requestTimeoutMs": 1500,
            "itemCacheMs": 300,
        });
        if let (Some(base), Some(extra)) = (config.as_object_mut(), options.config.as_object()) {
            base.extend(extra.clone());
        }
        let config: GatewayConfig = serde_json::from_value(config)?;
        config.check()?;
        let producer_brokers = options.brokers.unwrap_or_else(|| brokers.clone());
        let redis_url = match gateway_redis {
            Some(url) => url,
            None => stack::redis_url()?,
        };
        let mut producer = ProducerSettings::new(producer_brokers);
        producer.topic = topic.clone();
        if let Some(linger) = options.linger {
            producer.linger = linger;
        }
        let gateway = Running::start_producing(
            &redis_url,
            config.clone(),
            &inventory.url,
            producer,
            options.switches,
        )
        .await?;
        Ok(Self {
            sale,
            topic,
            brokers,
            inventory,
            gateway,
            config,
        })
    }

    /// A second replica of the same gateway.
    pub async fn replica(&self, switches: SwitchSource) -> anyhow::Result<Running> {
        Running::start(
            self.config.clone(),
            &self.inventory.url,
            &self.brokers,
            &self.topic,
            switches,
        )
        .await
    }

    /// The sale's stock of `sku` straight from the inventory.
    pub async fn available(&self, sku: &str) -> anyhow::Result<u64> {
        let url = format!(
            "{}/v1/sales/{}/items/{sku}/stock",
            self.inventory.url, self.sale
        );
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

    /// Removes the sale's Redis keys.
    pub async fn cleanup(self) -> anyhow::Result<()> {
        redis_keys::unlink_matching(&stack::redis_url()?, &format!("fs:{{{}}}:*", self.sale))
            .await?;
        Ok(())
    }
}

/// Creates (or resets) the Redis ACL user of `workload` for `sale` with the
/// rules of the key schema; returns a URL that logs in as it.
pub async fn acl_user(sale: &str, workload: Workload) -> anyhow::Result<String> {
    let name = format!(
        "{}-{sale}",
        match workload {
            Workload::Gateway => "gw",
            Workload::Inventory => "inv",
        }
    );
    let password = format!("pw-{name}");
    let admin = stack::redis_url()?;
    let client = redis::Client::open(admin.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&name)
        .arg("reset")
        .arg("on")
        .arg(format!(">{password}"))
        .arg(SaleKeys::new(sale).acl_rules(workload))
        .query_async(&mut conn)
        .await?;
    let rest = admin
        .strip_prefix("redis://")
        .ok_or_else(|| anyhow::anyhow!("not a redis:// URL: {admin}"))?;
    Ok(format!("redis://{name}:{password}@{rest}"))
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

/// An HTTP client for the tests.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// The test payment provider: posts a signed callback saying `order_id`
/// was paid `amount_minor` in `currency`, signed at `signed_at` (Unix s).
pub async fn provider_pays(
    gateway: &str,
    order_id: &str,
    amount_minor: i64,
    currency: &str,
    signed_at: i64,
) -> anyhow::Result<(u16, Value)> {
    let body = gateway::payments::succeeded(order_id, u64::try_from(amount_minor)?, currency);
    let signature = gateway::payments::sign(PAYMENT_SECRET, signed_at, &body)?;
    let response = http()
        .post(format!("{gateway}/api/v1/payments/callback"))
        .header(gateway::payments::SIGNATURE_HEADER, signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
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

/// Places an order; returns status and body.
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

/// A fresh one-partition topic.
pub async fn create_topic(brokers: &str, topic: &str) -> anyhow::Result<()> {
    Ok(flashsale_e2e::kafka::create_topic(brokers, topic, 1).await?)
}

/// A fresh one-partition topic with `spec`'s replication, on its brokers.
pub async fn create_replicated_topic(spec: &TopicSpec, topic: &str) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &spec.brokers)
        .create()?;
    let min_isr = spec.min_insync_replicas.to_string();
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(spec.replication))
        .set("min.insync.replicas", &min_isr);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&[new], &options).await? {
        result.map_err(|(name, code)| anyhow::anyhow!("creating topic {name}: {code}"))?;
    }
    Ok(())
}

/// Every event in the topic.
pub async fn events(brokers: &str, topic: &str) -> anyhow::Result<Vec<OrderEvent>> {
    Ok(flashsale_e2e::kafka::events(brokers, topic).await?)
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
