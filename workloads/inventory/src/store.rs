//! Stock reservations in Redis: every state change is one Lua script, so no
//! interleaving of replicas, retries or sweepers can sell a unit twice.
//! The protocol and its failure analysis: `docs/design/inventory.md`.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

// The store takes and answers the API's own types: what Redis holds is
// what the inventory serves.
pub use flashsale_inventory_api::{
    Adjustment, ItemDefinition, LoadedItem, Reservation, ReservationState, SaleDefinition,
    StockLevel,
};
use flashsale_runtime::{RedisConnection, RedisTarget, RedisTimeouts};
use redis::Script;
use tokio::sync::RwLock;

use crate::{
    coalesce::{BatchItem, CoalesceSettings, Coalescer},
    keys::{SaleKeys, ShardKeys},
};

/// How long a sharded claim may take between its first and last step; longer
/// than any request deadline, so a late step cannot race the sweeper.
const CLAIM_WINDOW_MS: u64 = 10_000;

/// How long a fence against a late step 2 of a released claim lives: far
/// longer than any process pause that could delay that step.
const FENCE_MS: u64 = 24 * 3_600_000;

/// How long a sweeper holds the due ids it took before another replica may
/// take them (if it died mid-sweep).
const SWEEP_LEASE_MS: u64 = 5_000;

/// Errors talking to Redis or reading what it holds.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis failed or is unreachable.
    #[error("redis: {0}")]
    Redis(redis::RedisError),
    /// Redis is a read-only replica (a standby region's, not yet promoted):
    /// the inventory stands by and sells once it is promoted.
    #[error(
        "this region's Redis is a read-only replica: the inventory stands by and sells once it is promoted"
    )]
    Standby,
    /// The Redis URL names no server.
    #[error(transparent)]
    Url(#[from] flashsale_runtime::redis::InvalidRedisUrl),
    /// Redis holds something this code did not write.
    #[error("unexpected data in redis: {0}")]
    Corrupt(String),
    /// The sale was never loaded into this store.
    #[error("sale {0:?} is not loaded")]
    UnknownSale(String),
    /// A sharded claim ran past its window; the sweeper returns its units.
    #[error("reservation {0} did not complete in time; retry with the same request id")]
    ClaimExpired(String),
    /// Redis lost the sale's stock (a flush, a restart without persistence,
    /// a failover that dropped writes) after the sale opened. Recreating it
    /// would sell units again, so the inventory refuses to sell this sale
    /// until an operator restores or re-creates it.
    #[error("the stock of sale {sale:?} was lost by Redis ({what}); refusing to sell it again")]
    StockLost {
        /// The sale.
        sale: String,
        /// What is missing.
        what: String,
    },
    /// The durability policy's replicas did not confirm the write in time;
    /// the reservation exists on the primary and a retry under the same
    /// request id answers it once it is safe.
    #[error(
        "the write reached {acked} of {wanted} replicas in time; retry with the same request id"
    )]
    NotDurable {
        /// Replicas that confirmed.
        acked: u64,
        /// Replicas the policy asks for.
        wanted: u32,
    },
}

impl From<redis::RedisError> for StoreError {
    /// A write refused by a read-only replica is the standby's answer,
    /// however the replica became one (started as one, or demoted under
    /// the inventory while it sold).
    fn from(err: redis::RedisError) -> Self {
        if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly) {
            Self::Standby
        } else {
            Self::Redis(err)
        }
    }
}

/// What [`Store::check_held`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// Redis holds the sale.
    Held,
    /// Redis lost the sale, found by this check.
    LostNow,
    /// Redis lost the sale, found before.
    Lost,
}

/// When a reservation (or a payment) is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Once the primary applied it. Replication is asynchronous, so a
    /// failover may lose the last acknowledged writes; after such a loss the
    /// inventory refuses to sell the sale instead of reselling (see
    /// [`StoreError::StockLost`]), but writes acknowledged just before it may
    /// be gone.
    #[default]
    Fast,
    /// Once `replicas` replicas confirmed it (`WAIT`), or refused as
    /// [`StoreError::NotDurable`] after `timeout`: a failover that promotes a
    /// confirming replica keeps every acknowledged reservation.
    Replicated {
        /// Replicas that must confirm.
        replicas: u32,
        /// How long to wait for them.
        timeout: Duration,
    },
}

impl Durability {
    /// The policy `auto` picks, given the fewest replicas any primary has
    /// ([`Store::fewest_replicas`]): `replicated` with `replicas` where
    /// every primary has that many, since a failover then keeps every
    /// acknowledged write; `fast` where some primary has fewer, since a
    /// `WAIT` there could never be answered and every write would fail.
    pub fn auto(fewest_replicas: u64, replicas: u32, timeout: Duration) -> Self {
        let replicas = replicas.max(1);
        if fewest_replicas >= u64::from(replicas) {
            Self::Replicated { replicas, timeout }
        } else {
            Self::Fast
        }
    }

    /// Acknowledges nothing before `key`'s primary has the writes made on
    /// `conn` replicated as the policy asks (one `WAIT`). `since` is
    /// [`RedisConnection::generation`] read before the writes: a connection
    /// replaced in between cannot vouch for them.
    pub(crate) async fn confirm(
        &self,
        conn: &mut RedisConnection,
        key: &str,
        since: u64,
    ) -> Result<(), StoreError> {
        let Self::Replicated { replicas, timeout } = *self else {
            return Ok(());
        };
        let mut acked = conn.wait_for_replicas(key, replicas, timeout).await?;
        if conn.generation() != since {
            acked = 0;
        }
        if acked < u64::from(replicas) {
            return Err(StoreError::NotDurable {
                acked,
                wanted: replicas,
            });
        }
        Ok(())
    }

    /// Replicas every acknowledged write waits for (0 for `fast`).
    pub fn replicas(&self) -> u32 {
        match self {
            Self::Fast => 0,
            Self::Replicated { replicas, .. } => *replicas,
        }
    }
}

/// `connected_slaves` of an `INFO replication` answer.
fn connected_replicas(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
}

/// A reservation request.
#[derive(Debug, Clone)]
pub struct ReserveRequest<'a> {
    /// Sale.
    pub sale: &'a str,
    /// SKU.
    pub sku: &'a str,
    /// Buyer.
    pub user: &'a str,
    /// Units, at least 1.
    pub quantity: u64,
    /// Client-chosen id; a retry with the same id gets the same answer.
    pub request_id: &'a str,
    /// What the units cost, in minor units, as the caller priced them; kept
    /// on the record so every event about the order says the same amount.
    pub amount_minor: u64,
}

/// The answer to a reservation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// Units are held until the record's `expires_at_ms` (Unix ms, Redis clock).
    Reserved(Reservation),
    /// The request id was seen before, for the same SKU and quantity; this is
    /// its reservation as it is now.
    Existing(Reservation),
    /// The request id was used before for another SKU or quantity: refused,
    /// so one idempotency key never stands for two different orders.
    Mismatch {
        /// The reservation the request id belongs to.
        id: String,
    },
    /// Not enough units left.
    SoldOut,
    /// The user already holds `held` units and the limit forbids more.
    UserLimit {
        /// Units the user holds.
        held: u64,
    },
    /// The sale has no such SKU.
    UnknownSku,
}

/// The answer to a confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// Paid now.
    Confirmed,
    /// Was already paid (a retry).
    AlreadyConfirmed,
    /// Lapsed or cancelled before payment: refused.
    NotReserved,
    /// No such reservation.
    Missing,
}

/// The answer to a cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Units returned now.
    Cancelled,
    /// Already released (a retry, or it lapsed): nothing to do.
    AlreadyReleased,
    /// Paid: a cancel is a refund, not a stock release.
    Confirmed,
    /// No such reservation.
    Missing,
}

/// Source of the one-shard reserve script (admission + reserve of a batch of
/// requests of one SKU; one request is a batch of one), for callers that
/// measure or exercise it directly: call it with
/// [`crate::coalesce::batch_invocation`].
pub const RESERVE_LOCAL_LUA: &str = concat!(
    include_str!("lua/admit.lua"),
    include_str!("lua/reserve_batch.lua")
);
/// Source of step 1 of a sharded reservation (admission + claim).
pub const CLAIM_LUA: &str = concat!(include_str!("lua/admit.lua"), include_str!("lua/claim.lua"));
/// Source of step 2 of a sharded reservation.
pub const TAKE_LUA: &str = include_str!("lua/take.lua");

struct Scripts {
    claim: Script,
    take: Script,
    settle: Script,
    confirm: Script,
    begin_release: Script,
    give_back: Script,
    finish_release: Script,
    load_item: Script,
    adjust_shard: Script,
    claim_due: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            claim: Script::new(CLAIM_LUA),
            take: Script::new(TAKE_LUA),
            settle: Script::new(include_str!("lua/settle.lua")),
            confirm: Script::new(include_str!("lua/confirm.lua")),
            begin_release: Script::new(include_str!("lua/begin_release.lua")),
            give_back: Script::new(include_str!("lua/give_back.lua")),
            finish_release: Script::new(include_str!("lua/finish_release.lua")),
            load_item: Script::new(include_str!("lua/load_item.lua")),
            adjust_shard: Script::new(include_str!("lua/adjust_shard.lua")),
            claim_due: Script::new(include_str!("lua/claim_due.lua")),
        }
    }
}

#[derive(Debug)]
struct SaleInfo {
    ttl_ms: u64,
    shards: HashMap<String, u32>,
    /// Set once Redis is found to have lost the sale; never cleared by
    /// this process.
    lost: AtomicBool,
}

/// The reservation store over one Redis.
#[derive(Clone)]
pub struct Store {
    conn: RedisConnection,
    scripts: Arc<Scripts>,
    // Shared per sale so the hot path clones a pointer, not the SKU map.
    sales: Arc<RwLock<HashMap<String, Arc<SaleInfo>>>>,
    pub(crate) durability: Durability,
    // One-shard reservations of a SKU share script calls (`coalesce`).
    pub(crate) coalescer: Arc<Coalescer>,
    // Set while Redis is a read-only replica (`standby`).
    standby: Arc<AtomicBool>,
}

impl Store {
    /// A store over `conn`. Scripts are sent by SHA and reloaded on NOSCRIPT
    /// (after `SCRIPT FLUSH` or a Redis restart) by the `redis` crate.
    pub fn new(conn: RedisConnection) -> Self {
        Self {
            coalescer: Arc::new(Coalescer::new(
                conn.clone(),
                CoalesceSettings::default(),
                Durability::Fast,
            )),
            conn,
            scripts: Arc::new(Scripts::new()),
            sales: Arc::default(),
            durability: Durability::Fast,
            standby: Arc::default(),
        }
    }

    /// The same store, acknowledging writes by `durability`.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self.coalescer = Arc::new(self.coalescer.rebuilt(self.coalescer.settings, durability));
        self
    }

    /// Checks that Redis evicts nothing (`maxmemory-policy noeviction` on
    /// every primary): an evicted counter or record is stock sold twice.
    /// `Ok(false)` when Redis does not let this user read its settings
    /// (a restricted ACL user); the caller warns.
    pub async fn check_no_eviction(&self) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        let answers = match conn.on_every_primary(&get).await {
            Ok(answers) => answers,
            Err(err) if err.code() == Some("NOPERM") => return Ok(false),
            Err(err) => return Err(err.into()),
        };
        for answer in answers {
            let pairs: HashMap<String, String> = redis::from_redis_value(answer)
                .map_err(|e| StoreError::Corrupt(format!("CONFIG GET answered {e}")))?;
            match pairs.get("maxmemory-policy").map(String::as_str) {
                Some("noeviction") => {}
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "maxmemory-policy is {other:?}: Redis may evict stock; set it to noeviction"
                    )));
                }
            }
        }
        Ok(true)
    }

    /// The fewest replicas any primary has now (a single server's, or the
    /// least of a cluster's primaries), as `INFO replication` counts the
    /// connected ones.
    pub async fn fewest_replicas(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let answers = conn.on_every_primary(&info).await?;
        let mut fewest: Option<u64> = None;
        for answer in answers {
            let text: String = redis::from_redis_value(answer)
                .map_err(|e| StoreError::Corrupt(format!("INFO replication answered {e}")))?;
            let count = connected_replicas(&text).ok_or_else(|| {
                StoreError::Corrupt("INFO replication has no connected_slaves line".to_owned())
            })?;
            fewest = Some(fewest.map_or(count, |f| f.min(count)));
        }
        Ok(fewest.unwrap_or(0))
    }

    /// Acknowledges nothing before `key`'s primary has the writes replicated
    /// as the durability policy asks.
    /// `since` is [`RedisConnection::generation`] read before the writes: a
    /// connection replaced in between cannot vouch for them.
    pub(crate) async fn make_durable(&self, key: &str, since: u64) -> Result<(), StoreError> {
        self.durability
            .confirm(&mut self.conn.clone(), key, since)
            .await
    }

    /// Whether Redis still holds sale `sale` (its load marker). A sale found
    /// lost is refused from then on ([`StoreError::StockLost`]).
    pub async fn check_held(&self, sale: &str) -> Result<Holding, StoreError> {
        let info = self.sale(sale).await?;
        if info.lost.load(Ordering::Relaxed) {
            return Ok(Holding::Lost);
        }
        let mut conn = self.conn.clone();
        let present: bool = redis::cmd("EXISTS")
            .arg(SaleKeys::new(sale).loaded())
            .query_async(&mut conn)
            .await?;
        if present {
            return Ok(Holding::Held);
        }
        info.lost.store(true, Ordering::Relaxed);
        Ok(Holding::LostNow)
    }

    /// The sales Redis lost, as found so far.
    pub async fn lost_sales(&self) -> Vec<String> {
        self.sales
            .read()
            .await
            .iter()
            .filter(|(_, info)| info.lost.load(Ordering::Relaxed))
            .map(|(sale, _)| sale.clone())
            .collect()
    }

    /// Connects to `url`: one Redis or a cluster (see [`RedisTarget`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let target: RedisTarget = url.parse()?;
        let timeouts = RedisTimeouts {
            connect: std::time::Duration::from_secs(2),
            response: std::time::Duration::from_secs(2),
            ..RedisTimeouts::default()
        };
        Ok(Self::new(
            RedisConnection::connect(&target, timeouts).await?,
        ))
    }

    /// Loads a sale: creates what is missing and keeps every count that
    /// exists, so a reload or a restart never resells sold units. After the
    /// sale's opening it creates nothing: missing stock then is
    /// [`StoreError::StockLost`].
    pub async fn load(&self, def: &SaleDefinition) -> Result<Vec<LoadedItem>, StoreError> {
        let keys = SaleKeys::new(&def.sale);
        let mut conn = self.conn.clone();
        let opened = def.opening() > 0 && self.now_ms(&keys.loaded()).await? >= def.opening();
        let mut loaded = Vec::with_capacity(def.items.len());
        let mut shards = HashMap::new();
        for item in &def.items {
            let created: i64 = self
                .scripts
                .load_item
                .key(keys.sku(&item.sku))
                .key(keys.loaded())
                .arg(item.stock)
                .arg(item.per_user_limit)
                .arg(item.shards.max(1))
                .arg(def.opening())
                .invoke_async(&mut conn)
                .await?;
            if created < 0 {
                if item.sku == flashsale_drill_buyer::SKU {
                    // A sale that opened before drill stock existed: only
                    // drill orders go without, never real ones.
                    tracing::warn!(
                        sale = def.sale,
                        "no drill stock: the sale opened before it was created; drill orders are refused"
                    );
                    continue;
                }
                return Err(lost(&def.sale, &format!("the record of SKU {}", item.sku)));
            }
            // The SKU's own record decides its shape; a changed spec does not reshard.
            let (stock, count): (u64, u32) = redis::cmd("HMGET")
                .arg(keys.sku(&item.sku))
                .arg("stock")
                .arg("shards")
                .query_async(&mut conn)
                .await?;
            let count = count.max(1);
            for i in 0..count {
                let avail = keys.shard(&item.sku, count, i).avail();
                if opened {
                    let present: bool = redis::cmd("EXISTS")
                        .arg(&avail)
                        .query_async(&mut conn)
                        .await?;
                    if !present {
                        return Err(lost(&def.sale, &format!("shard {i} of SKU {}", item.sku)));
                    }
                    continue;
                }
                let share =
                    stock / u64::from(count) + u64::from(u64::from(i) < stock % u64::from(count));
                let _: () = redis::cmd("SET")
                    .arg(avail)
                    .arg(share)
                    .arg("NX")
                    .query_async(&mut conn)
                    .await?;
            }
            shards.insert(item.sku.clone(), count);
            loaded.push(LoadedItem {
                sku: item.sku.clone(),
                created: created == 1,
            });
        }
        self.sales.write().await.insert(
            def.sale.clone(),
            Arc::new(SaleInfo {
                ttl_ms: def.reservation_ttl_ms,
                shards,
                lost: AtomicBool::new(false),
            }),
        );
        Ok(loaded)
    }

    /// Redis's clock (Unix ms) on the primary that owns `key`.
    async fn now_ms(&self, key: &str) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let value = conn.on_primary_of(key, &redis::cmd("TIME")).await?;
        let (secs, micros): (u64, u64) = redis::from_redis_value(value)
            .map_err(|e| StoreError::Corrupt(format!("TIME answered {e}")))?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// Names of the sales loaded into this store.
    /// While the store stands by, none: the background jobs have nothing
    /// to write.
    pub async fn sales(&self) -> Vec<String> {
        if self.standing_by() {
            return Vec::new();
        }
        self.sales.read().await.keys().cloned().collect()
    }

    /// Whether Redis takes writes: a read-only replica refuses a script
    /// that declares it may write (`#!lua` without `no-writes`), before
    /// running it, so the check writes nothing and needs no admin command
    /// (the inventory's ACL user has none). A cluster always does: it
    /// promotes its own replicas, and the connection follows them.
    pub async fn writable(&self) -> Result<bool, StoreError> {
        if self.conn.is_cluster() {
            return Ok(true);
        }
        let mut conn = self.conn.clone();
        let probe = redis::cmd("EVAL")
            .arg("#!lua\nreturn 1")
            .arg(0)
            .query_async::<i64>(&mut conn)
            .await;
        match probe.map_err(StoreError::from) {
            Ok(_) => Ok(true),
            Err(StoreError::Standby) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Whether the store stands by: every sale operation answers
    /// [`StoreError::Standby`] until [`Store::set_standby`] clears it.
    pub fn standing_by(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    /// Stands by (`true`) or sells again (`false`).
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Relaxed);
    }

    /// A handle on the store's Redis connection (multiplexed; cheap).
    pub(crate) fn connection(&self) -> RedisConnection {
        self.conn.clone()
    }

    /// Whether Redis answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    async fn sale(&self, sale: &str) -> Result<Arc<SaleInfo>, StoreError> {
        if self.standing_by() {
            return Err(StoreError::Standby);
        }
        self.sales
            .read()
            .await
            .get(sale)
            .cloned()
            .ok_or_else(|| StoreError::UnknownSale(sale.to_owned()))
    }

    /// Reserves units: one script for a SKU with one shard, three steps for a
    /// sharded one (claim, take from a shard, settle). A reservation is
    /// answered once it is as safe as the durability policy asks.
    pub async fn reserve(&self, req: &ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        let since = self.conn.generation();
        let (outcome, confirmed) = self.decide_reservation(req).await?;
        if !confirmed
            && matches!(
                outcome,
                ReserveOutcome::Reserved(_) | ReserveOutcome::Existing(_)
            )
        {
            self.make_durable(&SaleKeys::new(req.sale).sku(req.sku), since)
                .await?;
        }
        Ok(outcome)
    }

    /// The outcome, and whether it is already as durable as the policy
    /// asks (a coalesced batch is confirmed by the fence, `fence.rs`).
    async fn decide_reservation(
        &self,
        req: &ReserveRequest<'_>,
    ) -> Result<(ReserveOutcome, bool), StoreError> {
        let info = self.sale(req.sale).await?;
        if info.lost.load(Ordering::Relaxed) {
            return Err(lost(req.sale, "its load marker"));
        }
        let Some(&shards) = info.shards.get(req.sku) else {
            return Ok((ReserveOutcome::UnknownSku, true));
        };
        let keys = SaleKeys::new(req.sale);
        let uuid = uuid::Uuid::new_v4();
        let id = uuid.simple().to_string();
        let mut conn = self.conn.clone();
        let fresh = |expires_at_ms| Reservation {
            id: id.clone(),
            sku: req.sku.to_owned(),
            user: req.user.to_owned(),
            quantity: req.quantity,
            amount_minor: req.amount_minor,
            request_id: req.request_id.to_owned(),
            state: ReservationState::Reserved,
            reason: None,
            expires_at_ms,
        };
        if shards == 1 {
            let item = BatchItem {
                user: req.user.to_owned(),
                quantity: req.quantity,
                reservation_id: id.clone(),
                request_id: req.request_id.to_owned(),
                amount_minor: req.amount_minor,
                ttl_ms: info.ttl_ms,
            };
            let reply = self.coalescer.reserve(req.sale, req.sku, item).await?;
            return Ok((self.reserve_reply(&keys, reply, fresh).await?, true));
        }

        let reply: Vec<String> = admission(&self.scripts.claim, &keys, req, &id, CLAIM_WINDOW_MS)
            .invoke_async(&mut conn)
            .await?;
        if reply.first().map(String::as_str) != Some("claimed") {
            return Ok((self.reserve_reply(&keys, reply, fresh).await?, false));
        }
        // A random first shard spreads buyers; the others are tried in turn.
        let start = (uuid.as_u128() % u128::from(shards)) as u32;
        let taken_from = self
            .take_from_a_shard(&mut conn, &keys, req, &id, shards, start)
            .await?;
        let settled: Vec<String> = self
            .scripts
            .settle
            .key(keys.reservation(&id))
            .key(keys.expiry())
            .key(keys.user(req.sku, req.user))
            .key(keys.outbox())
            .arg(&id)
            .arg(taken_from)
            .arg(info.ttl_ms)
            .invoke_async(&mut conn)
            .await?;
        match settled.first().map(String::as_str) {
            Some("reserved") => Ok((
                ReserveOutcome::Reserved(fresh(
                    settled
                        .get(1)
                        .and_then(|e| e.parse().ok())
                        .unwrap_or_default(),
                )),
                false,
            )),
            Some("sold_out") => Ok((ReserveOutcome::SoldOut, true)),
            _ => Err(StoreError::ClaimExpired(id)),
        }
    }

    /// Takes the claimed units of reservation `id` from the first shard, from
    /// `start` on, that has them; the shard's index, or -1 when every shard
    /// was empty. A claim the sweeper already released is `ClaimExpired`.
    async fn take_from_a_shard(
        &self,
        conn: &mut RedisConnection,
        keys: &SaleKeys,
        req: &ReserveRequest<'_>,
        id: &str,
        shards: u32,
        start: u32,
    ) -> Result<i64, StoreError> {
        for step in 0..shards {
            let index = (start + step) % shards;
            let shard = keys.shard(req.sku, shards, index);
            let since = conn.generation();
            let outcome: String = self
                .scripts
                .take
                .key(shard.avail())
                .key(shard.held())
                .key(shard.taken(id))
                .arg(req.quantity)
                .invoke_async(conn)
                .await?;
            match outcome.as_str() {
                "taken" => {
                    self.make_durable(&shard.avail(), since).await?;
                    return Ok(i64::from(index));
                }
                "empty" => continue,
                // Fenced: the sweeper released this claim after its window.
                _ => return Err(StoreError::ClaimExpired(id.to_owned())),
            }
        }
        Ok(-1)
    }

    async fn reserve_reply(
        &self,
        keys: &SaleKeys,
        reply: Vec<String>,
        fresh: impl FnOnce(u64) -> Reservation,
    ) -> Result<ReserveOutcome, StoreError> {
        let field = |i: usize| reply.get(i).cloned().unwrap_or_default();
        match reply.first().map(String::as_str) {
            Some("reserved") => Ok(ReserveOutcome::Reserved(fresh(
                field(2).parse().unwrap_or_default(),
            ))),
            Some("mismatch") => Ok(ReserveOutcome::Mismatch { id: field(1) }),
            Some("duplicate") => match self.reservation_by_key(keys, &field(1)).await? {
                Some(existing) => Ok(ReserveOutcome::Existing(existing)),
                None => Err(StoreError::Corrupt(format!(
                    "request maps to missing reservation {}",
                    field(1)
                ))),
            },
            Some("sold_out") => Ok(ReserveOutcome::SoldOut),
            Some("user_limit") => Ok(ReserveOutcome::UserLimit {
                held: field(1).parse().unwrap_or_default(),
            }),
            Some("unknown_sku") => Ok(ReserveOutcome::UnknownSku),
            other => Err(StoreError::Corrupt(format!(
                "reserve script answered {other:?}"
            ))),
        }
    }

    /// Reads a reservation.
    pub async fn reservation(
        &self,
        sale: &str,
        id: &str,
    ) -> Result<Option<Reservation>, StoreError> {
        self.reservation_by_key(&SaleKeys::new(sale), id).await
    }

    /// Reads several reservations of `sale` in one round trip, in order;
    /// a record that cannot be read fails alone.
    pub async fn reservations(
        &self,
        sale: &str,
        ids: &[&str],
    ) -> Result<Vec<Result<Option<Reservation>, StoreError>>, StoreError> {
        let keys = SaleKeys::new(sale);
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("HGETALL").arg(keys.reservation(id));
        }
        let mut conn = self.conn.clone();
        let replies: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        Ok(ids
            .iter()
            .zip(replies)
            .map(|(id, fields)| record(id, &fields))
            .collect())
    }

    async fn reservation_by_key(
        &self,
        keys: &SaleKeys,
        id: &str,
    ) -> Result<Option<Reservation>, StoreError> {
        let mut conn = self.conn.clone();
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(keys.reservation(id))
            .query_async(&mut conn)
            .await?;
        record(id, &fields)
    }
    /// Marks a reservation paid. Refused once it lapsed, even before the
    /// sweeper returned its units.
    pub async fn confirm(&self, sale: &str, id: &str) -> Result<ConfirmOutcome, StoreError> {
        let keys = SaleKeys::new(sale);
        let Some(resv) = self.reservation_by_key(&keys, id).await? else {
            return Ok(ConfirmOutcome::Missing);
        };
        let mut conn = self.conn.clone();
        let since = conn.generation();
        let outcome: String = self
            .scripts
            .confirm
            .key(keys.reservation(id))
            .key(keys.expiry())
            .key(keys.sku(&resv.sku))
            .arg(id)
            .invoke_async(&mut conn)
            .await?;
        if outcome == "confirmed" {
            self.make_durable(&keys.sku(&resv.sku), since).await?;
        }
        Ok(match outcome.as_str() {
            "confirmed" if resv.state == ReservationState::Confirmed => {
                ConfirmOutcome::AlreadyConfirmed
            }
            "confirmed" => ConfirmOutcome::Confirmed,
            "missing" => ConfirmOutcome::Missing,
            _ => ConfirmOutcome::NotReserved,
        })
    }

    /// Cancels an unpaid reservation and returns its units.
    pub async fn cancel(&self, sale: &str, id: &str) -> Result<CancelOutcome, StoreError> {
        Ok(match self.release(sale, id, "cancelled", false).await? {
            Release::Released => CancelOutcome::Cancelled,
            Release::Missing => CancelOutcome::Missing,
            Release::Other(state) if state == "confirmed" => CancelOutcome::Confirmed,
            Release::Other(_) => CancelOutcome::AlreadyReleased,
        })
    }

    /// Returns up to `batch` reservations whose time has passed (unpaid ones
    /// after the TTL, stuck sharded claims after their window). Replicas
    /// share the work: each takes other due ids (`claim_due.lua`), and each
    /// reservation is returned, and counted, once. Ids whose record is gone
    /// leave the queue, so they cannot wedge it.
    pub async fn sweep(&self, sale: &str, batch: usize) -> Result<u64, StoreError> {
        let keys = SaleKeys::new(sale);
        let mut conn = self.conn.clone();
        let due: Vec<String> = self
            .scripts
            .claim_due
            .key(keys.expiry())
            .arg(batch)
            .arg(SWEEP_LEASE_MS)
            .invoke_async(&mut conn)
            .await?;
        let mut released = 0;
        for id in due {
            match self.release(sale, &id, "expired", true).await? {
                Release::Released => released += 1,
                Release::Missing => {
                    let _: () = redis::cmd("ZREM")
                        .arg(keys.expiry())
                        .arg(&id)
                        .query_async(&mut conn)
                        .await?;
                }
                Release::Other(_) => {}
            }
        }
        Ok(released)
    }

    /// begin → give back on the shard(s) → finish; each step is idempotent,
    /// so a crash anywhere is finished by the next sweeper.
    async fn release(
        &self,
        sale: &str,
        id: &str,
        reason: &str,
        only_if_due: bool,
    ) -> Result<Release, StoreError> {
        let keys = SaleKeys::new(sale);
        let mut conn = self.conn.clone();
        let begun: Vec<String> = self
            .scripts
            .begin_release
            .key(keys.reservation(id))
            .key(keys.expiry())
            .arg(id)
            .arg(reason)
            .arg(if only_if_due { "due" } else { "now" })
            .invoke_async(&mut conn)
            .await?;
        let field = |i: usize| begun.get(i).cloned().unwrap_or_default();
        match field(0).as_str() {
            "releasing" => {}
            "missing" => return Ok(Release::Missing),
            state => return Ok(Release::Other(state.to_owned())),
        }
        let (sku, user) = (field(3), field(4));
        // The SKU's record says how many shards it has: this replica may
        // never have loaded the sale, and a guess would leak the other shards.
        let shards: Option<u32> = redis::cmd("HGET")
            .arg(keys.sku(&sku))
            .arg("shards")
            .query_async(&mut conn)
            .await?;
        let shards = shards
            .filter(|&n| n >= 1)
            .ok_or_else(|| StoreError::Corrupt(format!("SKU {sku} has no shard count")))?;
        let shard: i64 = field(1)
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("reservation {id} shard")))?;
        match u32::try_from(shard) {
            Ok(index) => {
                self.give_back(&keys.shard(&sku, shards, index), id, false)
                    .await?;
            }
            // A claim that never settled may have taken from any shard: ask
            // them all, and fence each against its late step 2.
            Err(_) => {
                for index in 0..shards {
                    self.give_back(&keys.shard(&sku, shards, index), id, true)
                        .await?;
                }
            }
        }
        let finished: i64 = self
            .scripts
            .finish_release
            .key(keys.reservation(id))
            .key(keys.expiry())
            .key(keys.user(&sku, &user))
            .key(keys.outbox())
            .arg(id)
            .invoke_async(&mut conn)
            .await?;
        Ok(if finished == 1 {
            Release::Released
        } else {
            Release::Other("released".to_owned())
        })
    }

    async fn give_back(&self, shard: &ShardKeys, id: &str, fence: bool) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        Ok(self
            .scripts
            .give_back
            .key(shard.avail())
            .key(shard.held())
            .key(shard.taken(id))
            .arg(if fence { "fence" } else { "" })
            .arg(FENCE_MS)
            .invoke_async(&mut conn)
            .await?)
    }

    /// Stock of a SKU. Each shard is read atomically (`MGET` of its two
    /// counters, one slot), the shards concurrently: a shard's `avail +
    /// held` is constant, so the total stock is exact even while
    /// reservations run; `reserved` and `sold` are a moment's view.
    pub async fn stock(&self, sale: &str, sku: &str) -> Result<Option<StockLevel>, StoreError> {
        let info = self.sale(sale).await?;
        let Some(&shards) = info.shards.get(sku) else {
            return Ok(None);
        };
        let keys = SaleKeys::new(sale);
        let read_shard = |index: u32| {
            let shard = keys.shard(sku, shards, index);
            let mut conn = self.conn.clone();
            async move {
                let (avail, held): (Option<i64>, Option<i64>) = redis::cmd("MGET")
                    .arg(shard.avail())
                    .arg(shard.held())
                    .query_async(&mut conn)
                    .await?;
                let count = |c: Option<i64>| u64::try_from(c.unwrap_or(0)).unwrap_or(0);
                Ok::<_, StoreError>((count(avail), count(held)))
            }
        };
        let mut conn = self.conn.clone();
        let mut sold = redis::cmd("HGET");
        sold.arg(keys.sku(sku)).arg("sold");
        let (sold, counts) = tokio::join!(
            sold.query_async::<Option<u64>>(&mut conn),
            futures::future::try_join_all((0..shards).map(read_shard))
        );
        let (sold, counts) = (sold?.unwrap_or(0), counts?);
        let available = counts.iter().map(|(a, _)| a).sum::<u64>();
        let held = counts.iter().map(|(_, h)| h).sum::<u64>();
        // Stock is what the shards hold, so it can never disagree with them.
        Ok(Some(StockLevel {
            stock: available + held,
            available,
            reserved: held.saturating_sub(sold),
            sold,
        }))
    }

    /// Changes a SKU's stock by `delta` units and records who did it and why
    /// in the sale's audit stream. A decrease takes only available units
    /// (never reserved or sold ones), so it may apply less than asked; the
    /// report says how much.
    pub async fn adjust(
        &self,
        sale: &str,
        sku: &str,
        delta: i64,
        reason: &str,
    ) -> Result<Option<Adjustment>, StoreError> {
        let info = self.sale(sale).await?;
        let Some(&shards) = info.shards.get(sku) else {
            return Ok(None);
        };
        let Some(before) = self.stock(sale, sku).await? else {
            return Ok(None);
        };
        let keys = SaleKeys::new(sale);
        let mut conn = self.conn.clone();
        let mut applied: i64 = 0;
        let count = i64::from(shards);
        for index in 0..shards {
            let shard = keys.shard(sku, shards, index);
            let step = if delta >= 0 {
                // Spread an increase evenly, the remainder on the first shards.
                delta / count + i64::from(i64::from(index) < delta % count)
            } else {
                let avail: Option<i64> = redis::cmd("GET")
                    .arg(shard.avail())
                    .query_async(&mut conn)
                    .await?;
                -(avail.unwrap_or(0).max(0)).min(-(delta - applied))
            };
            if step == 0 {
                continue;
            }
            let reply: (String, i64) = self
                .scripts
                .adjust_shard
                .key(shard.avail())
                .arg(step)
                .invoke_async(&mut conn)
                .await?;
            if reply.0 == "ok" {
                applied += step;
            }
        }
        let after = self.stock(sale, sku).await?.unwrap_or(before);
        let _: String = redis::cmd("XADD")
            .arg(keys.audit())
            .arg("MAXLEN")
            .arg("~")
            .arg(10_000)
            .arg("*")
            .arg("sku")
            .arg(sku)
            .arg("requested")
            .arg(delta)
            .arg("applied")
            .arg(applied)
            .arg("reason")
            .arg(reason)
            .arg("stock_before")
            .arg(before.stock)
            .arg("stock_after")
            .arg(after.stock)
            .query_async(&mut conn)
            .await?;
        Ok(Some(Adjustment {
            sku: sku.to_owned(),
            requested: delta,
            applied,
            reason: reason.to_owned(),
            before,
            after,
        }))
    }

    /// Units a user holds of a SKU (reserved + sold).
    pub async fn held_by(&self, sale: &str, sku: &str, user: &str) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let held: Option<u64> = redis::cmd("GET")
            .arg(SaleKeys::new(sale).user(sku, user))
            .query_async(&mut conn)
            .await?;
        Ok(held.unwrap_or(0))
    }
}

/// The keys and arguments `admit.lua` and the scripts it prefixes share;
/// `window_ms` is the reservation TTL or the claim window. Public so tests
/// can stage a sharded claim ([`CLAIM_LUA`]) whose replica then dies.
pub fn admission<'a>(
    script: &'a Script,
    keys: &SaleKeys,
    req: &ReserveRequest<'_>,
    id: &str,
    window_ms: u64,
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.key(keys.sku(req.sku));
    invocation
        .key(keys.user(req.sku, req.user))
        .key(keys.request(req.request_id))
        .key(keys.reservation(id))
        .key(keys.expiry())
        .arg(req.quantity)
        .arg(id)
        .arg(req.user)
        .arg(req.sku)
        .arg(window_ms)
        .arg(req.amount_minor)
        .arg(req.request_id);
    invocation
}

/// The reservation `id` from its hash's fields; `None` when it has none.
fn record(id: &str, fields: &HashMap<String, String>) -> Result<Option<Reservation>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let get = |k: &str| {
        fields
            .get(k)
            .cloned()
            .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} lacks {k}")))
    };
    let state = match get("state")?.as_str() {
        "pending" => ReservationState::Pending,
        "reserved" => ReservationState::Reserved,
        "confirmed" => ReservationState::Confirmed,
        "releasing" => ReservationState::Releasing,
        "released" => ReservationState::Released,
        other => {
            return Err(StoreError::Corrupt(format!(
                "reservation {id} in state {other:?}"
            )));
        }
    };
    Ok(Some(Reservation {
        id: id.to_owned(),
        sku: get("sku")?,
        user: get("user")?,
        quantity: get("qty")?
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("reservation {id} qty")))?,
        // Absent on records written before amounts were kept.
        amount_minor: fields
            .get("amount")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0),
        request_id: get("request")?,
        state,
        reason: fields.get("reason").cloned(),
        expires_at_ms: get("expires_at")?.parse().unwrap_or_default(),
    }))
}

fn lost(sale: &str, what: &str) -> StoreError {
    StoreError::StockLost {
        sale: sale.to_owned(),
        what: what.to_owned(),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Release {
    Released,
    Missing,
    Other(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_replicated_only_where_every_primary_has_the_replicas() {
        let timeout = Duration::from_millis(50);
        let replicated = Durability::Replicated {
            replicas: 1,
            timeout,
        };
        assert_eq!(Durability::auto(0, 1, timeout), Durability::Fast);
        assert_eq!(Durability::auto(1, 1, timeout), replicated);
        assert_eq!(Durability::auto(3, 1, timeout), replicated);
        // Two asked, one there: a WAIT for two would never be answered.
        assert_eq!(Durability::auto(1, 2, timeout), Durability::Fast);
        // Zero asked means one.
        assert_eq!(Durability::auto(1, 0, timeout), replicated);
        assert_eq!(replicated.replicas(), 1);
        assert_eq!(Durability::Fast.replicas(), 0);
    }

    #[test]
    fn connected_replicas_are_read_from_info_replication() {
        let primary =
            "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=10.0.0.2\r\n";
        assert_eq!(connected_replicas(primary), Some(2));
        assert_eq!(
            connected_replicas("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"),
            Some(0)
        );
        assert_eq!(connected_replicas("role:master\r\n"), None);
    }
}
