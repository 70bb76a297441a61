//! The degradation tiers as the policy walked them: each change of
//! `status.tier`, with the time the policy gives for it.

use flashsale_api::DegradationPolicyStatus;
use jiff::Timestamp;
use serde::Serialize;

/// One tier the policy entered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierChange {
    /// The tier entered (0 = nothing shed).
    pub tier: i32,
    /// When, as the policy's `status.since` says (when first seen otherwise).
    pub at: Timestamp,
    /// Why: `Signal`, `Override` or `SignalLost`.
    pub reason: String,
    /// The load signal's last value when it was seen.
    pub value: Option<f64>,
}

/// The tiers seen so far, in order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TierLog {
    /// Every change, the first reading included.
    pub changes: Vec<TierChange>,
}

impl TierLog {
    /// Takes a reading of the policy's status at `seen`; returns the change
    /// when the tier differs from the last one logged.
    pub fn record(
        &mut self,
        status: &DegradationPolicyStatus,
        seen: Timestamp,
    ) -> Option<&TierChange> {
        let tier = status.tier?;
        if self.changes.last().is_some_and(|last| last.tier == tier) {
            return None;
        }
        self.changes.push(TierChange {
            tier,
            at: status.since.as_ref().map_or(seen, |since| since.0),
            reason: status
                .tier_reason
                .as_ref()
                .map_or_else(|| "Unknown".to_owned(), |r| format!("{r:?}")),
            value: status.last_value,
        });
        self.changes.last()
    }

    /// The tiers in the order they were entered.
    pub fn sequence(&self) -> Vec<i32> {
        self.changes.iter().map(|c| c.tier).collect()
    }

    /// The tier in force at `at` (0 before the first reading).
    pub fn tier_at(&self, at: Timestamp) -> i32 {
        self.changes
            .iter()
            .take_while(|c| c.at <= at)
            .last()
            .map_or(0, |c| c.tier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_api::degradation::TierReason;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn status(tier: i32, since: &str) -> anyhow::Result<DegradationPolicyStatus> {
        Ok(DegradationPolicyStatus {
            tier: Some(tier),
            tier_reason: Some(TierReason::Signal),
            since: Some(MicroTime(since.parse()?)),
            last_value: Some(0.5),
            ..DegradationPolicyStatus::default()
        })
    }

    #[test]
    fn only_changes_are_logged_with_the_policys_own_time() -> anyhow::Result<()> {
        let mut log = TierLog::default();
        let seen: Timestamp = "2026-11-11T00:00:09Z".parse()?;
        assert!(
            log.record(&status(0, "2026-11-11T00:00:00Z")?, seen)
                .is_some()
        );
        assert!(
            log.record(&status(0, "2026-11-11T00:00:00Z")?, seen)
                .is_none()
        );
        let change = log
            .record(&status(1, "2026-11-11T00:00:05Z")?, seen)
            .cloned();
        assert_eq!(
            change.map(|c| (c.tier, c.at.to_string(), c.reason)),
            Some((1, "2026-11-11T00:00:05Z".to_owned(), "Signal".to_owned()))
        );
        log.record(&status(2, "2026-11-11T00:00:08Z")?, seen);
        assert_eq!(log.sequence(), [0, 1, 2]);
        assert_eq!(log.tier_at("2026-11-11T00:00:06Z".parse()?), 1);
        assert_eq!(log.tier_at("2026-11-10T00:00:00Z".parse()?), 0);
        // A status without a tier yet says nothing.
        assert!(
            log.record(&DegradationPolicyStatus::default(), seen)
                .is_none()
        );
        Ok(())
    }
}
