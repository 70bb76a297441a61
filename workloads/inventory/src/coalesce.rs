//! Request coalescing for one-shard SKUs: concurrent reservations of one
//! (sale, SKU) on this replica are decided by one call of the reserve script
//! instead of one call each. See "Coalescing reservations" in
//! `docs/design/inventory.md`.
//!
//! Shape: one `Mutex<HashMap<(sale, SKU), queue>>`. A SKU has a queue only
//! while a drain task runs for it; the request that finds none creates it
//! and spawns the task, so at low load a request goes straight to Redis (no
//! timer, no waiting). While a call is in flight, later requests join the
//! queue; when the call returns, the task sends everything queued (up to
//! [`CoalesceSettings::max_batch`]) as the next call, and removes the queue
//! when nothing is left. A mutex rather than a long-lived task per SKU with a
//! channel: nothing idles per SKU, a SKU that goes quiet costs nothing, and
//! the lock is held only to push or take (never across an await).
//!
//! Each request waits for its answer on a oneshot. The drain task owns the
//! senders, so a waiter that goes away (a cancelled HTTP request) is skipped
//! if its call has not started, and otherwise its answer is dropped; either
//! way the others are untouched. A Redis error fails every member of the
//! batch with the same error; each caller retries under its own request id,
//! which the script answers with the reservation if the failed call did run.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, RwLock},
    time::Duration,
};

use flashsale_runtime::RedisConnection;
use redis::{ErrorKind, RedisError, Script, ScriptInvocation};
use scopeguard::ScopeGuard;
use tokio::sync::oneshot;

use crate::{
    keys::SaleKeys,
    metrics::Metrics,
    store::{Durability, RESERVE_LOCAL_LUA, Store, StoreError},
};

/// How reservations of one SKU are gathered into script calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceSettings {
    /// Most reservations one call decides; more queued start another call.
    pub max_batch: usize,
    /// How long a drain waits for more requests before its first call, when
    /// nothing was in flight. Zero (the default): a lone request goes at once.
    pub window: Duration,
}

impl Default for CoalesceSettings {
    fn default() -> Self {
        Self {
            max_batch: 128,
            window: Duration::ZERO,
        }
    }
}

/// One reservation of a batch, as the reserve script takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    /// Buyer.
    pub user: String,
    /// Units, at least 1.
    pub quantity: u64,
    /// Id of the reservation made if the request is granted.
    pub reservation_id: String,
    /// The client's request id.
    pub request_id: String,
    /// Price of the units in minor units.
    pub amount_minor: u64,
    /// How long the reservation stays unpaid, in milliseconds.
    pub ttl_ms: u64,
}

/// The call of [`RESERVE_LOCAL_LUA`] that decides `items`, in order, for
/// one-shard SKU `sku` of `sale`. Its answer is one reply per item (an
/// array of arrays of strings). A single reservation is a batch of one.
pub fn batch_invocation<'a>(
    script: &'a Script,
    sale: &SaleKeys,
    sku: &str,
    items: &[BatchItem],
) -> ScriptInvocation<'a> {
    let shard = sale.shard(sku, 1, 0);
    let mut call = script.key(sale.sku(sku));
    call.key(sale.expiry())
        .key(shard.avail())
        .key(shard.held())
        .key(sale.outbox())
        .arg(sku);
    for item in items {
        call.key(sale.user(sku, &item.user))
            .key(sale.request(&item.request_id))
            .key(sale.reservation(&item.reservation_id))
            .key(shard.taken(&item.reservation_id))
            .arg(item.quantity)
            .arg(&item.reservation_id)
            .arg(&item.user)
            .arg(item.ttl_ms)
            .arg(item.amount_minor)
            .arg(&item.request_id);
    }
    call
}

/// Why a coalesced reservation got no answer from the script.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum BatchError {
    /// Redis failed the batch's call.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// The script answered something that does not fit the batch.
    #[error("unexpected data in redis: {0}")]
    Corrupt(String),
    /// The drain task ended without answering (a panic or shutdown).
    #[error("the reservation batch was abandoned")]
    Abandoned,
    /// The batch's `WAIT` found too few replicas in time.
    #[error("the batch reached {acked} of {wanted} replicas in time")]
    NotDurable {
        /// Replicas that confirmed.
        acked: u64,
        /// Replicas the policy asks for.
        wanted: u32,
    },
}

impl From<BatchError> for StoreError {
    fn from(err: BatchError) -> Self {
        match err {
            BatchError::Redis(err) => Self::from(err),
            BatchError::Corrupt(what) => Self::Corrupt(what),
            BatchError::Abandoned => Self::Redis(RedisError::from((
                ErrorKind::Io,
                "the reservation batch was abandoned; retry with the same request id",
            ))),
            BatchError::NotDurable { acked, wanted } => Self::NotDurable { acked, wanted },
        }
    }
}

/// The raw reply of one reservation: the script's strings for it.
type Reply = Result<Vec<String>, BatchError>;

/// A (sale, SKU).
type SkuKey = (String, String);

/// The queues of waiting requests per SKU. A SKU is present exactly while a
/// drain task runs for it. Pure bookkeeping, so it is tested without Redis.
#[derive(Debug)]
pub(crate) struct Queues<T> {
    pending: HashMap<SkuKey, VecDeque<T>>,
}

impl<T> Default for Queues<T> {
    fn default() -> Self {
        Self {
            pending: HashMap::new(),
        }
    }
}

impl<T> Queues<T> {
    /// Queues `item`; `true` if no drain runs for the SKU, so the caller
    /// must start one.
    pub(crate) fn push(&mut self, key: SkuKey, item: T) -> bool {
        match self.pending.get_mut(&key) {
            Some(queue) => {
                queue.push_back(item);
                false
            }
            None => {
                self.pending.insert(key, VecDeque::from([item]));
                true
            }
        }
    }

    /// The next batch of the SKU, oldest first, at most `max` (at least one);
    /// empty when nothing waits, and then the SKU's drain is over: the next
    /// push starts a new one.
    pub(crate) fn take(&mut self, key: &SkuKey, max: usize) -> Vec<T> {
        let Some(queue) = self.pending.get_mut(key) else {
            return Vec::new();
        };
        if queue.is_empty() {
            self.pending.remove(key);
            return Vec::new();
        }
        let count = queue.len().min(max.max(1));
        queue.drain(..count).collect()
    }

    /// Ends the SKU's drain, giving back what still waits.
    pub(crate) fn abandon(&mut self, key: &SkuKey) -> Vec<T> {
        self.pending.remove(key).map(Vec::from).unwrap_or_default()
    }

    /// Whether a drain runs for the SKU.
    #[cfg(test)]
    fn draining(&self, key: &SkuKey) -> bool {
        self.pending.contains_key(key)
    }
}

struct Waiter {
    item: BatchItem,
    answer: oneshot::Sender<Reply>,
}

/// Gathers concurrent one-shard reservations per SKU into script calls.
pub(crate) struct Coalescer {
    conn: RedisConnection,
    script: Script,
    pub(crate) settings: CoalesceSettings,
    durability: Durability,
    queues: Mutex<Queues<Waiter>>,
    metrics: RwLock<Option<Metrics>>,
}

impl Coalescer {
    pub(crate) fn new(
        conn: RedisConnection,
        settings: CoalesceSettings,
        durability: Durability,
    ) -> Self {
        Self {
            conn,
            script: Script::new(RESERVE_LOCAL_LUA),
            settings,
            durability,
            queues: Mutex::default(),
            metrics: RwLock::new(None),
        }
    }

    /// A coalescer on the same connection and metrics with other settings
    /// or durability.
    pub(crate) fn rebuilt(&self, settings: CoalesceSettings, durability: Durability) -> Self {
        let metrics = self
            .metrics
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let coalescer = Self::new(self.conn.clone(), settings, durability);
        *coalescer
            .metrics
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = metrics;
        coalescer
    }

    fn queues(&self) -> MutexGuard<'_, Queues<Waiter>> {
        // The lock guards plain pushes and takes; a panic cannot leave it torn.
        self.queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Decides `item` for one-shard SKU `sku` of `sale`, together with the
    /// requests of the same SKU that arrive while a call is in flight.
    pub(crate) async fn reserve(self: &Arc<Self>, sale: &str, sku: &str, item: BatchItem) -> Reply {
        let (answer, reply) = oneshot::channel();
        let key = (sale.to_owned(), sku.to_owned());
        let start = self.queues().push(key.clone(), Waiter { item, answer });
        if start {
            tokio::spawn(self.clone().drain(key));
        }
        reply.await.unwrap_or(Err(BatchError::Abandoned))
    }

    /// Sends the SKU's queue as calls of at most `max_batch` until it is empty.
    async fn drain(self: Arc<Self>, key: SkuKey) {
        // Ends the drain if this task is dropped or panics mid-way, so the
        // SKU does not stay "in flight" forever: the queued waiters' senders
        // drop (they see `Abandoned`) and the next request starts afresh.
        let abandon = scopeguard::guard((), |()| drop(self.queues().abandon(&key)));
        if !self.settings.window.is_zero() {
            tokio::time::sleep(self.settings.window).await;
        }
        loop {
            let batch = self.queues().take(&key, self.settings.max_batch);
            if batch.is_empty() {
                // The empty take ended the drain.
                ScopeGuard::into_inner(abandon);
                return;
            }
            // A waiter that went away before its call is not sent at all.
            let batch: Vec<Waiter> = batch
                .into_iter()
                .filter(|w| !w.answer.is_closed())
                .collect();
            if batch.is_empty() {
                continue;
            }
            self.call(&key, batch).await;
        }
    }

    async fn call(&self, (sale, sku): &SkuKey, batch: Vec<Waiter>) {
        if let Some(metrics) = self
            .metrics
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
        {
            metrics.reserve_batch(batch.len());
        }
        let (items, answers): (Vec<BatchItem>, Vec<oneshot::Sender<Reply>>) =
            batch.into_iter().map(|w| (w.item, w.answer)).unzip();
        let mut conn = self.conn.clone();
        let since = conn.generation();
        let keys = SaleKeys::new(sale);
        let result: Result<Vec<Vec<String>>, BatchError> =
            batch_invocation(&self.script, &keys, sku, &items)
                .invoke_async(&mut conn)
                .await
                .map_err(BatchError::from)
                .and_then(|replies: Vec<Vec<String>>| {
                    if replies.len() == items.len() {
                        Ok(replies)
                    } else {
                        Err(BatchError::Corrupt(format!(
                            "reserve script answered {} replies to {} requests",
                            replies.len(),
                            items.len()
                        )))
                    }
                });
        // A send fails only if its waiter went away; the others still get theirs.
        match result {
            Ok(replies) => {
                // One WAIT for the whole batch: no member that holds a
                // reservation is answered before it, and if it fails they
                // all fail (their retries find their reservations).
                let holds = |reply: &[String]| {
                    matches!(
                        reply.first().map(String::as_str),
                        Some("reserved" | "duplicate")
                    )
                };
                let confirmed = if replies.iter().any(|r| holds(r)) {
                    self.durability
                        .confirm(&mut conn, &keys.sku(sku), since)
                        .await
                        .map_err(|err| match err {
                            StoreError::NotDurable { acked, wanted } => {
                                BatchError::NotDurable { acked, wanted }
                            }
                            StoreError::Redis(err) => BatchError::Redis(err),
                            other => BatchError::Corrupt(other.to_string()),
                        })
                } else {
                    Ok(())
                };
                for (answer, reply) in answers.into_iter().zip(replies) {
                    let reply = match &confirmed {
                        Err(err) if holds(&reply) => Err(err.clone()),
                        _ => Ok(reply),
                    };
                    let _ = answer.send(reply);
                }
            }
            Err(err) => {
                for answer in answers {
                    let _ = answer.send(Err(err.clone()));
                }
            }
        }
    }
}

impl Store {
    /// The same store with other coalescing settings. Call before the store
    /// is cloned and used: clones made earlier keep the old settings.
    pub fn with_coalescing(mut self, settings: CoalesceSettings) -> Self {
        let durability = self.coalescer.durability;
        self.coalescer = Arc::new(self.coalescer.rebuilt(settings, durability));
        self
    }

    /// Records the size of every reserve script call of this store (and its
    /// clones) in `metrics` (`flashsale_inventory_reserve_batch_size`).
    pub fn record_batch_sizes(&self, metrics: &Metrics) {
        *self
            .coalescer
            .metrics
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(metrics.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sku: &str) -> SkuKey {
        ("s".to_owned(), sku.to_owned())
    }

    #[test]
    fn the_first_request_starts_a_drain_and_later_ones_join_it() {
        let mut queues = Queues::default();
        assert!(queues.push(key("A"), 1));
        assert!(!queues.push(key("A"), 2));
        // Another SKU has a drain of its own.
        assert!(queues.push(key("B"), 10));
        assert!(!queues.push(key("A"), 3));
        assert_eq!(queues.take(&key("A"), 128), vec![1, 2, 3]);
        assert_eq!(queues.take(&key("B"), 128), vec![10]);
    }

    #[test]
    fn batches_are_bounded_and_keep_arrival_order() {
        let mut queues = Queues::default();
        for i in 0..300 {
            queues.push(key("A"), i);
        }
        let first = queues.take(&key("A"), 128);
        let second = queues.take(&key("A"), 128);
        let third = queues.take(&key("A"), 128);
        assert_eq!(first, (0..128).collect::<Vec<_>>());
        assert_eq!(second, (128..256).collect::<Vec<_>>());
        assert_eq!(third, (256..300).collect::<Vec<_>>());
        // A zero bound still makes progress.
        queues.push(key("A"), 7);
        assert_eq!(queues.take(&key("A"), 0), vec![7]);
    }

    #[test]
    fn an_empty_take_ends_the_drain_so_the_next_request_starts_one() {
        let mut queues = Queues::default();
        assert!(queues.push(key("A"), 1));
        assert_eq!(queues.take(&key("A"), 128), vec![1]);
        // Still draining: the call is in flight.
        assert!(queues.draining(&key("A")));
        assert!(!queues.push(key("A"), 2));
        assert_eq!(queues.take(&key("A"), 128), vec![2]);
        assert!(queues.take(&key("A"), 128).is_empty());
        assert!(!queues.draining(&key("A")));
        assert!(queues.push(key("A"), 3));
    }

    #[test]
    fn an_abandoned_drain_hands_back_every_waiter_once() {
        let mut queues = Queues::default();
        queues.push(key("A"), 1);
        queues.push(key("A"), 2);
        assert_eq!(queues.abandon(&key("A")), vec![1, 2]);
        assert!(queues.abandon(&key("A")).is_empty());
        assert!(queues.take(&key("A"), 128).is_empty());
        assert!(queues.push(key("A"), 3));
    }

    #[tokio::test]
    async fn waiters_get_their_own_answers_and_a_gone_one_breaks_nothing() {
        let mut queues = Queues::default();
        let mut replies = Vec::new();
        for i in 0..3 {
            let (answer, reply) = oneshot::channel::<Reply>();
            queues.push(key("A"), (i, answer));
            replies.push(reply);
        }
        // The second caller goes away.
        drop(replies.remove(1));
        for (i, answer) in queues.take(&key("A"), 128) {
            let _ = answer.send(Ok(vec![format!("answer {i}")]));
        }
        let mut got = Vec::new();
        for reply in replies {
            got.push(reply.await.ok().and_then(Result::ok));
        }
        assert_eq!(
            got,
            vec![
                Some(vec!["answer 0".to_owned()]),
                Some(vec!["answer 2".to_owned()])
            ]
        );
    }
}
