//! The gateway's funnel in this process, for the gateway's benchmark and the
//! play's buyers: the inventory (on the stack's Redis) with the sale
//! loaded, and a gateway in front of it, on loopback, built from the test
//! kit's plan (`flashsale_e2e::funnel`). The gateway's own tests build
//! theirs in their harness, where they read the gateway's state: a crate
//! they depend on cannot depend on the gateway.

use std::{net::SocketAddr, time::Duration};

use flashsale_e2e::{
    funnel::{INVENTORY_TOKEN, ITEMS, JWT_SECRET, PAYMENT_SECRET, Plan, ROOM_KEY, TopicSpec},
    stack,
};
use flashsale_runtime::Shutdown;
use gateway::{
    auth::Verifier,
    config::GatewayConfig,
    server::{Gateway, Settings, SwitchSource},
};
use inventory::store::{ItemDefinition, SaleDefinition, Store};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// What a funnel changes from the defaults.
#[derive(Debug, Clone)]
pub struct Options {
    /// Units of each SKU.
    pub stock: u64,
    /// Units of each SKU one user may hold.
    pub per_user_limit: u64,
    /// Gateway configuration over the funnel's.
    pub config: Value,
    /// Where the order topic is created and how it is replicated, when not
    /// on the stack's single broker with one replica.
    pub topic: Option<TopicSpec>,
    /// The producer's linger, when not its default.
    pub linger: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            stock: 100,
            per_user_limit: 5,
            config: json!({}),
            topic: None,
            linger: None,
        }
    }
}

/// One sale's funnel, stopped when dropped.
pub struct Funnel {
    /// The sale.
    pub sale: String,
    /// Its order topic.
    pub topic: String,
    /// The brokers holding the topic.
    pub brokers: String,
    /// The inventory's base URL.
    pub inventory_url: String,
    /// The gateway's base URL.
    pub gateway_url: String,
    shutdown: Shutdown,
    tasks: [JoinHandle<()>; 2],
}

impl Funnel {
    /// Loads a sale with the kit's SKUs, creates its topic and starts the
    /// inventory and the gateway.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        let plan = Plan::prepare(
            &options.config,
            options.topic.as_ref(),
            None,
            options.linger,
        )
        .await?;
        let redis_url = stack::redis_url()?;
        let (inventory_url, inventory) = serve_inventory(&redis_url, &plan.sale, &options).await?;
        let config: GatewayConfig = serde_json::from_value(plan.config)?;
        config.check()?;
        let settings = Settings {
            config,
            redis_url: Some(redis_url),
            inventory_url: inventory_url.clone(),
            inventory_token: Some(INVENTORY_TOKEN.to_owned()),
            payment_secret: Some(PAYMENT_SECRET.to_vec()),
            producer: plan.producer,
            verifier: Verifier::hs256(JWT_SECRET)?,
            ticket_key: Some(ROOM_KEY.to_vec()),
            switches: SwitchSource::None,
        };
        let addr: SocketAddr = "127.0.0.1:0".parse()?;
        let built = Gateway::build(settings, addr, &mut Registry::default()).await?;
        let gateway_url = format!("http://{}", built.local_addr()?);
        let shutdown = Shutdown::new();
        let stop = shutdown.clone();
        let gateway = tokio::spawn(async move {
            let _ = built.serve(stop).await;
        });
        Ok(Self {
            sale: plan.sale,
            topic: plan.topic,
            brokers: plan.brokers,
            inventory_url,
            gateway_url,
            shutdown,
            tasks: [inventory, gateway],
        })
    }

    /// The sale's stock of `sku` straight from the inventory.
    pub async fn available(&self, sku: &str) -> anyhow::Result<u64> {
        flashsale_e2e::funnel::available(&self.inventory_url, &self.sale, sku).await
    }

    /// Removes the sale's Redis keys.
    pub async fn cleanup(self) -> anyhow::Result<()> {
        flashsale_e2e::funnel::cleanup(&self.sale).await
    }
}

impl Drop for Funnel {
    fn drop(&mut self) {
        self.shutdown.trigger();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The inventory API for `sale` on a free port, with the kit's token; its
/// URL and serving task.
async fn serve_inventory(
    redis_url: &str,
    sale: &str,
    options: &Options,
) -> anyhow::Result<(String, JoinHandle<()>)> {
    let store = Store::connect(redis_url).await?;
    store
        .load(&SaleDefinition {
            sale: sale.to_owned(),
            opens_at_ms: None,
            reservation_ttl_ms: 60_000,
            items: ITEMS
                .iter()
                .map(|(sku, _)| ItemDefinition {
                    sku: (*sku).to_owned(),
                    stock: options.stock,
                    per_user_limit: options.per_user_limit,
                    shards: 1,
                })
                .collect(),
        })
        .await?;
    let metrics = inventory::metrics::Metrics::register(&mut Registry::default());
    let state = inventory::api::AppState::new(store, metrics, Duration::from_millis(200))
        .with_tokens(inventory::auth::Tokens::new(Some(INVENTORY_TOKEN), None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, inventory::api::router(state)).await;
    });
    Ok((url, task))
}
