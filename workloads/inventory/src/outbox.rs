//! Publishes an `expired` order event for every reservation that lapsed
//! unpaid or was cancelled, so no order stays `pending_payment` forever.
//! The gateway cancels a reservation only when the publish of its `created`
//! event failed; a send that timed out may still have landed, so the order
//! may exist, and `expired` ends it as its units went back to stock. The
//! order-writer acknowledges an `expired` event whose order never arrives.
//!
//! The last release step puts the reservation id in the sale's outbox
//! stream in the same script that releases it (`finish_release.lua`), so a
//! crash between releasing and publishing loses nothing. Publishers
//! read the stream through one consumer group, so with several replicas each
//! entry goes to one of them; an entry is acknowledged and deleted only once
//! Kafka acknowledged its event. An entry a replica took and never
//! acknowledged (it crashed, or Kafka refused) is retried by that replica on
//! its next round and, once idle for [`CLAIM_IDLE`], taken over by another.
//! Delivery is at least once; the order-writer applies `expired` once.

use std::time::Duration;

use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ReservedFacts};
use flashsale_runtime::RedisConnection;
use flashsale_runtime::Shutdown;
use redis::Value;

use crate::{
    keys::SaleKeys,
    metrics::Metrics,
    periodic,
    store::{Reservation, Store, StoreError},
};

/// The consumer group every inventory replica publishes through.
const GROUP: &str = "publishers";
/// Entries read per round.
const BATCH: usize = 128;
/// How long an entry may sit unacknowledged with another replica before it
/// is taken over: well past one Kafka send bound.
const CLAIM_IDLE: Duration = Duration::from_secs(30);

/// One outbox entry: its stream id and the reservation it names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    stream_id: String,
    reservation: String,
}

/// Publishes the outbox of every loaded sale each `interval` until shutdown.
pub async fn run(
    store: Store,
    producer: OrderProducer,
    metrics: Metrics,
    consumer: String,
    interval: Duration,
    shutdown: Shutdown,
) {
    periodic::for_each_sale(&store, interval, shutdown, |sale| {
        let (store, producer, metrics, consumer) = (&store, &producer, &metrics, &consumer);
        async move {
            match publish_round(store, producer, &sale, consumer).await {
                Ok(Round { published, pending }) => {
                    metrics.outbox(published, pending);
                    if published > 0 {
                        tracing::info!(sale, published, "published expired order events");
                    }
                }
                Err(err) => {
                    tracing::warn!(sale, error = %err, "outbox not published; retrying next tick")
                }
            }
        }
    })
    .await;
}

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Events acknowledged by Kafka and removed from the outbox.
    pub published: u64,
    /// Entries still in the outbox afterwards.
    pub pending: u64,
}

/// One round for one sale: this replica's own unacknowledged entries, then
/// new ones, then entries abandoned by other replicas. Public so tests can
/// drive it without a timer.
pub async fn publish_round(
    store: &Store,
    producer: &OrderProducer,
    sale: &str,
    consumer: &str,
) -> Result<Round, StoreError> {
    let keys = SaleKeys::new(sale);
    let stream = keys.outbox();
    let mut conn = store.connection();
    ensure_group(&mut conn, &stream).await?;
    let mut published = 0;
    for source in [Source::Own, Source::New, Source::Abandoned] {
        let entries = source.read(&mut conn, &stream, consumer).await?;
        for entry in entries {
            if publish(store, producer, sale, &entry).await? {
                let _: () = redis::pipe()
                    .atomic()
                    .cmd("XACK")
                    .arg(&stream)
                    .arg(GROUP)
                    .arg(&entry.stream_id)
                    .ignore()
                    .cmd("XDEL")
                    .arg(&stream)
                    .arg(&entry.stream_id)
                    .ignore()
                    .query_async(&mut conn)
                    .await?;
                published += 1;
            }
        }
    }
    let pending: u64 = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut conn)
        .await?;
    Ok(Round { published, pending })
}

/// Sends the entry's event; `Ok(false)` leaves it for a later round.
async fn publish(
    store: &Store,
    producer: &OrderProducer,
    sale: &str,
    entry: &Entry,
) -> Result<bool, StoreError> {
    let Some(record) = store.reservation(sale, &entry.reservation).await? else {
        // Nothing to announce: drop the entry rather than retry it forever.
        tracing::warn!(
            sale,
            reservation = entry.reservation,
            "outbox names a missing reservation"
        );
        return Ok(true);
    };
    let event = expired_event(sale, &record);
    match producer.send(&event).await {
        Ok(_) => Ok(true),
        Err(err) => {
            tracing::warn!(order = event.order_id, error = %err, "expired event not acknowledged; retrying");
            Ok(false)
        }
    }
}

/// The `expired` event of a lapsed or cancelled reservation, from its record.
fn expired_event(sale: &str, record: &Reservation) -> OrderEvent {
    let facts = ReservedFacts {
        sale,
        reservation_id: &record.id,
        user_id: &record.user,
        sku: &record.sku,
        quantity: record.quantity,
        amount_minor: record.amount_minor,
        request_id: &record.request_id,
    };
    OrderEvent::of_reservation(EventKind::Expired, facts, jiff::Timestamp::now())
}

async fn ensure_group(conn: &mut RedisConnection, stream: &str) -> Result<(), StoreError> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
        other => Ok(other?),
    }
}

/// Where a round reads entries from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// Entries this consumer read before and did not acknowledge.
    Own,
    /// Entries no consumer has read.
    New,
    /// Entries other consumers left unacknowledged past [`CLAIM_IDLE`].
    Abandoned,
}

impl Source {
    async fn read(
        self,
        conn: &mut RedisConnection,
        stream: &str,
        consumer: &str,
    ) -> Result<Vec<Entry>, StoreError> {
        let reply: Value = match self {
            Self::Own | Self::New => {
                redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg(consumer)
                    .arg("COUNT")
                    .arg(BATCH)
                    .arg("STREAMS")
                    .arg(stream)
                    .arg(if matches!(self, Self::Own) { "0" } else { ">" })
                    .query_async(conn)
                    .await?
            }
            Self::Abandoned => {
                redis::cmd("XAUTOCLAIM")
                    .arg(stream)
                    .arg(GROUP)
                    .arg(consumer)
                    .arg(CLAIM_IDLE.as_millis() as u64)
                    .arg("0")
                    .arg("COUNT")
                    .arg(BATCH)
                    .query_async(conn)
                    .await?
            }
        };
        Ok(entries(&reply))
    }
}

/// The entries in an XREADGROUP or XAUTOCLAIM reply, wherever they sit:
/// every `[id, [field, value, ...]]` pair whose fields name a reservation.
fn entries(reply: &Value) -> Vec<Entry> {
    let mut found = Vec::new();
    collect(reply, &mut found);
    found
}

fn collect(value: &Value, found: &mut Vec<Entry>) {
    let items = match value {
        Value::Array(items) => items,
        Value::Map(pairs) => {
            for (_, v) in pairs {
                collect(v, found);
            }
            return;
        }
        _ => return,
    };
    if let [Value::BulkString(id), Value::Array(fields)] = items.as_slice()
        && let Some(reservation) = field(fields, "reservation")
    {
        found.push(Entry {
            stream_id: String::from_utf8_lossy(id).into_owned(),
            reservation,
        });
        return;
    }
    for item in items {
        collect(item, found);
    }
}

fn field(fields: &[Value], name: &str) -> Option<String> {
    fields.chunks(2).find_map(|pair| match pair {
        [Value::BulkString(k), Value::BulkString(v)] if k == name.as_bytes() => {
            Some(String::from_utf8_lossy(v).into_owned())
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn entries_are_found_in_both_reply_shapes() {
        let entry = |id: &str, r: &str| {
            Value::Array(vec![
                bulk(id),
                Value::Array(vec![bulk("reservation"), bulk(r)]),
            ])
        };
        // XREADGROUP: [[stream, [entry...]]]
        let read = Value::Array(vec![Value::Array(vec![
            bulk("fs:{s}:outbox"),
            Value::Array(vec![entry("1-0", "a"), entry("2-0", "b")]),
        ])]);
        // XAUTOCLAIM: [next cursor, [entry...], [deleted ids]]
        let claimed = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry("3-0", "c")]),
            Value::Array(vec![]),
        ]);
        let ids = |v: &Value| -> Vec<String> {
            entries(v)
                .into_iter()
                .map(|e| format!("{}={}", e.stream_id, e.reservation))
                .collect()
        };
        assert_eq!(ids(&read), ["1-0=a", "2-0=b"]);
        assert_eq!(ids(&claimed), ["3-0=c"]);
        assert!(entries(&Value::Nil).is_empty());
    }
}
