//! The policy's status as a pure function of what one evaluation saw: the
//! decision, the signal, the override and how far the switches reached the
//! gateways.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, MicroTime, Time};

use super::{
    decide::Decision, decide::Memory, decide::OverrideAt, decide::override_at,
    propagation::Progress,
};
use flashsale_api::reasons::PolicyReason;
use flashsale_api::{
    conditions::PROPAGATED, conditions::READY, conditions::SIGNAL_AVAILABLE,
    degradation::ActiveOverride, degradation::DegradationPolicy,
    degradation::DegradationPolicyStatus, degradation::Propagation, degradation::TierReason,
};
use flashsale_kit::Blocker;
use flashsale_observe::signal::Reading;

/// Most gateways named in the status as not having applied the switches.
const MAX_LAGGARDS: usize = 10;

/// The memory the decision continues from: the tier in force and its
/// timers, as the last evaluation (by this replica or the previous leader)
/// left them in the status.
pub fn memory(status: Option<&DegradationPolicyStatus>) -> Memory {
    let status = status.cloned().unwrap_or_default();
    Memory {
        tier: status.tier.unwrap_or(0),
        source: status.tier_reason.unwrap_or(TierReason::Signal),
        since: status.since.map(|t| t.0),
        below_exit_since: status.below_exit_since.map(|t| t.0),
        lost_since: status.signal_lost_since.map(|t| t.0),
    }
}

fn start(
    old: Option<&DegradationPolicyStatus>,
    generation: Option<i64>,
) -> DegradationPolicyStatus {
    let mut status = old.cloned().unwrap_or_default();
    status.observed.observed_generation = generation;
    status
}

/// The status of a policy that cannot act: `Ready` false with the blocker;
/// the tier and everything last seen stay as they were, since nothing new
/// was decided or written.
pub fn blocked(
    old: Option<&DegradationPolicyStatus>,
    generation: Option<i64>,
    blocker: &Blocker<PolicyReason>,
    now: Timestamp,
) -> DegradationPolicyStatus {
    let mut status = start(old, generation);
    status
        .observed
        .set(READY, false, blocker.reason, &blocker.message, &Time(now));
    status
}

/// What one evaluation saw and decided.
pub struct Evaluation<'a> {
    /// The decision.
    pub decision: &'a Decision,
    /// The signal it was made on.
    pub reading: &'a Reading,
    /// The override in force, with who set it.
    pub active_override: Option<ActiveOverride>,
    /// The switches' generation and how far it reached the gateways.
    pub propagation: Option<(i64, Progress, Option<std::time::Duration>)>,
}

/// The status after an evaluation.
pub fn evaluated(
    old: Option<&DegradationPolicyStatus>,
    generation: Option<i64>,
    seen: &Evaluation<'_>,
    now: Timestamp,
) -> DegradationPolicyStatus {
    let when = Time(now);
    let mut status = start(old, generation);
    let memory = &seen.decision.memory;
    status.tier = Some(memory.tier);
    status.tier_reason = Some(memory.source);
    status.tier_message = Some(seen.decision.message.clone());
    status.since = memory.since.map(MicroTime);
    status.below_exit_since = memory.below_exit_since.map(MicroTime);
    status.signal_lost_since = memory.lost_since.map(MicroTime);
    status.last_evaluation_time = Some(when.clone());
    status.active_override = seen.active_override.clone();
    let conditions = &mut status.observed;
    match seen.reading {
        Reading::Value(sample) => {
            status.last_value = Some(sample.value);
            status.last_sample_time = Some(MicroTime(sample.at));
            conditions.set(
                SIGNAL_AVAILABLE,
                true,
                PolicyReason::SignalOk,
                format!("signal {:.3} at {}", sample.value, sample.at),
                &when,
            );
        }
        Reading::Lost(loss) => conditions.set(
            SIGNAL_AVAILABLE,
            false,
            PolicyReason::Signal(loss.cause),
            &loss.detail,
            &when,
        ),
    }
    if let Some(propagation) = &seen.propagation {
        propagated(&mut status, old, propagation, &when);
    }
    let conditions = &mut status.observed;
    let ready_message = format!("tier {}: {}", memory.tier, seen.decision.message);
    match &seen.decision.refused_override {
        // The signal still decides, but what on-call asked for is not done.
        Some(why) => conditions.set(
            READY,
            false,
            PolicyReason::OverrideRefused,
            format!("{why}; {ready_message}"),
            &when,
        ),
        None => conditions.set(READY, true, PolicyReason::AsExpected, ready_message, &when),
    }
    status
}

/// Records how far generation `switches` reached the gateways, and the
/// `Propagated` condition.
fn propagated(
    status: &mut DegradationPolicyStatus,
    old: Option<&DegradationPolicyStatus>,
    (switches, progress, took): &(i64, Progress, Option<std::time::Duration>),
    when: &Time,
) {
    let laggards: Vec<String> = progress
        .laggards
        .iter()
        .take(MAX_LAGGARDS)
        .cloned()
        .collect();
    let kept = old
        .and_then(|s| s.propagation.as_ref())
        .filter(|p| p.generation == *switches)
        .and_then(|p| p.seconds);
    status.propagation = Some(Propagation {
        generation: *switches,
        applied_replicas: progress.applied,
        desired_replicas: progress.total,
        // A measurement belongs to its generation: a later re-check that
        // finds everyone applied keeps the time first measured.
        seconds: took.map(|d| d.as_secs_f64()).or(kept),
        laggards: laggards.clone(),
    });
    let (ok, reason, message) = if progress.total == 0 {
        (
            false,
            PolicyReason::NoGateways,
            "no ready gateway pod of the sale to apply the switches".to_owned(),
        )
    } else if progress.laggards.is_empty() {
        let took = took
            .map(|d| format!(" in {} ms", d.as_millis()))
            .unwrap_or_default();
        (
            true,
            PolicyReason::Applied,
            format!(
                "all {} ready gateways applied generation {switches}{took}",
                progress.total
            ),
        )
    } else {
        (
            false,
            PolicyReason::NotApplied,
            format!(
                "{}/{} gateways applied generation {switches}; not yet: {}",
                progress.applied,
                progress.total,
                laggards.join("; ")
            ),
        )
    };
    status.observed.set(PROPAGATED, ok, reason, message, when);
}

/// The override in force at `now`, with the field manager that last wrote
/// `spec.override` (who, for the audit trail); `None` once it expired.
pub fn active_override(policy: &DegradationPolicy, now: Timestamp) -> Option<ActiveOverride> {
    let OverrideAt::InForce(wanted) = override_at(&policy.spec, now) else {
        return None;
    };
    let set_by = override_setter(policy.metadata.managed_fields.as_deref().unwrap_or(&[]))
        .unwrap_or_else(|| "unknown".to_owned());
    Some(ActiveOverride {
        tier: wanted.tier,
        reason: wanted.reason.clone(),
        expires: wanted.expires.clone(),
        set_by,
    })
}

/// The manager that owns `spec.override` in `managedFields`: the latest
/// writer when several share it (an edit after an apply).
fn override_setter(entries: &[ManagedFieldsEntry]) -> Option<String> {
    entries
        .iter()
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .and_then(|fields| fields.0.get("f:spec"))
                .and_then(|spec| spec.get("f:override"))
                .is_some()
        })
        .max_by_key(|entry| entry.time.as_ref().map(|t| t.0))
        .and_then(|entry| entry.manager.clone())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    use super::*;

    fn entry(manager: &str, at: i64, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.to_owned()),
            time: Timestamp::from_second(at).ok().map(Time),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn the_override_is_credited_to_its_latest_writer() {
        let entries = [
            entry(
                "kubectl-client-side-apply",
                10,
                json!({"f:spec": {"f:tiers": {}}}),
            ),
            entry(
                "kubectl-patch",
                20,
                json!({"f:spec": {"f:override": {"f:tier": {}}}}),
            ),
            entry(
                "oncall-bot",
                30,
                json!({"f:spec": {"f:override": {"f:reason": {}}}}),
            ),
            entry(
                "flashsale-operator-degradationpolicy",
                40,
                json!({"f:status": {}}),
            ),
        ];
        assert_eq!(override_setter(&entries).as_deref(), Some("oncall-bot"));
        assert_eq!(
            override_setter(&entries[..2]).as_deref(),
            Some("kubectl-patch")
        );
        assert_eq!(override_setter(&entries[..1]), None);
    }
}
