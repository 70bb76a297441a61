//! The writer loop against the real Kafka and PostgreSQL of the local stack.

use std::time::Duration;

use flashsale_e2e::{stack, wait::poll_until};
use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ProducerSettings, SCHEMA_VERSION};
use flashsale_runtime::Shutdown;
use order_writer::{
    metrics::WriterMetrics,
    sink::Sink,
    writer::{Writer, WriterSettings},
};
use rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{Consumer, StreamConsumer},
    message::Headers,
    producer::{FutureProducer, FutureRecord},
    util::Timeout,
};

const GOOD: usize = 500;

fn event(sale: &str, n: usize) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        kind: EventKind::Created,
        order_id: format!("{sale}-o{n}"),
        sale: sale.to_owned(),
        user_id: format!("u{}", n % 31),
        sku: "PHONE".into(),
        quantity: 1,
        amount_minor: 100,
        idempotency_key: format!("{sale}-k{n}"),
        reservation_id: format!("r{n}"),
        created_at: jiff::Timestamp::now(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_events_are_stored_poison_goes_to_the_dlq_and_offsets_follow() -> anyhow::Result<()>
{
    let brokers = stack::kafka_brokers()?;
    let (topic, dlq) = (
        stack::unique_name("orders"),
        stack::unique_name("orders-dlq"),
    );
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let topics = [
        NewTopic::new(&topic, 3, TopicReplication::Fixed(1)),
        NewTopic::new(&dlq, 1, TopicReplication::Fixed(1)),
    ];
    for result in admin.create_topics(&topics, &options).await? {
        result.map_err(|(name, code)| anyhow::anyhow!("creating {name}: {code}"))?;
    }
    let sale = stack::unique_name("writer");

    // Healthy events through the real producer, poison mixed in by hand.
    let mut settings = ProducerSettings::new(&brokers);
    settings.topic = topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let raw: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let mut negative = serde_json::to_value(event(&sale, 9_999))?;
    negative["quantity"] = (-2).into();
    let mut future = serde_json::to_value(event(&sale, 9_998))?;
    future["schema_version"] = 7.into();
    let poison: Vec<(Vec<u8>, &str)> = vec![
        (b"{oops".to_vec(), "malformed"),
        (negative.to_string().into_bytes(), "invalid_field"),
        (future.to_string().into_bytes(), "unknown_schema_version"),
        (vec![b'x'; 20_000], "oversize"),
    ];
    for n in 0..GOOD {
        producer.send(&event(&sale, n)).await?;
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

    let sink = Sink::connect(&stack::postgres_url()?, 4).await?;
    let group = stack::unique_name("writer-group");
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = WriterMetrics::register(&mut registry);
    let writer = Writer::new(
        WriterSettings {
            brokers: brokers.clone(),
            group_id: group.clone(),
            topic: topic.clone(),
            dlq_topic: dlq.clone(),
            batch_size: 200,
            flush_interval: Duration::from_millis(100),
        },
        sink.clone(),
        metrics.clone(),
    )?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { writer.run(shutdown).await }
    });

    let Sink::Postgres(pool) = &sink else {
        anyhow::bail!("postgres expected")
    };
    poll_until(
        "every healthy event stored",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE sale = $1")
                .bind(&sale)
                .fetch_one(pool)
                .await
                .map_err(|e| e.to_string())?;
            if n as usize == GOOD {
                Ok(())
            } else {
                Err(format!("{n} of {GOOD}"))
            }
        },
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

    // Offsets are committed up to the end of every partition.
    let ends = poll_until(
        "offsets committed to the end",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let (brokers, group, topic) = (brokers.clone(), group.clone(), topic.clone());
            async move {
                let probe: StreamConsumer = ClientConfig::new()
                    .set("bootstrap.servers", &brokers)
                    .set("group.id", &group)
                    .create()
                    .map_err(|e| e.to_string())?;
                let mut committed_total = 0;
                let mut end_total = 0;
                let mut list = TopicPartitionList::new();
                for p in 0..3 {
                    list.add_partition(&topic, p);
                    let (_, high) = probe
                        .fetch_watermarks(&topic, p, Duration::from_secs(5))
                        .map_err(|e| e.to_string())?;
                    end_total += high;
                }
                let committed = probe
                    .committed_offsets(list, Duration::from_secs(5))
                    .map_err(|e| e.to_string())?;
                for e in committed.elements() {
                    if let Offset::Offset(n) = e.offset() {
                        committed_total += n;
                    }
                }
                if committed_total == end_total {
                    Ok(end_total)
                } else {
                    Err(format!("{committed_total} of {end_total}"))
                }
            }
        },
    )
    .await?;
    assert_eq!(ends as usize, GOOD + poison.len());

    shutdown.trigger();
    let stats = running.await??;
    assert_eq!(
        (stats.inserted as usize, stats.dead_lettered as usize),
        (GOOD, poison.len())
    );
    admin.delete_topics(&[&topic, &dlq], &options).await?;
    Ok(())
}
