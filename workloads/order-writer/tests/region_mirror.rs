//! Region B's orders come from A through Kafka (`e2e/local/stack up
//! region-b`): MirrorMaker 2 copies A's order topic into B's Kafka under
//! the same name, and B's own order-writer stores each order once in B's
//! PostgreSQL. Every order A acknowledged reaches B's database once the
//! mirror drains; while the mirror is paused, what A acknowledged meanwhile
//! is exactly what B lacks: what region A's loss at that moment would
//! lose (the RPO), counted by order id.

mod common;

use std::time::Duration;

use flashsale_e2e::{faults, orders::Topics, region::Regions, stack};
use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::Shutdown;
use order_writer::{metrics::WriterMetrics, sink::Sink, writer::Writer};
use prometheus_client::registry::Registry;

const PARTITIONS: i32 = 3;
/// Orders before the pause, and during it.
const BEFORE: usize = 1_000;
const DURING: usize = 400;

/// Region B's order-writer, on B's Kafka and a database of its own on B's
/// PostgreSQL.
struct RegionBWriter {
    database: common::PrivateDatabase,
    sink: Sink,
    group: String,
    shutdown: Shutdown,
    running: tokio::task::JoinHandle<common::WriterEnd>,
}

impl RegionBWriter {
    async fn start(regions: &Regions, topic: &str, dlq: &str) -> anyhow::Result<Self> {
        let database = common::PrivateDatabase::create(&regions.b_database).await?;
        let sink = Sink::connect(&database.url, 4).await?;
        let group = stack::unique_name("region-b-writer");
        let mut registry = Registry::default();
        let writer = Writer::new(
            common::writer_settings(&regions.b_kafka, topic, dlq, &group),
            sink.clone(),
            WriterMetrics::register(&mut registry),
        )?;
        let shutdown = Shutdown::new();
        let running = common::spawn_writer(writer, &shutdown);
        Ok(Self {
            database,
            sink,
            group,
            shutdown,
            running,
        })
    }

    /// Stops the writer, which must leave its group, and drops its database.
    async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.trigger();
        let (stats, left) = self.running.await?;
        stats?;
        anyhow::ensure!(left, "B's writer did not leave its group");
        self.database.remove().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_b_stores_every_order_a_acknowledged_once_the_mirror_drains() -> anyhow::Result<()> {
    let regions = Regions::from_env()?;
    let _exclusive = faults::exclusive().await;
    // A name MirrorMaker copies, created on both sides with the same
    // partitions, so B's writer can subscribe before the first copy.
    let name = format!("failover.{}", stack::unique_name("orders"));
    let (topic, dlq) = (name.clone(), format!("{name}.dlq"));
    let a = Topics::create_named(
        &regions.a_kafka,
        topic.clone(),
        dlq.clone(),
        PARTITIONS,
        1,
        1,
    )
    .await?;
    let b = Topics::create_named(
        &regions.b_kafka,
        topic.clone(),
        dlq.clone(),
        PARTITIONS,
        1,
        1,
    )
    .await?;

    let writer = RegionBWriter::start(&regions, &topic, &dlq).await?;
    let (sink, group) = (writer.sink.clone(), writer.group.clone());

    let mut settings = ProducerSettings::new(&regions.a_kafka);
    settings.topic = topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let sale = stack::unique_name("mirrored");
    let (acked, failed) = common::produce(&producer, &sale, 0..BEFORE, 100).await;
    assert!(failed.is_empty(), "A refused orders: {failed:?}");
    common::wait_stored_exactly(
        &sink,
        &sale,
        &common::order_ids(&sale, acked.iter().copied()),
        Duration::from_secs(90),
    )
    .await?;

    // The mirror paused: A keeps acknowledging, B stores none of it.
    let pause = faults::Outage::pause("mirror-maker").await?;
    let (during, failed) = common::produce(&producer, &sale, BEFORE..BEFORE + DURING, 100).await;
    assert!(failed.is_empty(), "A refused orders: {failed:?}");
    // B's writer has read B's topic to its end: what B lacks is not in
    // flight there, it is only in A.
    let end = b
        .wait_committed_to_end(&group, Duration::from_secs(30))
        .await?;
    let stored = common::stored_ids(&sink, &sale)
        .await
        .map_err(anyhow::Error::msg)?;
    let lacking = common::order_ids(&sale, during.iter().copied());
    println!(
        "mirror paused: A acknowledged {} more, B's topic ends at {end}, B stores {} of {} \
         (would lose {} with A)",
        during.len(),
        stored.len(),
        acked.len() + during.len(),
        lacking.difference(&stored).count()
    );
    assert_eq!(
        stored.len(),
        acked.len(),
        "B stored orders the mirror never copied"
    );
    assert!(
        stored.is_disjoint(&lacking),
        "B holds orders A acknowledged during the pause"
    );

    // Drained: every order A acknowledged is in B's database, each once.
    pause.end().await?;
    let resumed = std::time::Instant::now();
    let all = common::order_ids(&sale, acked.iter().chain(&during).copied());
    common::wait_stored_exactly(&sink, &sale, &all, Duration::from_secs(90)).await?;
    println!(
        "mirror resumed: all {} orders in B's database {:?} later",
        all.len(),
        resumed.elapsed()
    );

    writer.stop().await?;
    a.delete().await?;
    b.delete().await
}
