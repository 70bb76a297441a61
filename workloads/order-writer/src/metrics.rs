//! The order-writer's Prometheus metrics (names per docs/architecture.md).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder},
    metrics::{
        MetricType,
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// Handles to the order-writer's metrics; cheap to clone.
#[derive(Clone)]
pub struct WriterMetrics {
    persisted: Counter,
    batch_size: Histogram,
    dlq: Family<Vec<(&'static str, String)>, Counter>,
    lag: MeasuredGauge,
    commit_latency: Histogram,
}

impl Default for WriterMetrics {
    fn default() -> Self {
        Self {
            persisted: Counter::default(),
            // 1, 2, 4 … 2048 events per batch.
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            dlq: Family::default(),
            lag: MeasuredGauge::default(),
            // 1 ms × 1.5^k up to about 3 minutes: fine enough for a p99.
            commit_latency: Histogram::new(exponential_buckets(0.001, 1.5, 30)),
        }
    }
}

impl WriterMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "order_writer_persisted",
            "Orders inserted into the database",
            metrics.persisted.clone(),
        );
        registry.register(
            "order_writer_batch_size",
            "Events per committed batch",
            metrics.batch_size.clone(),
        );
        registry.register(
            "order_writer_dlq",
            "Events sent to the dead-letter topic, by reason",
            metrics.dlq.clone(),
        );
        registry.register(
            "order_writer_consumer_lag",
            "Events of the topic not yet committed by the consumer group, over every partition \
             (high watermark minus the group's committed offset); absent until first measured",
            metrics.lag.clone(),
        );
        registry.register_with_unit(
            "order_writer_commit_latency",
            "Age of an event when the database transaction holding it committed",
            prometheus_client::registry::Unit::Seconds,
            metrics.commit_latency.clone(),
        );
        metrics
    }

    /// The consumer group's lag last measured; `None` until one succeeded.
    pub fn lag(&self) -> Option<i64> {
        self.lag.get()
    }

    pub(crate) fn set_lag(&self, lag: i64) {
        self.lag.set(lag);
    }

    /// Events created at `created` were stored by a transaction that
    /// committed at `now`.
    pub(crate) fn stored(
        &self,
        created: impl IntoIterator<Item = jiff::Timestamp>,
        now: jiff::Timestamp,
    ) {
        for at in created {
            let age = now.duration_since(at).as_secs_f64();
            self.commit_latency.observe(age.max(0.0));
        }
    }

    pub(crate) fn batch(&self, size: usize) {
        self.batch_size.observe(size as f64);
    }

    pub(crate) fn persisted(&self, inserted: u64) {
        self.persisted.inc_by(inserted);
    }

    pub(crate) fn dead_letter(&self, reason: &str) {
        self.dlq
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }
}

/// A gauge that is absent from the exposition until it is first set: a lag
/// never measured must not read as 0 ("nothing left to drain").
#[derive(Debug, Clone, Default)]
struct MeasuredGauge {
    gauge: Gauge,
    measured: Arc<AtomicBool>,
}

impl MeasuredGauge {
    fn get(&self) -> Option<i64> {
        self.measured
            .load(Ordering::Acquire)
            .then(|| self.gauge.get())
    }

    fn set(&self, value: i64) {
        self.gauge.set(value);
        self.measured.store(true, Ordering::Release);
    }
}

impl EncodeMetric for MeasuredGauge {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.gauge.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    /// An empty metric is left out of the exposition, help and type lines too.
    fn is_empty(&self) -> bool {
        !self.measured.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry)?;
        Ok(text)
    }

    #[test]
    fn the_lag_is_absent_until_measured() -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = WriterMetrics::register(&mut registry);
        let before = exposition(&registry)?;
        assert!(!before.contains("order_writer_consumer_lag"), "{before}");
        assert_eq!(metrics.lag(), None);

        metrics.set_lag(0);
        let after = exposition(&registry)?;
        assert!(
            after.lines().any(|l| l == "order_writer_consumer_lag 0"),
            "{after}"
        );
        assert!(
            after.contains("# TYPE order_writer_consumer_lag gauge"),
            "{after}"
        );
        assert_eq!(metrics.lag(), Some(0));
        Ok(())
    }
}
