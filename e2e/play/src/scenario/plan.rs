//! The scenario's plan: how many buyers, for how long, and the sale, the
//! degradation policy and the chaos drill it applies, all derived from the
//! few numbers a user scales it by. Pure, so the objects are tested as built.

use std::time::Duration;

use jiff::{Timestamp, ToSpan, civil::Time, tz::TimeZone};
use serde_json::{Value, json};

/// One SKU on sale.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Its SKU.
    pub sku: String,
    /// Units on sale.
    pub stock: i64,
    /// Units one buyer may hold.
    pub per_user_limit: i32,
    /// Price in minor units.
    pub price_minor: i64,
    /// Redis shards of its stock.
    pub shards: i32,
}

/// Where the sale's pods reach the stack's stores, and which node they run on.
#[derive(Debug, Clone, PartialEq)]
pub struct Wiring {
    /// `redis://` URL as pods see it.
    pub redis_url: String,
    /// Kafka bootstrap servers as pods see them.
    pub kafka_brokers: String,
    /// The run's own order topic (its dead letters go to `<topic>.dlq`).
    pub topic: String,
    /// The label and taint key of the nodes the sale's pods must run on,
    /// when the cluster keeps some apart (the local stack's real node,
    /// among simulated ones); none on a cluster whose nodes all run pods.
    pub node_label: Option<String>,
}

/// The whole scenario's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The sale's name.
    pub sale: String,
    /// Buyers at the peak.
    pub users: usize,
    /// The load profile's length, from the first buyer to the end of the
    /// ramp down; the tail (during the drill) comes on top.
    pub load: Duration,
    /// A buyer's mean think time between actions.
    pub think: Duration,
    /// From applying the sale to its opening (the pods start meanwhile).
    pub opens_in: Duration,
    /// How long an unpaid reservation holds its stock.
    pub reservation_ttl: Duration,
    /// How long the load must stay below a tier's exit before it steps down.
    pub hold_down: Duration,
    /// Buyers the waiting room lets in per second.
    pub admit_per_second: u32,
    /// What is on sale.
    pub items: Vec<Item>,
    /// Whether buyers queue in the waiting room before they order.
    pub waiting_room: bool,
    /// The waiting room's bot shield, leading zero bits by tier: each buyer
    /// solves a challenge to join, as a browser does; empty for none.
    pub shield_bits: Vec<u8>,
}

/// Share of the planned peak load above which tier 1 (tier 2) is entered,
/// and below which it is left: hysteresis between the two.
pub const TIER1: (f64, f64) = (0.35, 0.25);
/// See [`TIER1`].
pub const TIER2: (f64, f64) = (0.65, 0.50);

/// The SKU the library's sale sells.
pub const LIBRARY_SKU: &str = "CASE";

/// The drill's SLO name.
pub const SLO: &str = "gateways-up";

impl Plan {
    /// The full scenario: a few minutes of load on a few hundred buyers.
    pub fn full(sale: &str) -> Self {
        Self::scaled(sale, 300, Duration::from_secs(240))
    }

    /// The short scenario CI runs: the same story in under two minutes of load.
    pub fn short(sale: &str) -> Self {
        Self::scaled(sale, 60, Duration::from_secs(100))
    }

    /// A scenario of `users` buyers at the peak and `load` of load; the
    /// stock, the waiting room and the timers follow from them.
    pub fn scaled(sale: &str, users: usize, load: Duration) -> Self {
        let users = users.max(10);
        let short = load < Duration::from_secs(180);
        let units = i64::try_from(users).unwrap_or(i64::MAX / 4);
        Self {
            sale: sale.to_owned(),
            users,
            load,
            think: Duration::from_secs(1),
            opens_in: Duration::from_secs(if short { 40 } else { 60 }),
            reservation_ttl: Duration::from_secs(if short { 20 } else { 60 }),
            hold_down: Duration::from_secs(if short { 8 } else { 20 }),
            admit_per_second: u32::try_from(users / 20).unwrap_or(u32::MAX).max(2),
            items: vec![
                // Scarce: sells out at the peak.
                Item {
                    sku: "PHONE".into(),
                    stock: (units / 3).max(5),
                    per_user_limit: 1,
                    price_minor: 99_900,
                    shards: 2,
                },
                // Plenty: never sells out.
                Item {
                    sku: "CASE".into(),
                    stock: units * 2,
                    per_user_limit: 3,
                    price_minor: 1_900,
                    shards: 1,
                },
            ],
            waiting_room: true,
            // Cheap enough for hundreds of buyers on two cores, dear enough
            // to show: tier 2 costs 16 times tier 0's work.
            shield_bits: vec![8, 10, 12],
        }
    }

    /// The sale the library's drills run on: open 20 s after it is
    /// applied, without a waiting room, with stock for every order a steady
    /// flow places while they run (each order a buyer of its own).
    pub fn library(sale: &str) -> Self {
        Self {
            opens_in: Duration::from_secs(20),
            items: vec![Item {
                sku: LIBRARY_SKU.into(),
                stock: 100_000,
                per_user_limit: 1,
                price_minor: 1_900,
                shards: 1,
            }],
            waiting_room: false,
            shield_bits: Vec::new(),
            ..Self::scaled(sale, 10, Duration::from_secs(60))
        }
    }

    /// Requests per second the peak of buyers makes, one action per think
    /// time each: the unit of the policy's load signal.
    pub fn peak_rps(&self) -> f64 {
        self.users as f64 / self.think.as_secs_f64().max(0.001)
    }

    /// The PromQL selector of the sale's gateway pods in `namespace`.
    pub fn gateways(&self, namespace: &str) -> String {
        format!(
            r#"namespace="{namespace}", pod=~"{}-gateway-.*""#,
            self.sale
        )
    }

    /// The load signal: requests per second over all gateways, as a share of
    /// the planned peak.
    pub fn load_query(&self, namespace: &str) -> String {
        format!(
            "sum(rate(gateway_requests_total{{{}}}[10s])) / {}",
            self.gateways(namespace),
            self.peak_rps()
        )
    }

    /// The drill's SLO: how many of the sale's gateways Prometheus scrapes
    /// as up.
    pub fn slo_query(&self, namespace: &str) -> String {
        format!("count(up{{{}}} == 1)", self.gateways(namespace))
    }

    /// The FlashSale, opening at `start`; it ends an hour later unless the
    /// scenario ends it first (it does, once the load is over).
    pub fn sale(&self, start: Timestamp, wiring: &Wiring) -> Value {
        let end = start + 1.hour();
        let small =
            json!({"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}});
        let items: Vec<Value> = self
            .items
            .iter()
            .map(|i| {
                json!({"sku": i.sku, "stock": i.stock, "perUserLimit": i.per_user_limit,
                       "priceMinor": i.price_minor, "shards": i.shards})
            })
            .collect();
        json!({
            "apiVersion": "flashsale.dev/v1alpha1",
            "kind": "FlashSale",
            "metadata": {"name": self.sale, "labels": {"app.kubernetes.io/part-of": "flashsale-play"}},
            "spec": {
                "schedule": {"start": start.to_string(), "end": end.to_string(), "warmUp": "10m"},
                "region": "local",
                "reservationTTL": format!("{}s", self.reservation_ttl.as_secs()),
                "placement": wiring.node_label.as_ref().map(|label| json!({
                    "nodeSelector": {label.clone(): "true"},
                    "tolerations": [{"key": label, "operator": "Exists", "effect": "NoSchedule"}]
                })),
                "items": items,
                "gateway": {
                    "replicas": 2,
                    "resources": small,
                    "auth": {"hs256SecretRef": {"name": self.secret("jwt"), "key": "key"}},
                    "payment": {"secretRef": {"name": self.secret("payment"), "key": "key"}},
                    "rateLimit": {"perUserPerSecond": 2, "burst": 5},
                    "waitingRoom": {
                        "enabled": self.waiting_room,
                        "admitPerSecond": self.admit_per_second,
                        "ticketSecretRef": {"name": self.secret("queue"), "key": "key"},
                        "botShield": (self.waiting_room && !self.shield_bits.is_empty())
                            .then(|| json!({"difficultyBits": self.shield_bits}))
                    }
                },
                "inventory": {"replicas": 2, "resources": small, "redis": {"url": wiring.redis_url}},
                "orderWriter": {
                    "replicas": 1,
                    "resources": small,
                    "kafka": {"brokers": [wiring.kafka_brokers], "topic": wiring.topic,
                              "dlqTopic": format!("{}.dlq", wiring.topic)},
                    "database": {"driver": "postgres",
                                 "urlSecretRef": {"name": self.secret("db"), "key": "url"}}
                }
            }
        })
    }

    /// The name of the sale's Secret `what` (jwt, payment, queue, db).
    pub fn secret(&self, what: &str) -> String {
        format!("{}-{what}", self.sale)
    }

    /// The name of the Service in front of the sale's gateways.
    pub fn gateway_service(&self) -> String {
        format!("{}-gateway", self.sale)
    }

    /// The DegradationPolicy: two tiers on the share of the planned peak
    /// load, with hysteresis and a hold-down.
    pub fn policy(&self, namespace: &str) -> Value {
        json!({
            "apiVersion": "flashsale.dev/v1alpha1",
            "kind": "DegradationPolicy",
            "metadata": {"name": self.sale},
            "spec": {
                "saleRef": {"name": self.sale},
                "signal": {"query": self.load_query(namespace), "interval": "2s", "timeout": "1s",
                           "staleAfter": "30s"},
                "tiers": [
                    {"tier": 1, "enterAbove": TIER1.0, "exitBelow": TIER1.1,
                     "switches": {"recommendations": "static", "orderHistory": "last7Days",
                                  "voucherPush": "deferred"}},
                    {"tier": 2, "enterAbove": TIER2.0, "exitBelow": TIER2.1,
                     "switches": {"reviews": "queued", "shopChat": "throttled", "miniGames": "closed"}}
                ],
                "holdDown": format!("{}s", self.hold_down.as_secs()),
                "onSignalLoss": {"action": "EnterTier", "tier": 1, "after": "30s"}
            }
        })
    }

    /// The ChaosDrill: the library's guard check
    /// (`chaos/gateway-guard-check.yaml`) as a user applies it, for this
    /// sale: one of the two gateways failed (the blast-radius cap) for up to
    /// two minutes under the SLO "both gateways up", so its guard must
    /// abort. Its calendar gives way to a window opened from `now` for ten
    /// minutes (UTC, within the day), its steady state to 3 s, and it runs
    /// at once on the `run-now` request `request`.
    pub fn drill(&self, now: Timestamp, request: &str) -> Result<Value, serde_yaml_ng::Error> {
        let mut drill: Value = serde_yaml_ng::from_str(GUARD_CHECK)?;
        let (start, end) = window_from(now);
        drill["metadata"] =
            json!({"name": self.sale, "annotations": {"flashsale.dev/run-now": request}});
        let spec = &mut drill["spec"];
        spec["saleRef"]["name"] = self.sale.clone().into();
        // Scheduled runs only on New Year's Day: this one runs on request.
        spec["schedule"] = json!({"cron": "0 3 1 1 *", "timeZone": "UTC"});
        spec["windows"] = json!([{"days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
                                  "start": start, "end": end}]);
        spec["avoidLiveSale"] = false.into();
        spec["sloGuard"]["steadyState"] = "3s".into();
        Ok(drill)
    }
}

/// The library's guard check, as users find it in `chaos/`.
const GUARD_CHECK: &str = include_str!("../../../../chaos/gateway-guard-check.yaml");

/// A window `[start, end)` of local UTC times of day opening at `now`'s
/// minute and lasting ten minutes, cut at midnight (`24:00`): windows do not
/// wrap.
pub fn window_from(now: Timestamp) -> (String, String) {
    let time = now.to_zoned(TimeZone::UTC).time();
    let start = Time::constant(time.hour(), time.minute(), 0, 0);
    let minutes = i32::from(time.hour()) * 60 + i32::from(time.minute()) + 10;
    let end = if minutes >= 24 * 60 {
        "24:00".to_owned()
    } else {
        format!("{:02}:{:02}", minutes / 60, minutes % 60)
    };
    (start.strftime("%H:%M").to_string(), end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_api::{ChaosDrill, DegradationPolicy, FlashSale};

    fn wiring() -> Wiring {
        Wiring {
            redis_url: "redis://redis:6379".into(),
            kafka_brokers: "kafka:9094".into(),
            topic: "play-orders".into(),
            node_label: Some("flashsale.dev/real-node".into()),
        }
    }

    #[test]
    fn the_objects_are_valid_api_objects() -> anyhow::Result<()> {
        let plan = Plan::short("play");
        let now: Timestamp = "2026-11-11T10:15:30Z".parse()?;
        let sale: FlashSale = serde_json::from_value(plan.sale(now, &wiring()))?;
        assert!(sale.spec.gateway.waiting_room.enabled);
        let shield = sale.spec.gateway.waiting_room.bot_shield.as_ref();
        assert_eq!(
            shield.map(|s| s.difficulty_bits.clone()),
            Some(vec![8, 10, 12])
        );
        assert_eq!(sale.spec.items.len(), 2);
        let policy: DegradationPolicy = serde_json::from_value(plan.policy("shop"))?;
        assert_eq!(policy.spec.tiers.len(), 2);
        let drill: ChaosDrill = serde_json::from_value(plan.drill(now, "r1")?)?;
        assert_eq!(drill.spec.windows[0].start, "10:15");
        assert_eq!(drill.spec.windows[0].end, "10:25");
        assert!(!drill.spec.avoid_live_sale);
        assert_eq!(drill.spec.sale_ref.name, "play");
        // The guard the checks read is the library file's.
        let objectives = &drill.spec.slo_guard.objectives;
        assert_eq!(objectives.len(), 1);
        assert_eq!(objectives[0].name, SLO);
        assert_eq!(objectives[0].threshold, 2.0);
        Ok(())
    }

    #[test]
    fn the_librarys_sale_orders_without_a_waiting_room_from_ample_stock() -> anyhow::Result<()> {
        let plan = Plan::library("play-library");
        let now: Timestamp = "2026-11-11T10:15:30Z".parse()?;
        let sale: FlashSale = serde_json::from_value(plan.sale(now, &wiring()))?;
        assert!(!sale.spec.gateway.waiting_room.enabled);
        assert!(sale.spec.gateway.waiting_room.bot_shield.is_none());
        assert_eq!(sale.spec.items.len(), 1);
        assert_eq!(sale.spec.items[0].sku, LIBRARY_SKU);
        assert!(sale.spec.items[0].stock >= 10_000);
        Ok(())
    }

    #[test]
    fn the_load_signal_is_the_share_of_the_planned_peak() {
        let plan = Plan::scaled("play", 60, Duration::from_secs(100));
        assert_eq!(plan.peak_rps(), 60.0);
        assert_eq!(
            plan.load_query("shop"),
            r#"sum(rate(gateway_requests_total{namespace="shop", pod=~"play-gateway-.*"}[10s])) / 60"#
        );
        // Hysteresis: each tier is left below where it is entered.
        assert!(TIER1.1 < TIER1.0 && TIER2.1 < TIER2.0 && TIER1.0 < TIER2.0);
    }

    #[test]
    fn the_window_never_wraps_past_midnight() -> anyhow::Result<()> {
        assert_eq!(
            window_from("2026-11-11T23:55:10Z".parse()?),
            ("23:55".to_owned(), "24:00".to_owned())
        );
        assert_eq!(
            window_from("2026-11-11T23:49:59Z".parse()?),
            ("23:49".to_owned(), "23:59".to_owned())
        );
        assert_eq!(
            window_from("2026-11-11T00:00:00Z".parse()?),
            ("00:00".to_owned(), "00:10".to_owned())
        );
        Ok(())
    }

    #[test]
    fn scarce_and_plentiful_stock_follow_the_buyers() {
        let plan = Plan::scaled("play", 300, Duration::from_secs(240));
        assert_eq!(plan.items[0].stock, 100);
        assert_eq!(plan.items[1].stock, 600);
        assert_eq!(plan.admit_per_second, 15);
        let tiny = Plan::scaled("play", 1, Duration::from_secs(10));
        assert_eq!(tiny.users, 10);
        assert_eq!(tiny.items[0].stock, 5);
        assert_eq!(tiny.admit_per_second, 2);
    }
}
