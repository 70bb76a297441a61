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
}
