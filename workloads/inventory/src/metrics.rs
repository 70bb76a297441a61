//! The inventory's Prometheus metrics (names per docs/architecture.md).

use flashsale_runtime::metrics::Buckets;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Buckets of `flashsale_inventory_reserve_batch_size`: 1, 2, 4, … 128 (the
/// largest batch the coalescer sends).
const BATCH_BUCKETS: Buckets = Buckets::exponential(1.0, 2.0, 8);

/// Requests per reserve script call; a newtype so `Metrics` keeps its
/// derived `Default`.
#[derive(Clone)]
struct BatchSizes(Histogram);

impl Default for BatchSizes {
    fn default() -> Self {
        Self(BATCH_BUCKETS.histogram())
    }
}

/// Labels of `inventory_reservations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReservationLabels {
    /// `ok`, `sold_out`, `user_limit` or `error`.
    result: &'static str,
}

/// Labels of `inventory_stock_available`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkuLabels {
    /// The SKU, as the sale names it.
    sku: String,
}

/// Labels of `inventory_order_events_published`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    /// `created` or `expired`.
    kind: &'static str,
}

/// Handles to the inventory's metrics; cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    reservations: Family<ReservationLabels, Counter>,
    stock_available: Family<SkuLabels, Gauge>,
    expired: Counter,
    events_published: Family<EventLabels, Counter>,
    outbox_pending: Gauge,
    reserve_batch_size: BatchSizes,
    durability_replicas: Gauge,
    standby: Gauge,
    producer_replacements: Counter,
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
            "inventory_order_events_published",
            "Order events from the outbox acknowledged by Kafka, by kind (created, expired)",
            metrics.events_published.clone(),
        );
        registry.register(
            "inventory_outbox_pending",
            "Order events in the outbox not yet acknowledged by Kafka (last sale published)",
            metrics.outbox_pending.clone(),
        );
        registry.register(
            "inventory_durability_replicas",
            "Replicas every acknowledged write waits for (0: acknowledged on the primary alone)",
            metrics.durability_replicas.clone(),
        );
        registry.register(
            "inventory_standby",
            "1 while Redis is a read-only replica (a standby region's) and sales are refused until it is promoted",
            metrics.standby.clone(),
        );
        registry.register(
            "inventory_kafka_producer_replacements",
            "Times the order-event producer was replaced since start, having turned fatal or failed every send for its stall bound",
            metrics.producer_replacements.clone(),
        );
        registry.register(
            "flashsale_inventory_reserve_batch_size",
            "Reservations of one SKU decided by one reserve script call",
            metrics.reserve_batch_size.0.clone(),
        );
        metrics
    }

    /// Counts one reservation answer.
    pub fn reservation(&self, result: &'static str) {
        self.reservations
            .get_or_create(&ReservationLabels { result })
            .inc();
    }

    /// Records a SKU's available units.
    pub fn stock(&self, sku: &str, available: u64) {
        let value = i64::try_from(available).unwrap_or(i64::MAX);
        self.stock_available
            .get_or_create(&SkuLabels {
                sku: sku.to_owned(),
            })
            .set(value);
    }

    /// Counts reservations returned by a sweep.
    pub fn expired(&self, count: u64) {
        self.expired.inc_by(count);
    }

    /// Records one reserve script call deciding `size` reservations.
    pub fn reserve_batch(&self, size: usize) {
        self.reserve_batch_size.0.observe(size as f64);
    }

    /// Records the durability policy in force.
    pub fn durability(&self, replicas: u32) {
        self.durability_replicas.set(i64::from(replicas));
    }

    /// Records whether the inventory stands by.
    pub fn standby(&self, standing_by: bool) {
        self.standby.set(i64::from(standing_by));
    }

    /// The counter the order-event producer counts its replacements in.
    pub fn producer_replacements(&self) -> Counter {
        self.producer_replacements.clone()
    }

    /// Records one outbox round: events published, entries left.
    pub fn outbox(&self, round: &crate::outbox::Round) {
        for (kind, published) in [("created", round.created), ("expired", round.expired)] {
            self.events_published
                .get_or_create(&EventLabels { kind })
                .inc_by(published);
        }
        self.outbox_pending
            .set(i64::try_from(round.pending).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use flashsale_runtime::metrics::render;

    use super::*;

    /// Names and labels are a contract with dashboards and alerts: a
    /// renamed label must fail here.
    #[test]
    fn series_keep_their_names_and_labels() -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.reservation("sold_out");
        metrics.stock("HOT-1", 7);
        metrics.reserve_batch(3);
        metrics.standby(true);
        metrics.producer_replacements().inc_by(2);
        let text = render(&registry)?;
        for line in [
            r#"inventory_reservations_total{result="sold_out"} 1"#,
            r#"inventory_stock_available{sku="HOT-1"} 7"#,
            r#"flashsale_inventory_reserve_batch_size_bucket{le="2.0"} 0"#,
            r#"flashsale_inventory_reserve_batch_size_bucket{le="4.0"} 1"#,
            "flashsale_inventory_reserve_batch_size_count 1",
            "inventory_standby 1",
            "inventory_kafka_producer_replacements_total 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
        Ok(())
    }
}
