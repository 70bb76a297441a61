//! The order-event producer: idempotent, acks from every in-sync replica,
//! and `send` returns only once the broker acknowledged, within a bound.

use std::time::Duration;

use rdkafka::{
    ClientConfig,
    error::KafkaError,
    producer::{FutureProducer, FutureRecord, Producer},
    util::Timeout,
};

use crate::event::{OrderEvent, Poison};

/// Producer settings.
#[derive(Debug, Clone)]
pub struct ProducerSettings {
    /// Bootstrap servers.
    pub brokers: String,
    /// Topic of order events.
    pub topic: String,
    /// Longest a send may take, queueing and retries included.
    pub send_timeout: Duration,
    /// How long the client waits to fill a batch (latency for throughput).
    pub linger: Duration,
}

impl ProducerSettings {
    /// Defaults for `brokers`: topic `flashsale.orders`, 5 s send bound,
    /// 5 ms linger.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topic: "flashsale.orders".to_owned(),
            send_timeout: Duration::from_secs(5),
            linger: Duration::from_millis(5),
        }
    }
}

/// Why an event was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// The client could not be built from the settings.
    #[error("kafka producer configuration: {0}")]
    Config(#[source] KafkaError),
    /// The event breaks the contract; it was not sent.
    #[error("refusing to publish an invalid event: {0}")]
    Invalid(#[from] Poison),
    /// The broker did not acknowledge within the bound (or refused).
    #[error("order event not acknowledged: {0}")]
    NotAcknowledged(#[source] KafkaError),
}

/// Where an acknowledged event landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// Publishes order events keyed by user id.
#[derive(Clone)]
pub struct OrderProducer {
    producer: FutureProducer,
    topic: String,
    timeout: Duration,
}

impl OrderProducer {
    /// Builds the producer; no connection is made until the first send.
    pub fn new(settings: &ProducerSettings) -> Result<Self, ProduceError> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            // Idempotence implies acks=all and bounded in-flight requests,
            // so retries never duplicate or reorder a user's events.
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("linger.ms", settings.linger.as_millis().to_string())
            .set("batch.num.messages", "500")
            .set(
                "message.timeout.ms",
                settings.send_timeout.as_millis().to_string(),
            )
            .create()
            .map_err(ProduceError::Config)?;
        Ok(Self {
            producer,
            topic: settings.topic.clone(),
            timeout: settings.send_timeout,
        })
    }

    /// Validates and sends one event; resolves once the broker acknowledged
    /// it (all in-sync replicas) or the send bound passed.
    pub async fn send(&self, event: &OrderEvent) -> Result<Delivered, ProduceError> {
        event.validate()?;
        let payload = event.to_payload();
        let record = FutureRecord::to(&self.topic)
            .key(&event.user_id)
            .payload(&payload);
        match self
            .producer
            .send(record, Timeout::After(self.timeout))
            .await
        {
            Ok(delivery) => Ok(Delivered {
                partition: delivery.partition,
                offset: delivery.offset,
            }),
            Err((err, _)) => Err(ProduceError::NotAcknowledged(err)),
        }
    }

    /// Waits for every queued event to be acknowledged (at shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), ProduceError> {
        self.producer
            .flush(Timeout::After(timeout))
            .map_err(ProduceError::NotAcknowledged)
    }
}
