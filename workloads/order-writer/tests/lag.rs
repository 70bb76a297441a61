//! The consumer-lag gauge against the real Kafka: it is the whole group's
//! lag over every partition of the topic, so a replica that owns no
//! partition reports what the others still have to store, and it is absent
//! until it was measured.

mod common;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use common::Topics;
use flashsale_e2e::{stack, wait::poll_until};
use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::Shutdown;
use order_writer::{metrics::WriterMetrics, sink::Sink, writer::Writer};
use prometheus_client::registry::Registry;
use rdkafka::{
    ClientConfig, Offset, TopicPartitionList,
    consumer::{CommitMode, Consumer, StreamConsumer},
};

const PARTITIONS: i32 = 3;
const EVENTS: usize = 60;

/// A member of the writer's group that holds partitions and stores nothing.
struct Squatter {
    consumer: Arc<StreamConsumer>,
    polling: tokio::task::JoinHandle<()>,
}

impl Squatter {
    /// Joins `group` on the topic, with the writer's assignment strategy (a
    /// group's members must agree on it), and keeps polling so it stays.
    fn join(topics: &Topics, group: &str) -> anyhow::Result<Self> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &topics.brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .create()?;
        consumer.subscribe(&[&topics.topic])?;
        let consumer = Arc::new(consumer);
        let polling = tokio::spawn({
            let consumer = Arc::clone(&consumer);
            async move {
                loop {
                    let _ = consumer.recv().await;
                }
            }
        });
        Ok(Self { consumer, polling })
    }

    fn partitions(&self) -> Vec<i32> {
        self.consumer
            .assignment()
            .map(|a| a.elements().iter().map(|e| e.partition()).collect())
            .unwrap_or_default()
    }

    /// Leaves the group.
    async fn leave(self) -> anyhow::Result<()> {
        self.polling.abort();
        let _ = self.polling.await;
        let consumer = self.consumer;
        tokio::task::spawn_blocking(move || drop(consumer)).await?;
        Ok(())
    }
}

/// Produces [`EVENTS`] orders of `sale`: where each landed (order number →
/// partition and offset) and each partition's high watermark.
async fn produce_events(
    topics: &Topics,
    sale: &str,
) -> anyhow::Result<(BTreeMap<usize, (i32, i64)>, BTreeMap<i32, i64>)> {
    let mut settings = ProducerSettings::new(&topics.brokers);
    settings.topic = topics.topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let mut landed = BTreeMap::new();
    let mut high: BTreeMap<i32, i64> = BTreeMap::new();
    for n in 0..EVENTS {
        let delivered = producer.send(&common::event(sale, n)).await?;
        landed.insert(n, (delivered.partition, delivered.offset));
        let end = high.entry(delivered.partition).or_default();
        *end = (*end).max(delivered.offset + 1);
    }
    anyhow::ensure!(
        high.len() == PARTITIONS as usize && high.values().all(|&h| h >= 10),
        "every partition needs 10 events at least: {high:?}"
    );
    Ok((landed, high))
}

/// Three members that hold the three partitions of `group` before the
/// writer joins; the sticky assignment leaves it none.
async fn squat_every_partition(topics: &Topics, group: &str) -> anyhow::Result<[Squatter; 3]> {
    let squatters = [
        Squatter::join(topics, group)?,
        Squatter::join(topics, group)?,
        Squatter::join(topics, group)?,
    ];
    poll_until(
        "each squatter to hold one partition",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let held: Vec<Vec<i32>> = squatters.iter().map(Squatter::partitions).collect();
            if held.iter().all(|p| p.len() == 1) {
                Ok(())
            } else {
                Err(format!("{held:?}"))
            }
        },
    )
    .await?;
    Ok(squatters)
}

/// Partition 0: the group committed offset 4. Partition 1: nothing
/// committed, and retention dropped the first 6 (low watermark 6).
/// Partition 2: nothing committed. Returns the group's lag over the three.
async fn stage_offsets(
    topics: &Topics,
    squatters: &[Squatter],
    high: &BTreeMap<i32, i64>,
) -> anyhow::Result<i64> {
    let owner_of_0 = squatters
        .iter()
        .find(|s| s.partitions() == [0])
        .ok_or_else(|| anyhow::anyhow!("no squatter holds partition 0"))?;
    let mut commit = TopicPartitionList::new();
    commit.add_partition_offset(&topics.topic, 0, Offset::Offset(4))?;
    owner_of_0.consumer.commit(&commit, CommitMode::Sync)?;
    topics.delete_records_before(1, 6).await?;
    Ok((high[&0] - 4) + (high[&1] - 6) + high[&2])
}

/// The orders of `landed` the group has not committed, as
/// [`stage_offsets`] left it: partition 0 from offset 4, partition 1 from
/// offset 6, all of partition 2.
fn uncommitted(landed: &BTreeMap<usize, (i32, i64)>) -> impl Iterator<Item = usize> + '_ {
    landed
        .iter()
        .filter(|&(_, &(p, o))| match p {
            0 => o >= 4,
            1 => o >= 6,
            _ => true,
        })
        .map(|(&n, _)| n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_replica_reports_the_group_lag_over_every_partition() -> anyhow::Result<()> {
    let topics = Topics::create(PARTITIONS).await?;
    let sale = stack::unique_name("lag");
    // Order number → where it landed; partition → its high watermark.
    let (landed, high) = produce_events(&topics, &sale).await?;
    let group = stack::unique_name("lag-group");
    let squatters = squat_every_partition(&topics, &group).await?;
    let expected = stage_offsets(&topics, &squatters, &high).await?;

    let database = common::PrivateDatabase::create(&stack::postgres_url()?).await?;
    let sink = Sink::connect(&database.url, 2).await?;
    let mut registry = Registry::default();
    let metrics = WriterMetrics::register(&mut registry);
    let writer = Writer::new(
        common::writer_settings(&topics.brokers, &topics.topic, &topics.dlq, &group),
        sink.clone(),
        metrics,
    )?;
    assert_eq!(
        common::sample(&registry, "order_writer_consumer_lag")?,
        None,
        "not measured yet, so not in the exposition (0 would read as drained)"
    );
    let shutdown = Shutdown::new();
    let running = common::spawn_writer(writer, &shutdown);

    let lag_is = |want: i64| {
        let registry = &registry;
        move || async move {
            match common::sample(registry, "order_writer_consumer_lag") {
                Ok(Some(lag)) if lag == want => Ok(()),
                other => Err(format!("lag {other:?}, expected {want}")),
            }
        }
    };
    poll_until(
        "the writer, without partitions, to report the group's lag",
        Duration::from_secs(30),
        Duration::from_millis(100),
        lag_is(expected),
    )
    .await?;
    assert_eq!(
        common::count_rows(&sink, &sale)
            .await
            .map_err(anyhow::Error::msg)?,
        0,
        "the writer held no partition, so it stored nothing"
    );
    assert!(
        squatters.iter().all(|s| s.partitions().len() == 1),
        "the squatters still hold every partition"
    );

    // The squatters leave: the writer takes every partition, stores what
    // the group has not committed, and the group's lag reaches 0.
    for squatter in squatters {
        squatter.leave().await?;
    }
    let expected_ids = common::order_ids(&sale, uncommitted(&landed));
    common::wait_stored_exactly(&sink, &sale, &expected_ids, Duration::from_secs(60)).await?;
    poll_until(
        "the group's lag to reach 0",
        Duration::from_secs(30),
        Duration::from_millis(100),
        lag_is(0),
    )
    .await?;

    shutdown.trigger();
    let (stats, closed) = running.await?;
    stats?;
    assert!(
        closed,
        "the writer did not leave the consumer group within 10 s"
    );
    topics.delete().await?;
    database.remove().await
}
