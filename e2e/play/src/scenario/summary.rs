//! The run in words and figures: the funnel, the terminal summary and the
//! report's key figures.

use serde::Serialize;

use super::{
    Outcome,
    checks::{run_text, time_of_day},
    plan::Plan,
};
use crate::report::{Bar, BarPlot};

/// How far buyers got, stage by stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Funnel {
    /// Buyers who came.
    pub arrived: u64,
    /// Buyers the waiting room queued.
    pub queued: u64,
    /// Buyers it let through to checkout.
    pub admitted: u64,
    /// Requests refused by the per-user rate limit.
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
    /// The stages as (label, count), in funnel order.
    pub fn stages(&self) -> [(&'static str, u64); 8] {
        [
            ("arrived", self.arrived),
            ("queued", self.queued),
            ("admitted", self.admitted),
            ("rate-limited", self.rate_limited),
            ("reserved", self.reserved),
            ("acknowledged", self.acknowledged),
            ("persisted", self.persisted),
            ("paid", self.paid),
        ]
    }

    /// The funnel as a bar plot.
    pub fn plot(&self) -> BarPlot {
        BarPlot {
            id: "funnel".into(),
            title: "Funnel: from arrival to a paid order".into(),
            unit: "buyers, requests or orders".into(),
            groups: self
                .stages()
                .into_iter()
                .map(|(label, n)| {
                    (
                        label.to_owned(),
                        vec![Bar {
                            name: label.to_owned(),
                            value: n as f64,
                        }],
                    )
                })
                .collect(),
        }
    }
}

/// The report's key figures.
pub fn figures(outcome: &Outcome, plan: &Plan) -> Vec<(String, String)> {
    let mut out = vec![
        ("buyers at the peak".to_owned(), plan.users.to_string()),
        ("load".to_owned(), format!("{} s", plan.load.as_secs())),
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

/// The terminal summary: funnel, tiers, drill, checks and the report's path.
pub fn text(outcome: &Outcome) -> String {
    let mut out = String::from("\nFunnel\n");
    let top = outcome.funnel.arrived.max(1) as f64;
    for (label, n) in outcome.funnel.stages() {
        let width = ((n as f64 / top) * 30.0).round().clamp(0.0, 30.0) as usize;
        out.push_str(&format!("  {label:<13} {n:>7}  {}\n", "█".repeat(width)));
    }
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
    fn the_funnel_keeps_its_order_and_scales_its_bars() {
        let funnel = Funnel {
            arrived: 100,
            queued: 80,
            admitted: 70,
            rate_limited: 12,
            reserved: 40,
            acknowledged: 39,
            persisted: 39,
            paid: 30,
        };
        let plot = funnel.plot();
        let labels: Vec<&str> = plot.groups.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "arrived",
                "queued",
                "admitted",
                "rate-limited",
                "reserved",
                "acknowledged",
                "persisted",
                "paid"
            ]
        );
        assert_eq!(plot.groups[5].1[0].value, 39.0);
    }
}
