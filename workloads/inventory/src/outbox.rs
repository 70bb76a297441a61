//! The relay of the sales' order events: publishes every entry of a sale's
//! outbox stream to Kafka (`acks=all`, idempotent producer), oldest first.
//!
//! Two scripts write the stream, each in the same atomic step as the change
//! it announces, so a crash between the change and its publication loses
//! nothing:
//! - the reserve (`reserve_batch.lua`, or `settle.lua` for a sharded SKU)
//!   adds `created` for every reservation it grants: an order is
//!   acknowledged to its buyer once that script returned (and, under the
//!   replicated policy, its `WAIT`), one durable write, and its event
//!   reaches Kafka from here;
//! - the last release step (`finish_release.lua`) adds `expired` for a
//!   reservation that lapsed unpaid or was cancelled.
//!
//! An entry names the reservation; the event is built from its record (an
//! order is exactly what was reserved) and stamped with the entry's time.
//! Under the replicated policy an entry is published only once a replica
//! has it (one `WAIT` per round), so a write refused as not durable is not
//! announced while its primary alone holds it.
//! Publishers read the stream through one consumer group, so with several
//! replicas each entry goes to one of them; a round sends all it read at
//! once and acknowledges and deletes an entry only once Kafka acknowledged
//! its event. An entry a replica took and never acknowledged (it crashed,
//! or Kafka refused) is retried by that replica and, once idle for
//! [`CLAIM_IDLE`], taken over by another. Delivery is at least once; the
//! order-writer stores an order once and applies `expired` once, and parks a
//! `paid` event that overtook its `created` (see its ledger) for longer
//! than a takeover takes.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ReservedFacts};
use flashsale_runtime::RedisConnection;
use flashsale_runtime::Shutdown;
use redis::Value;
use tokio::time::Instant;

use crate::{
    keys::SaleKeys,
    metrics::Metrics,
    periodic::Ticks,
    store::{Reservation, Store, StoreError},
};

/// The consumer group every inventory replica publishes through.
const GROUP: &str = "publishers";
/// Entries read per source and round.
const BATCH: usize = 512;
/// How long an entry may sit unacknowledged with another replica before it
/// is taken over: past one Kafka send bound (5 s), so a replica still
/// sending is rarely overtaken, and within the order-writer's parking of a
/// `paid` event that overtook its `created` one.
pub const CLAIM_IDLE: Duration = Duration::from_secs(10);
/// How often a replica looks for entries abandoned by others.
const CLAIM_EVERY: Duration = Duration::from_secs(1);

/// One outbox entry: its stream id, what it announces and the reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    stream_id: String,
    kind: EventKind,
    reservation: String,
}

impl Entry {
    /// When the entry was added, from its stream id (Redis's clock, ms).
    fn added_at(&self) -> Option<jiff::Timestamp> {
        let ms = self.stream_id.split('-').next()?.parse().ok()?;
        jiff::Timestamp::from_millisecond(ms).ok()
    }
}

/// Publishes the outbox of every loaded sale every `interval` until
/// shutdown; a round that found more goes again at once.
pub async fn run(
    store: Store,
    producer: OrderProducer,
    metrics: Metrics,
    consumer: String,
    interval: Duration,
    shutdown: Shutdown,
) {
    let mut ticks = Ticks::new(interval, shutdown);
    let mut due: HashMap<String, Due> = HashMap::new();
    while ticks.next().await {
        for sale in store.sales().await {
            let due = due.entry(sale.clone()).or_insert_with(Due::new);
            loop {
                let sources = due.sources(Instant::now());
                match publish_from(&store, &producer, &sale, &consumer, sources).await {
                    Ok(round) => {
                        metrics.outbox(&round);
                        due.after(sources, &round, Instant::now());
                        if round.expired > 0 {
                            tracing::info!(
                                sale,
                                expired = round.expired,
                                "published expired order events"
                            );
                        }
                        if !round.more() {
                            break;
                        }
                    }
                    Err(err) => {
                        // The stream may be gone with its group (its keys
                        // removed): make it again, and reread what this
                        // replica holds.
                        *due = Due::new();
                        tracing::warn!(sale, error = %err, "outbox not published; retrying next tick");
                        break;
                    }
                }
            }
        }
    }
}

/// What a sale's next round does besides reading new entries.
#[derive(Debug)]
struct Due {
    /// Create the consumer group (at start, and after a failed round).
    group: bool,
    /// Read this replica's own unacknowledged entries (at start, and after
    /// a round that left some).
    own: bool,
    /// When abandoned entries were last looked for.
    claimed: Option<Instant>,
}

impl Due {
    fn new() -> Self {
        Self {
            group: true,
            own: true,
            claimed: None,
        }
    }

    fn sources(&self, now: Instant) -> Sources {
        Sources {
            group: self.group,
            own: self.own,
            abandoned: self
                .claimed
                .is_none_or(|at| now.saturating_duration_since(at) >= CLAIM_EVERY),
        }
    }

    fn after(&mut self, sources: Sources, round: &Round, now: Instant) {
        self.group = false;
        self.own = round.unsent > 0;
        if sources.abandoned {
            self.claimed = Some(now);
        }
    }
}

/// Which entries a round reads, new ones always, and whether it first
/// creates the consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    /// Create the consumer group (and the stream) if missing.
    pub group: bool,
    /// Entries this consumer read before and did not acknowledge.
    pub own: bool,
    /// Entries other consumers left unacknowledged past [`CLAIM_IDLE`].
    pub abandoned: bool,
}

impl Sources {
    /// Every source, the group created first.
    pub const ALL: Self = Self {
        group: true,
        own: true,
        abandoned: true,
    };
}

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Round {
    /// `created` events acknowledged by Kafka and removed from the outbox.
    pub created: u64,
    /// `expired` events acknowledged by Kafka and removed from the outbox.
    pub expired: u64,
    /// Entries read but not published (Kafka refused them): retried.
    pub unsent: u64,
    /// Entries in the outbox afterwards (any replica's).
    pub pending: u64,
}

impl Round {
    /// Events published.
    pub fn published(&self) -> u64 {
        self.created + self.expired
    }

    /// Whether the relay should go again at once: everything read went
    /// out and entries remain.
    fn more(&self) -> bool {
        self.published() > 0 && self.unsent == 0 && self.pending > 0
    }
}

/// One round of every source for one sale. Public so tests can drive it
/// without a timer.
pub async fn publish_round(
    store: &Store,
    producer: &OrderProducer,
    sale: &str,
    consumer: &str,
) -> Result<Round, StoreError> {
    publish_from(store, producer, sale, consumer, Sources::ALL).await
}

/// One round for one sale: this replica's own unacknowledged entries (if
/// asked), new ones, then entries abandoned by other replicas (if asked),
/// all sent at once in stream order.
pub async fn publish_from(
    store: &Store,
    producer: &OrderProducer,
    sale: &str,
    consumer: &str,
    sources: Sources,
) -> Result<Round, StoreError> {
    let stream = SaleKeys::new(sale).outbox();
    let mut conn = store.connection();
    let since = conn.generation();
    if sources.group {
        ensure_group(&mut conn, &stream).await?;
    }
    let mut entries = Vec::new();
    for (source, wanted) in [
        (Source::Own, sources.own),
        (Source::New, true),
        (Source::Abandoned, sources.abandoned),
    ] {
        if wanted {
            entries.extend(source.read(&mut conn, &stream, consumer).await?);
        }
    }
    // This replica's own entries, once idle, are also among the abandoned.
    let mut seen = HashSet::new();
    entries.retain(|e| seen.insert(e.stream_id.clone()));
    let mut round = Round::default();
    // Only what the durability policy holds durable is announced: under
    // `replicated`, entries a replica has. Reading moved the group's
    // cursor, a write on this connection, so one WAIT now covers every
    // entry read. An order refused as not durable is not announced while
    // only its primary holds it (a promoted standby with no replica of its
    // own announces none of what it refused).
    if !entries.is_empty()
        && let Err(err) = store.make_durable(&stream, since).await
    {
        tracing::debug!(sale, error = %err, "outbox entries not durable yet; publishing them later");
        round.unsent = u64::try_from(entries.len()).unwrap_or(u64::MAX);
        entries.clear();
    }
    if !entries.is_empty() {
        let ids: Vec<&str> = entries.iter().map(|e| e.reservation.as_str()).collect();
        let records = store.reservations(sale, &ids).await?;
        let sends = entries
            .iter()
            .zip(&records)
            .map(|(entry, record)| publish(producer, sale, entry, record.as_ref()));
        let sent = futures::future::join_all(sends).await;
        let mut done = Vec::new();
        let mut refused = None;
        for (entry, sent) in entries.iter().zip(sent) {
            match sent {
                Ok(()) => {
                    match entry.kind {
                        EventKind::Expired => round.expired += 1,
                        _ => round.created += 1,
                    }
                    done.push(entry.stream_id.as_str());
                }
                Err(err) => {
                    round.unsent += 1;
                    refused.get_or_insert(err);
                }
            }
        }
        if let Some(err) = refused {
            tracing::warn!(sale, unsent = round.unsent, error = %err, "order events not acknowledged by Kafka; retrying");
        }
        if !done.is_empty() {
            let _: () = redis::pipe()
                .atomic()
                .cmd("XACK")
                .arg(&stream)
                .arg(GROUP)
                .arg(&done)
                .ignore()
                .cmd("XDEL")
                .arg(&stream)
                .arg(&done)
                .ignore()
                .query_async(&mut conn)
                .await?;
        }
    }
    round.pending = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut conn)
        .await?;
    Ok(round)
}

/// Sends the entry's event; an error (Kafka's) leaves it for a later round.
async fn publish(
    producer: &OrderProducer,
    sale: &str,
    entry: &Entry,
    record: Result<&Option<Reservation>, &StoreError>,
) -> Result<(), String> {
    let record = match record {
        Ok(Some(record)) => record,
        // Nothing to announce, or nothing that ever could be: drop the
        // entry rather than retry it forever.
        Ok(None) => {
            tracing::warn!(
                sale,
                reservation = entry.reservation,
                "outbox names a missing reservation"
            );
            return Ok(());
        }
        Err(err) => {
            tracing::error!(sale, reservation = entry.reservation, error = %err, "outbox names an unreadable reservation; its event is dropped");
            return Ok(());
        }
    };
    let facts = ReservedFacts {
        sale,
        reservation_id: &record.id,
        user_id: &record.user,
        sku: &record.sku,
        quantity: record.quantity,
        amount_minor: record.amount_minor,
        request_id: &record.request_id,
    };
    let at = entry.added_at().unwrap_or_else(jiff::Timestamp::now);
    let event = OrderEvent::of_reservation(entry.kind, facts, at);
    producer
        .send(&event)
        .await
        .map(drop)
        .map_err(|err| format!("{:?} event of {}: {err}", entry.kind, event.order_id))
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
    Own,
    New,
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
            // Entries from before `created` went through the outbox name
            // no kind: they were all `expired`.
            kind: match field(fields, "kind").as_deref() {
                Some("created") => EventKind::Created,
                _ => EventKind::Expired,
            },
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
                Value::Array(vec![
                    bulk("kind"),
                    bulk("created"),
                    bulk("reservation"),
                    bulk(r),
                ]),
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
                .map(|e| format!("{}={}:{:?}", e.stream_id, e.reservation, e.kind))
                .collect()
        };
        assert_eq!(ids(&read), ["1-0=a:Created", "2-0=b:Created"]);
        assert_eq!(ids(&claimed), ["3-0=c:Created"]);
        // An entry written before entries had a kind announces an expiry.
        let old = Value::Array(vec![
            bulk("4-0"),
            Value::Array(vec![bulk("reservation"), bulk("d")]),
        ]);
        assert_eq!(ids(&Value::Array(vec![old])), ["4-0=d:Expired"]);
        assert!(entries(&Value::Nil).is_empty());
    }
}
