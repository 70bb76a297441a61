//! The degradation tier as a pure function of the policy, what the controller
//! remembered, the signal's reading and the time: every rule is tested
//! without waiting, and the controller wakes exactly when the decision could
//! change by time alone.
//!
//! The rules, in order:
//! - An override whose `expires` is after now wins. At `expires` exactly it
//!   has lapsed, and the signal decides again from the tier in force. One
//!   that expires more than [`OVERRIDE_HORIZON`] ahead is refused and the
//!   signal decides: an override is for an incident and is renewed while it
//!   lasts, so `2099-…` is a typo, and a typo must not pin a sale's
//!   features for years. (The apiserver cannot refuse it: CEL has no
//!   clock.)
//! - The signal steps up at once, to the highest tier whose `enterAbove` it
//!   exceeds, skipping tiers if need be.
//! - It steps down one tier at a time, each step only after the value stayed
//!   below the tier's `exitBelow` for a full `holdDown`. A value between
//!   `exitBelow` and `enterAbove` holds, so an oscillating load never flaps.
//! - A lost signal holds the tier until `onSignalLoss.after` has passed; then
//!   `Hold` keeps it, and `EnterTier` raises it to the tier given.
//!
//! Choices the policy's spec leaves open:
//! - After a step down, the next step's hold-down starts at that instant if
//!   the same value is already below the new tier's `exitBelow` (it was seen
//!   there then), otherwise when a value is first seen below it.
//! - `EnterTier` never lowers the tier: while blind, degrade more, never less.
//! - While an override is in force the hold-down does not run, so the first
//!   step down after it lapses needs a full hold-down seen by the signal. The
//!   loss streak does run: it is a fact about the signal, so a signal lost
//!   throughout an override is acted on as soon as the override lapses.
//! - A lost signal also resets the hold-down: it restarts from the first
//!   fresh value below `exitBelow`.
//! - A tier the spec does not define (an override's, or one removed from the
//!   spec) has no thresholds: the signal never asks for it, so the policy
//!   leaves it after one hold-down, for the next lower defined tier.

use jiff::{SignedDuration, Timestamp};

use flashsale_api::{
    degradation::DegradationPolicySpec, degradation::Override, degradation::SignalLossAction,
    degradation::Tier, degradation::TierReason,
};
use flashsale_observe::{signal::Loss, signal::Reading};

/// What the controller keeps in the status between evaluations.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    /// The tier in force (0 = nothing degraded).
    pub tier: i32,
    /// Why that tier.
    pub source: TierReason,
    /// When `tier` was entered.
    pub since: Option<Timestamp>,
    /// When the signal went below the current tier's `exitBelow` and stayed
    /// there: the start of the running hold-down.
    pub below_exit_since: Option<Timestamp>,
    /// When the signal was first missing in the current loss streak.
    pub lost_since: Option<Timestamp>,
}

impl Memory {
    /// The memory as seen at `now`: an instant after `now` (the wall clock
    /// stepped back since it was written) is taken as `now`. A streak then
    /// restarts, so a hold-down lasts at most its own length more, never
    /// the length of the step.
    fn not_after(&self, now: Timestamp) -> Self {
        let clamp = |at: Option<Timestamp>| at.map(|at| at.min(now));
        Self {
            since: clamp(self.since),
            below_exit_since: clamp(self.below_exit_since),
            lost_since: clamp(self.lost_since),
            ..self.clone()
        }
    }
}

impl Default for Memory {
    /// A new policy: nothing degraded.
    fn default() -> Self {
        Self {
            tier: 0,
            source: TierReason::Signal,
            since: None,
            below_exit_since: None,
            lost_since: None,
        }
    }
}

/// The outcome of one evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What to keep until the next evaluation, with the tier to apply.
    pub memory: Memory,
    /// Whether the tier differs from the one in force before.
    pub changed: bool,
    /// Why, as one sentence for the Event and the status.
    pub message: String,
    /// The next instant the decision could change with no new reading: the
    /// end of a hold-down, of `onSignalLoss.after`, or the override's expiry.
    pub wake_at: Option<Timestamp>,
    /// When the override that decided the tier lapses; `None` when the
    /// signal decided. Written with the switches, so the override's expiry
    /// is honoured even if this policy can no longer be evaluated.
    pub override_expires: Option<Timestamp>,
    /// Why the spec's override was refused, if it was.
    pub refused_override: Option<String>,
}

/// The furthest ahead an override may expire.
pub const OVERRIDE_HORIZON: SignedDuration = SignedDuration::from_hours(24);

/// The spec's override as it stands at an instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OverrideAt<'a> {
    /// None is set, or it lapsed.
    Absent,
    /// It decides the tier until it expires.
    InForce(&'a Override),
    /// It expires more than [`OVERRIDE_HORIZON`] ahead: not applied.
    TooFar(&'a Override),
}

/// The spec's override at `now`.
pub fn override_at(spec: &DegradationPolicySpec, now: Timestamp) -> OverrideAt<'_> {
    match spec.r#override.as_ref() {
        Some(over) if now >= over.expires.0 => OverrideAt::Absent,
        Some(over) if over.expires.0 > plus(now, OVERRIDE_HORIZON.unsigned_abs()) => {
            OverrideAt::TooFar(over)
        }
        Some(over) => OverrideAt::InForce(over),
        None => OverrideAt::Absent,
    }
}

/// What a rule decided, before the bookkeeping every rule shares.
struct Step {
    tier: i32,
    source: TierReason,
    below_exit_since: Option<Timestamp>,
    wake_at: Option<Timestamp>,
    message: String,
}

/// The tier for `reading` at `now`, given the policy and what the previous
/// evaluation left in `memory`.
pub fn decide(
    spec: &DegradationPolicySpec,
    memory: &Memory,
    reading: &Reading,
    now: Timestamp,
) -> Decision {
    let memory = &memory.not_after(now);
    let lost_since = match reading {
        Reading::Value(_) => None,
        Reading::Lost(_) => Some(memory.lost_since.unwrap_or(now)),
    };
    let at = override_at(spec, now);
    let in_force = match at {
        OverrideAt::InForce(over) => Some(over),
        OverrideAt::Absent | OverrideAt::TooFar(_) => None,
    };
    let refused_override = match at {
        OverrideAt::TooFar(over) => Some(format!(
            "spec.override (tier {}) refused: it expires at {}, more than {} ahead; \
             set an expiry within a day and renew it while the incident lasts",
            over.tier,
            over.expires.0,
            flashsale_api::Duration(OVERRIDE_HORIZON.unsigned_abs())
        )),
        OverrideAt::Absent | OverrideAt::InForce(_) => None,
    };
    let step = match (in_force, reading) {
        (Some(over), _) => overridden(over, reading),
        (None, Reading::Value(sample)) => by_signal(spec, memory, sample.value, now),
        (None, Reading::Lost(loss)) => by_loss(spec, memory, loss, lost_since.unwrap_or(now), now),
    };
    let changed = step.tier != memory.tier;
    Decision {
        memory: Memory {
            tier: step.tier,
            source: step.source,
            since: if changed { Some(now) } else { memory.since },
            below_exit_since: step.below_exit_since,
            lost_since,
        },
        changed,
        message: step.message,
        wake_at: step.wake_at,
        override_expires: in_force.map(|over| over.expires.0),
        refused_override,
    }
}

/// On-call's tier, until it lapses.
fn overridden(over: &Override, reading: &Reading) -> Step {
    let mut message = format!(
        "override by on-call until {}: {}",
        over.expires.0, over.reason
    );
    if let Reading::Lost(loss) = reading {
        message.push_str(&format!("; {}", lost(loss)));
    }
    Step {
        tier: over.tier,
        source: TierReason::Override,
        below_exit_since: None,
        wake_at: Some(over.expires.0),
        message,
    }
}

/// Hysteresis and hold-down over a fresh value.
fn by_signal(spec: &DegradationPolicySpec, memory: &Memory, value: f64, now: Timestamp) -> Step {
    let current = memory.tier;
    let defined = |tier: i32| spec.tiers.iter().find(|t| t.tier == tier);
    let shown = ratio(value);
    let step = |tier, below_exit_since, wake_at, message| Step {
        tier,
        source: TierReason::Signal,
        below_exit_since,
        wake_at,
        message,
    };

    let wanted = spec
        .tiers
        .iter()
        .filter(|t| t.enter_above < value)
        .max_by_key(|t| t.tier);
    if let Some(up) = wanted.filter(|t| t.tier > current) {
        let message = format!(
            "signal {shown} above tier {}'s enterAbove {}",
            up.tier, up.enter_above
        );
        return step(up.tier, None, None, message);
    }
    if current <= 0 {
        let message = match spec.tiers.iter().min_by_key(|t| t.tier) {
            Some(first) => format!(
                "signal {shown} not above tier {}'s enterAbove {}: nothing degraded",
                first.tier, first.enter_above
            ),
            None => "no tier defined: nothing degraded".to_owned(),
        };
        return step(current, None, None, message);
    }

    let tier = defined(current);
    if let Some(tier) = tier.filter(|t| value >= t.exit_below) {
        let message = if value > tier.enter_above {
            format!(
                "signal {shown} above tier {current}'s enterAbove {}",
                tier.enter_above
            )
        } else {
            format!(
                "signal {shown} between tier {current}'s exitBelow {} and enterAbove {}: \
                 holding tier {current}",
                tier.exit_below, tier.enter_above
            )
        };
        return step(current, None, None, message);
    }

    let below = match tier {
        Some(tier) => format!("below tier {current}'s exitBelow {}", tier.exit_below),
        None => format!("under tier {current}, which no tier of the policy defines,"),
    };
    let hold_down = spec.hold_down.0;
    let below_since = memory.below_exit_since.unwrap_or(now);
    let due = plus(below_since, hold_down);
    let waited = span(below_since, now);
    if now < due {
        let message = format!(
            "signal {shown} {below} for {waited} of the {} hold-down",
            spec.hold_down
        );
        return step(current, Some(below_since), Some(due), message);
    }
    let lower: Option<&Tier> = spec
        .tiers
        .iter()
        .filter(|t| t.tier < current)
        .max_by_key(|t| t.tier);
    let next = lower.map_or(0, |t| t.tier);
    let next_below = lower.filter(|t| value < t.exit_below).map(|_| now);
    let message = format!(
        "signal {shown} {below} for {waited} (hold-down {}): stepping down to tier {next}",
        spec.hold_down
    );
    step(
        next,
        next_below,
        next_below.map(|since| plus(since, hold_down)),
        message,
    )
}

/// `onSignalLoss` over a missing value, lost since `lost_since`.
fn by_loss(
    spec: &DegradationPolicySpec,
    memory: &Memory,
    loss: &Loss,
    lost_since: Timestamp,
    now: Timestamp,
) -> Step {
    let rule = &spec.on_signal_loss;
    let current = memory.tier;
    let cause = format!("{} for {}", lost(loss), span(lost_since, now));
    let due = plus(lost_since, rule.after.0);
    if now < due {
        // A lapsed override's tier is now the signal's to change.
        let source = match memory.source {
            TierReason::Override => TierReason::Signal,
            source => source,
        };
        return Step {
            tier: current,
            source,
            below_exit_since: None,
            wake_at: Some(due),
            message: format!(
                "{cause}: holding tier {current} until onSignalLoss.after {} has passed",
                rule.after
            ),
        };
    }
    let (tier, message) = match (rule.action, rule.tier) {
        (SignalLossAction::EnterTier, Some(tier)) if tier > current => (
            tier,
            format!("{cause}: entering tier {tier} as onSignalLoss says"),
        ),
        (SignalLossAction::EnterTier, Some(tier)) if tier < current => (
            current,
            format!(
                "{cause}: keeping tier {current} rather than onSignalLoss's tier {tier}, \
                 never degrading less while blind"
            ),
        ),
        _ => (
            current,
            format!("{cause}: holding tier {current} as onSignalLoss says"),
        ),
    };
    Step {
        tier,
        source: TierReason::SignalLost,
        below_exit_since: None,
        wake_at: None,
        message,
    }
}

/// A loss as the messages name it.
fn lost(loss: &Loss) -> String {
    format!("signal lost ({}: {})", loss.cause, loss.detail)
}

/// A signal value for a message: at most three decimals, no trailing zeros.
fn ratio(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `at + by`, saturating at the end of time.
fn plus(at: Timestamp, by: std::time::Duration) -> Timestamp {
    let by = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
    at.saturating_add(by).unwrap_or(Timestamp::MAX)
}

/// From `from` to `to`, for a message (0 if the clock went back).
fn span(from: Timestamp, to: Timestamp) -> flashsale_api::Duration {
    flashsale_api::Duration(
        std::time::Duration::try_from(to.duration_since(from)).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use flashsale_observe::{signal::Sample, signal::SignalLoss};

    /// Two tiers as in the example policy; loss enters tier 1 after 30 s.
    fn spec() -> DegradationPolicySpec {
        let yaml = r#"
            saleRef: {name: singles-day}
            signal: {query: "load"}
            tiers:
              - {tier: 2, enterAbove: 0.95, exitBelow: 0.85, switches: {}}
              - {tier: 1, enterAbove: 0.80, exitBelow: 0.70, switches: {}}
            holdDown: 2m
            onSignalLoss: {action: EnterTier, tier: 1, after: 30s}
        "#;
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|err| panic!("bad spec: {err}"))
    }

    fn with_loss(action: SignalLossAction, tier: Option<i32>) -> DegradationPolicySpec {
        let mut spec = spec();
        spec.on_signal_loss.action = action;
        spec.on_signal_loss.tier = tier;
        spec
    }

    fn with_override(tier: i32, expires: i64) -> DegradationPolicySpec {
        let mut spec = spec();
        spec.r#override = Some(Override {
            tier,
            reason: "INC-4711: payment provider slow".to_owned(),
            expires: Time(t(expires)),
        });
        spec
    }

    /// `secs` after 2026-11-11T00:00:00Z.
    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_794_355_200 + secs)
            .unwrap_or_else(|err| panic!("bad time {secs}: {err}"))
    }

    fn ms(millis: i64) -> Timestamp {
        t(0).saturating_add(SignedDuration::from_millis(millis))
            .unwrap_or_else(|err| panic!("bad time {millis}: {err}"))
    }

    /// A reading: a value, or lost.
    #[derive(Debug, Clone, Copy)]
    enum In {
        V(f64),
        Lost,
    }

    fn reading(input: In, now: Timestamp) -> Reading {
        match input {
            In::V(value) => Reading::Value(Sample { value, at: now }),
            In::Lost => Reading::Lost(Loss {
                cause: SignalLoss::PrometheusUnreachable,
                detail: "connection refused".to_owned(),
            }),
        }
    }

    fn at_tier(tier: i32, source: TierReason) -> Memory {
        Memory {
            tier,
            source,
            since: Some(t(-1000)),
            ..Memory::default()
        }
    }

    /// Feeds `steps` (seconds, reading, expected tier) to `decide` in turn,
    /// each evaluation remembering the last; returns the last decision.
    fn run(spec: &DegradationPolicySpec, start: Memory, steps: &[(i64, In, i32)]) -> Decision {
        let mut memory = start;
        let mut last = None;
        for &(secs, input, tier) in steps {
            let decision = decide(spec, &memory, &reading(input, t(secs)), t(secs));
            assert_eq!(
                decision.memory.tier, tier,
                "at {secs}s with {input:?}: {}",
                decision.message
            );
            assert_eq!(decision.changed, tier != memory.tier, "at {secs}s");
            memory = decision.memory.clone();
            last = Some(decision);
        }
        last.unwrap_or_else(|| panic!("no steps"))
    }

    use In::{Lost, V};

    #[test]
    fn rising_load_steps_up_at_once() {
        let last = run(
            &spec(),
            Memory::default(),
            &[
                (0, V(0.5), 0),
                (5, V(0.81), 1),
                (10, V(0.9), 1),
                (15, V(0.96), 2),
            ],
        );
        assert_eq!(last.memory.since, Some(t(15)));
        assert_eq!(last.memory.source, TierReason::Signal);
        assert_eq!(last.message, "signal 0.96 above tier 2's enterAbove 0.95");
        assert_eq!(last.wake_at, None);
        // From nothing straight to the top.
        let jump = run(&spec(), Memory::default(), &[(0, V(0.97), 2)]);
        assert!(jump.changed);
        // The threshold itself does not enter: "above".
        run(&spec(), Memory::default(), &[(0, V(0.8), 0)]);
    }

    #[test]
    fn falling_load_steps_down_one_tier_per_full_hold_down() {
        // 0.8 is below tier 2's exit but not tier 1's.
        run(
            &spec(),
            Memory::default(),
            &[
                (0, V(0.99), 2),
                (5, V(0.8), 2),
                (124, V(0.8), 2),
                (125, V(0.8), 1),
                (130, V(0.6), 1),
                (249, V(0.6), 1),
                (250, V(0.6), 0),
            ],
        );
        // Below both exits: each step still waits its own hold-down.
        let spec = spec();
        let first = run(
            &spec,
            at_tier(2, TierReason::Signal),
            &[(10, V(0.5), 2), (129, V(0.5), 2), (130, V(0.5), 1)],
        );
        assert_eq!(first.memory.below_exit_since, Some(t(130)));
        assert_eq!(first.wake_at, Some(t(250)));
        assert_eq!(
            first.message,
            "signal 0.5 below tier 2's exitBelow 0.85 for 2m (hold-down 2m): stepping down to tier 1"
        );
        let held = decide(&spec, &first.memory, &reading(V(0.5), t(200)), t(200));
        assert_eq!(held.memory.tier, 1);
        assert_eq!(
            held.message,
            "signal 0.5 below tier 1's exitBelow 0.7 for 1m10s of the 2m hold-down"
        );
        assert_eq!(held.wake_at, Some(t(250)));
        let down = decide(&spec, &held.memory, &reading(V(0.5), t(250)), t(250));
        assert_eq!((down.memory.tier, down.changed), (0, true));
        // Tier 0 has no exit and nothing to wait for.
        assert_eq!((down.memory.below_exit_since, down.wake_at), (None, None));
    }

    #[test]
    fn the_hold_down_ends_at_its_exact_instant() {
        let spec = spec();
        let memory = Memory {
            below_exit_since: Some(t(0)),
            ..at_tier(1, TierReason::Signal)
        };
        let before = decide(&spec, &memory, &reading(V(0.5), ms(119_999)), ms(119_999));
        assert_eq!((before.memory.tier, before.wake_at), (1, Some(t(120))));
        let at = decide(&spec, &memory, &reading(V(0.5), t(120)), t(120));
        assert_eq!(at.memory.tier, 0);
    }

    #[test]
    fn a_wall_clock_stepped_back_costs_at_most_one_more_hold_down() {
        // Below exitBelow since 0; then the clock steps back an hour.
        let spec = spec();
        let memory = Memory {
            below_exit_since: Some(t(0)),
            ..at_tier(1, TierReason::Signal)
        };
        let stepped = t(60 - 3600);
        let held = decide(&spec, &memory, &reading(V(0.5), stepped), stepped);
        assert_eq!(held.memory.tier, 1);
        assert_eq!(held.memory.below_exit_since, Some(stepped));
        // The hold-down restarts at the step, not an hour after it.
        assert_eq!(held.wake_at, Some(t(60 - 3600 + 120)));
        let next = t(60 - 3600 + 120);
        let down = decide(&spec, &held.memory, &reading(V(0.5), next), next);
        assert_eq!(down.memory.tier, 0, "{}", down.message);
    }

    #[test]
    fn oscillating_load_never_flaps() {
        // Around tier 1's enterAbove, after entering: stays at tier 1.
        let mut steps = vec![(0, V(0.81), 1)];
        for i in 1..120 {
            let value = if i % 2 == 0 { 0.81 } else { 0.79 };
            steps.push((i * 5, V(value), 1));
        }
        // Dipping below exitBelow, but never for a whole hold-down.
        for i in 120..240 {
            let value = if i % 10 == 0 { 0.71 } else { 0.69 };
            steps.push((i * 5, V(value), 1));
        }
        run(&spec(), Memory::default(), &steps);
    }

    #[test]
    fn a_value_between_exit_and_enter_holds() {
        let last = run(
            &spec(),
            at_tier(2, TierReason::Signal),
            &[(0, V(0.9), 2), (300, V(0.85), 2), (600, V(0.95), 2)],
        );
        assert_eq!(last.memory.below_exit_since, None);
        assert_eq!(last.wake_at, None);
        assert_eq!(
            last.message,
            "signal 0.95 between tier 2's exitBelow 0.85 and enterAbove 0.95: holding tier 2"
        );
        // A value back at exitBelow restarts the hold-down.
        let last = run(
            &spec(),
            at_tier(2, TierReason::Signal),
            &[
                (0, V(0.8), 2),
                (100, V(0.85), 2),
                (110, V(0.8), 2),
                (229, V(0.8), 2),
            ],
        );
        assert_eq!(last.memory.below_exit_since, Some(t(110)));
        assert_eq!(last.wake_at, Some(t(230)));
    }

    #[test]
    fn a_loss_shorter_than_after_holds_the_tier() {
        let last = run(
            &spec(),
            Memory::default(),
            &[
                (0, V(0.5), 0),
                (10, Lost, 0),
                (39, Lost, 0),
                // A value ends the streak; the next one starts anew.
                (45, V(0.5), 0),
                (50, Lost, 0),
                (79, Lost, 0),
            ],
        );
        assert_eq!(last.memory.lost_since, Some(t(50)));
        assert_eq!(last.memory.source, TierReason::Signal);
        assert_eq!(last.wake_at, Some(t(80)));
        assert_eq!(
            last.message,
            "signal lost (PrometheusUnreachable: connection refused) for 29s: \
             holding tier 0 until onSignalLoss.after 30s has passed"
        );
        let entered = decide(&spec(), &last.memory, &reading(Lost, t(80)), t(80));
        assert_eq!(entered.memory.tier, 1);
        assert_eq!(entered.memory.source, TierReason::SignalLost);
        assert_eq!(entered.wake_at, None);
        assert_eq!(
            entered.message,
            "signal lost (PrometheusUnreachable: connection refused) for 30s: \
             entering tier 1 as onSignalLoss says"
        );
    }

    #[test]
    fn after_a_long_loss_hold_keeps_and_enter_tier_raises() {
        let steps = [(0, Lost, 0), (30, Lost, 0)];
        let hold = run(
            &with_loss(SignalLossAction::Hold, None),
            Memory::default(),
            &steps,
        );
        assert_eq!(hold.memory.source, TierReason::SignalLost);
        assert!(
            hold.message
                .ends_with("holding tier 0 as onSignalLoss says")
        );
        let steps = [(0, Lost, 0), (30, Lost, 2)];
        let spec = with_loss(SignalLossAction::EnterTier, Some(2));
        let enter = run(&spec, Memory::default(), &steps);
        assert_eq!(enter.memory.source, TierReason::SignalLost);
    }

    #[test]
    fn enter_tier_never_lowers_the_tier() {
        let last = run(
            &spec(),
            at_tier(2, TierReason::Signal),
            &[(0, Lost, 2), (30, Lost, 2), (600, Lost, 2)],
        );
        assert_eq!(last.memory.source, TierReason::SignalLost);
        assert_eq!(last.memory.since, Some(t(-1000)));
        assert!(
            last.message.ends_with(
                "keeping tier 2 rather than onSignalLoss's tier 1, never degrading less while blind"
            ),
            "{}",
            last.message
        );
    }

    #[test]
    fn after_a_loss_the_hold_down_starts_with_the_first_fresh_value() {
        // Below exit since 0, then blind: the hold-down does not count the
        // time blind, it restarts at 70.
        let last = run(
            &spec(),
            at_tier(1, TierReason::Signal),
            &[
                (0, V(0.5), 1),
                (60, Lost, 1),
                (70, V(0.5), 1),
                (120, V(0.5), 1),
                (189, V(0.5), 1),
                (190, V(0.5), 0),
            ],
        );
        assert_eq!(last.memory.source, TierReason::Signal);
        // Recovery from a loss steps up at once.
        run(
            &spec(),
            Memory::default(),
            &[(0, Lost, 0), (30, Lost, 1), (35, V(0.99), 2)],
        );
    }

    #[test]
    fn an_override_beats_the_signal_until_its_exact_expiry() {
        let spec = with_override(0, 100);
        let last = run(
            &spec,
            at_tier(2, TierReason::Signal),
            &[(0, V(0.99), 0), (50, Lost, 0), (99, V(0.99), 0)],
        );
        assert_eq!(last.memory.source, TierReason::Override);
        assert_eq!(last.wake_at, Some(t(100)));
        assert_eq!(
            last.message,
            "override by on-call until 2026-11-11T00:01:40Z: INC-4711: payment provider slow"
        );
        let memory = last.memory;
        let almost = decide(&spec, &memory, &reading(V(0.99), ms(99_999)), ms(99_999));
        assert_eq!(almost.memory.tier, 0);
        // At `expires` the override has lapsed: the signal steps up at once.
        let lapsed = decide(&spec, &memory, &reading(V(0.99), t(100)), t(100));
        assert_eq!(lapsed.memory.tier, 2);
        assert_eq!(lapsed.memory.source, TierReason::Signal);
        // A higher override beats a low signal.
        run(&with_override(2, 100), Memory::default(), &[(0, V(0.1), 2)]);
    }

    #[test]
    fn an_override_expiring_more_than_a_day_ahead_is_refused_and_the_signal_decides() {
        let day = 24 * 3600;
        // Exactly a day ahead is allowed; a second more is not.
        let allowed = decide(
            &with_override(2, day),
            &Memory::default(),
            &reading(V(0.1), t(0)),
            t(0),
        );
        assert_eq!(allowed.memory.tier, 2);
        assert_eq!(allowed.override_expires, Some(t(day)));
        assert_eq!(allowed.refused_override, None);
        let refused = decide(
            &with_override(2, day + 1),
            &Memory::default(),
            &reading(V(0.1), t(0)),
            t(0),
        );
        assert_eq!(refused.memory.tier, 0);
        assert_eq!(refused.memory.source, TierReason::Signal);
        assert_eq!(refused.override_expires, None);
        let why = refused.refused_override.unwrap_or_default();
        assert!(
            why.contains("spec.override") && why.contains("24h"),
            "{why}"
        );
    }

    #[test]
    fn a_loss_during_an_override_is_acted_on_when_it_lapses() {
        let spec = with_override(0, 100);
        let during = run(&spec, Memory::default(), &[(10, Lost, 0), (90, Lost, 0)]);
        assert_eq!(during.memory.lost_since, Some(t(10)));
        assert!(
            during
                .message
                .ends_with("; signal lost (PrometheusUnreachable: connection refused)"),
            "{}",
            during.message
        );
        run(&spec, during.memory, &[(100, Lost, 1)]);
    }

    #[test]
    fn after_an_override_the_signal_steps_down_with_hold_down() {
        let spec = with_override(2, 100);
        let last = run(
            &spec,
            Memory::default(),
            &[
                (0, V(0.5), 2),
                (99, V(0.5), 2),
                // Lapsed: the hold-down starts now, not while overridden.
                (100, V(0.5), 2),
                (219, V(0.5), 2),
                (220, V(0.5), 1),
                (339, V(0.5), 1),
                (340, V(0.5), 0),
            ],
        );
        assert_eq!(last.memory.source, TierReason::Signal);
        let lapsed = decide(
            &spec,
            &Memory {
                tier: 2,
                source: TierReason::Override,
                ..Memory::default()
            },
            &reading(V(0.5), t(100)),
            t(100),
        );
        assert_eq!(lapsed.memory.source, TierReason::Signal);
        assert_eq!(lapsed.wake_at, Some(t(220)));
        // A lost signal right after it keeps the tier, as the signal's now.
        let blind = decide(
            &spec,
            &at_tier(2, TierReason::Override),
            &reading(Lost, t(100)),
            t(100),
        );
        assert_eq!(
            (blind.memory.tier, blind.memory.source),
            (2, TierReason::Signal)
        );
    }

    #[test]
    fn an_undefined_tier_is_left_after_one_hold_down() {
        let spec = with_override(5, 0);
        let last = run(
            &spec,
            at_tier(5, TierReason::Override),
            &[(0, V(0.99), 5), (119, V(0.99), 5), (120, V(0.99), 2)],
        );
        assert!(
            last.message
                .contains("under tier 5, which no tier of the policy defines, for 2m"),
            "{}",
            last.message
        );
    }

    #[test]
    fn wake_at_is_the_next_change_by_time_alone() {
        let spec = spec();
        let cases = [
            // Steady: nothing to wait for.
            (Memory::default(), V(0.5), None),
            (at_tier(1, TierReason::Signal), V(0.75), None),
            // A hold-down running since 10 s.
            (
                Memory {
                    below_exit_since: Some(t(10)),
                    ..at_tier(1, TierReason::Signal)
                },
                V(0.5),
                Some(t(130)),
            ),
            // A loss since 40 s, and one past `after`.
            (
                Memory {
                    lost_since: Some(t(40)),
                    ..Memory::default()
                },
                Lost,
                Some(t(70)),
            ),
            (
                Memory {
                    lost_since: Some(t(-40)),
                    ..at_tier(1, TierReason::SignalLost)
                },
                Lost,
                None,
            ),
        ];
        for (memory, input, wake_at) in cases {
            let decision = decide(&spec, &memory, &reading(input, t(60)), t(60));
            assert_eq!(decision.wake_at, wake_at, "{memory:?} {input:?}");
        }
        let overridden = decide(
            &with_override(1, 90),
            &Memory::default(),
            &reading(V(0.5), t(60)),
            t(60),
        );
        assert_eq!(overridden.wake_at, Some(t(90)));
    }

    #[test]
    fn signal_values_print_short() {
        assert_eq!(ratio(0.97), "0.97");
        assert_eq!(ratio(0.1 + 0.2), "0.3");
        assert_eq!(ratio(2.0), "2");
        assert_eq!(ratio(100.0), "100");
        assert_eq!(ratio(1.23456), "1.235");
    }
}
