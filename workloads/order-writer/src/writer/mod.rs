//! The consume → store → commit loop. Offsets are committed only after the
//! database committed the batch (and poison went to the DLQ), so a crash at
//! any point replays events, and the idempotent sink makes replays harmless:
//! nothing acknowledged is lost, nothing is written twice. Nothing is dropped
//! silently either: a status event whose order is not stored yet is parked
//! and retried (see [`ledger`]), then a `paid` one is dead-lettered and an
//! `expired` one is counted and acknowledged (its order's `created` event
//! never landed, so there is nothing to expire); a `created` event that
//! clashes with a stored order is dead-lettered.

mod dead_letter;
mod lag;
mod ledger;
mod store;

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Weak},
    time::Duration,
};

use backon::ExponentialBuilder;
use flashsale_orders::{EventKind, OrderEvent};
use flashsale_runtime::{Readiness, Shutdown};
use rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    consumer::{CommitMode, Consumer, StreamConsumer},
    error::KafkaError,
    producer::FutureProducer,
};
use tokio::time::Instant;

use crate::{
    metrics::WriterMetrics,
    sink::{Sink, SourcedEvent},
};
use ledger::{Ledger, Verdict};

/// Longest pause between retries of an unreachable database or DLQ: also
/// the longest the writer idles after the dependency is back.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Pauses while the database or the DLQ is unreachable: 100 ms, doubling up
/// to [`MAX_BACKOFF`], for as long as it takes.
const UNREACHABLE_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_factor(2.0)
    .with_max_delay(MAX_BACKOFF)
    .without_max_times();

/// How often the consumer-lag gauge is refreshed.
const LAG_INTERVAL: Duration = Duration::from_secs(2);

/// Longest wait for one broker call made for lag or readiness.
const BROKER_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest wait for a first message when nothing is buffered.
const IDLE_WAIT: Duration = Duration::from_millis(500);

/// The consumer group's session timeout unless configured: how long the
/// group waits for a silent member before its partitions move to another
/// replica. It outlasts a broker's failover: when the group's coordinator
/// dies, heartbeats fail until the cluster fences it (the brokers' session
/// timeout, 9 s by default) and another broker loads the group, 9-13 s
/// measured, and the last good heartbeat may be an interval (3 s) older;
/// heartbeats queued behind offset commits wait as long when the
/// coordinator lives but an in-sync replica of its partition died. At 10 s
/// the consumer gave up its partitions during that move and its rejoin
/// waited out the old member: 10-11 s more stall than the producers saw.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);

/// Parked events at most: beyond, the writer retries them before it reads
/// more, so a flood of events for unknown orders cannot grow memory unbounded.
const MAX_PARKED: usize = 10_000;

/// Writer settings.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    /// Bootstrap servers.
    pub brokers: String,
    /// Consumer group.
    pub group_id: String,
    /// Topic of order events.
    pub topic: String,
    /// Dead-letter topic.
    pub dlq_topic: String,
    /// Events per database transaction, at most.
    pub batch_size: usize,
    /// Longest wait before a partial batch is written.
    pub flush_interval: Duration,
    /// Transactions written at once, each for its own set of partitions.
    pub write_concurrency: usize,
    /// How long the group waits for a silent member before handing its
    /// partitions to the others: the takeover time after a crash
    /// ([`DEFAULT_SESSION_TIMEOUT`] says how long it must be).
    pub session_timeout: Duration,
}

/// Errors that stop the writer.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// Kafka client setup or a commit failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Counts of one run, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Orders inserted.
    pub inserted: u64,
    /// Events sent to the DLQ.
    pub dead_lettered: u64,
    /// `expired` events acknowledged after parking because their order was
    /// never stored.
    pub expired_without_order: u64,
    /// Batches committed.
    pub batches: u64,
}

/// One message, copied out of the consumer's buffer.
#[derive(Debug, Clone)]
struct Received {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

/// A valid event and the message it came in, which goes to the DLQ if the
/// event cannot be stored.
#[derive(Debug, Clone)]
struct Pending {
    message: Received,
    event: SourcedEvent,
}

impl Pending {
    fn at(&self) -> ledger::Position {
        (self.event.partition, self.event.offset)
    }
}

/// The order-writer loop.
pub struct Writer {
    consumer: Arc<StreamConsumer>,
    dlq: FutureProducer,
    sink: Sink,
    settings: WriterSettings,
    metrics: WriterMetrics,
}

impl Writer {
    /// Builds the consumer (manual commits, from the earliest offset for a
    /// new group) and the DLQ producer.
    pub fn new(
        settings: WriterSettings,
        sink: Sink,
        metrics: WriterMetrics,
    ) -> Result<Self, WriterError> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set(
                "session.timeout.ms",
                settings.session_timeout.as_millis().to_string(),
            )
            .create()?;
        let dlq: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()?;
        Ok(Self {
            consumer: Arc::new(consumer),
            dlq,
            sink,
            settings,
            metrics,
        })
    }

    /// Runs until shutdown. The batch in hand when shutdown comes is
    /// finished and committed if the database takes it; otherwise it is left
    /// uncommitted for the next owner of its partitions.
    pub async fn run(&self, shutdown: Shutdown) -> Result<WriterStats, WriterError> {
        self.consumer.subscribe(&[&self.settings.topic])?;
        tokio::select! {
            stats = self.drain(&shutdown) => stats,
            never = self.track_lag() => match never {},
        }
    }

    /// Leaves the consumer group, giving up after `within`. librdkafka's
    /// close can block for a long time while the broker is unreachable; the
    /// offsets are committed by then, so an abandoned close only means the
    /// group waits out the session timeout. Returns whether it finished.
    pub async fn close(self, within: Duration) -> bool {
        let (done, closed) = tokio::sync::oneshot::channel();
        // A plain thread, not the runtime's blocking pool, so a stuck close
        // cannot hold up the runtime's own shutdown.
        std::thread::spawn(move || {
            let Self { mut consumer, .. } = self;
            // The group is left where the last reference drops. A lag
            // reading or a readiness check may hold one for a broker call:
            // wait for it here, so the close never runs on (and blocks) a
            // runtime thread.
            let consumer = loop {
                match Arc::try_unwrap(consumer) {
                    Ok(consumer) => break consumer,
                    Err(shared) => {
                        consumer = shared;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            };
            drop(consumer);
            let _ = done.send(());
        });
        tokio::time::timeout(within, closed).await.is_ok()
    }

    /// The checks behind `/readyz`: the database answers, and the broker
    /// answers with the topic's metadata.
    pub fn readiness(&self) -> Readiness {
        let sink = self.sink.clone();
        let kafka = KafkaProbe {
            consumer: Arc::downgrade(&self.consumer),
            topic: self.settings.topic.clone(),
        };
        Readiness::default()
            .with_check("database", move || {
                let sink = sink.clone();
                async move { sink.ping().await.map_err(|e| e.to_string()) }
            })
            .with_check("kafka", move || {
                let kafka = kafka.clone();
                async move { kafka.check().await }
            })
    }

    /// Refreshes the consumer-lag gauge for as long as the writer drains.
    /// The broker calls block, so they run on the blocking pool.
    async fn track_lag(&self) -> std::convert::Infallible {
        loop {
            let (consumer, topic) = (Arc::clone(&self.consumer), self.settings.topic.clone());
            let measured = tokio::task::spawn_blocking(move || {
                lag::group_lag(&consumer, &topic, BROKER_CALL_TIMEOUT)
            });
            match measured.await {
                Ok(Ok(lag)) => self.metrics.set_lag(lag),
                Ok(Err(err)) => tracing::debug!(error = %err, "consumer lag not measured"),
                Err(err) => tracing::debug!(error = %err, "consumer lag task failed"),
            }
            tokio::time::sleep(LAG_INTERVAL).await;
        }
    }

    async fn drain(&self, shutdown: &Shutdown) -> Result<WriterStats, WriterError> {
        let mut stats = WriterStats::default();
        let mut ledger: Ledger<Pending> = Ledger::default();
        while !shutdown.is_triggered() {
            let fetched = if ledger.parked() < MAX_PARKED {
                self.next_batch(shutdown, ledger.next_due()).await?
            } else {
                // Retry the parked events before reading more.
                if let Some(due) = ledger.next_due() {
                    tokio::select! {
                        _ = shutdown.wait() => {}
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
                Vec::new()
            };
            let mut fresh = Vec::with_capacity(fetched.len());
            for message in &fetched {
                match OrderEvent::parse(&message.payload) {
                    Ok(event) => fresh.push(Pending {
                        event: SourcedEvent {
                            event,
                            partition: message.partition,
                            offset: message.offset,
                        },
                        message: message.clone(),
                    }),
                    Err(poison) => {
                        self.dead_letter(message, poison.reason(), &poison.to_string(), shutdown)
                            .await?;
                        stats.dead_lettered += 1;
                    }
                }
            }
            let (round, retried) = with_retries(&ledger, fresh, Instant::now());
            if fetched.is_empty() && retried == 0 {
                continue;
            }
            let Some(outcome) = self.store_round(&round, shutdown).await? else {
                // Shutdown while the database was down: leave the batch uncommitted.
                break;
            };
            let given_up = self
                .park_missing(&mut ledger, &round, retried, &outcome.missing, shutdown)
                .await?;
            stats.dead_lettered += given_up.dead_lettered;
            stats.expired_without_order += given_up.expired_without_order;
            for message in &fetched {
                ledger.handled((message.partition, message.offset));
            }
            self.metrics.stored(outcome.stored, jiff::Timestamp::now());
            self.metrics.persisted(outcome.inserted);
            stats.inserted += outcome.inserted;
            stats.dead_lettered += outcome.dead_lettered;
            if !fetched.is_empty() {
                self.metrics.batch(fetched.len());
                stats.batches += 1;
            }
            self.commit_progress(&mut ledger);
        }
        self.commit_final(&ledger);
        Ok(stats)
    }

    /// Settles the parked events retried in `round` (its first `retried`)
    /// and parks the status events of `round` at `missing`; of those
    /// retried enough, dead-letters a `paid` one and acknowledges an
    /// `expired` one. Returns how many went either way.
    async fn park_missing(
        &self,
        ledger: &mut Ledger<Pending>,
        round: &[Pending],
        retried: usize,
        missing: &[usize],
        shutdown: &Shutdown,
    ) -> Result<GivenUp, WriterError> {
        let missed: HashSet<usize> = missing.iter().copied().collect();
        for (i, pending) in round[..retried].iter().enumerate() {
            if !missed.contains(&i) {
                ledger.settled(pending.at());
            }
        }
        let (now, mut given_up) = (Instant::now(), GivenUp::default());
        for &i in missing {
            let pending = &round[i];
            let order_id = &pending.event.event.order_id;
            let verdict = ledger.missed(pending.at(), order_id, pending.clone(), now);
            let Verdict::GiveUp { attempts, waited } = verdict else {
                continue;
            };
            if pending.event.event.kind == EventKind::Expired {
                // Its `created` event never landed: the gateway's publish
                // failed and it cancelled the reservation (which the
                // inventory announces as expired in case the send landed
                // after all), or it died between reserve and publish.
                // Nothing to expire, and nothing lost: not poison.
                self.metrics.expired_without_order();
                tracing::debug!(
                    order = order_id,
                    attempts,
                    waited_ms = waited.as_millis() as u64,
                    "expired event for an order never stored; nothing to expire"
                );
                given_up.expired_without_order += 1;
            } else {
                // Money must never vanish silently: a payment without its
                // order is for a person to look at.
                let error = format!(
                    "order {order_id} not stored after {attempts} attempts over {} ms",
                    waited.as_millis()
                );
                self.dead_letter(&pending.message, "missing_order", &error, shutdown)
                    .await?;
                given_up.dead_lettered += 1;
            }
            ledger.settled(pending.at());
        }
        Ok(given_up)
    }

    /// At shutdown, waits for the commit of every position of the
    /// partitions still ours: a revoked one's new owner may be ahead.
    fn commit_final(&self, ledger: &Ledger<Pending>) {
        let assigned = match self.consumer.assignment() {
            Ok(assigned) => assigned,
            Err(err) => {
                tracing::warn!(error = %err, "assignment unknown; final offsets not committed, the next owner replays idempotently");
                return;
            }
        };
        let mut positions = ledger.positions();
        positions.retain(|&p, _| assigned.find_partition(&self.settings.topic, p).is_some());
        if !positions.is_empty()
            && let Err(err) = self.commit(&positions, CommitMode::Sync)
        {
            tracing::warn!(error = %err, "final offset commit refused; the next owner replays idempotently");
        }
    }

    /// Commits the positions that moved, for the partitions still ours.
    /// A commit refused after a rebalance is not fatal: the rows are stored,
    /// and the partition's new owner replays them as no-ops.
    fn commit_progress(&self, ledger: &mut Ledger<Pending>) {
        let assigned = match self.consumer.assignment() {
            Ok(assigned) => assigned,
            Err(err) => {
                // Keep everything, parked events included, for the next round.
                tracing::warn!(error = %err, "assignment unknown; commit deferred");
                return;
            }
        };
        let topic = self.settings.topic.as_str();
        let moved = ledger.advanced(|p| assigned.find_partition(topic, p).is_some());
        if !moved.is_empty()
            && let Err(err) = self.commit(&moved, CommitMode::Async)
        {
            tracing::warn!(error = %err, "offset commit refused (rebalance?); the next owner replays idempotently");
        }
    }

    /// Reads up to a fetch's worth of messages: returns after
    /// `flush_interval` from the first one, after [`IDLE_WAIT`] if none
    /// comes, and at `not_after` (a parked event due) whatever it has.
    async fn next_batch(
        &self,
        shutdown: &Shutdown,
        not_after: Option<Instant>,
    ) -> Result<Vec<Received>, WriterError> {
        let mut batch = Vec::new();
        let idle_until = Instant::now() + IDLE_WAIT;
        let mut deadline = None;
        while batch.len() < self.settings.batch_size * self.settings.write_concurrency.max(1) {
            let until = deadline.unwrap_or(idle_until);
            let until = not_after.map_or(until, |due| due.min(until));
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = tokio::time::sleep_until(until) => break,
                message = self.consumer.recv() => {
                    let message = match message {
                        Ok(message) => message,
                        Err(err) => {
                            // Broker trouble is reported here too; the client
                            // reconnects by itself, so keep what we have and go on.
                            tracing::warn!(error = %err, "kafka consume error");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            break;
                        }
                    };
                    deadline.get_or_insert_with(|| Instant::now() + self.settings.flush_interval);
                    batch.push(Received {
                        partition: message.partition(),
                        offset: message.offset(),
                        key: message.key().map(<[u8]>::to_vec),
                        payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                    });
                }
            }
        }
        Ok(batch)
    }

    /// Commits `next` (partition → offset after the last stored message).
    /// Commits are cumulative, so during the run they go out without
    /// waiting for the broker (a lost one is covered by the next); the last
    /// one, at shutdown, waits.
    fn commit(&self, next: &BTreeMap<i32, i64>, mode: CommitMode) -> Result<(), WriterError> {
        let mut offsets = TopicPartitionList::new();
        for (&partition, &offset) in next {
            offsets.add_partition_offset(
                &self.settings.topic,
                partition,
                Offset::Offset(offset),
            )?;
        }
        self.consumer.commit(&offsets, mode)?;
        Ok(())
    }
}

/// Parked events [`Writer::park_missing`] stopped waiting for.
#[derive(Debug, Clone, Copy, Default)]
struct GivenUp {
    /// `paid` events sent to the DLQ (`missing_order`).
    dead_lettered: u64,
    /// `expired` events acknowledged: their order was never stored.
    expired_without_order: u64,
}

/// The round to write: the parked events to retry now (those due, and
/// those of an order an event of `fresh` belongs to), then `fresh`. Parked
/// events go first: they are older than anything fetched, and an order's
/// status moves keep their order. Returns the round and how many retries
/// lead it.
fn with_retries(
    ledger: &Ledger<Pending>,
    fresh: Vec<Pending>,
    now: Instant,
) -> (Vec<Pending>, usize) {
    let seen: HashSet<&str> = fresh
        .iter()
        .map(|p| p.event.event.order_id.as_str())
        .collect();
    let mut round = ledger.retries(now, |order| seen.contains(order));
    let retried = round.len();
    round.extend(fresh);
    (round, retried)
}

/// Checks that the broker answers and the topic exists; cheap to clone.
/// It holds the writer's consumer only for the length of a check, so it
/// never keeps the consumer, and the close of its group, past
/// [`Writer::close`].
#[derive(Clone)]
struct KafkaProbe {
    consumer: Weak<StreamConsumer>,
    topic: String,
}

impl KafkaProbe {
    /// `Ok` when the broker returned the topic's metadata in time.
    async fn check(&self) -> Result<(), String> {
        let consumer = self.consumer.upgrade().ok_or("the writer stopped")?;
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || {
            let metadata = consumer
                .fetch_metadata(Some(&topic), BROKER_CALL_TIMEOUT)
                .map_err(|e| format!("broker unreachable: {e}"))?;
            match metadata.topics().first() {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
                _ => Err(format!("topic {topic} not found")),
            }
        })
        .await
        .map_err(|e| e.to_string())?
    }
}
