//! The producer against the real Kafka broker of the local stack.

use std::{collections::HashMap, time::Duration};

use flashsale_e2e::stack;
use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ProducerSettings, SCHEMA_VERSION};
use rdkafka::{
    ClientConfig, Message,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{Consumer, StreamConsumer},
};

fn event(n: usize) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        kind: EventKind::Created,
        order_id: format!("o-{n}"),
        sale: "s".into(),
        user_id: format!("u-{}", n % 13),
        sku: "PHONE".into(),
        quantity: 1,
        amount_minor: 100,
        idempotency_key: format!("k-{n}"),
        reservation_id: format!("r-{n}"),
        created_at: jiff::Timestamp::now(),
    }
}

#[tokio::test]
async fn acknowledged_events_are_all_there_keyed_by_user() -> anyhow::Result<()> {
    let brokers = stack::kafka_brokers()?;
    let topic = stack::unique_name("orders");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            &[NewTopic::new(&topic, 6, TopicReplication::Fixed(1))],
            &options,
        )
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("creating {name}: {code}"))?;
    }

    let mut settings = ProducerSettings::new(&brokers);
    settings.topic = topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let mut partition_of_user: HashMap<String, i32> = HashMap::new();
    for n in 0..300 {
        let e = event(n);
        let delivered = producer.send(&e).await?;
        let first = *partition_of_user
            .entry(e.user_id.clone())
            .or_insert(delivered.partition);
        assert_eq!(
            first, delivered.partition,
            "one user's events share a partition"
        );
    }

    let mut bad = event(999);
    bad.quantity = 0;
    assert!(
        producer.send(&bad).await.is_err(),
        "an invalid event is refused before sending"
    );

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", stack::unique_name("orders-check"))
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&topic])?;
    let mut seen = HashMap::new();
    while seen.len() < 300 {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .map_err(|_| anyhow::anyhow!("only {} of 300 events within 30 s", seen.len()))??;
        let parsed = OrderEvent::parse(message.payload().unwrap_or_default())?;
        assert_eq!(message.key(), Some(parsed.user_id.as_bytes()));
        seen.insert(parsed.order_id.clone(), parsed);
    }
    assert_eq!(seen.len(), 300);
    assert!(!seen.contains_key("o-999"));
    admin.delete_topics(&[&topic], &options).await?;
    Ok(())
}
