//! Acknowledging reservations only once replicas hold them, without holding
//! up the script calls that make them. See "Replicated acknowledgements" in
//! `docs/design/inventory.md`.
//!
//! Redis' `WAIT` blocks the client that sends it until replicas have that
//! client's writes. Sent on the store's multiplexed connection, it would
//! hold up every script call queued behind it, so the coalescer hands the
//! reservations a batch made to a [`Fence`], which confirms them on a
//! connection of its own while the next batch's script runs.
//!
//! A `WAIT` covers only the writes made on its own connection, so a round
//! first sends `fence.lua`, in one pipeline with the `WAIT` and to the node
//! that owns the sale: it checks that the node holds every reservation of
//! the round (by its request-id key) and rewrites one of them unchanged,
//! which puts the connection's replication offset past all of them. A
//! reservation the node lacks is refused as not durable, never vouched for.
//!
//! One round per sale at a time: the reservations that arrive while a round
//! runs go in the next one, so a sale's acknowledgements cost one `WAIT` per
//! round trip to its replicas, whatever the rate.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use flashsale_runtime::RedisConnection;
use tokio::sync::{OnceCell, oneshot};

use crate::{
    coalesce::BatchError,
    queues::{Queues, drain},
};

/// Source of the fence script.
const FENCE_LUA: &str = include_str!("lua/fence.lua");

/// Most batches one round confirms; more wait for the next round.
const MAX_ROUND: usize = 64;

/// One batch's reservations waiting for their round.
struct Pending {
    /// Request-id keys of the batch's reservations.
    keys: Vec<String>,
    answer: oneshot::Sender<Result<(), BatchError>>,
}

/// Confirms reservations under the replicated policy, one round per sale at
/// a time, on a connection of its own.
pub struct Fence {
    store: RedisConnection,
    own: OnceCell<RedisConnection>,
    replicas: u32,
    timeout: Duration,
    queues: Mutex<Queues<String, Pending>>,
}

impl Fence {
    /// A fence that opens its connection from `store` at first use and
    /// waits up to `timeout` for `replicas` replicas.
    pub fn new(store: RedisConnection, replicas: u32, timeout: Duration) -> Self {
        Self {
            store,
            own: OnceCell::new(),
            replicas,
            timeout,
            queues: Mutex::default(),
        }
    }

    /// Returns once `replicas` replicas hold the reservations behind the
    /// request-id keys `keys` (all of sale `sale`), or fails them all as
    /// not durable.
    pub async fn confirm(
        self: &Arc<Self>,
        sale: &str,
        keys: Vec<String>,
    ) -> Result<(), BatchError> {
        let (answer, reply) = oneshot::channel();
        let start = self
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sale.to_owned(), Pending { keys, answer });
        if start {
            let fence = self.clone();
            let sale = sale.to_owned();
            tokio::spawn(async move {
                drain(&fence.queues, &sale, MAX_ROUND, |round| fence.round(round)).await;
            });
        }
        reply.await.unwrap_or(Err(BatchError::Abandoned))
    }

    /// Confirms one round and answers each of its batches.
    async fn round(&self, round: Vec<Pending>) {
        let keys: Vec<&str> = round
            .iter()
            .flat_map(|p| p.keys.iter().map(String::as_str))
            .collect();
        let outcome = self.fence_and_wait(&keys).await;
        let mut offset = 0;
        for pending in round {
            let count = pending.keys.len();
            let reply = outcome
                .as_ref()
                .map_err(BatchError::clone)
                .and_then(|(held, acked)| {
                    let all_held = held
                        .get(offset..offset + count)
                        .is_some_and(|h| h.iter().all(|&h| h));
                    // A node that lacks a reservation cannot vouch for it.
                    let acked = if all_held { *acked } else { 0 };
                    if acked >= u64::from(self.replicas) {
                        Ok(())
                    } else {
                        Err(BatchError::NotDurable {
                            acked,
                            wanted: self.replicas,
                        })
                    }
                });
            offset += count;
            let _ = pending.answer.send(reply);
        }
    }

    /// The fence script and a `WAIT` in one pipeline to the sale's primary:
    /// whether the node holds each key, and how many replicas confirmed.
    async fn fence_and_wait(&self, keys: &[&str]) -> Result<(Vec<bool>, u64), BatchError> {
        let Some(first) = keys.first() else {
            return Ok((Vec::new(), 0));
        };
        let mut conn = self
            .own
            .get_or_try_init(|| self.store.separate())
            .await?
            .clone();
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL").arg(FENCE_LUA).arg(keys.len()).arg(keys);
        pipe.cmd("WAIT").arg(self.replicas).arg(
            u64::try_from(self.timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let answers = conn.pipeline_on_primary_of(first, &pipe).await?;
        let corrupt = |what: &str| BatchError::Corrupt(format!("durability fence: {what}"));
        let [held, acked] = answers.as_slice() else {
            return Err(corrupt(&format!("{} answers to 2 commands", answers.len())));
        };
        let held: Vec<i64> =
            redis::from_redis_value_ref(held).map_err(|e| corrupt(&e.to_string()))?;
        let acked: u64 = redis::from_redis_value_ref(acked).map_err(|e| corrupt(&e.to_string()))?;
        if held.len() != keys.len() {
            return Err(corrupt(&format!(
                "{} answers for {} keys",
                held.len(),
                keys.len()
            )));
        }
        Ok((held.into_iter().map(|h| h == 1).collect(), acked))
    }
}
