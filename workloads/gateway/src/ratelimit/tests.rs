use std::{num::NonZeroU32, time::Duration};

use super::*;

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
