//! Order topics and order events as the order-writer's tests and its
//! benchmark make them: a fresh topic with its DLQ, numbered events of a
//! sale, sends that report what the broker acknowledged, and the checks
//! every run ends with (offsets committed to the end, exactly the produced
//! orders stored).

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ProduceError, SCHEMA_VERSION};
use rdkafka::{
    ClientConfig, Offset, TopicPartitionList,
    admin::{AdminClient, AdminOptions},
    client::DefaultClientContext,
    consumer::{Consumer, StreamConsumer},
};
use tokio::task::JoinHandle;

use crate::{kafka, stack, wait::poll_until};

/// An order topic and its DLQ, deleted by [`Topics::delete`].
pub struct Topics {
    /// The brokers holding them.
    pub brokers: String,
    /// The order topic.
    pub topic: String,
    /// Its dead-letter topic.
    pub dlq: String,
    /// The order topic's partitions.
    pub partitions: i32,
    admin: AdminClient<DefaultClientContext>,
}

fn admin_options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

impl Topics {
    /// Creates a fresh order topic with `partitions` and a one-partition DLQ
    /// on the stack's single broker.
    pub async fn create(partitions: i32) -> anyhow::Result<Self> {
        Self::create_on(&stack::kafka_brokers()?, partitions, 1, 1).await
    }

    /// Creates them on the cluster of `brokers`, every partition on
    /// `replicas` brokers, and a write (acks=all) acknowledged only once
    /// `min_insync` of them hold it.
    pub async fn create_on(
        brokers: &str,
        partitions: i32,
        replicas: i32,
        min_insync: i32,
    ) -> anyhow::Result<Self> {
        let (topic, dlq) = (
            stack::unique_name("orders"),
            stack::unique_name("orders-dlq"),
        );
        Self::create_named(brokers, topic, dlq, partitions, replicas, min_insync).await
    }

    /// [`Topics::create_on`] under the names given, for a name a mirror
    /// copies (`failover.*`).
    pub async fn create_named(
        brokers: &str,
        topic: String,
        dlq: String,
        partitions: i32,
        replicas: i32,
        min_insync: i32,
    ) -> anyhow::Result<Self> {
        kafka::create_replicated_topics(
            brokers,
            &[(&topic, partitions), (&dlq, 1)],
            replicas,
            min_insync,
        )
        .await?;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()?;
        Ok(Self {
            brokers: brokers.to_owned(),
            topic,
            dlq,
            partitions,
            admin,
        })
    }

    /// Deletes both topics.
    pub async fn delete(self) -> anyhow::Result<()> {
        self.admin
            .delete_topics(&[&self.topic, &self.dlq], &admin_options())
            .await?;
        Ok(())
    }

    /// Polls until `group` has committed the end of every partition, and
    /// returns the total number of messages.
    pub async fn wait_committed_to_end(
        &self,
        group: &str,
        within: Duration,
    ) -> anyhow::Result<i64> {
        let probe: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .create()?;
        let probe = std::sync::Arc::new(probe);
        let (topic, partitions) = (self.topic.clone(), self.partitions);
        poll_until(
            "offsets committed to the end of every partition",
            within,
            Duration::from_millis(250),
            || {
                let (probe, topic) = (probe.clone(), topic.clone());
                async move {
                    tokio::task::spawn_blocking(move || {
                        let (mut committed, mut end) = (0, 0);
                        let mut list = TopicPartitionList::new();
                        for p in 0..partitions {
                            list.add_partition(&topic, p);
                            let (_, high) = probe
                                .fetch_watermarks(&topic, p, Duration::from_secs(5))
                                .map_err(|e| e.to_string())?;
                            end += high;
                        }
                        let offsets = probe
                            .committed_offsets(list, Duration::from_secs(5))
                            .map_err(|e| e.to_string())?;
                        for e in offsets.elements() {
                            if let Offset::Offset(n) = e.offset() {
                                committed += n;
                            }
                        }
                        if committed == end {
                            Ok(end)
                        } else {
                            Err(format!("{committed} of {end} committed"))
                        }
                    })
                    .await
                    .map_err(|e| e.to_string())?
                }
            },
        )
        .await
        .map_err(Into::into)
    }
}

impl Topics {
    /// Deletes the order topic's messages of `partition` before `offset`,
    /// which moves its low watermark there (retention, by hand).
    pub async fn delete_records_before(&self, partition: i32, offset: i64) -> anyhow::Result<()> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&self.topic, partition, Offset::Offset(offset))?;
        let done = self.admin.delete_records(&list, &admin_options()).await?;
        for element in done.elements() {
            element.error()?;
        }
        Ok(())
    }

    /// How many members consumer group `group` has, as its coordinator
    /// sees them.
    pub async fn group_members(&self, group: &str) -> anyhow::Result<usize> {
        let probe: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", stack::unique_name("members"))
            .create()?;
        let group = group.to_owned();
        tokio::task::spawn_blocking(move || {
            let groups = probe.fetch_group_list(Some(&group), Duration::from_secs(5))?;
            Ok(groups.groups().iter().map(|g| g.members().len()).sum())
        })
        .await?
    }

    /// Messages in `topic` (high minus low watermark over its partitions).
    pub async fn message_count(&self, topic: &str, partitions: i32) -> anyhow::Result<i64> {
        let probe: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", stack::unique_name("count"))
            .create()?;
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut total = 0;
            for p in 0..partitions {
                let (low, high) = probe.fetch_watermarks(&topic, p, Duration::from_secs(5))?;
                total += high - low;
            }
            Ok(total)
        })
        .await?
    }
}

/// The order id of the `n`th order of `sale`.
pub fn order_id(sale: &str, n: usize) -> String {
    format!("{sale}-o{n}")
}

/// The order ids of orders `numbers` of `sale`.
pub fn order_ids(sale: &str, numbers: impl IntoIterator<Item = usize>) -> BTreeSet<String> {
    numbers.into_iter().map(|n| order_id(sale, n)).collect()
}

/// The `n`th created event of `sale`; 97 users so every partition gets some.
pub fn event(sale: &str, n: usize) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        kind: EventKind::Created,
        order_id: order_id(sale, n),
        sale: sale.to_owned(),
        user_id: format!("u{}", n % 97),
        sku: "PHONE".into(),
        quantity: 1,
        amount_minor: 100,
        idempotency_key: format!("{sale}-k{n}"),
        reservation_id: format!("r{n}"),
        created_at: jiff::Timestamp::now(),
    }
}

/// Sends events `range` of `sale`, `window` at a time, and returns the
/// numbers whose send returned `Ok` (acknowledged by the broker).
pub async fn produce(
    producer: &OrderProducer,
    sale: &str,
    range: std::ops::Range<usize>,
    window: usize,
) -> (Vec<usize>, Vec<ProduceError>) {
    let (mut acked, mut failed) = (Vec::new(), Vec::new());
    let numbers: Vec<usize> = range.collect();
    for chunk in numbers.chunks(window.max(1)) {
        let sends = chunk.iter().map(|&n| async move {
            let result = producer.send(&event(sale, n)).await;
            (n, result)
        });
        for (n, result) in futures::future::join_all(sends).await {
            match result {
                Ok(_) => acked.push(n),
                Err(err) => failed.push(err),
            }
        }
    }
    (acked, failed)
}

/// Events of a sale sent without pause by `senders` concurrent senders
/// until stopped, dropped or `at_most` passed: sender `i` sends numbers
/// `i`, `i + senders`, …, each once. A refused send waits 20 ms before the
/// next, so a producer that refuses at once never spins a worker thread.
pub struct Stream {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    /// Why the latest refused send was refused, for a wait that times out.
    last_refusal: Arc<Mutex<Option<String>>>,
    tasks: Vec<JoinHandle<Sent>>,
}

/// What a [`Stream`] sent.
#[derive(Debug, Default)]
pub struct Sent {
    /// The numbers whose send returned `Ok` (acknowledged by the broker).
    pub acked: Vec<usize>,
    /// The numbers whose send failed.
    pub failed: Vec<usize>,
}

impl Sent {
    /// Every number sent, acknowledged or not.
    pub fn all(&self) -> impl Iterator<Item = usize> + '_ {
        self.acked.iter().chain(&self.failed).copied()
    }
}

impl Stream {
    /// Starts the senders on the current runtime.
    pub fn start(producer: &OrderProducer, sale: &str, senders: usize, at_most: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let last_refusal = Arc::new(Mutex::new(None));
        let until = tokio::time::Instant::now() + at_most;
        let tasks = (0..senders)
            .map(|first| {
                let (producer, sale) = (producer.clone(), sale.to_owned());
                let (stop, acked) = (stop.clone(), acked.clone());
                let last_refusal = last_refusal.clone();
                tokio::spawn(async move {
                    let mut sent = Sent::default();
                    let mut n = first;
                    while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < until {
                        if let Err(err) = producer.send(&event(&sale, n)).await {
                            *last_refusal.lock().unwrap_or_else(PoisonError::into_inner) =
                                Some(err.to_string());
                            sent.failed.push(n);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        } else {
                            acked.fetch_add(1, Ordering::Relaxed);
                            sent.acked.push(n);
                        }
                        n += senders;
                    }
                    sent
                })
            })
            .collect();
        Self {
            stop,
            acked,
            last_refusal,
            tasks,
        }
    }

    /// How many sends were acknowledged so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Waits until `more` sends past the count of `since` were acknowledged,
    /// for at most `within`.
    pub async fn wait_acked(
        &self,
        since: usize,
        more: usize,
        what: &str,
        within: Duration,
    ) -> Result<(), crate::wait::Timeout> {
        poll_until(what, within, Duration::from_millis(50), || async {
            let acked = self.acked();
            if acked >= since + more {
                Ok(())
            } else {
                let refusal = self
                    .last_refusal
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                Err(format!(
                    "{} of {more} acknowledged; the latest refusal: {}",
                    acked - since,
                    refusal.as_deref().unwrap_or("none")
                ))
            }
        })
        .await
    }

    /// Stops the senders and returns what they sent.
    pub async fn stop(mut self) -> Sent {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Sent::default();
        for task in std::mem::take(&mut self.tasks) {
            if let Ok(sent) = task.await {
                all.acked.extend(sent.acked);
                all.failed.extend(sent.failed);
            }
        }
        all
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How `stored` differs from `expected`, or `None` when it is the same set.
pub fn difference(stored: &BTreeSet<String>, expected: &BTreeSet<String>) -> Option<String> {
    let missing: Vec<&String> = expected.difference(stored).collect();
    let extra: Vec<&String> = stored.difference(expected).collect();
    if missing.is_empty() && extra.is_empty() {
        return None;
    }
    Some(format!(
        "{} of {} orders stored; {} missing (first {:?}), {} not produced by this test (first {:?})",
        stored.len(),
        expected.len(),
        missing.len(),
        missing.first(),
        extra.len(),
        extra.first()
    ))
}
