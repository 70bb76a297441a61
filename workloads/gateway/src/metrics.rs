//! The gateway's Prometheus metrics (names per docs/architecture.md).

use std::sync::atomic::AtomicU64;

use flashsale_runtime::metrics::Buckets;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use crate::ratelimit::{Charges, Source};

/// Latency buckets: 0.1 ms × 1.5^k up to about 2 minutes.
const LATENCY: Buckets = Buckets::exponential(0.0001, 1.5, 35);

/// Labels of `gateway_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// The matched route template (`unmatched` when none), never the raw
    /// path, so the series stay few.
    route: String,
    /// The HTTP status code answered.
    code: u16,
}

/// Labels of `gateway_drill_orders_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    /// The HTTP status code answered.
    code: u16,
}

/// Marks a drill buyer's order on its response: the edge counts it in
/// `gateway_drill_orders_total` instead of the buyers' request series, so
/// a drill's synthetic orders never move a sale's SLOs.
#[derive(Clone, Copy, Debug)]
pub struct DrillOrder;

/// Labels of `gateway_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    /// The matched route template, as in [`RequestLabels`].
    route: String,
}

/// Labels of `gateway_concurrency_rejected_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    /// `core` or `non_core`.
    partition: &'static str,
}

/// Labels of `gateway_payment_callbacks_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallbackLabels {
    /// `paid`, `refused`, `unauthenticated` or `error`.
    outcome: &'static str,
}

/// Why a payment must be refunded (`gateway_refunds_needed_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefundReason {
    /// The order lapsed (or was cancelled) before the payment came.
    Lapsed,
    /// The payment's amount or currency is not the order's.
    AmountMismatch,
}

impl RefundReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lapsed => "lapsed",
            Self::AmountMismatch => "amount_mismatch",
        }
    }
}

/// Labels of `gateway_bot_refusals_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BotRefusalLabels {
    /// `missing`, or the refused proof's code
    /// ([`crate::waiting_room::Refusal::code`]).
    reason: &'static str,
}

/// Labels of `gateway_refunds_needed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefundLabels {
    /// [`RefundReason::as_str`].
    reason: &'static str,
}

/// Why the item cache read the inventory
/// (`gateway_item_refreshes_total{mode}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefreshMode {
    /// Behind an answer, in the refresh-ahead window: no reader waited.
    Ahead,
    /// With readers waiting: a first reading, or one nobody read in time.
    Waited,
}

/// Labels of `gateway_item_refreshes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefreshLabels {
    /// `ahead` or `waited`.
    mode: &'static str,
}

/// Labels of `gateway_rate_limit_decisions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    /// `redis` or `local`.
    source: &'static str,
}

impl DecisionLabels {
    fn of(source: Source) -> Self {
        let source = match source {
            Source::Redis => "redis",
            Source::Local => "local",
        };
        Self { source }
    }
}

/// Labels of `gateway_rate_limit_charges_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChargeLabels {
    /// The quota charged: `user` (the per-user rate limit) or `source` (the
    /// bot shield's per-source budget).
    quota: &'static str,
    /// `within`, `over` or `failed`.
    outcome: &'static str,
}

/// Handles to the gateway's metrics; cheap to clone.
#[derive(Clone)]
pub struct GatewayMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<RouteLabels, Histogram, Buckets>,
    drill_orders: Family<CodeLabels, Counter>,
    inflight: Gauge,
    concurrency_limit: Gauge,
    concurrency_rejected: Family<PartitionLabels, Counter>,
    rate_limited: Counter,
    rate_limit_decisions: Family<DecisionLabels, Counter>,
    rate_limit_charges: Family<ChargeLabels, Counter>,
    waiting_room_depth: Gauge,
    admitted: Counter,
    sold_out_from_memory: Counter,
    item_refreshes: Family<RefreshLabels, Counter>,
    item_reads_hedged: Counter,
    item_refreshes_failed: Counter,
    degradation_tier: Gauge,
    degradation_generation: Gauge,
    clock_skew: Gauge<f64, AtomicU64>,
    payment_callbacks: Family<CallbackLabels, Counter>,
    refunds_needed: Family<RefundLabels, Counter>,
    producer_replacements: Counter,
    bot_refusals: Family<BotRefusalLabels, Counter>,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(LATENCY),
            drill_orders: Family::default(),
            inflight: Gauge::default(),
            concurrency_limit: Gauge::default(),
            concurrency_rejected: Family::default(),
            rate_limited: Counter::default(),
            rate_limit_decisions: Family::default(),
            rate_limit_charges: Family::default(),
            waiting_room_depth: Gauge::default(),
            admitted: Counter::default(),
            sold_out_from_memory: Counter::default(),
            item_refreshes: Family::default(),
            item_reads_hedged: Counter::default(),
            item_refreshes_failed: Counter::default(),
            degradation_tier: Gauge::default(),
            degradation_generation: Gauge::default(),
            clock_skew: Gauge::default(),
            payment_callbacks: Family::default(),
            refunds_needed: Family::default(),
            producer_replacements: Counter::default(),
            bot_refusals: Family::default(),
        }
    }
}

impl GatewayMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "gateway_requests",
            "Requests answered, by route template and status code",
            m.requests.clone(),
        );
        registry.register_with_unit(
            "gateway_request_duration",
            "Time to answer, by route template",
            Unit::Seconds,
            m.duration.clone(),
        );
        registry.register(
            "gateway_drill_orders",
            "Drill buyers' orders answered, by status code (not in gateway_requests)",
            m.drill_orders.clone(),
        );
        registry.register(
            "gateway_inflight",
            "Requests being served now",
            m.inflight.clone(),
        );
        registry.register(
            "gateway_concurrency_limit",
            "Current adaptive concurrency limit",
            m.concurrency_limit.clone(),
        );
        registry.register(
            "gateway_concurrency_rejected",
            "Requests refused at once over the concurrency limit, by partition",
            m.concurrency_rejected.clone(),
        );
        registry.register(
            "gateway_rate_limited",
            "Requests refused by the per-user rate limit",
            m.rate_limited.clone(),
        );
        registry.register(
            "gateway_rate_limit_decisions",
            "Shared per-user rate-limit decisions, by where they were taken: redis, or local (this replica alone, while Redis fails)",
            m.rate_limit_decisions.clone(),
        );
        // Both series from the start, so the local share is defined at once.
        for source in [Source::Redis, Source::Local] {
            drop(
                m.rate_limit_decisions
                    .get_or_create(&DecisionLabels::of(source)),
            );
        }
        registry.register(
            "gateway_rate_limit_charges",
            "Requests charged to a shared quota in Redis after their answer (the per-user rate limit, or the bot shield's per-source budget), by quota and outcome: within the quota, over it (let through before this replica learnt the user had used it up elsewhere; paid back by the user's next requests), or failed",
            m.rate_limit_charges.clone(),
        );
        registry.register(
            "gateway_kafka_producer_replacements",
            "Times the producer of paid events was replaced since start, having turned fatal or failed every send for its stall bound",
            m.producer_replacements.clone(),
        );
        registry.register(
            "gateway_bot_refusals",
            "Joins of the waiting room (or orders, where a sale has none) refused by the bot shield, by reason: missing (no proof), malformed, forged, wrong_kind, other_user, other_sale, unsolved, expired, replayed or source_budget",
            m.bot_refusals.clone(),
        );
        m.register_state(registry);
        m
    }

    /// The counter the producer of paid events counts its replacements in.
    pub fn producer_replacements(&self) -> Counter {
        self.producer_replacements.clone()
    }

    /// The counters a rate limiter of `quota` (`user` or `source`) counts
    /// its charges in (every outcome present from the start).
    pub fn rate_limit_charges(&self, quota: &'static str) -> Charges {
        let counter = |outcome| {
            self.rate_limit_charges
                .get_or_create(&ChargeLabels { quota, outcome })
                .clone()
        };
        Charges {
            within: counter("within"),
            over: counter("over"),
            failed: counter("failed"),
        }
    }

    /// The waiting room's, the switches', the clock's and the payments'
    /// series.
    fn register_state(&self, registry: &mut Registry) {
        registry.register(
            "gateway_waiting_room_depth",
            "Users in the waiting room not yet admitted",
            self.waiting_room_depth.clone(),
        );
        registry.register(
            "gateway_admitted",
            "Waiting-room passes redeemed for an order",
            self.admitted.clone(),
        );
        registry.register(
            "gateway_sold_out_from_memory",
            "Orders answered sold out from this gateway's memory, without the inventory or Redis",
            self.sold_out_from_memory.clone(),
        );
        registry.register(
            "gateway_item_refreshes",
            "Stock reads of the item cache from the inventory, by whether readers waited (waited) or were answered from the last reading meanwhile (ahead)",
            self.item_refreshes.clone(),
        );
        registry.register(
            "gateway_item_reads_hedged",
            "Stock reads of the item cache that sent a second request after the first was slow",
            self.item_reads_hedged.clone(),
        );
        registry.register(
            "gateway_item_refreshes_failed",
            "Stock reads of the item cache the inventory did not answer in time: the page is served from the last reading, marked stale",
            self.item_refreshes_failed.clone(),
        );
        registry.register(
            "gateway_degradation_tier",
            "Degradation tier in force",
            self.degradation_tier.clone(),
        );
        registry.register(
            "gateway_degradation_generation",
            "Generation of the degradation switches in force",
            self.degradation_generation.clone(),
        );
        registry.register_with_unit(
            "gateway_clock_skew",
            "This replica's wall clock minus the sale's (Redis's) clock",
            Unit::Seconds,
            self.clock_skew.clone(),
        );
        registry.register(
            "gateway_payment_callbacks",
            "Payment-provider callbacks by outcome (paid, refused, unauthenticated, error)",
            self.payment_callbacks.clone(),
        );
        registry.register(
            "gateway_refunds_needed",
            "Signed payments that moved money for an order that cannot take it, by reason (lapsed, amount_mismatch): each must be refunded",
            self.refunds_needed.clone(),
        );
        // Every series from the start, so an alert on an increase sees the first one.
        for reason in [RefundReason::Lapsed, RefundReason::AmountMismatch] {
            drop(self.refunds_needed.get_or_create(&RefundLabels {
                reason: reason.as_str(),
            }));
        }
    }

    /// One payment that must be refunded, for `reason`.
    pub fn refund_needed(&self, reason: RefundReason) {
        self.refunds_needed
            .get_or_create(&RefundLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// One join (or order, without a waiting room) refused by the bot
    /// shield, for `reason`.
    pub fn bot_refusal(&self, reason: &'static str) {
        self.bot_refusals
            .get_or_create(&BotRefusalLabels { reason })
            .inc();
    }

    /// One payment-provider callback answered with `outcome`.
    pub fn payment_callback(&self, outcome: &'static str) {
        self.payment_callbacks
            .get_or_create(&CallbackLabels { outcome })
            .inc();
    }

    /// One answered request.
    pub fn request(&self, route: &str, code: u16, seconds: f64) {
        let route = route.to_owned();
        self.requests
            .get_or_create(&RequestLabels {
                route: route.clone(),
                code,
            })
            .inc();
        self.duration
            .get_or_create(&RouteLabels { route })
            .observe(seconds);
    }

    /// One answered drill buyer's order.
    pub fn drill_order(&self, code: u16) {
        self.drill_orders.get_or_create(&CodeLabels { code }).inc();
    }

    /// The in-flight gauge (incremented while a request is served).
    pub fn inflight(&self) -> &Gauge {
        &self.inflight
    }

    /// A request refused by the rate limit.
    pub fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    /// A decision of the shared rate limit, taken by `source`.
    pub fn rate_limit_decision(&self, source: Source) {
        self.rate_limit_decisions
            .get_or_create(&DecisionLabels::of(source))
            .inc();
    }

    /// A request refused over the concurrency limit.
    pub fn concurrency_rejected(&self, partition: &'static str) {
        self.concurrency_rejected
            .get_or_create(&PartitionLabels { partition })
            .inc();
    }

    /// A pass redeemed.
    pub fn admitted(&self) {
        self.admitted.inc();
    }

    /// An order answered sold out from memory.
    pub fn sold_out_from_memory(&self) {
        self.sold_out_from_memory.inc();
    }

    /// A stock read of the item cache.
    pub fn item_refresh(&self, mode: RefreshMode) {
        let mode = match mode {
            RefreshMode::Ahead => "ahead",
            RefreshMode::Waited => "waited",
        };
        self.item_refreshes
            .get_or_create(&RefreshLabels { mode })
            .inc();
    }

    /// A stock read that was hedged.
    pub fn item_read_hedged(&self) {
        self.item_reads_hedged.inc();
    }

    /// A stock read that got no answer.
    pub fn item_refresh_failed(&self) {
        self.item_refreshes_failed.inc();
    }

    /// This replica's clock minus Redis's, seconds.
    pub fn set_clock_skew(&self, seconds: f64) {
        self.clock_skew.set(seconds);
    }

    /// Periodic gauges.
    pub fn set_levels(&self, concurrency_limit: usize, waiting: Option<u64>) {
        self.concurrency_limit.set(concurrency_limit as i64);
        if let Some(depth) = waiting {
            self.waiting_room_depth.set(depth as i64);
        }
    }

    /// The degradation state in force.
    pub fn set_degradation(&self, tier: u32, generation: u64) {
        self.degradation_tier.set(i64::from(tier));
        self.degradation_generation.set(generation as i64);
    }
}

#[cfg(test)]
mod tests {
    use flashsale_runtime::metrics::render;

    use super::*;

    /// Names, labels and buckets are a contract with dashboards and alerts:
    /// a renamed label or a moved bucket must fail here.
    #[test]
    fn series_keep_their_names_labels_and_buckets() -> Result<(), std::fmt::Error> {
        let mut registry = Registry::default();
        let metrics = GatewayMetrics::register(&mut registry);
        metrics.request("/v1/sales/{sale}/orders", 202, 0.03);
        metrics.drill_order(201);
        metrics.payment_callback("paid");
        metrics.concurrency_rejected("non_core");
        metrics.rate_limit_decision(Source::Local);
        metrics.bot_refusal("unsolved");
        let text = render(&registry)?;
        for line in [
            r#"gateway_requests_total{route="/v1/sales/{sale}/orders",code="202"} 1"#,
            r#"gateway_request_duration_seconds_count{route="/v1/sales/{sale}/orders"} 1"#,
            r#"gateway_request_duration_seconds_bucket{le="0.0001",route="/v1/sales/{sale}/orders"} 0"#,
            r#"gateway_request_duration_seconds_bucket{le="97.07397373664758",route="/v1/sales/{sale}/orders"} 1"#,
            r#"gateway_drill_orders_total{code="201"} 1"#,
            r#"gateway_payment_callbacks_total{outcome="paid"} 1"#,
            r#"gateway_concurrency_rejected_total{partition="non_core"} 1"#,
            r#"gateway_rate_limit_decisions_total{source="redis"} 0"#,
            r#"gateway_rate_limit_decisions_total{source="local"} 1"#,
            r#"gateway_bot_refusals_total{reason="unsolved"} 1"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("gateway_request_duration_seconds_bucket"))
            .count();
        assert_eq!(buckets, 36, "35 bounds and +Inf in:\n{text}");
        Ok(())
    }
}
