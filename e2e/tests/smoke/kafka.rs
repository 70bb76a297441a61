//! Kafka (KRaft) takes a topic, idempotent produces, and a consumer group's
//! committed offsets.

use std::time::Duration;

use flashsale_e2e::stack;
use rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{CommitMode, Consumer, StreamConsumer},
    producer::{FutureProducer, FutureRecord},
};

const PARTITIONS: i32 = 3;
const MESSAGES: usize = 30;

fn config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    config
}

#[tokio::test]
async fn kafka_produce_consume_and_commit_in_a_group() -> anyhow::Result<()> {
    let brokers = stack::kafka_brokers()?;
    let topic = stack::unique_name("smoke");
    let group = stack::unique_name("smoke-group");

    let admin: AdminClient<DefaultClientContext> = config(&brokers).create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &options,
        )
        .await?;
    for result in created {
        result.map_err(|(name, code)| anyhow::anyhow!("creating topic {name}: {code}"))?;
    }

    let producer: FutureProducer = config(&brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "10000")
        .create()?;
    for i in 0..MESSAGES {
        let key = format!("user-{}", i % 7);
        let payload = format!("{{\"n\":{i}}}");
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(err, _)| anyhow::anyhow!("send {i}: {err}"))?;
    }

    let consumer: StreamConsumer = config(&brokers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&topic])?;
    let mut seen = Vec::new();
    while seen.len() < MESSAGES {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .map_err(|_| {
                anyhow::anyhow!("only {} of {MESSAGES} messages within 30 s", seen.len())
            })??;
        let payload = message
            .payload()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        seen.push(payload.unwrap_or_default());
    }
    assert_eq!(seen.len(), MESSAGES);
    consumer.commit_consumer_state(CommitMode::Sync)?;

    // A second member of the group reads the offsets the broker stored.
    let reader: StreamConsumer = config(&brokers).set("group.id", &group).create()?;
    let mut partitions = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        partitions.add_partition(&topic, p);
    }
    let committed = reader.committed_offsets(partitions, Duration::from_secs(10))?;
    let total: i64 = committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(total, MESSAGES as i64, "committed offsets {committed:?}");

    admin.delete_topics(&[&topic], &options).await?;
    Ok(())
}
