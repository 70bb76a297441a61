//! The inventory's Prometheus metrics (names per docs/architecture.md).

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

type Labels = Vec<(&'static str, String)>;

/// Handles to the inventory's metrics; cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    reservations: Family<Labels, Counter>,
    stock_available: Family<Labels, Gauge>,
    expired: Counter,
    expired_published: Counter,
    outbox_pending: Gauge,
}

impl Metrics {
    /// Registers the metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "inventory_reservations",
            "Reservation requests by result (ok, sold_out, user_limit, error)",
            metrics.reservations.clone(),
        );
        registry.register(
            "inventory_stock_available",
            "Units available per SKU",
            metrics.stock_available.clone(),
        );
        registry.register(
            "inventory_expired",
            "Unpaid reservations returned to stock",
            metrics.expired.clone(),
        );
        registry.register(
            "inventory_expired_published",
            "Expired order events acknowledged by Kafka",
            metrics.expired_published.clone(),
        );
        registry.register(
            "inventory_outbox_pending",
            "Expired order events not yet acknowledged by Kafka (last sale published)",
            metrics.outbox_pending.clone(),
        );
        metrics
    }

    /// Counts one reservation answer.
    pub fn reservation(&self, result: &'static str) {
        self.reservations
            .get_or_create(&vec![("result", result.to_owned())])
            .inc();
    }

    /// Records a SKU's available units.
    pub fn stock(&self, sku: &str, available: u64) {
        let value = i64::try_from(available).unwrap_or(i64::MAX);
        self.stock_available
            .get_or_create(&vec![("sku", sku.to_owned())])
            .set(value);
    }

    /// Counts reservations returned by a sweep.
    pub fn expired(&self, count: u64) {
        self.expired.inc_by(count);
    }

    /// Records one outbox round: events published, entries left.
    pub fn outbox(&self, published: u64, pending: u64) {
        self.expired_published.inc_by(published);
        self.outbox_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }
}
