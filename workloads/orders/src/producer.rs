//! The order-event producer: idempotent, acks from every in-sync replica,
//! and `send` returns only once the broker acknowledged, within a bound.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

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
///
/// librdkafka's idempotent producer turns fatal when it finds its sequence
/// numbers out of step with the broker's (after an outage longer than the
/// send bound, for example) and then refuses every send at once. The send
/// that meets such a producer replaces it with a new one (a new producer
/// id), so orders are acknowledged again once the broker answers; the
/// order-writer stores each order once whichever producer sent it.
#[derive(Clone)]
pub struct OrderProducer {
    current: Arc<Mutex<Current>>,
    config: ClientConfig,
    topic: String,
    timeout: Duration,
}

/// The producer in use, and how many it replaced.
struct Current {
    generation: u64,
    producer: FutureProducer,
}

impl OrderProducer {
    /// Builds the producer; no connection is made until the first send.
    pub fn new(settings: &ProducerSettings) -> Result<Self, ProduceError> {
        let mut config = ClientConfig::new();
        config
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
            );
        let producer = config.create().map_err(ProduceError::Config)?;
        Ok(Self {
            current: Arc::new(Mutex::new(Current {
                generation: 0,
                producer,
            })),
            config,
            topic: settings.topic.clone(),
            timeout: settings.send_timeout,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn producer(&self) -> (u64, FutureProducer) {
        let current = self.lock();
        (current.generation, current.producer.clone())
    }

    /// Replaces the producer of `generation` if it turned fatal (once, when
    /// several sends meet it together).
    fn replace_if_fatal(&self, generation: u64, producer: &FutureProducer) {
        let Some((code, reason)) = producer.client().fatal_error() else {
            return;
        };
        let mut current = self.lock();
        if current.generation != generation {
            return;
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                current.producer = fresh;
                current.generation += 1;
                tracing::warn!(%code, %reason, generation = current.generation,
                    "the kafka producer turned fatal; replaced it with a new one");
            }
            Err(err) => {
                tracing::error!(%code, %reason, error = %err,
                    "the kafka producer turned fatal and a new one could not be built");
            }
        }
    }

    /// Validates and sends one event; resolves once the broker acknowledged
    /// it (all in-sync replicas) or the send bound passed.
    pub async fn send(&self, event: &OrderEvent) -> Result<Delivered, ProduceError> {
        event.validate()?;
        let payload = event.to_payload();
        let record = FutureRecord::to(&self.topic)
            .key(&event.user_id)
            .payload(&payload);
        let (generation, producer) = self.producer();
        match producer.send(record, Timeout::After(self.timeout)).await {
            Ok(delivery) => Ok(Delivered {
                partition: delivery.partition,
                offset: delivery.offset,
            }),
            Err((err, _)) => {
                self.replace_if_fatal(generation, &producer);
                Err(ProduceError::NotAcknowledged(err))
            }
        }
    }

    /// Waits for every queued event to be acknowledged (at shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), ProduceError> {
        self.producer()
            .1
            .flush(Timeout::After(timeout))
            .map_err(ProduceError::NotAcknowledged)
    }
}
