//! The order-writer's Prometheus metrics (names per docs/architecture.md).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use flashsale_runtime::metrics::Buckets;
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{MetricType, counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Labels of `order_writer_dlq_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DlqLabels {
    /// Why the event was not stored (the values are listed in the
    /// order-writer's design).
    reason: String,
}

/// Handles to the order-writer's metrics; cheap to clone.
#[derive(Clone)]
pub struct WriterMetrics {
    persisted: Counter,
    batch_size: Histogram,
    dlq: Family<DlqLabels, Counter>,
    expired_without_order: Counter,
    lag: MeasuredGauge,
    commit_latency: Histogram,
}

impl Default for WriterMetrics {
    fn default() -> Self {
        Self {
            persisted: Counter::default(),
            // 1, 2, 4 … 2048 events per batch.
            batch_size: Buckets::exponential(1.0, 2.0, 12).histogram(),
            dlq: Family::default(),
            expired_without_order: Counter::default(),
            lag: MeasuredGauge::default(),
            // 1 ms × 1.5^k up to about 3 minutes: fine enough for a p99.
            commit_latency: Buckets::exponential(0.001, 1.5, 30).histogram(),
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
            "order_writer_expired_without_order",
            "Expired events acknowledged without a change because their order was never stored \
             (its created event never landed), after the parking window",
            metrics.expired_without_order.clone(),
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

    pub(crate) fn expired_without_order(&self) {
        self.expired_without_order.inc();
    }

    pub(crate) fn dead_letter(&self, reason: &str) {
        self.dlq
            .get_or_create(&DlqLabels {
                reason: reason.to_owned(),
            })
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
    use flashsale_runtime::metrics::render;

    use super::*;

    #[test]
    fn the_lag_is_absent_until_measured() -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = WriterMetrics::register(&mut registry);
        let before = render(&registry)?;
        assert!(!before.contains("order_writer_consumer_lag"), "{before}");
        assert_eq!(metrics.lag(), None);

        metrics.set_lag(0);
        let after = render(&registry)?;
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

    /// Names, labels and buckets are a contract with dashboards and alerts:
    /// a renamed label or a moved bucket must fail here.
    #[test]
    fn series_keep_their_names_labels_and_buckets() -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = WriterMetrics::register(&mut registry);
        metrics.dead_letter("malformed");
        metrics.expired_without_order();
        metrics.persisted(3);
        metrics.batch(3);
        let now = jiff::Timestamp::UNIX_EPOCH;
        metrics.stored([now], now);
        let text = render(&registry)?;
        for line in [
            r#"order_writer_dlq_total{reason="malformed"} 1"#,
            "order_writer_expired_without_order_total 1",
            "order_writer_persisted_total 3",
            "order_writer_batch_size_count 1",
            "order_writer_commit_latency_seconds_count 1",
            r#"order_writer_batch_size_bucket{le="1.0"} 0"#,
            r#"order_writer_batch_size_bucket{le="2048.0"} 1"#,
            r#"order_writer_commit_latency_seconds_bucket{le="0.001"} 1"#,
            r#"order_writer_commit_latency_seconds_bucket{le="127.8340394885894"} 1"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
        for (histogram, bounds) in [
            ("order_writer_batch_size_bucket", 12),
            ("order_writer_commit_latency_seconds_bucket", 30),
        ] {
            let buckets = text.lines().filter(|l| l.starts_with(histogram)).count();
            assert_eq!(
                buckets,
                bounds + 1,
                "{histogram}: {bounds} bounds and +Inf in:\n{text}"
            );
        }
        Ok(())
    }
}
