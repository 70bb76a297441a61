//! No acknowledged order is lost when a part of the order path is killed
//! with SIGKILL under 200 concurrent buyers: the inventory binary (its
//! relay's entries are taken over by the next replica), the Redis primary
//! of the sale (under the replicated policy), or the leader of the order
//! topic's partition. On the stack's Redis Cluster and three brokers (a
//! topic of three replicas, `min.insync.replicas` 2), like production.
//!
//! The buyers reserve through the gateway's own inventory client, so their
//! reservations travel in batches as in production, and a kill fails whole
//! batches. An order is acknowledged when the client returned its
//! reservation: the reservation and its `created` outbox entry were written
//! in one script and confirmed by a replica. Every acknowledged order must reach Kafka as a `created`
//! event, by order id; and once the outbox is drained, every reserved unit
//! is an order on the topic and every order a reserved unit.

mod common;

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use common::InventoryProcess;
use flashsale_e2e::{
    clusters::{KafkaCluster, RedisCluster},
    kafka,
    stack::unique_name,
    wait::{poll_until, until_stream_empty},
};
use flashsale_inventory_api::StockLevel;
use flashsale_orders::EventKind;
use flashsale_runtime::{RedisConnection, RedisTarget, RedisTimeouts};
use gateway::inventory_client::InventoryClient;
use inventory::{
    keys::SaleKeys,
    store::{ItemDefinition, SaleDefinition},
};

const BUYERS: usize = 200;
/// Orders acknowledged before the kill, and again after it.
const BEFORE: usize = 300;
const AFTER: usize = 300;
const HEALED_WITHIN: Duration = Duration::from_secs(180);
/// Kills share the clusters: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What is killed.
#[derive(Debug, Clone, Copy)]
enum Kill {
    Inventory,
    RedisPrimary,
    Broker,
}

/// The buyers: each places orders back to back, each order a new buyer,
/// against whichever inventory is current, through one client (one batcher)
/// per inventory; acknowledged reservation ids are kept.
struct Buyers {
    client: Arc<RwLock<InventoryClient>>,
    acked: Arc<Mutex<BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Buyers {
    fn start(client: InventoryClient) -> Self {
        let client = Arc::new(RwLock::new(client));
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(0));
        let tasks = (0..BUYERS)
            .map(|_| {
                let (client, acked, stop, next) =
                    (client.clone(), acked.clone(), stop.clone(), next.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let buyer = format!("b{}", next.fetch_add(1, Ordering::Relaxed));
                        let Ok(current) = client.read().map(|c| c.clone()) else {
                            return;
                        };
                        // The gateway's order budget (requestTimeoutMs).
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                        match current.reserve("HOT", &buyer, 1, 0, &buyer, deadline).await {
                            Ok(record) => {
                                if let Ok(mut acked) = acked.lock() {
                                    acked.insert(record.id);
                                }
                            }
                            // Refused or failed: not acknowledged, nothing promised.
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                })
            })
            .collect();
        Self {
            client,
            acked,
            stop,
            tasks,
        }
    }

    fn count(&self) -> usize {
        self.acked.lock().map(|a| a.len()).unwrap_or(0)
    }

    /// Waits until at least `n` orders were acknowledged.
    async fn until(&self, n: usize, what: &str, log: impl Fn() -> String) -> anyhow::Result<()> {
        poll_until(
            what,
            Duration::from_secs(120),
            Duration::from_millis(50),
            || async {
                match self.count() {
                    c if c >= n => Ok(()),
                    c => Err(format!(
                        "{c} of {n} acknowledged; inventory log:\n{}",
                        log()
                    )),
                }
            },
        )
        .await?;
        Ok(())
    }

    async fn finish(self) -> anyhow::Result<BTreeSet<String>> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await?;
        }
        Ok(self.acked.lock().map(|a| a.clone()).unwrap_or_default())
    }
}

/// A sale on the Redis Cluster and its topic on the three brokers.
struct Scene {
    redis: RedisCluster,
    brokers: KafkaCluster,
    def: SaleDefinition,
    topic: String,
}

impl Scene {
    async fn new() -> anyhow::Result<Self> {
        let redis = RedisCluster::from_env()?;
        let brokers = KafkaCluster::from_env()?;
        redis.until_healthy(HEALED_WITHIN).await?;
        brokers.until_healthy(HEALED_WITHIN).await?;
        let topic = unique_name("kill-orders");
        kafka::create_replicated_topics(brokers.brokers(), &[(&topic, 1)], 3, 2).await?;
        let def = SaleDefinition {
            sale: unique_name("kill"),
            opens_at_ms: None,
            reservation_ttl_ms: 600_000,
            items: vec![ItemDefinition {
                sku: "HOT".into(),
                stock: 1_000_000,
                per_user_limit: 1,
                shards: 1,
            }],
        };
        Ok(Self {
            redis,
            brokers,
            def,
            topic,
        })
    }

    /// The inventory binary as pod `pod`, acknowledging once a replica
    /// confirmed, publishing to the scene's topic.
    fn start(&self, pod: &str) -> anyhow::Result<InventoryProcess> {
        InventoryProcess::start(
            self.redis.urls(),
            &self.def,
            &[
                "--durability",
                "replicated",
                "--durability-timeout-ms",
                "200",
                "--kafka-brokers",
                self.brokers.brokers(),
                "--orders-topic",
                &self.topic,
                "--pod-name",
                pod,
            ],
        )
    }

    /// The gateway's client of `inventory`, for the scene's sale.
    fn client(&self, inventory: &InventoryProcess) -> anyhow::Result<InventoryClient> {
        Ok(InventoryClient::new(&inventory.api, &self.def.sale, None)?)
    }

    /// SIGKILLs what `kill` names; a killed store comes back as a replica.
    async fn strike(
        &self,
        kill: Kill,
        inventory: &mut InventoryProcess,
        buyers: &Buyers,
    ) -> anyhow::Result<()> {
        match kill {
            Kill::Inventory => {
                // A new pod takes the dead one's place under another name.
                inventory.kill().await?;
                *inventory = self.start("inventory-b")?;
                let client = self.client(inventory)?;
                if let Ok(mut current) = buyers.client.write() {
                    *current = client;
                }
            }
            Kill::RedisPrimary => {
                let primary = self
                    .redis
                    .primary_for_key(&SaleKeys::new(&self.def.sale).sku("HOT"))
                    .await?;
                self.redis.kill(primary).await?;
                // Back as a replica of the promoted one: the replicated
                // policy acknowledges again once the new primary has one.
                self.redis.restart(primary).await?;
            }
            Kill::Broker => {
                let leader = self
                    .brokers
                    .leader_of(&self.topic, 0)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("the topic has no leader"))?;
                self.brokers.kill(leader).await?;
                self.brokers.restart(leader).await?;
            }
        }
        Ok(())
    }

    /// The order ids of the topic's `created` events, with repeats.
    async fn created(&self) -> anyhow::Result<Vec<String>> {
        Ok(kafka::events(self.brokers.brokers(), &self.topic)
            .await?
            .into_iter()
            .filter(|e| e.kind == EventKind::Created)
            .map(|e| e.order_id)
            .collect())
    }

    /// Waits until the sale's outbox is empty: every event it held is on
    /// the topic.
    async fn drained(&self) -> anyhow::Result<()> {
        let target: RedisTarget = self.redis.urls().parse()?;
        let conn = RedisConnection::connect(&target, RedisTimeouts::default()).await?;
        let outbox = SaleKeys::new(&self.def.sale).outbox();
        until_stream_empty(&conn, &outbox, Duration::from_secs(60)).await?;
        Ok(())
    }
}

async fn no_acknowledged_order_is_lost(kill: Kill) -> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let scene = Scene::new().await?;
    let mut inventory = scene.start("inventory-a")?;
    let buyers = Buyers::start(scene.client(&inventory)?);
    buyers
        .until(BEFORE, "orders before the kill", || inventory.log())
        .await?;
    scene.strike(kill, &mut inventory, &buyers).await?;
    let killed_at = buyers.count();
    buyers
        .until(killed_at + AFTER, "orders after the kill", || {
            inventory.log()
        })
        .await?;
    let acked = buyers.finish().await?;
    scene.redis.until_healthy(HEALED_WITHIN).await?;
    scene.brokers.until_healthy(HEALED_WITHIN).await?;

    // Every acknowledged order reaches Kafka (a killed replica's entries
    // are taken over 10 s after it died).
    let wanted: BTreeSet<String> = acked
        .iter()
        .map(|id| flashsale_orders::order_id(id))
        .collect();
    poll_until(
        "every acknowledged order's created event on the topic",
        Duration::from_secs(90),
        Duration::from_millis(500),
        || async {
            let created = scene.created().await.map_err(|e| e.to_string())?;
            let on_topic: BTreeSet<&String> = created.iter().collect();
            match wanted.iter().filter(|id| !on_topic.contains(id)).count() {
                0 => Ok(()),
                missing => Err(format!(
                    "{missing} of {} acknowledged orders not on the topic",
                    wanted.len()
                )),
            }
        },
    )
    .await?;

    // Once the outbox is drained, the reserved units are exactly the orders.
    scene.drained().await?;
    let created = scene.created().await?;
    let orders: BTreeSet<&String> = created.iter().collect();
    let url = format!(
        "{}/v1/sales/{}/items/HOT/stock",
        inventory.api, scene.def.sale
    );
    let level: StockLevel = inventory.http.get(url).send().await?.json().await?;
    eprintln!(
        "{kill:?}: {} acknowledged, {} orders on the topic ({} created events), {} units reserved",
        acked.len(),
        orders.len(),
        created.len(),
        level.reserved
    );
    assert_eq!(
        level.reserved,
        orders.len() as u64,
        "every reserved unit is one order on the topic, and every order one unit"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_inventory_loses_no_acknowledged_order() -> anyhow::Result<()> {
    no_acknowledged_order_is_lost(Kill::Inventory).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_primary_loses_no_acknowledged_order() -> anyhow::Result<()> {
    no_acknowledged_order_is_lost(Kill::RedisPrimary).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_broker_loses_no_acknowledged_order() -> anyhow::Result<()> {
    no_acknowledged_order_is_lost(Kill::Broker).await
}
