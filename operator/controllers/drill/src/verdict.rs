//! The SLO guard's dead-man verdict as a pure function of what each objective
//! last gave, when the guard started, `staleAfter` and the time: every rule
//! is tested without waiting or a Prometheus.
//!
//! The guard fails closed: whatever it cannot vouch for aborts the run. The
//! rules, per objective:
//! - A fresh value breaches when it is above the threshold (`Above`) or below
//!   it (`Below`); a value equal to the threshold does not. A threshold that
//!   is not a number has no value within it, so every value breaches.
//! - A value whose sample is older than `staleAfter` (`now - at > staleAfter`)
//!   makes the guard blind (`StaleSample`); so does a value that is not a
//!   finite number (`NotANumber`).
//! - Prometheus unreachable is a pause, not yet blindness: the guard waits
//!   until `staleAfter` has passed since the last usable value (or since the
//!   guard started, whichever is later), and is blind from that instant on.
//! - Any other loss (empty result, not a number, invalid or ambiguous query,
//!   stale sample) is blind at once: asking again soon will not help.
//! - No answer yet: the guard waits until `staleAfter` has passed since it
//!   started, then is blind as if Prometheus were unreachable.
//!
//! Across objectives the worst wins: a breach beats blindness, which beats
//! waiting, which beats healthy; among equals the first objective in the
//! spec's order. A guard with no objective (the schema requires one) vouches
//! for nothing, so it is blind.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use flashsale_api::reasons::DrillReason;
use flashsale_api::{chaosdrill::BreachWhen, chaosdrill::SloObjective};
use flashsale_kit::clock::Moment;
use flashsale_observe::{signal::Reading, signal::SignalLoss};

/// What the guard knows of one objective.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The objective as the spec gives it.
    pub objective: &'a SloObjective,
    /// The latest evaluation of its query, if any has finished.
    pub latest: Option<&'a Reading>,
    /// When a usable value last arrived, on the monotonic clock.
    pub last_usable: Option<Duration>,
}

/// The guard's judgement at one instant.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every objective has a fresh value within its threshold.
    Healthy,
    /// An objective has no answer yet, or Prometheus is unreachable, but
    /// `staleAfter` has not passed: neither healthy nor an abort.
    Waiting {
        /// The first objective waited for.
        objective: String,
    },
    /// An objective's fresh value crossed its threshold.
    Breach {
        /// The objective breached.
        objective: String,
        /// Its value.
        value: f64,
        /// The threshold it crossed.
        threshold: f64,
        /// Which way it crossed.
        breach_when: BreachWhen,
        /// When Prometheus evaluated the value.
        sampled_at: Timestamp,
    },
    /// The guard cannot tell whether an objective holds.
    Blind {
        /// The objective the guard is blind to.
        objective: String,
        /// Why, as a category.
        cause: SignalLoss,
        /// Why, as a sentence.
        detail: String,
    },
}

impl Verdict {
    /// Whether the run must be aborted: on a breach or a blind guard.
    pub fn aborts(&self) -> bool {
        matches!(self, Self::Breach { .. } | Self::Blind { .. })
    }

    /// A stable CamelCase reason for conditions and Events; a blind guard
    /// gives its loss's reason, e.g. `PrometheusUnreachable`.
    pub fn reason(&self) -> DrillReason {
        match self {
            Self::Healthy => DrillReason::Healthy,
            Self::Waiting { .. } => DrillReason::Waiting,
            Self::Breach { .. } => DrillReason::SloBreached,
            Self::Blind { cause, .. } => DrillReason::Signal(*cause),
        }
    }

    /// How bad: the worst verdict of the objectives is the guard's.
    fn severity(&self) -> u8 {
        match self {
            Self::Healthy => 0,
            Self::Waiting { .. } => 1,
            Self::Blind { .. } => 2,
            Self::Breach { .. } => 3,
        }
    }
}

/// The guard's verdict at `now` over every objective, for a guard started at
/// `started` (monotonic) with the dead-man bound `stale_after`. Silence is
/// measured on the monotonic clock, a sample's age on the wall clock (the
/// sample's timestamp is Prometheus's).
pub fn verdict(
    observed: &[Observed<'_>],
    started: Duration,
    stale_after: SignedDuration,
    now: Moment,
) -> Verdict {
    let mut worst: Option<Verdict> = None;
    for one in observed {
        let verdict = judge(one, started, stale_after, now);
        // Strictly worse only: among equals the first objective stays.
        if worst
            .as_ref()
            .is_none_or(|w| verdict.severity() > w.severity())
        {
            worst = Some(verdict);
        }
    }
    worst.unwrap_or_else(|| Verdict::Blind {
        objective: String::new(),
        cause: SignalLoss::EmptyResult,
        detail: "the guard has no objective to vouch for the run".to_owned(),
    })
}

/// The verdict on one objective.
fn judge(
    one: &Observed<'_>,
    started: Duration,
    stale_after: SignedDuration,
    now: Moment,
) -> Verdict {
    let objective = one.objective;
    let name = || objective.name.clone();
    let blind = |cause, detail| Verdict::Blind {
        objective: name(),
        cause,
        detail,
    };
    // The dead-man clock runs from the last evidence, or from the start:
    // before it started the guard was not asked to see anything.
    let since = one.last_usable.map_or(started, |at| at.max(started));
    let silent =
        SignedDuration::try_from(now.mono.saturating_sub(since)).unwrap_or(SignedDuration::MAX);
    match one.latest {
        None if silent < stale_after => Verdict::Waiting { objective: name() },
        None => blind(
            SignalLoss::PrometheusUnreachable,
            format!(
                "no answer from Prometheus for {} since the guard started (staleAfter {})",
                span(silent),
                span(stale_after)
            ),
        ),
        Some(Reading::Lost(loss)) if loss.cause == SignalLoss::PrometheusUnreachable => {
            if silent < stale_after {
                Verdict::Waiting { objective: name() }
            } else {
                blind(
                    loss.cause,
                    format!(
                        "{}; no usable value for {} (staleAfter {})",
                        loss.detail,
                        span(silent),
                        span(stale_after)
                    ),
                )
            }
        }
        Some(Reading::Lost(loss)) => blind(loss.cause, loss.detail.clone()),
        Some(Reading::Value(sample)) => {
            let age = now.wall.duration_since(sample.at);
            if age > stale_after {
                return blind(
                    SignalLoss::StaleSample,
                    format!(
                        "the latest sample is from {}, {} old, older than staleAfter {}",
                        sample.at,
                        span(age),
                        span(stale_after)
                    ),
                );
            }
            // A NaN would compare as within every threshold: fail closed.
            if !sample.value.is_finite() {
                return blind(
                    SignalLoss::NotANumber,
                    format!("the query's value is {}, not a number", sample.value),
                );
            }
            if objective.holds(sample.value) {
                Verdict::Healthy
            } else {
                Verdict::Breach {
                    objective: name(),
                    value: sample.value,
                    threshold: objective.threshold,
                    breach_when: objective.breach_when,
                    sampled_at: sample.at,
                }
            }
        }
    }
}

/// When the current healthy streak started: kept while healthy, `now` on the
/// first healthy verdict, none once the guard is anything but healthy.
pub fn steady_since(
    previous: Option<Duration>,
    verdict: &Verdict,
    now: Duration,
) -> Option<Duration> {
    match verdict {
        Verdict::Healthy => Some(previous.unwrap_or(now)),
        _ => None,
    }
}

/// Whether a healthy streak started at `since` has lasted the steady-state
/// `period` at `now` (exactly `period` counts); both on the monotonic clock.
pub fn held_for(since: Option<Duration>, period: Duration, now: Duration) -> bool {
    since.is_some_and(|since| now.checked_sub(since).is_some_and(|held| held >= period))
}

/// A duration for a message (0 if negative, as after a clock step back).
fn span(duration: SignedDuration) -> flashsale_api::Duration {
    flashsale_api::Duration(std::time::Duration::try_from(duration).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_observe::{signal::Loss, signal::Sample};

    /// `millis` after 2026-11-11T00:00:00Z.
    fn t(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(1_794_355_200_000 + millis)
            .unwrap_or_else(|err| panic!("bad time {millis}: {err}"))
    }

    /// `millis` on the monotonic clock.
    fn m(millis: i64) -> Duration {
        Duration::from_millis(u64::try_from(millis).unwrap_or_default())
    }

    /// `millis` on both clocks, which agree here.
    fn at(millis: i64) -> Moment {
        Moment {
            wall: t(millis),
            mono: m(millis),
        }
    }

    /// The guard starts at 0 with a 2 s dead-man bound.
    const STARTED: i64 = 0;
    const STALE_AFTER: SignedDuration = SignedDuration::from_secs(2);

    fn objective(name: &str, threshold: f64, breach_when: BreachWhen) -> SloObjective {
        SloObjective {
            name: name.to_owned(),
            query: format!("{name}_ratio"),
            threshold,
            breach_when,
        }
    }

    fn value(value: f64, at: i64) -> Reading {
        Reading::Value(Sample { value, at: t(at) })
    }

    fn lost(cause: SignalLoss) -> Reading {
        Reading::Lost(Loss {
            cause,
            detail: format!("{cause:?} detail"),
        })
    }

    /// What one objective has seen: its latest reading and last usable time.
    #[derive(Debug, Clone)]
    struct Seen(Option<Reading>, Option<i64>);

    fn judge_all(objectives: &[(SloObjective, Seen)], now: i64) -> Verdict {
        let observed: Vec<Observed<'_>> = objectives
            .iter()
            .map(|(objective, Seen(latest, last_usable))| Observed {
                objective,
                latest: latest.as_ref(),
                last_usable: last_usable.map(m),
            })
            .collect();
        verdict(&observed, m(STARTED), STALE_AFTER, at(now))
    }

    fn judge_one(objective: SloObjective, seen: Seen, now: i64) -> Verdict {
        judge_all(&[(objective, seen)], now)
    }

    fn blind(name: &str, cause: SignalLoss) -> (String, SignalLoss) {
        (name.to_owned(), cause)
    }

    fn blindness(verdict: &Verdict) -> Option<(String, SignalLoss)> {
        match verdict {
            Verdict::Blind {
                objective, cause, ..
            } => Some((objective.clone(), *cause)),
            _ => None,
        }
    }

    fn waiting(name: &str) -> Verdict {
        Verdict::Waiting {
            objective: name.to_owned(),
        }
    }

    fn breach(name: &str, value: f64, threshold: f64, breach_when: BreachWhen, at: i64) -> Verdict {
        Verdict::Breach {
            objective: name.to_owned(),
            value,
            threshold,
            breach_when,
            sampled_at: t(at),
        }
    }

    use BreachWhen::{Above, Below};

    #[test]
    fn a_fresh_value_breaches_strictly_past_its_threshold() {
        let cases = [
            // (threshold, direction, value, breached)
            (0.05, Above, 0.04, false),
            (0.05, Above, 0.05, false),
            (0.05, Above, 0.050_000_1, true),
            (0.05, Above, -1.0, false),
            (0.99, Below, 0.995, false),
            (0.99, Below, 0.99, false),
            (0.99, Below, 0.989_999, true),
            (0.99, Below, 1e9, false),
            (0.0, Above, 0.0, false),
            (0.0, Above, f64::MIN_POSITIVE, true),
            (0.0, Below, -0.0, false),
        ];
        for (threshold, breach_when, reading, breached) in cases {
            let got = judge_one(
                objective("error-rate", threshold, breach_when),
                Seen(Some(value(reading, 900)), Some(900)),
                1000,
            );
            let want = if breached {
                breach("error-rate", reading, threshold, breach_when, 900)
            } else {
                Verdict::Healthy
            };
            assert_eq!(got, want, "{reading} vs {breach_when:?} {threshold}");
        }
    }

    #[test]
    fn a_value_older_than_stale_after_is_blind() {
        let slo = || objective("p99", 0.3, Above);
        // Sampled at 1 s: fresh through 3 s exactly, stale 1 ms later.
        let fresh = judge_one(slo(), Seen(Some(value(0.1, 1000)), Some(1000)), 3000);
        assert_eq!(fresh, Verdict::Healthy);
        let stale = judge_one(slo(), Seen(Some(value(0.1, 1000)), Some(1000)), 3001);
        assert_eq!(
            blindness(&stale),
            Some(blind("p99", SignalLoss::StaleSample))
        );
        let Verdict::Blind { detail, .. } = stale else {
            panic!("not blind: {stale:?}");
        };
        assert_eq!(
            detail,
            "the latest sample is from 2026-11-11T00:00:01Z, 2s1ms old, older than staleAfter 2s"
        );
        // Stale beats breached: a stale value says nothing about now.
        let old_breach = judge_one(slo(), Seen(Some(value(9.0, 0)), Some(0)), 2500);
        assert_eq!(
            blindness(&old_breach),
            Some(blind("p99", SignalLoss::StaleSample))
        );
        // A sample stamped ahead of our clock is fresh.
        let ahead = judge_one(slo(), Seen(Some(value(0.1, 5000)), Some(5000)), 4000);
        assert_eq!(ahead, Verdict::Healthy);
    }

    #[test]
    fn a_value_that_is_not_a_number_is_blind() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for breach_when in [Above, Below] {
                let got = judge_one(
                    objective("error-rate", 0.05, breach_when),
                    Seen(Some(value(bad, 1000)), Some(1000)),
                    1000,
                );
                assert_eq!(
                    blindness(&got),
                    Some(blind("error-rate", SignalLoss::NotANumber)),
                    "{bad} {breach_when:?}"
                );
            }
        }
        // The reader's own NaN loss is blind at once too.
        let got = judge_one(
            objective("error-rate", 0.05, Above),
            Seen(Some(lost(SignalLoss::NotANumber)), Some(900)),
            1000,
        );
        assert_eq!(
            blindness(&got),
            Some(blind("error-rate", SignalLoss::NotANumber))
        );
    }

    #[test]
    fn a_threshold_that_is_not_a_number_breaches() {
        for breach_when in [Above, Below] {
            let got = judge_one(
                objective("error-rate", f64::NAN, breach_when),
                Seen(Some(value(0.0, 1000)), Some(1000)),
                1000,
            );
            assert_eq!(got.reason().as_str(), "SloBreached", "{breach_when:?}");
        }
    }

    #[test]
    fn losses_other_than_unreachable_are_blind_at_once() {
        for cause in [
            SignalLoss::EmptyResult,
            SignalLoss::NotANumber,
            SignalLoss::InvalidQuery,
            SignalLoss::AmbiguousResult,
            SignalLoss::StaleSample,
        ] {
            // Even right at the start, with a usable value a moment ago.
            for (now, last_usable) in [(0, None), (1, Some(0)), (10_000, Some(9_999))] {
                let got = judge_one(
                    objective("error-rate", 0.05, Above),
                    Seen(Some(lost(cause)), last_usable),
                    now,
                );
                assert_eq!(
                    got,
                    Verdict::Blind {
                        objective: "error-rate".to_owned(),
                        cause,
                        detail: format!("{cause:?} detail"),
                    },
                    "at {now} after {last_usable:?}"
                );
            }
        }
    }

    #[test]
    fn unreachable_waits_until_stale_after_since_the_last_usable_value() {
        let slo = || objective("error-rate", 0.05, Above);
        let unreachable = || Some(lost(SignalLoss::PrometheusUnreachable));
        let cases = [
            // (last usable, now, blind)
            // Never a value: the clock runs from the start at 0.
            (None, 0, false),
            (None, 1999, false),
            (None, 2000, true),
            // A value at 5 s: blind from 7 s exactly.
            (Some(5000), 6999, false),
            (Some(5000), 7000, true),
            (Some(5000), 60_000, true),
            // A value from before the start: the clock runs from the start.
            (Some(-10_000), 1999, false),
            (Some(-10_000), 2000, true),
        ];
        for (last_usable, now, is_blind) in cases {
            let got = judge_one(slo(), Seen(unreachable(), last_usable), now);
            if is_blind {
                assert_eq!(
                    blindness(&got),
                    Some(blind("error-rate", SignalLoss::PrometheusUnreachable)),
                    "{last_usable:?} at {now}"
                );
                assert_eq!(got.reason().as_str(), "PrometheusUnreachable");
            } else {
                assert_eq!(got, waiting("error-rate"), "{last_usable:?} at {now}");
            }
        }
        let got = judge_one(slo(), Seen(unreachable(), Some(5000)), 7500);
        let Verdict::Blind { detail, .. } = got else {
            panic!("not blind: {got:?}");
        };
        assert_eq!(
            detail,
            "PrometheusUnreachable detail; no usable value for 2s500ms (staleAfter 2s)"
        );
    }

    #[test]
    fn no_answer_yet_waits_then_is_blind() {
        let slo = || objective("error-rate", 0.05, Above);
        assert_eq!(judge_one(slo(), Seen(None, None), 0), waiting("error-rate"));
        assert_eq!(
            judge_one(slo(), Seen(None, None), 1999),
            waiting("error-rate")
        );
        let got = judge_one(slo(), Seen(None, None), 2000);
        assert_eq!(
            got,
            Verdict::Blind {
                objective: "error-rate".to_owned(),
                cause: SignalLoss::PrometheusUnreachable,
                detail: "no answer from Prometheus for 2s since the guard started \
                         (staleAfter 2s)"
                    .to_owned(),
            }
        );
        assert!(got.aborts());
    }

    #[test]
    fn the_worst_objective_decides_and_the_first_among_equals() {
        let a = || objective("a", 0.05, Above);
        let b = || objective("b", 0.9, Below);
        let ok_a = || Seen(Some(value(0.01, 900)), Some(900));
        let ok_b = || Seen(Some(value(0.95, 900)), Some(900));
        let breached_a = || Seen(Some(value(0.5, 900)), Some(900));
        let breached_b = || Seen(Some(value(0.5, 900)), Some(900));
        let empty = || Seen(Some(lost(SignalLoss::EmptyResult)), Some(500));
        let pending = || Seen(None, None);
        let cases = [
            (vec![(a(), ok_a()), (b(), ok_b())], "Healthy", ""),
            (vec![(a(), ok_a()), (b(), pending())], "Waiting", "b"),
            (vec![(a(), pending()), (b(), pending())], "Waiting", "a"),
            (vec![(a(), pending()), (b(), empty())], "EmptyResult", "b"),
            (vec![(a(), empty()), (b(), empty())], "EmptyResult", "a"),
            // One breaching, one blind: the breach, in either order.
            (
                vec![(a(), breached_a()), (b(), empty())],
                "SloBreached",
                "a",
            ),
            (
                vec![(a(), empty()), (b(), breached_b())],
                "SloBreached",
                "b",
            ),
            (
                vec![(a(), breached_a()), (b(), breached_b())],
                "SloBreached",
                "a",
            ),
            (
                vec![(a(), pending()), (b(), breached_b())],
                "SloBreached",
                "b",
            ),
        ];
        for (objectives, reason, name) in cases {
            let got = judge_all(&objectives, 1000);
            let objective = match &got {
                Verdict::Healthy => "",
                Verdict::Waiting { objective }
                | Verdict::Breach { objective, .. }
                | Verdict::Blind { objective, .. } => objective,
            };
            assert_eq!(
                (got.reason().as_str(), objective),
                (reason, name),
                "{objectives:?}"
            );
        }
    }

    #[test]
    fn a_guard_with_no_objective_is_blind() {
        let got = judge_all(&[], 0);
        assert_eq!(blindness(&got), Some(blind("", SignalLoss::EmptyResult)));
        assert!(got.aborts());
    }

    #[test]
    fn only_a_breach_or_blindness_aborts() {
        let cases = [
            (Verdict::Healthy, false, "Healthy"),
            (waiting("a"), false, "Waiting"),
            (breach("a", 1.0, 0.5, Above, 0), true, "SloBreached"),
            (
                Verdict::Blind {
                    objective: "a".to_owned(),
                    cause: SignalLoss::StaleSample,
                    detail: String::new(),
                },
                true,
                "StaleSample",
            ),
        ];
        for (verdict, aborts, reason) in cases {
            assert_eq!(
                (verdict.aborts(), verdict.reason().as_str()),
                (aborts, reason)
            );
        }
    }

    #[test]
    fn the_steady_state_runs_while_healthy_and_restarts_after() {
        let healthy = Verdict::Healthy;
        let cases = [
            // (previous, verdict, since)
            (None, &healthy, Some(m(5000))),
            (Some(m(1000)), &healthy, Some(m(1000))),
            (Some(m(1000)), &waiting("a"), None),
            (None, &waiting("a"), None),
            (Some(m(1000)), &breach("a", 1.0, 0.5, Above, 0), None),
        ];
        for (previous, verdict, since) in cases {
            assert_eq!(
                steady_since(previous, verdict, m(5000)),
                since,
                "{verdict:?}"
            );
        }
        let period = Duration::from_secs(60);
        let held = [
            (None, 1_000_000, false),
            (Some(0), 59_999, false),
            (Some(0), 60_000, true),
            (Some(0), 61_000, true),
            // A streak that starts later than now is not held.
            (Some(10_000), 0, false),
        ];
        for (since, now, want) in held {
            assert_eq!(
                held_for(since.map(m), period, m(now)),
                want,
                "{since:?} {now}"
            );
        }
        assert!(held_for(Some(m(0)), Duration::ZERO, m(0)));
    }

    #[test]
    fn a_run_of_evaluations_holds_then_aborts() {
        // A blip of unreachable restarts the steady state; a breach ends it.
        let slo = objective("error-rate", 0.05, Above);
        let period = Duration::from_millis(1500);
        let steps = [
            // (now, latest, last usable, reason, steady since, held)
            (0, Some(value(0.01, 0)), Some(0), "Healthy", Some(0), false),
            (
                1000,
                Some(lost(SignalLoss::PrometheusUnreachable)),
                Some(0),
                "Waiting",
                None,
                false,
            ),
            (
                1500,
                Some(value(0.01, 1500)),
                Some(1500),
                "Healthy",
                Some(1500),
                false,
            ),
            (
                2999,
                Some(value(0.01, 2999)),
                Some(2999),
                "Healthy",
                Some(1500),
                false,
            ),
            (
                3000,
                Some(value(0.01, 3000)),
                Some(3000),
                "Healthy",
                Some(1500),
                true,
            ),
            (
                3500,
                Some(value(0.06, 3500)),
                Some(3000),
                "SloBreached",
                None,
                false,
            ),
        ];
        let mut since = None;
        for (now, latest, last_usable, reason, want_since, held) in steps {
            let got = judge_one(slo.clone(), Seen(latest, last_usable), now);
            assert_eq!(got.reason().as_str(), reason, "at {now}");
            since = steady_since(since, &got, m(now));
            assert_eq!(since, want_since.map(m), "at {now}");
            assert_eq!(held_for(since, period, m(now)), held, "at {now}");
        }
    }

    #[test]
    fn a_wall_clock_step_back_does_not_keep_a_blind_guard_waiting() {
        // Prometheus stopped answering at 1000; then the wall clock stepped
        // back an hour while the monotonic clock went on for 3 s.
        let slo = objective("error-rate", 0.05, Above);
        let lost = lost(SignalLoss::PrometheusUnreachable);
        let observed = [Observed {
            objective: &slo,
            latest: Some(&lost),
            last_usable: Some(m(1000)),
        }];
        let stepped = Moment {
            wall: t(4000 - 3_600_000),
            mono: m(4000),
        };
        let got = verdict(&observed, m(STARTED), STALE_AFTER, stepped);
        assert_eq!(got.reason().as_str(), "PrometheusUnreachable", "{got:?}");
    }
}
