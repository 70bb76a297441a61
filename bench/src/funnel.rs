//! The gateway's funnel in this process, for the gateway's tests, its
//! benchmark and the play's buyers: a real inventory (on the stack's Redis)
//! with a freshly loaded sale, a fresh Kafka topic, and a gateway in front
//! of them, all on loopback, built from the test kit's plan
//! (`flashsale_e2e::funnel`). The gateway's integration tests reach it
//! through a dev-dependency: a cycle through dev-dependencies only, which
//! cargo allows, and those tests link the same gateway library as this
//! crate, so they read the gateway's state through [`Running::state`].

use std::{net::SocketAddr, sync::Arc, time::Duration};

use flashsale_e2e::{
    funnel::{
        DRILL_KEY, INVENTORY_ADMIN_TOKEN, INVENTORY_TOKEN, ITEMS, JWT_SECRET, PAYMENT_SECRET, Plan,
        ROOM_KEY, TopicSpec,
    },
    stack,
};
use flashsale_orders::ProducerSettings;
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
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// A running inventory over a Redis, with its outbox relay when it has a
/// producer.
pub struct Inventory {
    /// Its base URL.
    pub url: String,
    task: JoinHandle<()>,
    relay: Option<(Shutdown, JoinHandle<()>)>,
}

impl Inventory {
    /// Serves the inventory API on a free port over the Redis at
    /// `redis_url`, `sale` loaded first, and publishes the sale's order
    /// events with `relay`, when given.
    pub async fn start_on(
        redis_url: &str,
        sale: &SaleDefinition,
        relay: Option<&ProducerSettings>,
    ) -> anyhow::Result<Self> {
        let store = Store::connect(redis_url).await?;
        store.load(sale).await?;
        let metrics = inventory::metrics::Metrics::register(&mut Registry::default());
        let relay = match relay {
            Some(settings) => {
                let producer = flashsale_orders::OrderProducer::new(settings)?;
                let shutdown = Shutdown::new();
                let task = tokio::spawn(inventory::outbox::run(
                    store.clone(),
                    producer,
                    metrics.clone(),
                    format!("funnel-{}", sale.sale),
                    Duration::from_millis(10),
                    shutdown.clone(),
                ));
                Some((shutdown, task))
            }
            None => None,
        };
        let state =
            inventory::api::AppState::new(store, metrics, Duration::from_millis(200)).with_tokens(
                inventory::auth::Tokens::new(Some(INVENTORY_TOKEN), Some(INVENTORY_ADMIN_TOKEN)),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, inventory::api::router(state)).await;
        });
        Ok(Self { url, task, relay })
    }

    /// Stops serving and publishing: connections are refused from now on.
    pub fn stop(&self) {
        self.task.abort();
        if let Some((shutdown, relay)) = &self.relay {
            shutdown.trigger();
            relay.abort();
        }
    }
}

impl Drop for Inventory {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a funnel changes from the defaults.
#[derive(Debug, Clone)]
pub struct Options {
    /// Units of each SKU.
    pub stock: u64,
    /// Units of each SKU one user may hold.
    pub per_user_limit: u64,
    /// Gateway configuration over the funnel's.
    pub config: Value,
    /// The brokers the gateway's producer sends to, when not the topic's.
    pub brokers: Option<String>,
    /// Where the gateway takes its degradation switches from.
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
    /// Whether the inventory's relay publishes the outbox's events.
    pub relay: bool,
    /// How long a reservation holds its units unpaid. The funnel's inventory
    /// runs no sweeper, so a lapsed reservation stays `reserved` until
    /// a caller sweeps it.
    pub reservation_ttl: Duration,
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
            relay: true,
            reservation_ttl: Duration::from_secs(60),
        }
    }
}

/// One sale's funnel; its services stop when it is dropped.
pub struct Funnel {
    /// The sale.
    pub sale: String,
    /// Its order topic.
    pub topic: String,
    /// The brokers holding the topic.
    pub brokers: String,
    /// The inventory.
    pub inventory: Inventory,
    /// The gateway.
    pub gateway: Running,
    /// The gateway's configuration.
    pub config: GatewayConfig,
    /// The same, as a gateway's `--config` file holds it.
    pub config_file: Value,
}

/// A gateway serving on a free port, stopped when dropped.
pub struct Running {
    /// Its base URL.
    pub url: String,
    /// Its state, as its handlers see it.
    pub state: AppState,
    /// Its metrics.
    pub registry: Arc<Registry>,
    shutdown: Shutdown,
    task: JoinHandle<()>,
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
        let drill = flashsale_drill_buyer::Checker::new(DRILL_KEY, &config.sale)?;
        let settings = Settings {
            config,
            redis_url: Some(redis_url.to_owned()),
            inventory_url: inventory_url.to_owned(),
            inventory_token: Some(INVENTORY_TOKEN.to_owned()),
            payment_secret: Some(PAYMENT_SECRET.to_vec()),
            producer,
            verifier: Verifier::hs256(JWT_SECRET)?.with_drill_buyers(drill),
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
            registry: Arc::new(registry),
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
        flashsale_e2e::metrics::sample(&self.metrics(), series)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.trigger();
        self.task.abort();
    }
}

impl Funnel {
    /// Loads a sale with the funnel's SKUs, creates its topic and starts
    /// the inventory and the gateway.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        let plan = Plan::prepare(
            &options.config,
            options.topic.as_ref(),
            options.brokers,
            options.linger,
        )
        .await?;
        let definition = SaleDefinition {
            sale: plan.sale.clone(),
            opens_at_ms: None,
            reservation_ttl_ms: u64::try_from(options.reservation_ttl.as_millis())?,
            items: ITEMS
                .iter()
                .map(|(sku, _)| ItemDefinition {
                    sku: (*sku).to_owned(),
                    stock: options.stock,
                    per_user_limit: options.per_user_limit,
                    shards: 1,
                })
                .chain([ItemDefinition::drill()])
                .collect(),
        };
        let (inventory_redis, gateway_redis) = if options.acl {
            (
                acl_user(&plan.sale, Workload::Inventory).await?,
                acl_user(&plan.sale, Workload::Gateway).await?,
            )
        } else {
            let stack = stack::redis_url()?;
            (stack.clone(), options.redis_url.unwrap_or(stack))
        };
        let inventory = Inventory::start_on(
            &inventory_redis,
            &definition,
            options.relay.then_some(&plan.producer),
        )
        .await?;
        let config_file = plan.config;
        let config: GatewayConfig = serde_json::from_value(config_file.clone())?;
        config.check()?;
        let gateway = Running::start_producing(
            &gateway_redis,
            config.clone(),
            &inventory.url,
            plan.producer,
            options.switches,
        )
        .await?;
        Ok(Self {
            sale: plan.sale,
            topic: plan.topic,
            brokers: plan.brokers,
            inventory,
            gateway,
            config,
            config_file,
        })
    }

    /// A second replica of the same gateway.
    pub async fn replica(&self, switches: SwitchSource) -> anyhow::Result<Running> {
        self.replica_via(&self.inventory.url, switches).await
    }

    /// A second replica of the same gateway, reaching the inventory at
    /// `inventory_url` (a proxy in front of it, say).
    pub async fn replica_via(
        &self,
        inventory_url: &str,
        switches: SwitchSource,
    ) -> anyhow::Result<Running> {
        Running::start(
            self.config.clone(),
            inventory_url,
            &self.brokers,
            &self.topic,
            switches,
        )
        .await
    }

    /// The sale's stock of `sku` straight from the inventory.
    pub async fn available(&self, sku: &str) -> anyhow::Result<u64> {
        flashsale_e2e::funnel::available(&self.inventory.url, &self.sale, sku).await
    }

    /// The order events on the sale's topic once the inventory's outbox is
    /// drained: every order acknowledged so far is then in Kafka (an entry
    /// leaves the outbox only once Kafka acknowledged its event).
    pub async fn events(&self) -> anyhow::Result<Vec<flashsale_orders::OrderEvent>> {
        let conn = redis::Client::open(stack::redis_url()?)?
            .get_multiplexed_async_connection()
            .await?;
        let outbox = SaleKeys::new(&self.sale).outbox();
        flashsale_e2e::wait::until_stream_empty(&conn, &outbox, Duration::from_secs(15)).await?;
        flashsale_e2e::funnel::events(&self.brokers, &self.topic).await
    }

    /// Removes the sale's Redis keys.
    pub async fn cleanup(self) -> anyhow::Result<()> {
        flashsale_e2e::funnel::cleanup(&self.sale).await
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
