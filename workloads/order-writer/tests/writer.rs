//! The writer loop against the real Kafka and PostgreSQL of the local stack.

mod common;

use std::time::Duration;

use common::Topics;
use flashsale_e2e::stack;
use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::{Shutdown, metrics::render};
use order_writer::{metrics::WriterMetrics, sink::Sink, writer::Writer};
use rdkafka::{
    ClientConfig, Message,
    consumer::{Consumer, StreamConsumer},
    message::Headers,
    producer::{FutureProducer, FutureRecord},
    util::Timeout,
};

const GOOD: usize = 500;

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

    // Healthy events through the real producer, poison mixed in by hand.
    let mut settings = ProducerSettings::new(&brokers);
    settings.topic = topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let raw: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let mut negative = serde_json::to_value(common::event(&sale, 9_999))?;
    negative["quantity"] = (-2).into();
    let mut future = serde_json::to_value(common::event(&sale, 9_998))?;
    future["schema_version"] = 7.into();
    let poison: Vec<(Vec<u8>, &str)> = vec![
        (b"{oops".to_vec(), "malformed"),
        (negative.to_string().into_bytes(), "invalid_field"),
        (future.to_string().into_bytes(), "unknown_schema_version"),
        (vec![b'x'; 20_000], "oversize"),
    ];
    for n in 0..GOOD {
        producer.send(&common::event(&sale, n)).await?;
        let due = if n % 100 == 50 {
            poison.get(n / 100)
        } else {
            None
        };
        if let Some((payload, _)) = due {
            raw.send(
                FutureRecord::to(&topic).key("u1").payload(payload),
                Timeout::After(Duration::from_secs(10)),
            )
            .await
            .map_err(|(e, _)| e)?;
        }
    }

    let database = common::PrivateDatabase::create(&stack::postgres_url()?).await?;
    let sink = Sink::connect(&database.url, 4).await?;
    let group = stack::unique_name("writer-group");
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = WriterMetrics::register(&mut registry);
    let writer = Writer::new(
        common::writer_settings(&brokers, &topic, &dlq, &group),
        sink.clone(),
        metrics,
    )?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let stats = writer.run(shutdown).await;
            (stats, writer.close(Duration::from_secs(10)).await)
        }
    });

    common::wait_stored_exactly(
        &sink,
        &sale,
        &common::order_ids(&sale, 0..GOOD),
        Duration::from_secs(60),
    )
    .await?;

    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", stack::unique_name("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .create()?;
    reader.subscribe(&[&dlq])?;
    let mut reasons = Vec::new();
    while reasons.len() < poison.len() {
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
    flashsale_e2e::wait::poll_until(
        "the lag gauge to read a measured 0",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            match common::sample(&registry, "order_writer_consumer_lag") {
                Ok(Some(0)) => Ok(()),
                other => Err(format!("lag {other:?}")),
            }
        },
    )
    .await?;

    let text = render(&registry)?;
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
