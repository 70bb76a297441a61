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
//! A `WAIT` waits only for the writes made on its own connection, so a round
//! first sends `fence.lua`, in one pipeline with the `WAIT` and to the node
//! that owns the sale: it checks that the node holds every reservation of
//! the round (its request-id key, with the value that names it) and
//! rewrites one of them unchanged, which puts the connection's replication
//! offset past all of them. A reservation the node lacks is refused as not
//! durable, never vouched for.
//!
//! One round per sale at a time, on a connection per sale (a `WAIT` blocks
//! its connection, and one sale's slow replicas must not delay another's):
//! the batches that finish while a round runs go in the next one, up to
//! [`MAX_ROUND`], so a busy sale costs one `WAIT` per round trip to its
//! replicas.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use flashsale_runtime::RedisConnection;
use tokio::sync::{OnceCell, oneshot};

use crate::{
    coalesce::BatchError,
    queues::{Queues, drain, enqueue},
};

/// Source of the fence script.
const FENCE_LUA: &str = include_str!("lua/fence.lua");

/// Most batches one round confirms; more wait for the next round.
pub const MAX_ROUND: usize = 64;

/// A reservation to confirm: its request-id key and the value that key
/// holds for it (`"<reservation id> <sku> <qty>"`, see `admit.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The request-id key.
    pub key: String,
    /// What the key holds when it stands for this reservation.
    pub value: String,
}

/// One batch's reservations waiting for their round.
struct Pending {
    held: Vec<Held>,
    answer: oneshot::Sender<Result<(), BatchError>>,
}

/// Confirms reservations under the replicated policy, one round per sale at
/// a time, on a connection per sale.
pub struct Fence {
    store: RedisConnection,
    own: Mutex<HashMap<String, Arc<OnceCell<RedisConnection>>>>,
    replicas: u32,
    timeout: Duration,
    queues: Mutex<Queues<String, Pending>>,
}

impl Fence {
    /// A fence that opens its connections from `store` at first use and
    /// waits up to `timeout` for `replicas` replicas.
    pub fn new(store: RedisConnection, replicas: u32, timeout: Duration) -> Self {
        Self {
            store,
            own: Mutex::default(),
            replicas,
            timeout,
            queues: Mutex::default(),
        }
    }

    /// Returns once `replicas` replicas hold the reservations `held` (all of
    /// sale `sale`), or fails them all: as not durable when the replicas or
    /// the node did not have them, or with the Redis error of the round.
    pub async fn confirm(self: &Arc<Self>, sale: &str, held: Vec<Held>) -> Result<(), BatchError> {
        let (answer, reply) = oneshot::channel();
        if enqueue(&self.queues, sale.to_owned(), Pending { held, answer }) {
            let fence = self.clone();
            let sale = sale.to_owned();
            tokio::spawn(async move {
                drain(&fence.queues, &sale, MAX_ROUND, Duration::ZERO, |round| {
                    fence.round(&sale, round)
                })
                .await;
            });
        }
        reply.await.unwrap_or(Err(BatchError::Abandoned))
    }

    /// Confirms one round of `sale` and answers each of its batches.
    async fn round(&self, sale: &str, round: Vec<Pending>) {
        let held: Vec<&Held> = round.iter().flat_map(|p| &p.held).collect();
        let outcome = self.fence_and_wait(sale, &held).await;
        let mut offset = 0;
        for pending in round {
            let count = pending.held.len();
            let reply = outcome
                .as_ref()
                .map_err(BatchError::clone)
                .and_then(|(present, acked)| {
                    let all_present = present
                        .get(offset..offset + count)
                        .is_some_and(|p| p.iter().all(|&p| p));
                    // A node that lacks a reservation cannot vouch for it.
                    let acked = if all_present { *acked } else { 0 };
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

    /// The connection of `sale`'s rounds, opened at its first round.
    async fn connection(&self, sale: &str) -> Result<RedisConnection, BatchError> {
        let cell = self
            .own
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(sale.to_owned())
            .or_default()
            .clone();
        Ok(cell
            .get_or_try_init(|| self.store.separate())
            .await?
            .clone())
    }

    /// The fence script and a `WAIT` in one pipeline to the sale's primary:
    /// whether the node holds each reservation, and how many replicas
    /// confirmed.
    async fn fence_and_wait(
        &self,
        sale: &str,
        held: &[&Held],
    ) -> Result<(Vec<bool>, u64), BatchError> {
        let Some(first) = held.first() else {
            return Ok((Vec::new(), 0));
        };
        let mut conn = self.connection(sale).await?;
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(FENCE_LUA)
            .arg(held.len())
            .arg(held.iter().map(|h| h.key.as_str()).collect::<Vec<_>>())
            .arg(held.iter().map(|h| h.value.as_str()).collect::<Vec<_>>());
        pipe.cmd("WAIT").arg(self.replicas).arg(
            u64::try_from(self.timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let answers = conn.pipeline_on_primary_of(&first.key, &pipe).await?;
        let corrupt = |what: &str| BatchError::Corrupt(format!("durability fence: {what}"));
        let [present, acked] = answers.as_slice() else {
            return Err(corrupt(&format!("{} answers to 2 commands", answers.len())));
        };
        let present: Vec<i64> =
            redis::from_redis_value_ref(present).map_err(|e| corrupt(&e.to_string()))?;
        let acked: u64 = redis::from_redis_value_ref(acked).map_err(|e| corrupt(&e.to_string()))?;
        if present.len() != held.len() {
            return Err(corrupt(&format!(
                "{} answers for {} reservations",
                present.len(),
                held.len()
            )));
        }
        Ok((present.into_iter().map(|p| p == 1).collect(), acked))
    }
}
