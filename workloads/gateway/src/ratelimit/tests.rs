use std::{num::NonZeroU32, time::Duration};

use super::{
    fallback::{Fallback, Route},
    *,
};

fn policy() -> Policy {
    Policy {
        rate: NonZeroU32::MIN.saturating_add(9),
        burst: NonZeroU32::MIN.saturating_add(19),
    }
}

#[test]
fn the_window_is_the_time_to_refill_the_burst() {
    assert_eq!(policy().interval_micros(), 100_000);
    assert_eq!(policy().window(), Duration::from_secs(2));
}

#[test]
fn refused_requests_carry_retry_after_and_the_ietf_fields() {
    let decision = Decision {
        allowed: false,
        remaining: 0,
        retry_after: Duration::from_millis(40),
        reset: Duration::from_millis(1_950),
        source: Source::Redis,
    };
    let headers = rate_limit_headers(policy(), &decision);
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .and_then(|(_, v)| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        get("ratelimit-policy").as_deref(),
        Some("\"user\";q=20;w=2")
    );
    assert_eq!(get("ratelimit").as_deref(), Some("\"user\";r=0;t=2"));
    assert_eq!(get("retry-after").as_deref(), Some("1"));
}

#[test]
fn allowed_requests_have_no_retry_after() {
    let decision = Decision {
        allowed: true,
        remaining: 7,
        retry_after: Duration::ZERO,
        reset: Duration::from_millis(300),
        source: Source::Local,
    };
    let headers = rate_limit_headers(policy(), &decision);
    assert!(headers.iter().all(|(n, _)| n.as_str() != "retry-after"));
    assert!(
        headers
            .iter()
            .any(|(n, v)| n.as_str() == "ratelimit" && v == "\"user\";r=7;t=1")
    );
}

const MS: Duration = Duration::from_millis(1);

fn thresholds() -> Thresholds {
    Thresholds {
        failures: 3,
        failing_for: 20 * MS,
        hold_off: 1_000 * MS,
    }
}

/// Feeds `calls` (time in ms, succeeded) to a fallback on Redis, each call
/// routed when it starts 5 ms before it ends; returns the switches seen.
fn run(calls: &[(u64, bool)]) -> Vec<(u64, Switch)> {
    let mut fallback = Fallback::new(thresholds());
    let mut switches = Vec::new();
    for &(at, ok) in calls {
        let route = fallback.route(Duration::from_millis(at.saturating_sub(5)));
        if route == Route::Local {
            continue;
        }
        if let Some(switch) = fallback.record(Duration::from_millis(at), route, ok) {
            switches.push((at, switch));
        }
    }
    switches
}

#[test]
fn one_slow_call_or_a_short_blip_does_not_switch() {
    // One timeout among successes.
    assert_eq!(run(&[(0, true), (5, false), (6, true), (7, true)]), []);
    // A 15 ms blip failing every call of a busy replica.
    let blip: Vec<(u64, bool)> = (0..=15).map(|at| (100 + at, false)).collect();
    assert_eq!(run(&[&blip[..], &[(116, true)]].concat()), []);
    // Failures over a long time, but never three in a row.
    let spread: Vec<(u64, bool)> = (0..20).map(|i| (i * 50, i % 2 == 0)).collect();
    assert_eq!(run(&spread), []);
}

#[test]
fn failures_in_a_row_for_long_enough_switch_to_local() {
    // Sequential calls timing out every 5 ms: the fifth ends 20 ms after the first.
    let outage: Vec<(u64, bool)> = (1..=8).map(|i| (i * 5, false)).collect();
    assert_eq!(
        run(&outage),
        [(
            25,
            Switch::ToLocal {
                failures: 5,
                over: 20 * MS
            }
        )]
    );
    // A quiet replica: three failed requests seconds apart.
    assert_eq!(
        run(&[(1_000, false), (2_000, false), (3_000, false)]),
        [(
            3_000,
            Switch::ToLocal {
                failures: 3,
                over: 2_000 * MS
            }
        )]
    );
}

#[test]
fn while_local_one_probe_per_hold_off_and_the_first_success_switches_back() {
    let mut fallback = Fallback::new(thresholds());
    for at in [0, 10, 20] {
        let route = fallback.route(at * MS);
        fallback.record(at * MS, route, false);
    }
    assert_eq!(fallback.route(21 * MS), Route::Local);
    assert_eq!(fallback.route(1_019 * MS), Route::Local);
    // Asking whether Redis is in use hands out no probe.
    assert!(!fallback.on_redis());
    assert_eq!(fallback.route(1_020 * MS), Route::Probe);
    // Only one probe at a time; a failed one waits a hold-off again.
    assert_eq!(fallback.route(1_021 * MS), Route::Local);
    assert_eq!(fallback.record(1_025 * MS, Route::Probe, false), None);
    assert_eq!(fallback.route(2_024 * MS), Route::Local);
    // A probe whose request went away is followed by another one.
    assert_eq!(fallback.route(2_025 * MS), Route::Probe);
    assert_eq!(fallback.route(3_025 * MS), Route::Probe);
    // A late answer to a call made on Redis before the switch changes nothing.
    assert_eq!(fallback.record(3_026 * MS, Route::Redis, true), None);
    assert_eq!(fallback.route(3_027 * MS), Route::Local);
    assert_eq!(
        fallback.record(3_030 * MS, Route::Probe, true),
        Some(Switch::ToRedis { after: 3_010 * MS })
    );
    assert_eq!(fallback.route(3_031 * MS), Route::Redis);
    assert!(fallback.on_redis());
    // Back on Redis the count starts over.
    assert_eq!(fallback.record(3_040 * MS, Route::Redis, false), None);
    assert_eq!(fallback.record(3_070 * MS, Route::Redis, false), None);
    assert_eq!(fallback.route(3_071 * MS), Route::Redis);
}
