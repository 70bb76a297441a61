//! The verdicts on a played sale: pure functions of the facts gathered from
//! Redis, PostgreSQL, the apiserver and the buyers' ledger.

use std::collections::{BTreeMap, BTreeSet};

use flashsale_api::{chaosdrill::RunOutcome, chaosdrill::RunRecord};
use serde::Serialize;

use super::tiers::TierLog;
use crate::report::Check;

/// One SKU's stock as the inventory holds it in Redis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stock {
    /// The SKU.
    pub sku: String,
    /// Units loaded for sale.
    pub stock: i64,
    /// Units paid for.
    pub sold: i64,
    /// Units the shards can still give.
    pub available: i64,
    /// Units the shards gave (reserved or sold).
    pub held: i64,
}

/// One order row in the database.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Its order id.
    pub order_id: String,
    /// Its idempotency key: the gateway's request id of the purchase.
    pub idempotency_key: String,
    /// Its SKU.
    pub sku: String,
    /// Units.
    pub quantity: i64,
    /// `pending_payment`, `paid` or `expired`.
    pub status: String,
}

/// One order the gateway acknowledged to a buyer, as the buyer kept it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Acked {
    /// Its order id.
    pub order_id: String,
    /// Its SKU.
    pub sku: String,
    /// Units.
    pub quantity: i64,
    /// Whether the payment went through.
    pub paid: bool,
}

/// The tiers a rising then falling load must walk through.
pub const TIER_WALK: [i32; 5] = [0, 1, 2, 1, 0];

/// Every unit is sold, still available, or nowhere: `sold + available ==
/// stock` per SKU, and no reservation holds any unit any more.
pub fn stock_conserved(stock: &[Stock]) -> Check {
    let passed = !stock.is_empty()
        && stock
            .iter()
            .all(|s| s.sold + s.available == s.stock && s.held == s.sold);
    let detail = stock
        .iter()
        .map(|s| {
            format!(
                "{}: {} sold + {} available = {} of {} (held {})",
                s.sku,
                s.sold,
                s.available,
                s.sold + s.available,
                s.stock,
                s.held
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    check(
        "stock is conserved: sold + available == stock",
        passed,
        detail,
    )
}

/// What the inventory sold is what buyers paid for and what the database
/// says is paid, per SKU.
pub fn sold_is_paid(stock: &[Stock], acked: &[Acked], rows: &[Row]) -> Check {
    let mut paid_by_buyers: BTreeMap<&str, i64> = BTreeMap::new();
    for order in acked.iter().filter(|o| o.paid) {
        *paid_by_buyers.entry(&order.sku).or_default() += order.quantity;
    }
    let mut paid_rows: BTreeMap<&str, i64> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.status == "paid") {
        *paid_rows.entry(&row.sku).or_default() += row.quantity;
    }
    let mut passed = !stock.is_empty();
    let mut parts = Vec::new();
    for s in stock {
        let buyers = paid_by_buyers.get(s.sku.as_str()).copied().unwrap_or(0);
        let db = paid_rows.get(s.sku.as_str()).copied().unwrap_or(0);
        passed &= s.sold == buyers && s.sold == db;
        parts.push(format!(
            "{}: inventory {} sold, buyers paid {}, database {} paid",
            s.sku, s.sold, buyers, db
        ));
    }
    check(
        "units sold == units paid (inventory, buyers, database)",
        passed,
        parts.join("; "),
    )
}

/// Every acknowledged order is exactly one row, in the state its buyer left
/// it (paid, or expired once abandoned), and no other live row exists.
/// A row nobody was told about may exist only as `expired`: the gateway
/// refused the order after its publish failed, the event may still have
/// landed, and the inventory announced the returned reservation as expired.
/// `unresolved` are the request ids of purchases whose outcome the buyer
/// never learnt: one that became a live row is an extra row; one that did
/// not is a purchase that failed.
pub fn orders_persisted_once(acked: &[Acked], unresolved: &[String], rows: &[Row]) -> Check {
    let acked_ids: BTreeSet<&str> = acked.iter().map(|o| o.order_id.as_str()).collect();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for row in rows {
        *seen.entry(&row.order_id).or_default() += 1;
    }
    let missing: Vec<&str> = acked_ids
        .iter()
        .filter(|id| !seen.contains_key(*id))
        .copied()
        .collect();
    let status: BTreeMap<&str, &str> = rows
        .iter()
        .map(|r| (r.order_id.as_str(), r.status.as_str()))
        .collect();
    let (refused, extra): (Vec<&str>, Vec<&str>) = seen
        .keys()
        .filter(|id| !acked_ids.contains(*id))
        .copied()
        .partition(|id| status.get(id) == Some(&"expired"));
    let doubled = seen.values().filter(|n| **n > 1).count();
    let wrong: Vec<String> = acked
        .iter()
        .filter_map(|o| {
            let want = if o.paid { "paid" } else { "expired" };
            let got = *status.get(o.order_id.as_str())?;
            (got != want).then(|| format!("{} is {got}, not {want}", o.order_id))
        })
        .collect();
    let keys: BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.status != "expired" || acked_ids.contains(r.order_id.as_str()))
        .map(|r| r.idempotency_key.as_str())
        .collect();
    let unresolved_rows = unresolved
        .iter()
        .filter(|k| keys.contains(k.as_str()))
        .count();
    let passed = missing.is_empty()
        && extra.is_empty()
        && doubled == 0
        && wrong.is_empty()
        && acked_ids.len() == acked.len();
    let mut detail = format!(
        "{} acknowledged ({} paid, {} abandoned), {} rows; missing {}, extra {}, \
         refused and expired {}, duplicated {}, in the wrong state {}; outcome unknown to \
         the buyer {} ({} of them a row)",
        acked.len(),
        acked.iter().filter(|o| o.paid).count(),
        acked.iter().filter(|o| !o.paid).count(),
        rows.len(),
        missing.len(),
        extra.len(),
        refused.len(),
        doubled,
        wrong.len(),
        unresolved.len(),
        unresolved_rows
    );
    for (what, ids) in [("missing", &missing), ("extra", &extra)] {
        if !ids.is_empty() {
            let first: Vec<&str> = ids.iter().take(5).copied().collect();
            detail.push_str(&format!("; {what}: {}", first.join(", ")));
        }
    }
    if let Some(first) = wrong.first() {
        detail.push_str(&format!("; e.g. {first}"));
    }
    check(
        "every acknowledged order is exactly one row, and nothing else is",
        passed,
        detail,
    )
}

/// The tiers went up one by one as the load rose and back down as it fell,
/// in time order.
pub fn tiers_walked(log: &TierLog) -> Check {
    let sequence = log.sequence();
    let in_order = log.changes.windows(2).all(|w| w[0].at <= w[1].at);
    let detail = log
        .changes
        .iter()
        .map(|c| {
            let value = c
                .value
                .map_or_else(String::new, |v| format!(", load {v:.2}"));
            format!(
                "tier {} at {} ({}{value})",
                c.tier,
                time_of_day(c.at),
                c.reason
            )
        })
        .collect::<Vec<_>>()
        .join(" → ");
    check(
        "tiers went 0 → 1 → 2 → 1 → 0 with the load",
        sequence == TIER_WALK && in_order,
        if detail.is_empty() {
            "no tier seen".to_owned()
        } else {
            detail
        },
    )
}

/// The drill's run was aborted by its SLO guard after a real breach, with
/// its detection and stop latencies measured.
pub fn drill_aborted(run: Option<&RunRecord>, slo: &str) -> Check {
    let Some(run) = run else {
        return check(
            "the drill was aborted by its SLO guard",
            false,
            "no run ended".to_owned(),
        );
    };
    let worst = run.slo_extremes.get(slo).copied();
    let passed = run.outcome == Some(RunOutcome::Aborted)
        && run.reason.as_deref() == Some("SloBreached")
        && run.detection_latency.is_some()
        && run.abort_latency.is_some()
        && run.targets.len() == 1
        && worst.is_some_and(|w| w < 2.0);
    let detail = format!(
        "run {}: {}, target {}, worst {slo} {}",
        run.id,
        run_text(run),
        run.targets.join(", "),
        worst.map_or("-".to_owned(), |w| w.to_string()),
    );
    check("the drill was aborted by its SLO guard", passed, detail)
}

/// The Events an SRE reads with `kubectl describe` tell the run: the sale's
/// phases, each tier change of the policy, the drill's run started and
/// aborted. `told` holds each kind's reasons.
pub fn events_told(told: &BTreeMap<String, Vec<String>>) -> Check {
    let count = |kind: &str, reason: &str| {
        told.get(kind)
            .map_or(0, |reasons| reasons.iter().filter(|r| *r == reason).count())
    };
    let expected = [
        ("FlashSale", "PhaseWarmingUp", 1),
        ("FlashSale", "PhaseLive", 1),
        ("FlashSale", "PhaseEnded", 1),
        ("DegradationPolicy", "TierChanged", TIER_WALK.len() - 1),
        ("ChaosDrill", "RunStarted", 1),
        ("ChaosDrill", "RunAborted", 1),
    ];
    let passed = expected
        .iter()
        .all(|(kind, reason, n)| count(kind, reason) == *n);
    let detail = expected
        .iter()
        .map(|(kind, reason, n)| format!("{kind} {reason} {}/{n}", count(kind, reason)))
        .collect::<Vec<_>>()
        .join(", ");
    check(
        "the sale, the policy and the drill told it in Events",
        passed,
        detail,
    )
}

/// No Chaos Mesh object of the drill is left: `left` counts them by kind.
pub fn no_chaos_left(left: &BTreeMap<String, usize>) -> Check {
    let total: usize = left.values().sum();
    let detail = if total == 0 {
        format!(
            "none of {} left",
            left.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    } else {
        left.iter()
            .filter(|(_, n)| **n > 0)
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    check("no chaos object is left", total == 0, detail)
}

fn check(name: &str, passed: bool, detail: String) -> Check {
    Check {
        name: name.to_owned(),
        passed,
        detail,
    }
}

/// A run's outcome, reason and latencies in a few words; a latency the
/// run did not have (no breach, no abort) is left out.
pub fn run_text(run: &RunRecord) -> String {
    let mut text = format!(
        "{} ({})",
        run.outcome
            .as_ref()
            .map_or("still running".to_owned(), |o| format!("{o:?}")),
        run.reason.as_deref().unwrap_or("no reason"),
    );
    if let Some(detection) = &run.detection_latency {
        text.push_str(&format!(", detection {detection}"));
    }
    if let Some(abort) = &run.abort_latency {
        text.push_str(&format!(", decision → chaos gone {abort}"));
    }
    text
}

/// `HH:MM:SS` UTC.
pub fn time_of_day(at: jiff::Timestamp) -> String {
    at.strftime("%H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::tiers::TierChange;

    fn stock(sku: &str, stock: i64, sold: i64, available: i64, held: i64) -> Stock {
        Stock {
            sku: sku.into(),
            stock,
            sold,
            available,
            held,
        }
    }

    fn acked(id: &str, sku: &str, paid: bool) -> Acked {
        Acked {
            order_id: id.into(),
            sku: sku.into(),
            quantity: 1,
            paid,
        }
    }

    fn row(id: &str, sku: &str, status: &str) -> Row {
        Row {
            order_id: id.into(),
            idempotency_key: format!("key-{id}"),
            sku: sku.into(),
            quantity: 1,
            status: status.into(),
        }
    }

    #[test]
    fn stock_must_add_up_and_hold_nothing_reserved() {
        assert!(stock_conserved(&[stock("A", 10, 4, 6, 4)]).passed);
        // A unit lost.
        assert!(!stock_conserved(&[stock("A", 10, 4, 5, 4)]).passed);
        // A reservation still holds a unit.
        assert!(!stock_conserved(&[stock("A", 10, 4, 5, 5)]).passed);
        // Nothing read is no proof.
        assert!(!stock_conserved(&[]).passed);
    }

    #[test]
    fn sold_units_must_match_the_payments_on_both_sides() {
        let s = [stock("A", 10, 1, 9, 1)];
        let orders = [acked("o1", "A", true), acked("o2", "A", false)];
        let rows = [row("o1", "A", "paid"), row("o2", "A", "expired")];
        assert!(sold_is_paid(&s, &orders, &rows).passed);
        let unpaid_row = [row("o1", "A", "pending_payment"), row("o2", "A", "expired")];
        assert!(!sold_is_paid(&s, &orders, &unpaid_row).passed);
        assert!(!sold_is_paid(&[stock("A", 10, 2, 8, 2)], &orders, &rows).passed);
    }

    #[test]
    fn rows_must_be_exactly_the_acknowledged_orders() {
        let orders = [acked("o1", "A", true), acked("o2", "A", false)];
        let good = [row("o1", "A", "paid"), row("o2", "A", "expired")];
        assert!(orders_persisted_once(&orders, &[], &good).passed);
        let missing = [row("o1", "A", "paid")];
        let check = orders_persisted_once(&orders, &[], &missing);
        assert!(!check.passed);
        assert!(check.detail.contains("missing: o2"), "{}", check.detail);
        let extra = [
            row("o1", "A", "paid"),
            row("o2", "A", "expired"),
            row("o3", "A", "paid"),
        ];
        assert!(!orders_persisted_once(&orders, &[], &extra).passed);
        let doubled = [
            row("o1", "A", "paid"),
            row("o1", "A", "paid"),
            row("o2", "A", "expired"),
        ];
        assert!(!orders_persisted_once(&orders, &[], &doubled).passed);
        let unpaid_abandoned = [row("o1", "A", "paid"), row("o2", "A", "pending_payment")];
        assert!(!orders_persisted_once(&orders, &[], &unpaid_abandoned).passed);
        // A purchase whose outcome the buyer never learnt and that made no
        // order is a failed purchase; one that made an order is an extra row.
        let lost = ["key-o9".to_owned()];
        let check = orders_persisted_once(&orders, &lost, &good);
        assert!(check.passed, "{}", check.detail);
        assert!(
            check
                .detail
                .contains("outcome unknown to the buyer 1 (0 of them a row)")
        );
        // An order refused after its publish failed may have landed; it
        // must end expired, like its returned reservation.
        let refused = [
            row("o1", "A", "paid"),
            row("o2", "A", "expired"),
            row("o8", "A", "expired"),
        ];
        let check = orders_persisted_once(&orders, &[], &refused);
        assert!(check.passed, "{}", check.detail);
        assert!(
            check.detail.contains("refused and expired 1"),
            "{}",
            check.detail
        );
        let made = [
            row("o1", "A", "paid"),
            row("o2", "A", "expired"),
            row("o9", "A", "pending_payment"),
        ];
        let check = orders_persisted_once(&orders, &lost, &made);
        assert!(!check.passed);
        assert!(
            check.detail.contains("(1 of them a row)"),
            "{}",
            check.detail
        );
    }

    #[test]
    fn the_tier_walk_must_be_complete_and_in_order() -> anyhow::Result<()> {
        let mut log = TierLog::default();
        for (i, tier) in [0, 1, 2, 1, 0].into_iter().enumerate() {
            log.changes.push(TierChange {
                tier,
                at: jiff::Timestamp::from_second(1_000 + i as i64)?,
                reason: "Signal".into(),
                value: Some(0.5),
            });
        }
        assert!(tiers_walked(&log).passed);
        log.changes.pop();
        assert!(!tiers_walked(&log).passed, "never came back to 0");
        Ok(())
    }

    #[test]
    fn leftover_chaos_fails() {
        let mut left = BTreeMap::from([("PodChaos".to_owned(), 0), ("Workflow".to_owned(), 0)]);
        assert!(no_chaos_left(&left).passed);
        left.insert("PodChaos".into(), 1);
        let check = no_chaos_left(&left);
        assert!(!check.passed);
        assert_eq!(check.detail, "1 PodChaos");
    }

    #[test]
    fn the_events_must_tell_every_phase_tier_change_and_the_run() {
        let reasons = |list: &[&str]| list.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>();
        let mut told = BTreeMap::from([
            (
                "FlashSale".to_owned(),
                reasons(&["PhaseWarmingUp", "PhaseLive", "PhaseEnded"]),
            ),
            (
                "DegradationPolicy".to_owned(),
                reasons(&[
                    "EmptyResult",
                    "TierChanged",
                    "TierChanged",
                    "TierChanged",
                    "TierChanged",
                ]),
            ),
            (
                "ChaosDrill".to_owned(),
                reasons(&["RunStarted", "RunAborted"]),
            ),
        ]);
        assert!(events_told(&told).passed, "{}", events_told(&told).detail);
        told.insert(
            "ChaosDrill".into(),
            reasons(&["RunStarted", "RunSucceeded"]),
        );
        let check = events_told(&told);
        assert!(!check.passed);
        assert!(
            check.detail.contains("ChaosDrill RunAborted 0/1"),
            "{}",
            check.detail
        );
        told.remove("FlashSale");
        assert!(
            events_told(&told)
                .detail
                .contains("FlashSale PhaseLive 0/1")
        );
    }
}
