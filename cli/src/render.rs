//! `status` as text: one block per sale, a line per concern, the figures
//! first, readable at a glance.

use std::fmt::Write;

use jiff::Timestamp;

use crate::{
    funnel::Funnel,
    report::{DrillReport, FailoverReport, PolicyReport, SaleReport, span},
    style::Style,
};

/// The label column's width.
const LABEL: usize = 10;

/// The reports as text at `now`.
pub fn sales(reports: &[SaleReport], now: Timestamp, style: Style) -> String {
    if reports.is_empty() {
        return "no FlashSale found\n".to_owned();
    }
    let blocks: Vec<String> = reports.iter().map(|r| sale(r, now, style)).collect();
    blocks.join("\n")
}

fn sale(report: &SaleReport, now: Timestamp, style: Style) -> String {
    let mut out = String::new();
    let phase = report.phase.as_deref().unwrap_or("Unknown");
    let painted = match phase {
        "Live" => style.good(phase),
        "Failed" => style.bad(phase),
        _ => style.warn(phase),
    };
    let mut head = format!(
        "{}  {painted}",
        style.bold(&format!("{}/{}", report.namespace, report.name))
    );
    if let Some(next) = &report.next {
        let _ = write!(head, "  → {} in {}", next.phase, span(now, next.at));
    }
    if let Some(ready) = &report.ready_workloads {
        let _ = write!(head, "  workloads {ready}");
    }
    let _ = writeln!(out, "{head}");
    for (i, stock) in report.stock.iter().enumerate() {
        let label = if i == 0 { "stock" } else { "" };
        let figure = |n: Option<i64>| n.map_or_else(|| "?".to_owned(), |n| n.to_string());
        let left = figure(stock.available);
        let left = if stock.available == Some(0) {
            style.warn(&left)
        } else {
            left
        };
        line(
            &mut out,
            label,
            &format!(
                "{:<10} {left} left · {} reserved · {} sold of {}",
                stock.sku,
                figure(stock.reserved),
                figure(stock.sold),
                stock.total
            ),
        );
    }
    match (&report.funnel, &report.funnel_missing) {
        (Some(funnel), _) => line(&mut out, "funnel/s", &funnel_line(funnel)),
        (None, Some(why)) => line(&mut out, "funnel/s", &style.dim(why)),
        (None, None) => {}
    }
    for policy in &report.degradation {
        degradation(&mut out, policy, now, style);
    }
    for drill in &report.drills {
        drill_lines(&mut out, drill, now, style);
    }
    out
}

fn line(out: &mut String, label: &str, text: &str) {
    let _ = writeln!(out, "  {label:<LABEL$}{text}");
}

fn funnel_line(f: &Funnel) -> String {
    format!(
        "arrived {:.1} → queued {:.1} → admitted {:.1} → reserved {:.1} → ordered {:.1} → paid {:.1} · rate-limited {:.1}",
        f.arrived, f.queued, f.admitted, f.reserved, f.ordered, f.paid, f.rate_limited
    )
}

fn degradation(out: &mut String, policy: &PolicyReport, now: Timestamp, style: Style) {
    let tier = policy.tier.unwrap_or(0);
    let label = format!("tier {tier}");
    let painted = if tier > 0 {
        style.warn(&label)
    } else {
        style.good(&label)
    };
    let source = policy.source.as_deref().unwrap_or("not decided yet");
    let mut first = match &policy.r#override {
        Some(o) => format!(
            "override by {} until {} ({} left): {}",
            o.set_by,
            clock(o.until),
            span(now, o.until),
            o.reason
        ),
        None => match &policy.why {
            Some(why) => format!("{}: {why}", source.to_lowercase()),
            None => source.to_lowercase(),
        },
    };
    if let Some(since) = policy.since {
        let _ = write!(first, " · since {} ago", span(since, now));
    }
    let _ = writeln!(
        out,
        "  {painted}{:pad$}{first} {}",
        "",
        style.dim(&format!("({})", policy.name)),
        pad = LABEL.saturating_sub(label.len())
    );
    let signal = policy
        .signal
        .map_or_else(|| "no reading".to_owned(), |v| format!("{v:.2}"));
    let thresholds: Vec<String> = policy
        .thresholds
        .iter()
        .map(|t| {
            format!(
                "tier {} above {:.2} (left below {:.2})",
                t.tier, t.enter_above, t.exit_below
            )
        })
        .collect();
    line(
        out,
        "",
        &format!("signal {signal} · {}", thresholds.join(" · ")),
    );
    if let Some(p) = &policy.propagation {
        let all = p.applied == p.desired;
        let counted = format!("{}/{} gateways", p.applied, p.desired);
        let text = match p.seconds {
            _ if p.desired == 0 => "no gateway runs to apply it".to_owned(),
            Some(secs) if all => format!("applied by {} in {secs:.2}s", style.good(&counted)),
            _ => format!("applied by {} so far", style.warn(&counted)),
        };
        line(out, "", &text);
        for laggard in &p.laggards {
            line(out, "", &style.warn(&format!("behind: {laggard}")));
        }
    }
}

fn drill_lines(out: &mut String, drill: &DrillReport, now: Timestamp, style: Style) {
    let phase = drill.phase.as_deref().unwrap_or("Unknown");
    let painted = match phase {
        "Injecting" | "Aborting" => style.warn(phase),
        "Failed" | "Suspended" => style.bad(phase),
        _ => phase.to_owned(),
    };
    let mut head = format!("{}  {painted}", drill.name);
    if let Some(next) = drill.next_run.filter(|_| drill.running.is_none()) {
        let _ = write!(head, "  next run in {}", span(now, next));
    }
    line(out, "drill", &head);
    if let Some(run) = &drill.running {
        let targets = if run.targets.is_empty() {
            "none yet".to_owned()
        } else {
            run.targets.join(", ")
        };
        line(out, "", &format!("run {} · targets {targets}", run.id));
        if let Some(guard) = &run.guard {
            line(out, "", &format!("guard: {guard}"));
        }
    }
    if let Some(last) = &drill.last {
        let outcome = last.outcome.as_deref().unwrap_or("?");
        let painted = match outcome {
            "Succeeded" => style.good(outcome),
            "Failed" => style.bad(outcome),
            _ => style.warn(outcome),
        };
        let mut text = format!("last {painted}");
        if let Some(reason) = &last.reason {
            let _ = write!(text, " ({reason})");
        }
        if let Some(ended) = last.ended {
            let _ = write!(text, " {} ago", span(ended, now));
        }
        if let Some(latency) = &last.abort_latency {
            let _ = write!(text, " · abort latency {latency}");
        }
        line(out, "", &text);
    }
    if let Some(failover) = &drill.failover {
        line(out, "", &failover_line(failover, now, style));
    }
}

/// The standby's readiness in one line.
pub fn failover_line(f: &FailoverReport, now: Timestamp, style: Style) -> String {
    let verdict = if f.ready {
        style.good("ready")
    } else {
        style.bad("NOT ready")
    };
    let checked = f
        .checked_at
        .map(|at| format!(" (checked {} ago)", span(at, now)))
        .unwrap_or_default();
    let checks: Vec<String> = f
        .checks
        .iter()
        .map(|c| {
            let mark = if c.passed {
                style.good("✓")
            } else {
                style.bad("✗")
            };
            let figure = match (&c.value, &c.bound) {
                (Some(v), Some(b)) => format!(" {v} (bound {b})"),
                (Some(v), None) => format!(" {v}"),
                _ => String::new(),
            };
            format!("{} {mark}{figure}", c.name)
        })
        .collect();
    format!("failover {verdict}{checked}: {}", checks.join(" · "))
}

/// A time of day people compare with their clock: UTC, to the second.
pub fn clock(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{funnel::Funnel, report};
    use flashsale_api::{ChaosDrill, DegradationPolicy, FlashSale};

    /// The fixtures' sale mid-sale: Live, one SKU sold out, an override in
    /// force, one drill injecting and one whose standby lags.
    fn mid_sale() -> anyhow::Result<Vec<SaleReport>> {
        let sale: FlashSale = serde_yaml_ng::from_str(include_str!("fixtures/sale.yaml"))?;
        let policy: DegradationPolicy =
            serde_yaml_ng::from_str(include_str!("fixtures/policy.yaml"))?;
        let drills: Vec<ChaosDrill> =
            serde_yaml_ng::from_str(include_str!("fixtures/drills.yaml"))?;
        let funnel = Funnel {
            arrived: 1203.4,
            queued: 410.0,
            admitted: 395.5,
            rate_limited: 22.1,
            reserved: 180.0,
            ordered: 176.2,
            paid: 150.0,
        };
        // The same sale in another namespace, ended: its policy follows the
        // signal, and no gateway runs any more.
        let mut ended = sale.clone();
        ended.metadata.namespace = Some("outlet".to_owned());
        if let Some(status) = ended.status.as_mut() {
            status.phase = Some(flashsale_api::flashsale::SalePhase::Ended);
            status.ready_workloads = Some("1/3".to_owned());
        }
        let mut calm = policy.clone();
        calm.metadata.namespace = Some("outlet".to_owned());
        calm.spec.r#override = None;
        if let Some(status) = calm.status.as_mut() {
            status.tier = Some(0);
            status.tier_reason = Some(flashsale_api::degradation::TierReason::Signal);
            status.tier_message = Some("load 0.12 is below every tier's threshold".to_owned());
            status.active_override = None;
            status.propagation = Some(flashsale_api::degradation::Propagation {
                generation: 9,
                desired_replicas: 0,
                ..Default::default()
            });
        }
        let missing = Err("no Prometheus: set --prometheus-url or PROMETHEUS_URL".to_owned());
        let other = report::sale(&ended, std::slice::from_ref(&calm), &drills, missing);
        Ok(vec![
            report::sale(&sale, &[policy], &drills, Ok(funnel)),
            other,
        ])
    }

    fn now() -> anyhow::Result<Timestamp> {
        Ok("2026-11-11T00:01:00Z".parse()?)
    }

    #[test]
    fn status_as_plain_text() -> anyhow::Result<()> {
        insta::assert_snapshot!(sales(&mid_sale()?, now()?, Style::PLAIN));
        Ok(())
    }

    #[test]
    fn status_in_colour() -> anyhow::Result<()> {
        insta::assert_snapshot!(sales(&mid_sale()?, now()?, Style::COLOUR));
        Ok(())
    }

    #[test]
    fn status_as_json() -> anyhow::Result<()> {
        insta::assert_json_snapshot!(mid_sale()?);
        Ok(())
    }

    #[test]
    fn no_sale_says_so() -> anyhow::Result<()> {
        assert_eq!(sales(&[], now()?, Style::PLAIN), "no FlashSale found\n");
        Ok(())
    }
}
