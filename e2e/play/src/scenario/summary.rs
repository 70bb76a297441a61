//! The run in words and figures: the funnel, the terminal summary and the
//! report's key figures.

use serde::Serialize;

use super::{
    Outcome,
    checks::{run_text, time_of_day},
    plan::Plan,
};
use crate::report::{Bar, BarPlot};

/// How far buyers got, stage by stage, and what became of the orders. The
/// funnel counts buyers only; orders and answers are counted apart, since
/// one buyer may send many of each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Funnel {
    /// Buyers who came.
    pub arrived: u64,
    /// Buyers the waiting room queued.
    pub queued: u64,
    /// Buyers it let through to checkout.
    pub admitted: u64,
    /// Buyers with at least one acknowledged order.
    pub ordered: u64,
    /// Buyers with at least one paid order.
    pub paying: u64,
    /// Answers refused by the per-user rate limit (429).
    pub rate_limited: u64,
    /// Reservations the inventory made.
    pub reserved: u64,
    /// Orders the gateway acknowledged (201).
    pub acknowledged: u64,
    /// Order rows in the database.
    pub persisted: u64,
    /// Orders paid.
    pub paid: u64,
}

impl Funnel {
    /// The buyers' stages as (label, buyers), in funnel order.
    pub fn stages(&self) -> [(&'static str, u64); 5] {
        [
            ("arrived", self.arrived),
            ("queued", self.queued),
            ("admitted", self.admitted),
            ("ordered", self.ordered),
            ("paid", self.paying),
        ]
    }

    /// The orders' stages as (label, orders), from the reservation to the
    /// payment.
    pub fn order_stages(&self) -> [(&'static str, u64); 4] {
        [
            ("reserved", self.reserved),
            ("acknowledged", self.acknowledged),
            ("persisted", self.persisted),
            ("paid", self.paid),
        ]
    }

    /// The buyers' funnel as a bar plot, in buyers.
    pub fn plot(&self) -> BarPlot {
        stage_plot(
            "funnel",
            "Funnel: buyers from arrival to a paid order",
            "buyers",
            &self.stages(),
        )
    }

    /// The orders as a bar plot, in orders.
    pub fn orders_plot(&self) -> BarPlot {
        stage_plot(
            "orders",
            "Orders: reserved, acknowledged, stored, paid",
            "orders",
            &self.order_stages(),
        )
    }
}

/// One bar per stage, all in `unit`.
fn stage_plot(id: &str, title: &str, unit: &str, stages: &[(&str, u64)]) -> BarPlot {
    BarPlot {
        id: id.into(),
        title: title.into(),
        unit: unit.into(),
        groups: stages
            .iter()
            .map(|&(label, n)| {
                (
                    label.to_owned(),
                    vec![Bar {
                        name: unit.to_owned(),
                        value: n as f64,
                    }],
                )
            })
            .collect(),
    }
}

/// The report's key figures.
pub fn figures(outcome: &Outcome, plan: &Plan) -> Vec<(String, String)> {
    let mut out = vec![
        ("buyers at the peak".to_owned(), plan.users.to_string()),
        ("load".to_owned(), format!("{} s", plan.load.as_secs())),
        (
            "rate-limited answers".to_owned(),
            format!(
                "{} (429, the per-user limit; counted apart from buyers)",
                outcome.funnel.rate_limited
            ),
        ),
        (
            "checks".to_owned(),
            format!(
                "{} of {} passed",
                outcome.checks.iter().filter(|c| c.passed).count(),
                outcome.checks.len()
            ),
        ),
        (
            "tiers".to_owned(),
            outcome
                .tiers
                .sequence()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" → "),
        ),
        (
            "scenario time".to_owned(),
            format!("{:.0} s", outcome.seconds),
        ),
    ];
    if let Some(run) = &outcome.drill {
        out.push(("drill".to_owned(), run_text(run)));
    }
    out
}

/// Rows of `stages` with bars scaled to the first stage.
fn bars(out: &mut String, stages: &[(&str, u64)]) {
    let top = stages.first().map_or(0, |&(_, n)| n).max(1) as f64;
    for &(label, n) in stages {
        let width = ((n as f64 / top) * 30.0).round().clamp(0.0, 30.0) as usize;
        out.push_str(&format!("  {label:<13} {n:>7}  {}\n", "█".repeat(width)));
    }
}

/// The terminal summary: funnel, orders, tiers, drill, checks and the
/// report's path.
pub fn text(outcome: &Outcome) -> String {
    let funnel = &outcome.funnel;
    let mut out = String::from("\nFunnel (buyers)\n");
    bars(&mut out, &funnel.stages());
    out.push_str("Orders\n");
    bars(&mut out, &funnel.order_stages());
    out.push_str(&format!(
        "  rate-limited answers: {}\n",
        funnel.rate_limited
    ));
    out.push_str("Tiers\n");
    for change in &outcome.tiers.changes {
        out.push_str(&format!(
            "  {}  tier {} ({})\n",
            time_of_day(change.at),
            change.tier,
            change.reason
        ));
    }
    out.push_str("Drill\n");
    match &outcome.drill {
        Some(run) => out.push_str(&format!(
            "  {}, target {}\n",
            run_text(run),
            run.targets.join(", ")
        )),
        None => out.push_str("  no run ended\n"),
    }
    out.push_str("Checks\n");
    for check in &outcome.checks {
        out.push_str(&format!(
            "  {} {}\n      {}\n",
            if check.passed { "✓" } else { "✗" },
            check.name,
            check.detail
        ));
    }
    let passed = outcome.checks.iter().filter(|c| c.passed).count();
    out.push_str(&format!(
        "\n{passed} of {} checks passed in {:.0} s. Report: {}\n",
        outcome.checks.len(),
        outcome.seconds,
        outcome.report.display()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_funnel_counts_buyers_and_the_orders_are_plotted_apart() {
        let funnel = Funnel {
            arrived: 100,
            queued: 80,
            admitted: 70,
            ordered: 38,
            paying: 29,
            rate_limited: 2_034,
            reserved: 40,
            acknowledged: 39,
            persisted: 39,
            paid: 30,
        };
        let plot = funnel.plot();
        let labels: Vec<&str> = plot.groups.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["arrived", "queued", "admitted", "ordered", "paid"]);
        assert_eq!(plot.unit, "buyers");
        let values: Vec<f64> = plot.groups.iter().map(|(_, b)| b[0].value).collect();
        assert_eq!(values, [100.0, 80.0, 70.0, 38.0, 29.0]);

        let orders = funnel.orders_plot();
        assert_eq!(orders.unit, "orders");
        let values: Vec<f64> = orders.groups.iter().map(|(_, b)| b[0].value).collect();
        assert_eq!(values, [40.0, 39.0, 39.0, 30.0]);
        // The 2,034 answers are in neither plot.
        assert!(
            plot.groups
                .iter()
                .chain(&orders.groups)
                .all(|(_, b)| b[0].value < 2_034.0)
        );
    }
}
