//! Kafka helpers for tests: a fresh topic, and every order event in it.

use std::time::{Duration, Instant};

use flashsale_orders::OrderEvent;
use rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{BaseConsumer, Consumer},
    error::KafkaError,
};

use crate::stack;

/// Why a Kafka helper failed.
#[derive(Debug, thiserror::Error)]
pub enum KafkaHelperError {
    /// The client or broker failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The broker refused to create the topic.
    #[error("creating topic {0}: {1}")]
    Create(String, String),
    /// The topic was not read to its end in time.
    #[error("read {read} of {total} messages of {topic} within {within:?}")]
    Timeout {
        /// Topic.
        topic: String,
        /// Messages read.
        read: usize,
        /// Messages there were.
        total: i64,
        /// The bound.
        within: Duration,
    },
    /// A message is not an order event.
    #[error("message at {partition}/{offset} is not an order event: {reason}")]
    NotAnEvent {
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// The parser's reason.
        reason: String,
    },
    /// The reading task failed.
    #[error("reader task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Creates `topic` with `partitions` partitions (replication 1).
pub async fn create_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
) -> Result<(), KafkaHelperError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &options,
        )
        .await?
    {
        result.map_err(|(name, code)| KafkaHelperError::Create(name, code.to_string()))?;
    }
    Ok(())
}

/// Creates `topics` (name, partitions) on the brokers of `brokers`, every
/// partition on `replicas` brokers and a write (acks=all) acknowledged only
/// once `min_insync` of them hold it.
pub async fn create_replicated_topics(
    brokers: &str,
    topics: &[(&str, i32)],
    replicas: i32,
    min_insync: i32,
) -> Result<(), KafkaHelperError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let min_insync = min_insync.to_string();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| {
            NewTopic::new(name, *partitions, TopicReplication::Fixed(replicas))
                .set("min.insync.replicas", &min_insync)
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&new, &options).await? {
        result.map_err(|(name, code)| KafkaHelperError::Create(name, code.to_string()))?;
    }
    Ok(())
}

/// Every order event in `topic`, each partition read to the end it had when
/// the call began, in partition then offset order.
pub async fn events(brokers: &str, topic: &str) -> Result<Vec<OrderEvent>, KafkaHelperError> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || read_all(&brokers, &topic)).await?
}

fn read_all(brokers: &str, topic: &str) -> Result<Vec<OrderEvent>, KafkaHelperError> {
    const WITHIN: Duration = Duration::from_secs(20);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", stack::unique_name("test-reader"))
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut events = Vec::new();
    let deadline = Instant::now() + WITHIN;
    for partition in partitions {
        let (_, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
        consumer.assign(&assignment)?;
        let mut next = 0;
        while next < high {
            if Instant::now() > deadline {
                return Err(KafkaHelperError::Timeout {
                    topic: topic.to_owned(),
                    read: events.len(),
                    total: high,
                    within: WITHIN,
                });
            }
            if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                let message = message?;
                next = message.offset() + 1;
                let payload = message.payload().unwrap_or_default();
                let event =
                    OrderEvent::parse(payload).map_err(|p| KafkaHelperError::NotAnEvent {
                        partition,
                        offset: message.offset(),
                        reason: p.to_string(),
                    })?;
                events.push(event);
            }
        }
    }
    Ok(events)
}
