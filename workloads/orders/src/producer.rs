//! The order-event producer: idempotent, acks from every in-sync replica,
//! and `send` returns only once the broker acknowledged, within a bound.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use prometheus_client::metrics::counter::Counter;
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
    /// Counts the producer's replacements; a workload registers it in its
    /// metrics under its own name.
    pub replacements: Counter,
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
            replacements: Counter::default(),
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

/// The shortest time a producer may fail every send before it is replaced:
/// longer than a healthy producer takes to find a broker back.
const STALL_FLOOR: Duration = Duration::from_secs(10);

/// Publishes order events keyed by user id.
///
/// librdkafka's idempotent producer can stop acknowledging for good after a
/// broker outage:
/// - it turns fatal when it finds its sequence numbers out of step with the
///   broker's (after an outage longer than the send bound, for example), and
///   then refuses every send at once;
/// - it can also stay in a state that is not fatal but times out every send,
///   with the broker back and answering others (seen here after broker
///   pauses and restarts under load, for 10 to 60 s).
///
/// A failed send that finds the producer fatal, or failing every send for
/// the stall bound, replaces it with a new one (a new producer id), so
/// orders are acknowledged again once the broker answers; the order-writer
/// stores each order once whichever producer sent it.
#[derive(Clone)]
pub struct OrderProducer {
    current: Arc<Mutex<Current>>,
    config: ClientConfig,
    topic: String,
    timeout: Duration,
    stall_bound: Duration,
    replacements: Counter,
}

/// The producer in use, how many came before it, and since when it has had
/// only failed sends.
struct Current {
    generation: u64,
    producer: FutureProducer,
    failing_since: Option<Instant>,
}

/// Why the producer that failed a send must be replaced, if it must.
fn replacement(
    fatal: Option<(rdkafka::types::RDKafkaErrorCode, String)>,
    failing_for: Duration,
    stall_bound: Duration,
) -> Option<String> {
    match fatal {
        Some((code, reason)) => Some(format!("it turned fatal ({code}: {reason})")),
        None if failing_for >= stall_bound => Some(format!(
            "it failed every send for {}s",
            failing_for.as_secs()
        )),
        None => None,
    }
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
            )
            // A broker back from an outage is found within a second, not
            // after reconnection attempts backed off to 10 s.
            .set("reconnect.backoff.max.ms", "1000");
        let producer = config.create().map_err(ProduceError::Config)?;
        Ok(Self {
            current: Arc::new(Mutex::new(Current {
                generation: 0,
                producer,
                failing_since: None,
            })),
            config,
            topic: settings.topic.clone(),
            timeout: settings.send_timeout,
            stall_bound: (settings.send_timeout * 3).max(STALL_FLOOR),
            replacements: settings.replacements.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn producer(&self) -> (u64, FutureProducer) {
        let current = self.lock();
        (current.generation, current.producer.clone())
    }

    /// Notes an acknowledged send of `generation`'s producer.
    fn acknowledged(&self, generation: u64) {
        let mut current = self.lock();
        if current.generation == generation {
            current.failing_since = None;
        }
    }

    /// Notes a failed send of `generation`'s producer, and replaces that
    /// producer if it turned fatal or stalled (once, when several sends meet
    /// it together).
    fn failed(&self, generation: u64, producer: &FutureProducer) {
        let fatal = producer.client().fatal_error();
        let mut current = self.lock();
        if current.generation != generation {
            return;
        }
        let failing_since = *current.failing_since.get_or_insert_with(Instant::now);
        let Some(why) = replacement(fatal, failing_since.elapsed(), self.stall_bound) else {
            return;
        };
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                current.producer = fresh;
                current.generation += 1;
                current.failing_since = None;
                self.replacements.inc();
                tracing::warn!(
                    generation = current.generation,
                    "replaced the kafka producer with a new one: {why}"
                );
            }
            Err(err) => {
                tracing::error!(error = %err,
                    "the kafka producer must be replaced ({why}), and a new one could not be built");
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
            Ok(delivery) => {
                self.acknowledged(generation);
                Ok(Delivered {
                    partition: delivery.partition,
                    offset: delivery.offset,
                })
            }
            Err((err, _)) => {
                self.failed(generation, &producer);
                Err(ProduceError::NotAcknowledged(err))
            }
        }
    }

    /// How many times the producer was replaced, having turned fatal or
    /// stalled: the settings' counter, so every producer built from one
    /// settings value adds to the same count.
    pub fn replacements(&self) -> u64 {
        self.replacements.get()
    }

    /// Waits for every queued event to be acknowledged (at shutdown).
    pub fn flush(&self, timeout: Duration) -> Result<(), ProduceError> {
        self.producer()
            .1
            .flush(Timeout::After(timeout))
            .map_err(ProduceError::NotAcknowledged)
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::types::RDKafkaErrorCode;

    use super::*;

    #[test]
    fn a_fatal_or_stalled_producer_is_replaced_and_one_failing_for_less_is_kept() {
        let bound = Duration::from_secs(10);
        let fatal = Some((
            RDKafkaErrorCode::OutOfOrderSequenceNumber,
            "out of step".to_owned(),
        ));
        let why = replacement(fatal, Duration::ZERO, bound);
        assert!(
            why.as_deref().is_some_and(|w| w.contains("fatal")),
            "{why:?}"
        );
        assert_eq!(replacement(None, Duration::from_millis(9_999), bound), None);
        let why = replacement(None, bound, bound);
        assert!(why.as_deref().is_some_and(|w| w.contains("10s")), "{why:?}");
    }

    #[test]
    fn the_stall_bound_is_three_send_bounds_and_never_under_its_floor() {
        let mut settings = ProducerSettings::new("127.0.0.1:9");
        for (send, stall) in [(1, 10), (5, 15), (20, 60)] {
            settings.send_timeout = Duration::from_secs(send);
            let producer = OrderProducer::new(&settings).map(|p| p.stall_bound);
            assert_eq!(
                producer.ok(),
                Some(Duration::from_secs(stall)),
                "send bound {send}s"
            );
        }
    }
}
