//! Request coalescing for one-shard SKUs: concurrent reservations of one
//! (sale, SKU) on this replica are decided by one call of the reserve script
//! instead of one call each. See "Coalescing reservations" in
//! `docs/design/inventory.md`.
//!
//! Shape: one queue per (sale, SKU) ([`Queues`]). A SKU has a queue only
//! while a drain task runs for it; the request that finds none creates it
//! and spawns the task, so at low load a request goes straight to Redis (no
//! timer, no waiting). While a call is in flight, later requests join the
//! queue; when the call returns, the task sends everything queued (up to
//! [`CoalesceSettings::max_batch`]) as the next call, and removes the queue
//! when nothing is left. A mutex rather than a long-lived task per SKU with a
//! channel: nothing idles per SKU, a SKU that goes quiet costs nothing, and
//! the lock is held only to push or take (never across an await).
//!
//! Under the replicated policy a batch's reservations are answered once the
//! [`Fence`] confirmed them; the drain does not wait for that and sends the
//! next batch at once.
//!
//! Each request waits for its answer on a oneshot. The drain task owns the
//! senders, so a waiter that goes away (a cancelled HTTP request) is skipped
//! if its call has not started, and otherwise its answer is dropped; either
//! way the others are untouched. A Redis error fails every member of the
//! batch with the same error; each caller retries under its own request id,
//! which the script answers with the reservation if the failed call did run.

use std::{
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use flashsale_runtime::RedisConnection;
use redis::{ErrorKind, RedisError, Script, ScriptInvocation};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::{
    fence::{Fence, Held, MAX_ROUND},
    keys::SaleKeys,
    metrics::Metrics,
    queues::{Queues, drain, enqueue},
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

/// Why a coalesced reservation got no answer, or its confirmation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    /// Redis failed the batch's call.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// The script answered something that does not fit the batch.
    #[error("unexpected data in redis: {0}")]
    Corrupt(String),
    /// The drain task ended without answering (a panic or shutdown).
    #[error("the reservation batch was abandoned")]
    Abandoned,
    /// Too few replicas confirmed the batch in time, or the node asked
    /// did not hold it (then `acked` is 0).
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

struct Waiter {
    item: BatchItem,
    answer: oneshot::Sender<Reply>,
}

/// The fence of the replicated policy, and the batches it may have waiting.
struct Confirming {
    fence: Arc<Fence>,
    unconfirmed: Arc<Semaphore>,
}

/// Gathers concurrent one-shard reservations per SKU into script calls.
pub(crate) struct Coalescer {
    conn: RedisConnection,
    script: Script,
    pub(crate) settings: CoalesceSettings,
    /// Confirms reservations under the replicated policy; `None` for fast.
    fence: Option<Confirming>,
    queues: Mutex<Queues<SkuKey, Waiter>>,
    metrics: RwLock<Option<Metrics>>,
}

impl Coalescer {
    pub(crate) fn new(
        conn: RedisConnection,
        settings: CoalesceSettings,
        durability: Durability,
    ) -> Self {
        let fence = match durability {
            Durability::Fast => None,
            Durability::Replicated { replicas, timeout } => Some(Confirming {
                fence: Arc::new(Fence::new(conn.clone(), replicas, timeout)),
                unconfirmed: Arc::new(Semaphore::new(MAX_ROUND)),
            }),
        };
        Self {
            conn,
            script: Script::new(RESERVE_LOCAL_LUA),
            settings,
            fence,
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
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let coalescer = Self::new(self.conn.clone(), settings, durability);
        *coalescer
            .metrics
            .write()
            .unwrap_or_else(PoisonError::into_inner) = metrics;
        coalescer
    }

    /// Decides `item` for one-shard SKU `sku` of `sale`, together with the
    /// requests of the same SKU that arrive while a call is in flight.
    pub(crate) async fn reserve(self: &Arc<Self>, sale: &str, sku: &str, item: BatchItem) -> Reply {
        let (answer, reply) = oneshot::channel();
        let key = (sale.to_owned(), sku.to_owned());
        if enqueue(&self.queues, key.clone(), Waiter { item, answer }) {
            let coalescer = self.clone();
            tokio::spawn(async move {
                let CoalesceSettings { max_batch, window } = coalescer.settings;
                drain(&coalescer.queues, &key, max_batch, window, |batch| {
                    coalescer.call(&key, batch)
                })
                .await;
            });
        }
        reply.await.unwrap_or(Err(BatchError::Abandoned))
    }

    async fn call(&self, (sale, sku): &SkuKey, batch: Vec<Waiter>) {
        // A waiter that went away before its call is not sent at all.
        let (items, answers): (Vec<BatchItem>, Vec<oneshot::Sender<Reply>>) = batch
            .into_iter()
            .filter(|w| !w.answer.is_closed())
            .map(|w| (w.item, w.answer))
            .unzip();
        if items.is_empty() {
            return;
        }
        if let Some(metrics) = self
            .metrics
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            metrics.reserve_batch(items.len());
        }
        // Scripts run ahead of the fence by at most this many batches, so
        // replicas that lag slow the reservations down instead of letting
        // unconfirmed ones pile up.
        let unconfirmed = match &self.fence {
            Some(confirming) => confirming.unconfirmed.clone().acquire_owned().await.ok(),
            None => None,
        };
        let keys = SaleKeys::new(sale);
        let result: Result<Vec<Vec<String>>, BatchError> =
            batch_invocation(&self.script, &keys, sku, &items)
                .invoke_async(&mut self.conn.clone())
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
        let replies = match result {
            Ok(replies) => replies,
            Err(err) => {
                // A send fails only if its waiter went away.
                for answer in answers {
                    let _ = answer.send(Err(err.clone()));
                }
                return;
            }
        };
        self.answer(sale, sku, &items, answers, replies, unconfirmed);
    }

    /// Answers a batch's members from the script's replies: at once, or,
    /// under the replicated policy, those holding a reservation once the
    /// fence confirmed it (`unconfirmed` is held until then).
    fn answer(
        &self,
        sale: &str,
        sku: &str,
        items: &[BatchItem],
        answers: Vec<oneshot::Sender<Reply>>,
        replies: Vec<Vec<String>>,
        unconfirmed: Option<OwnedSemaphorePermit>,
    ) {
        let Some(confirming) = &self.fence else {
            for (answer, reply) in answers.into_iter().zip(replies) {
                let _ = answer.send(Ok(reply));
            }
            return;
        };
        let keys = SaleKeys::new(sale);
        let mut holders = Vec::new();
        let mut held = Vec::new();
        for ((answer, reply), item) in answers.into_iter().zip(replies).zip(items) {
            // The reservation a holder's request id names: the one just
            // made, or the one a retry found (same SKU and quantity, or
            // the script would have answered a mismatch).
            let id = match reply.first().map(String::as_str) {
                Some("reserved") => Some(item.reservation_id.as_str()),
                Some("duplicate") => reply.get(1).map(String::as_str),
                _ => None,
            };
            match id {
                Some(id) => {
                    held.push(Held {
                        key: keys.request(&item.request_id),
                        value: format!("{id} {sku} {}", item.quantity),
                    });
                    holders.push((answer, reply));
                }
                None => {
                    let _ = answer.send(Ok(reply));
                }
            }
        }
        if holders.is_empty() {
            return;
        }
        // No member that holds a reservation is answered before the fence
        // confirmed it; if the fence fails they all fail, and their retries
        // find their reservations. The next batch does not wait for this.
        let fence = confirming.fence.clone();
        let sale = sale.to_owned();
        tokio::spawn(async move {
            let confirmed = fence.confirm(&sale, held).await;
            drop(unconfirmed);
            for (answer, reply) in holders {
                let _ = answer.send(confirmed.clone().map(|()| reply));
            }
        });
    }
}

impl Store {
    /// The same store with other coalescing settings. Call before the store
    /// is cloned and used: clones made earlier keep the old settings.
    pub fn with_coalescing(mut self, settings: CoalesceSettings) -> Self {
        self.coalescer = Arc::new(self.coalescer.rebuilt(settings, self.durability));
        self
    }

    /// Records the size of every reserve script call of this store (and its
    /// clones) in `metrics` (`flashsale_inventory_reserve_batch_size`).
    pub fn record_batch_sizes(&self, metrics: &Metrics) {
        *self
            .coalescer
            .metrics
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(metrics.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_get_their_own_answers_and_a_gone_one_breaks_nothing() {
        let mut queues = Queues::default();
        let key = ("s".to_owned(), "A".to_owned());
        let mut replies = Vec::new();
        for i in 0..3 {
            let (answer, reply) = oneshot::channel::<Reply>();
            queues.push(key.clone(), (i, answer));
            replies.push(reply);
        }
        // The second caller goes away.
        drop(replies.remove(1));
        for (i, answer) in queues.take(&key, 128) {
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
