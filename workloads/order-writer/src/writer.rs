//! The consume → store → commit loop. Offsets are committed only after the
//! database committed the batch (and poison went to the DLQ), so a crash at
//! any point replays events, and the idempotent sink makes replays harmless:
//! nothing acknowledged is lost, nothing is written twice.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use flashsale_orders::OrderEvent;
use flashsale_runtime::{Readiness, Shutdown};
use rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    consumer::{CommitMode, Consumer, StreamConsumer},
    error::KafkaError,
    message::{Header, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
    util::Timeout,
};

use crate::{
    metrics::WriterMetrics,
    sink::{Sink, SinkError, SourcedEvent},
};

/// Attempts at a row the database rejects before it goes to the DLQ.
const MAX_ATTEMPTS: u32 = 3;

/// Longest pause between retries of an unreachable database or DLQ: also
/// the longest the writer idles after the dependency is back.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How often the consumer-lag gauge is refreshed.
const LAG_INTERVAL: Duration = Duration::from_secs(2);

/// Longest wait for one broker call made for lag or readiness.
const BROKER_CALL_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// partitions to the others: the takeover time after a crash.
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
    /// Batches committed.
    pub batches: u64,
}

/// One message, copied out of the consumer's buffer.
struct Received {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
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
            drop(self);
            let _ = done.send(());
        });
        tokio::time::timeout(within, closed).await.is_ok()
    }

    /// The checks behind `/readyz`: the database answers, and the broker
    /// answers with the topic's metadata.
    pub fn readiness(&self) -> Readiness {
        let sink = self.sink.clone();
        let kafka = KafkaProbe {
            consumer: Arc::clone(&self.consumer),
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
            match tokio::task::spawn_blocking(move || lag_of(&consumer, &topic)).await {
                Ok(Ok(lag)) => self.metrics.set_lag(lag),
                Ok(Err(err)) => tracing::debug!(error = %err, "consumer lag not measured"),
                Err(err) => tracing::debug!(error = %err, "consumer lag task failed"),
            }
            tokio::time::sleep(LAG_INTERVAL).await;
        }
    }

    async fn drain(&self, shutdown: &Shutdown) -> Result<WriterStats, WriterError> {
        let mut stats = WriterStats::default();
        // Partition → offset after the last stored message, for the final commit.
        let mut stored: BTreeMap<i32, i64> = BTreeMap::new();
        while !shutdown.is_triggered() {
            let batch = self.next_batch(shutdown).await?;
            if batch.is_empty() {
                continue;
            }
            let mut events = Vec::with_capacity(batch.len());
            for message in &batch {
                match OrderEvent::parse(&message.payload) {
                    Ok(event) => events.push(SourcedEvent {
                        event,
                        partition: message.partition,
                        offset: message.offset,
                    }),
                    Err(poison) => {
                        self.dead_letter(message, poison.reason(), &poison.to_string(), shutdown)
                            .await?;
                        stats.dead_lettered += 1;
                    }
                }
            }
            // Partitions are independent (a user's events share one), so
            // groups of partitions are written in concurrent transactions.
            let lanes = self.settings.write_concurrency.max(1);
            let mut groups: Vec<Vec<SourcedEvent>> = vec![Vec::new(); lanes];
            for event in &events {
                groups[event.partition.unsigned_abs() as usize % lanes].push(event.clone());
            }
            let outcomes = futures::future::join_all(
                groups
                    .iter()
                    .map(|group| self.store(group, &batch, shutdown)),
            )
            .await;
            let (mut inserted, mut rejected, mut finished) = (0, 0, true);
            for outcome in outcomes {
                match outcome? {
                    Some((i, r)) => {
                        inserted += i;
                        rejected += r;
                    }
                    None => finished = false,
                }
            }
            if !finished {
                // Shutdown while the database was down: leave the batch uncommitted.
                break;
            }
            self.metrics.stored(&events, jiff::Timestamp::now());
            stats.inserted += inserted;
            stats.dead_lettered += rejected;
            let mut next = BTreeMap::new();
            for message in &batch {
                let entry = next.entry(message.partition).or_insert(0);
                *entry = message.offset.saturating_add(1).max(*entry);
            }
            stored.extend(next.iter().map(|(&p, &o)| (p, o)));
            // A commit refused after a rebalance is not fatal: the rows are
            // stored, and the partition's new owner replays them as no-ops.
            if let Err(err) = self.commit(&next, CommitMode::Async) {
                tracing::warn!(error = %err, "offset commit refused (rebalance?); the next owner replays idempotently");
            }
            self.metrics.batch(batch.len(), inserted);
            stats.batches += 1;
        }
        // Only partitions still ours: a revoked one's new owner may be ahead.
        let assigned = self.consumer.assignment().unwrap_or_default();
        stored.retain(|&p, _| assigned.find_partition(&self.settings.topic, p).is_some());
        if !stored.is_empty()
            && let Err(err) = self.commit(&stored, CommitMode::Sync)
        {
            tracing::warn!(error = %err, "final offset commit refused; the next owner replays idempotently");
        }
        Ok(stats)
    }

    async fn next_batch(&self, shutdown: &Shutdown) -> Result<Vec<Received>, WriterError> {
        let mut batch = Vec::new();
        let mut deadline = None;
        while batch.len() < self.settings.batch_size * self.settings.write_concurrency.max(1) {
            let wait = match deadline {
                Some(at) => tokio::time::sleep_until(at),
                None => tokio::time::sleep(Duration::from_millis(500)),
            };
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = wait => break,
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
                    deadline.get_or_insert_with(|| tokio::time::Instant::now() + self.settings.flush_interval);
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

    /// Writes the batch; on a rejected row, isolates it by writing rows one
    /// at a time, retrying each rejected row before dead-lettering it. While
    /// the database is unreachable it waits with backoff and does not move
    /// on. `None` means shutdown came first.
    async fn store(
        &self,
        events: &[SourcedEvent],
        batch: &[Received],
        shutdown: &Shutdown,
    ) -> Result<Option<(u64, u64)>, WriterError> {
        if events.is_empty() {
            return Ok(Some((0, 0)));
        }
        match self.write_until_reachable(events, shutdown).await {
            None => return Ok(None),
            Some(Ok(outcome)) => return Ok(Some((outcome.inserted, 0))),
            Some(Err(err)) => {
                tracing::warn!(error = %err, size = events.len(), "batch rejected; isolating the bad rows")
            }
        }
        let (mut inserted, mut rejected) = (0, 0);
        for event in events {
            let mut attempt = 1;
            loop {
                match self
                    .write_until_reachable(std::slice::from_ref(event), shutdown)
                    .await
                {
                    None => return Ok(None),
                    Some(Ok(outcome)) => {
                        inserted += outcome.inserted;
                        break;
                    }
                    Some(Err(err)) if attempt < MAX_ATTEMPTS => {
                        tracing::warn!(error = %err, attempt, order = event.event.order_id, "row rejected; retrying");
                        attempt += 1;
                    }
                    Some(Err(err)) => {
                        let original = batch
                            .iter()
                            .find(|m| m.partition == event.partition && m.offset == event.offset);
                        if let Some(message) = original {
                            self.dead_letter(message, "db_rejected", &err.to_string(), shutdown)
                                .await?;
                        }
                        rejected += 1;
                        break;
                    }
                }
            }
        }
        Ok(Some((inserted, rejected)))
    }

    /// `Some(Ok)` stored, `Some(Err)` the database refused the data, `None`
    /// shutdown while it was unreachable.
    async fn write_until_reachable(
        &self,
        events: &[SourcedEvent],
        shutdown: &Shutdown,
    ) -> Option<Result<crate::sink::BatchOutcome, SinkError>> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.sink.write_batch(events).await {
                Ok(outcome) => return Some(Ok(outcome)),
                Err(err) if is_rejection(&err) => return Some(Err(err)),
                Err(err) => {
                    tracing::warn!(error = %err, retry_in_ms = backoff.as_millis() as u64, "database unavailable; holding the batch");
                    tokio::select! {
                        _ = shutdown.wait() => return None,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Sends one message to the DLQ with its reason and origin, and waits
    /// for the acknowledgement (retrying), so its offset may be committed.
    async fn dead_letter(
        &self,
        message: &Received,
        reason: &str,
        error: &str,
        shutdown: &Shutdown,
    ) -> Result<(), WriterError> {
        let (partition, offset) = (message.partition.to_string(), message.offset.to_string());
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "flashsale-dlq-reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "flashsale-dlq-error",
                value: Some(error),
            })
            .insert(Header {
                key: "flashsale-original-topic",
                value: Some(self.settings.topic.as_str()),
            })
            .insert(Header {
                key: "flashsale-original-partition",
                value: Some(partition.as_str()),
            })
            .insert(Header {
                key: "flashsale-original-offset",
                value: Some(offset.as_str()),
            });
        self.metrics.dead_letter(reason);
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut record = FutureRecord::to(&self.settings.dlq_topic)
                .payload(&message.payload)
                .headers(headers.clone());
            if let Some(key) = &message.key {
                record = record.key(key);
            }
            match self
                .dlq
                .send(record, Timeout::After(Duration::from_secs(10)))
                .await
            {
                Ok(_) => return Ok(()),
                Err((err, _)) => {
                    tracing::warn!(error = %err, "DLQ send failed; retrying");
                    tokio::select! {
                        _ = shutdown.wait() => return Err(WriterError::Kafka(err)),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
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

/// Events not yet committed by this member: over its assigned partitions,
/// the high watermark minus the group's committed offset (or the low
/// watermark where nothing is committed yet).
fn lag_of(consumer: &StreamConsumer, topic: &str) -> Result<i64, KafkaError> {
    let assignment = consumer.assignment()?;
    if assignment.count() == 0 {
        return Ok(0);
    }
    let committed = consumer.committed_offsets(assignment, BROKER_CALL_TIMEOUT)?;
    let mut lag = 0;
    for element in committed.elements_for_topic(topic) {
        let (low, high) =
            consumer.fetch_watermarks(topic, element.partition(), BROKER_CALL_TIMEOUT)?;
        let done = match element.offset() {
            Offset::Offset(n) => n,
            _ => low,
        };
        lag += (high - done).max(0);
    }
    Ok(lag)
}

/// Checks that the broker answers and the topic exists; cheap to clone.
#[derive(Clone)]
struct KafkaProbe {
    consumer: Arc<StreamConsumer>,
    topic: String,
}

impl KafkaProbe {
    /// `Ok` when the broker returned the topic's metadata in time.
    async fn check(&self) -> Result<(), String> {
        let (consumer, topic) = (Arc::clone(&self.consumer), self.topic.clone());
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

/// Whether the database refused the data (retrying the same rows cannot
/// help) rather than being unreachable (waiting can).
fn is_rejection(err: &SinkError) -> bool {
    match err {
        SinkError::Database(sqlx::Error::Database(db)) => {
            db.kind() != sqlx::error::ErrorKind::Other
                || db.code().is_some_and(|c| c.starts_with("22"))
        }
        _ => false,
    }
}
