//! The IETF rate-limit fields (draft-ietf-httpapi-ratelimit-headers) and
//! `Retry-After` for a decision.

use axum::http::{HeaderName, HeaderValue};

use super::{Decision, Policy};

/// `RateLimit-Policy` (quota and window), `RateLimit` (remaining and reset)
/// and, when refused, `Retry-After`, all in whole seconds rounded up.
pub fn rate_limit_headers(policy: Policy, decision: &Decision) -> Vec<(HeaderName, HeaderValue)> {
    let window = policy.window().as_secs_f64().ceil().max(1.0) as u64;
    let reset = decision.reset.as_secs_f64().ceil() as u64;
    let mut headers = vec![
        (
            HeaderName::from_static("ratelimit-policy"),
            HeaderValue::try_from(format!("\"user\";q={};w={window}", policy.burst))
                .unwrap_or_else(|_| HeaderValue::from_static("")),
        ),
        (
            HeaderName::from_static("ratelimit"),
            HeaderValue::try_from(format!("\"user\";r={};t={reset}", decision.remaining))
                .unwrap_or_else(|_| HeaderValue::from_static("")),
        ),
    ];
    if !decision.allowed {
        let seconds = decision.retry_after.as_secs_f64().ceil().max(1.0) as u64;
        headers.push((axum::http::header::RETRY_AFTER, HeaderValue::from(seconds)));
    }
    headers
}
