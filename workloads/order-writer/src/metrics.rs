//! The order-writer's Prometheus metrics (names per docs/architecture.md).

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
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
}

impl Default for WriterMetrics {
    fn default() -> Self {
        Self {
            persisted: Counter::default(),
            // 1, 2, 4 … 2048 events per batch.
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            dlq: Family::default(),
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
        metrics
    }

    pub(crate) fn batch(&self, size: usize, inserted: u64) {
        self.batch_size.observe(size as f64);
        self.persisted.inc_by(inserted);
    }

    pub(crate) fn dead_letter(&self, reason: &str) {
        self.dlq
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }
}
