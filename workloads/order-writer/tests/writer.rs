//! The writer loop against the real Kafka and PostgreSQL of the local stack.

mod common;

use std::time::Duration;

use common::Topics;
use flashsale_e2e::{stack, wait::poll_until};
use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::{Shutdown, metrics::render};
use order_writer::{metrics::WriterMetrics, sink::Sink, writer::Writer};
use prometheus_client::registry::Registry;
use rdkafka::{
    ClientConfig, Message,
    consumer::{Consumer, StreamConsumer},
    message::Headers,
    producer::{FutureProducer, FutureRecord},
    util::Timeout,
};

const GOOD: usize = 500;

/// Produces [`GOOD`] healthy orders of `sale` through the real producer,
/// with poison mixed in by hand (one every 100 orders, from the 50th); the
/// poison and the reason each must be dead-lettered with.
async fn produce_with_poison(
    topics: &Topics,
    sale: &str,
) -> anyhow::Result<Vec<(Vec<u8>, &'static str)>> {
    let mut settings = ProducerSettings::new(&topics.brokers);
    settings.topic = topics.topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let raw: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &topics.brokers)
        .create()?;
    let mut negative = serde_json::to_value(common::event(sale, 9_999))?;
    negative["quantity"] = (-2).into();
    let mut future = serde_json::to_value(common::event(sale, 9_998))?;
    future["schema_version"] = 7.into();
    let poison: Vec<(Vec<u8>, &str)> = vec![
        (b"{oops".to_vec(), "malformed"),
        (negative.to_string().into_bytes(), "invalid_field"),
        (future.to_string().into_bytes(), "unknown_schema_version"),
        (vec![b'x'; 20_000], "oversize"),
    ];
    for n in 0..GOOD {
        producer.send(&common::event(sale, n)).await?;
        let due = if n % 100 == 50 {
            poison.get(n / 100)
        } else {
            None
        };
        if let Some((payload, _)) = due {
            raw.send(
                FutureRecord::to(&topics.topic).key("u1").payload(payload),
                Timeout::After(Duration::from_secs(10)),
            )
            .await
            .map_err(|(e, _)| e)?;
        }
    }
    Ok(poison)
}

/// Reads `count` dead letters from the DLQ; their reasons, sorted. Each
/// must name the offset it had.
async fn dead_letter_reasons(topics: &Topics, count: usize) -> anyhow::Result<Vec<String>> {
    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &topics.brokers)
        .set("group.id", stack::unique_name("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .create()?;
    reader.subscribe(&[&topics.dlq])?;
    let mut reasons = Vec::new();
    while reasons.len() < count {
        let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
            .await
            .map_err(|_| anyhow::anyhow!("only {} dead letters", reasons.len()))??;
        let headers = message
            .headers()
            .ok_or_else(|| anyhow::anyhow!("dead letter without headers"))?;
        let reason = headers
            .iter()
            .find(|h| h.key == "flashsale-dlq-reason")
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        assert!(headers.iter().any(|h| h.key == "flashsale-original-offset"));
        reasons.push(reason);
    }
    reasons.sort();
    Ok(reasons)
}

/// Once everything is committed: the lag gauge reads a measured 0, and the
/// exposition counts what was stored and dead-lettered.
async fn check_metrics(registry: &Registry) -> anyhow::Result<()> {
    flashsale_e2e::wait::poll_until(
        "the lag gauge to read a measured 0",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            match common::sample(registry, "order_writer_consumer_lag") {
                Ok(Some(0)) => Ok(()),
                other => Err(format!("lag {other:?}")),
            }
        },
    )
    .await?;

    let text = render(registry)?;
    for line in [
        format!("order_writer_persisted_total {GOOD}"),
        format!("order_writer_commit_latency_seconds_count {GOOD}"),
        "order_writer_dlq_total{reason=\"malformed\"} 1".to_owned(),
        "order_writer_dlq_total{reason=\"oversize\"} 1".to_owned(),
        "order_writer_consumer_lag 0".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_events_are_stored_poison_goes_to_the_dlq_and_offsets_follow() -> anyhow::Result<()>
{
    let topics = Topics::create(3).await?;
    let (brokers, topic, dlq) = (
        topics.brokers.clone(),
        topics.topic.clone(),
        topics.dlq.clone(),
    );
    let sale = stack::unique_name("writer");
    let poison = produce_with_poison(&topics, &sale).await?;

    let database = common::PrivateDatabase::create(&stack::postgres_url()?).await?;
    let sink = Sink::connect(&database.url, 4).await?;
    let group = stack::unique_name("writer-group");
    let mut registry = Registry::default();
    let metrics = WriterMetrics::register(&mut registry);
    let writer = Writer::new(
        common::writer_settings(&brokers, &topic, &dlq, &group),
        sink.clone(),
        metrics,
    )?;
    let shutdown = Shutdown::new();
    let running = common::spawn_writer(writer, &shutdown);

    common::wait_stored_exactly(
        &sink,
        &sale,
        &common::order_ids(&sale, 0..GOOD),
        Duration::from_secs(60),
    )
    .await?;

    let reasons = dead_letter_reasons(&topics, poison.len()).await?;
    let mut expected: Vec<String> = poison.iter().map(|(_, r)| (*r).to_owned()).collect();
    expected.sort();
    assert_eq!(reasons, expected);
    assert_eq!(
        topics.message_count(&dlq, 1).await?,
        poison.len() as i64,
        "only the poison is dead-lettered"
    );

    // Offsets are committed up to the end of every partition.
    let end = topics
        .wait_committed_to_end(&group, Duration::from_secs(30))
        .await?;
    assert_eq!(end as usize, GOOD + poison.len());
    check_metrics(&registry).await?;

    shutdown.trigger();
    let (stats, closed) = running.await?;
    let stats = stats?;
    assert!(
        closed,
        "the writer did not leave the consumer group within 10 s"
    );
    assert_eq!(
        (stats.inserted as usize, stats.dead_lettered as usize),
        (GOOD, poison.len())
    );
    topics.delete().await?;
    database.remove().await
}

/// Closing the writer leaves its consumer group at once, even while its
/// readiness checks, which `/readyz` serves until the process ends, are
/// still held: the group is left by `close`, not later on whichever thread
/// lets go of the consumer last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_leaves_the_group_while_the_readiness_checks_live() -> anyhow::Result<()> {
    let topics = Topics::create(1).await?;
    let database = common::PrivateDatabase::create(&stack::postgres_url()?).await?;
    let sink = Sink::connect(&database.url, 2).await?;
    let group = stack::unique_name("close-group");
    let writer = Writer::new(
        common::writer_settings(&topics.brokers, &topics.topic, &topics.dlq, &group),
        sink,
        WriterMetrics::register(&mut Registry::default()),
    )?;
    let readiness = writer.readiness();
    let shutdown = Shutdown::new();
    let running = common::spawn_writer(writer, &shutdown);
    poll_until(
        "the writer to join its group",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            match topics.group_members(&group).await {
                Ok(1) => Ok(()),
                other => Err(format!("members: {other:?}")),
            }
        },
    )
    .await?;
    let report = readiness.report().await;
    assert!(report.ready, "{report:?}");

    shutdown.trigger();
    let (stats, closed) = running.await?;
    stats?;
    assert!(closed, "the writer did not close within 10 s");
    assert_eq!(
        topics.group_members(&group).await?,
        0,
        "the writer is still a member of its group after close"
    );
    let report = readiness.report().await;
    assert_eq!(report.checks["kafka"], "the writer stopped", "{report:?}");
    topics.delete().await?;
    database.remove().await
}
