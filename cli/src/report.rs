//! What `status` says about a sale, as a pure function of the objects the
//! operator wrote (and the funnel, when Prometheus answered) at a given
//! moment: the same report is rendered as text or serialised as JSON/YAML.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

use flashsale_api::{
    ChaosDrill, DegradationPolicy, FlashSale,
    chaosdrill::{DrillPhase, FailoverStatus, RunRecord},
    conditions::READY,
    degradation::TierReason,
    flashsale::SalePhase,
};

use crate::funnel::Funnel;

/// One sale with its policies and drills.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SaleReport {
    /// The sale's namespace.
    pub namespace: String,
    /// The sale.
    pub name: String,
    /// Its phase, as the operator last wrote it.
    pub phase: Option<String>,
    /// The next phase and when it is due.
    pub next: Option<NextPhase>,
    /// Ready workloads, e.g. `3/3`.
    pub ready_workloads: Option<String>,
    /// Stock per SKU.
    pub stock: Vec<Stock>,
    /// The funnel in requests a second over the last minute.
    pub funnel: Option<Funnel>,
    /// Why there is no funnel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub funnel_missing: Option<String>,
    /// The sale's degradation policies.
    pub degradation: Vec<PolicyReport>,
    /// The sale's drills.
    pub drills: Vec<DrillReport>,
}

/// The phase a sale goes to next.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NextPhase {
    /// Its name.
    pub phase: String,
    /// When.
    pub at: Timestamp,
}

/// One SKU's stock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stock {
    /// The SKU.
    pub sku: String,
    /// Units of the sale.
    pub total: i64,
    /// Units left to sell.
    pub available: Option<i64>,
    /// Units held by unpaid orders.
    pub reserved: Option<i64>,
    /// Units sold.
    pub sold: Option<i64>,
}

/// A degradation policy's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    /// The policy.
    pub name: String,
    /// The tier in force.
    pub tier: Option<i32>,
    /// What decided it: Signal, Override or SignalLost.
    pub source: Option<String>,
    /// Why that tier, as the policy's status says it.
    pub why: Option<String>,
    /// Since when.
    pub since: Option<Timestamp>,
    /// The override in force.
    pub r#override: Option<OverrideReport>,
    /// The signal's last value.
    pub signal: Option<f64>,
    /// Each tier's thresholds.
    pub thresholds: Vec<Threshold>,
    /// How far the switches reached the gateways.
    pub propagation: Option<PropagationReport>,
}

/// An override in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OverrideReport {
    /// The forced tier.
    pub tier: i32,
    /// The field manager that set it.
    pub set_by: String,
    /// Why.
    pub reason: String,
    /// When it lapses.
    pub until: Timestamp,
}

/// One tier's thresholds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Threshold {
    /// The tier.
    pub tier: i32,
    /// Entered above this signal.
    pub enter_above: f64,
    /// Left below this one.
    pub exit_below: f64,
}

/// The switches' propagation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PropagationReport {
    /// Gateways that applied the switches.
    pub applied: i32,
    /// Gateways in all.
    pub desired: i32,
    /// Seconds from the write to the last gateway applying it.
    pub seconds: Option<f64>,
    /// Gateways behind, `pod: why`.
    pub laggards: Vec<String>,
}

/// A drill's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillReport {
    /// The drill.
    pub name: String,
    /// Its phase.
    pub phase: Option<String>,
    /// The next run, if one is scheduled.
    pub next_run: Option<Timestamp>,
    /// The run in progress.
    pub running: Option<RunningReport>,
    /// The latest finished run.
    pub last: Option<LastRun>,
    /// The standby's readiness.
    pub failover: Option<FailoverReport>,
}

/// The run in progress.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningReport {
    /// Its id.
    pub id: String,
    /// The pods its experiments target.
    pub targets: Vec<String>,
    /// The guard's verdict, as the drill's Ready condition says it.
    pub guard: Option<String>,
}

/// A finished run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastRun {
    /// Its id.
    pub id: String,
    /// Succeeded, Aborted, Skipped or Failed.
    pub outcome: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// When it ended.
    pub ended: Option<Timestamp>,
    /// The guard's decision to the faults being gone.
    pub abort_latency: Option<String>,
}

/// The standby's readiness.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverReport {
    /// Whether every check passed.
    pub ready: bool,
    /// When it was checked.
    pub checked_at: Option<Timestamp>,
    /// Each check.
    pub checks: Vec<CheckReport>,
}

/// One readiness check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    /// `standby`, `capacity`, `endpoint` or `replication/<name>`.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// What was measured.
    pub value: Option<String>,
    /// The bound.
    pub bound: Option<String>,
    /// The check in a sentence.
    pub message: String,
}

/// The report of `sale`, with the `policies` and `drills` of its namespace
/// (those naming another sale are left out).
pub fn sale(
    sale: &FlashSale,
    policies: &[DegradationPolicy],
    drills: &[ChaosDrill],
    funnel: Result<Funnel, String>,
) -> SaleReport {
    let name = sale.name_any();
    let namespace = sale.namespace().unwrap_or_default();
    let status = sale.status.clone().unwrap_or_default();
    let counts: BTreeMap<_, _> = status.items.iter().map(|i| (i.sku.clone(), i)).collect();
    let stock = sale
        .spec
        .items
        .iter()
        .map(|item| {
            let count = counts.get(&item.sku);
            Stock {
                sku: item.sku.clone(),
                total: item.stock,
                available: count.map(|c| c.available),
                reserved: count.map(|c| c.reserved),
                sold: count.map(|c| c.sold),
            }
        })
        .collect();
    let same =
        |ns: Option<String>, sale_ref: &str| ns.as_deref() == Some(&namespace) && sale_ref == name;
    let (funnel, funnel_missing) = match funnel {
        Ok(funnel) => (Some(funnel), None),
        Err(why) => (None, Some(why)),
    };
    SaleReport {
        phase: status.phase.map(|p| format!("{p:?}")),
        next: status.phase.and_then(next_phase).and_then(|phase| {
            let at = status.next_transition_time.as_ref()?.0;
            Some(NextPhase {
                phase: phase.to_owned(),
                at,
            })
        }),
        ready_workloads: status.ready_workloads.clone(),
        stock,
        funnel,
        funnel_missing,
        degradation: policies
            .iter()
            .filter(|p| same(p.namespace(), &p.spec.sale_ref.name))
            .map(policy)
            .collect(),
        drills: drills
            .iter()
            .filter(|d| same(d.namespace(), &d.spec.sale_ref.name))
            .map(drill)
            .collect(),
        namespace,
        name,
    }
}

fn next_phase(phase: SalePhase) -> Option<&'static str> {
    match phase {
        SalePhase::Pending => Some("WarmingUp"),
        SalePhase::WarmingUp => Some("Live"),
        SalePhase::Live => Some("Ended"),
        SalePhase::Ended | SalePhase::Failed => None,
    }
}

fn policy(policy: &DegradationPolicy) -> PolicyReport {
    let status = policy.status.clone().unwrap_or_default();
    PolicyReport {
        name: policy.name_any(),
        tier: status.tier,
        source: status.tier_reason.map(|r| {
            match r {
                TierReason::Signal => "Signal",
                TierReason::Override => "Override",
                TierReason::SignalLost => "SignalLost",
            }
            .to_owned()
        }),
        why: status.tier_message.clone(),
        since: status.since.map(|s| s.0),
        r#override: status.active_override.map(|o| OverrideReport {
            tier: o.tier,
            set_by: o.set_by,
            reason: o.reason,
            until: o.expires.0,
        }),
        signal: status.last_value,
        thresholds: policy
            .spec
            .tiers
            .iter()
            .map(|t| Threshold {
                tier: t.tier,
                enter_above: t.enter_above,
                exit_below: t.exit_below,
            })
            .collect(),
        propagation: status.propagation.map(|p| PropagationReport {
            applied: p.applied_replicas,
            desired: p.desired_replicas,
            seconds: p.seconds,
            laggards: p.laggards,
        }),
    }
}

fn drill(drill: &ChaosDrill) -> DrillReport {
    let status = drill.status.clone().unwrap_or_default();
    let ready = status
        .observed
        .conditions
        .iter()
        .find(|c| c.type_ == READY)
        .map(|c| c.message.clone());
    DrillReport {
        name: drill.name_any(),
        phase: status.phase.map(phase_name),
        next_run: status.next_run_time.map(|t| t.0),
        running: status.current_run.map(|run| RunningReport {
            id: run.id,
            targets: run.targets,
            guard: ready,
        }),
        last: status.history.first().map(last_run),
        failover: status.failover.as_ref().map(failover),
    }
}

/// The standby's readiness as the operator recorded it.
pub fn failover(status: &FailoverStatus) -> FailoverReport {
    FailoverReport {
        ready: status.ready,
        checked_at: status.checked_at.as_ref().map(|t| t.0),
        checks: status
            .checks
            .iter()
            .map(|c| CheckReport {
                name: c.name.clone(),
                passed: c.passed,
                value: c.value.clone(),
                bound: c.bound.clone(),
                message: c.message.clone(),
            })
            .collect(),
    }
}

/// A drill phase's name.
pub fn phase_name(phase: DrillPhase) -> String {
    format!("{phase:?}")
}

/// A finished run, briefly.
pub fn last_run(run: &RunRecord) -> LastRun {
    LastRun {
        id: run.id.clone(),
        outcome: run.outcome.map(|o| o.name().to_owned()),
        reason: run.reason.clone(),
        ended: run.ended_at.as_ref().map(|t| t.0),
        abort_latency: run.abort_latency.map(|d| d.to_string()),
    }
}

/// The time from `from` to `to` (either way) as people read it at a
/// glance: `41m20s`, `2h05m`, `3d4h`.
pub fn span(from: Timestamp, to: Timestamp) -> String {
    let secs = to.duration_since(from).as_secs().unsigned_abs();
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    #[test]
    fn spans_read_at_a_glance() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (60, "1m00s"),
            (2480, "41m20s"),
            (7500, "2h05m"),
            (273_600, "3d4h"),
        ];
        let now = Timestamp::UNIX_EPOCH;
        for (secs, text) in cases {
            let later = now + SignedDuration::from_secs(secs);
            assert_eq!(span(now, later), text);
            assert_eq!(span(later, now), text);
        }
    }
}
