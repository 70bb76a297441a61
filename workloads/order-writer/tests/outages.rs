//! Real outages of the stack's PostgreSQL and Kafka while the writer runs:
//! nothing acknowledged is lost, nothing goes to the DLQ for it, and the
//! writer catches up by itself. `/readyz` names the dependency that is down.

mod common;

use std::time::{Duration, Instant};

use common::Topics;
use flashsale_e2e::{faults, orders::Stream, stack, wait::poll_until};
use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::{Readiness, Shutdown};
use order_writer::{
    metrics::WriterMetrics,
    sink::Sink,
    writer::{Writer, WriterStats},
};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

/// A writer running in this process, with its metrics and readiness.
struct Running {
    registry: Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    task: JoinHandle<common::WriterEnd>,
    group: String,
}

async fn start_writer(topics: &Topics, sink: Sink) -> anyhow::Result<Running> {
    let group = stack::unique_name("outage-group");
    let mut registry = Registry::default();
    let metrics = WriterMetrics::register(&mut registry);
    let writer = Writer::new(
        common::writer_settings(&topics.brokers, &topics.topic, &topics.dlq, &group),
        sink,
        metrics,
    )?;
    let readiness = writer.readiness();
    let shutdown = Shutdown::new();
    let task = common::spawn_writer(writer, &shutdown);
    Ok(Running {
        registry,
        readiness,
        shutdown,
        task,
        group,
    })
}

impl Running {
    async fn wait_lag(&self, expected: i64, within: Duration) -> anyhow::Result<()> {
        poll_until(
            "consumer lag to reach its expected value",
            within,
            Duration::from_millis(200),
            || async {
                // Measured: a gauge not measured yet is absent, never 0.
                match common::sample(&self.registry, "order_writer_consumer_lag") {
                    Ok(Some(lag)) if lag == expected => Ok(()),
                    other => Err(format!("lag {other:?}, expected {expected}")),
                }
            },
        )
        .await
        .map_err(Into::into)
    }

    async fn stop(self) -> anyhow::Result<WriterStats> {
        self.shutdown.trigger();
        let (stats, closed) = tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .map_err(|_| anyhow::anyhow!("the writer did not stop within 30 s"))??;
        let stats = stats?;
        anyhow::ensure!(
            closed,
            "the writer did not leave the consumer group within 10 s"
        );
        Ok(stats)
    }
}

fn producer(topics: &Topics) -> anyhow::Result<OrderProducer> {
    let mut settings = ProducerSettings::new(&topics.brokers);
    settings.topic = topics.topic.clone();
    Ok(OrderProducer::new(&settings)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_stopped_for_10s_loses_nothing_and_dead_letters_nothing() -> anyhow::Result<()> {
    let _exclusive = faults::exclusive().await;
    let topics = Topics::create(3).await?;
    let sale = stack::unique_name("db-outage");
    let database = common::PrivateDatabase::create(&stack::postgres_url()?).await?;
    let sink = Sink::connect(&database.url, 4).await?;
    let producer = producer(&topics)?;
    let writer = start_writer(&topics, sink.clone()).await?;

    let (acked, _) = common::produce(&producer, &sale, 0..2_000, 500).await;
    assert_eq!(acked.len(), 2_000);
    common::wait_stored_exactly(
        &sink,
        &sale,
        &common::order_ids(&sale, 0..2_000),
        Duration::from_secs(60),
    )
    .await?;
    writer.wait_lag(0, Duration::from_secs(30)).await?;

    let outage = faults::Outage::begin("postgres").await?;
    let down_since = Instant::now();
    let (acked, _) = common::produce(&producer, &sale, 2_000..5_000, 500).await;
    assert_eq!(
        acked.len(),
        3_000,
        "Kafka takes orders while the database is down"
    );
    // Nothing is committed while the database is down: the lag is exactly
    // what arrived since.
    writer.wait_lag(3_000, Duration::from_secs(10)).await?;
    let report = writer.readiness.report().await;
    assert!(!report.ready, "{report:?}");
    assert_ne!(report.checks["database"], "ok");
    assert_eq!(report.checks["kafka"], "ok");
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(down_since.elapsed())).await;
    outage.end().await?;

    let back = Instant::now();
    common::wait_stored_exactly(
        &sink,
        &sale,
        &common::order_ids(&sale, 0..5_000),
        Duration::from_secs(60),
    )
    .await?;
    eprintln!(
        "caught up {} ms after the database came back",
        back.elapsed().as_millis()
    );
    topics
        .wait_committed_to_end(&writer.group, Duration::from_secs(30))
        .await?;
    writer.wait_lag(0, Duration::from_secs(30)).await?;
    assert!(writer.readiness.report().await.ready);
    let stats = writer.stop().await?;
    assert_eq!((stats.inserted, stats.dead_lettered), (5_000, 0));
    assert_eq!(topics.message_count(&topics.dlq, 1).await?, 0);
    topics.delete().await?;
    database.remove().await
}

/// Produces orders of `sale` 50 at a time until `stop`: the acknowledged
/// order numbers, how many sends failed, and how many orders were sent.
/// Waits until `sale` has at least `rows` rows stored.
async fn wait_rows(
    sink: &Sink,
    sale: &str,
    rows: i64,
    what: &str,
    within: Duration,
) -> anyhow::Result<()> {
    poll_until(what, within, Duration::from_millis(100), || async {
        let stored = common::count_rows(sink, sale).await?;
        if stored >= rows {
            Ok(())
        } else {
            Err(format!("{stored} rows"))
        }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_acknowledged_across_a_broker_restart_is_stored() -> anyhow::Result<()> {
    let _exclusive = faults::exclusive().await;
    let topics = Topics::create(3).await?;
    let sale = stack::unique_name("broker-restart");
    let database = common::PrivateDatabase::create(&stack::postgres_url()?).await?;
    let sink = Sink::connect(&database.url, 4).await?;
    let producer = producer(&topics)?;
    let writer = start_writer(&topics, sink.clone()).await?;

    // Orders keep coming, 50 senders at once, through the whole restart.
    let stream = Stream::start(&producer, &sale, 50, Duration::from_secs(180));
    wait_rows(
        &sink,
        &sale,
        1_000,
        "orders flowing before the restart",
        Duration::from_secs(30),
    )
    .await?;

    let outage = faults::Outage::begin("kafka").await?;
    let report = writer.readiness.report().await;
    assert_ne!(report.checks["kafka"], "ok", "{report:?}");
    assert_eq!(report.checks["database"], "ok");
    outage.end().await?;
    let rows_at_restart = common::count_rows(&sink, &sale)
        .await
        .map_err(anyhow::Error::msg)?;
    wait_rows(
        &sink,
        &sale,
        rows_at_restart + 1_000,
        "orders flowing after the restart",
        Duration::from_secs(60),
    )
    .await?;
    let sent = stream.stop().await;
    eprintln!(
        "{} acknowledged, {} failed during the restart",
        sent.acked.len(),
        sent.failed.len()
    );

    // Every acknowledged event is stored; unacknowledged ones may be stored
    // too (the broker may have written them before the answer was lost),
    // but nothing the test did not send.
    let acked = common::order_ids(&sale, sent.acked.iter().copied());
    let sent_ids = common::order_ids(&sale, sent.all());
    let stored = poll_until(
        "every acknowledged event stored",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let stored = common::stored_ids(&sink, &sale).await?;
            let missing = acked.difference(&stored).count();
            if missing == 0 {
                Ok(stored)
            } else {
                Err(format!("{missing} acknowledged events missing"))
            }
        },
    )
    .await?;
    let extra: Vec<&String> = stored.difference(&sent_ids).collect();
    assert!(
        extra.is_empty(),
        "{} stored orders were never sent, first {:?}",
        extra.len(),
        extra.first()
    );
    let stats = writer.stop().await?;
    assert_eq!(stats.dead_lettered, 0);
    topics.delete().await?;
    database.remove().await
}
