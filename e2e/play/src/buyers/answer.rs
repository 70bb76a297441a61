//! An HTTP answer reduced to what the buyers decide on.

use std::time::Duration;

use serde_json::Value;

/// Header the gateway puts on answers served in a degraded mode.
pub(crate) const DEGRADED_HEADER: &str = "x-flashsale-degraded";

/// What came back for one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    /// The `error` code of a refusal's JSON body.
    pub(crate) error: Option<String>,
    /// `Retry-After`, in whole seconds (the gateway never sends a date).
    pub(crate) retry_after: Option<Duration>,
    pub(crate) degraded: bool,
    /// The JSON body (`Null` when there is none or it is not JSON).
    pub(crate) body: Value,
}

impl Answer {
    /// An answer from its parts.
    pub(crate) fn new(status: u16, retry_after: Option<&str>, degraded: bool, body: &[u8]) -> Self {
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let error = body["error"].as_str().map(str::to_owned);
        Self {
            status,
            error,
            retry_after: retry_after
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
            degraded,
            body,
        }
    }

    /// A string field of the body.
    pub(crate) fn text(&self, field: &str) -> Option<&str> {
        self.body[field].as_str()
    }

    /// A whole-number field of the body.
    pub(crate) fn number(&self, field: &str) -> Option<u64> {
        self.body[field].as_u64()
    }

    /// What the answer was, for the ledger: the error code, else the status.
    pub(crate) fn describe(&self) -> String {
        match &self.error {
            Some(code) => format!("{} {code}", self.status),
            None => self.status.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_yield_their_code_and_retry_after() {
        let answer = Answer::new(
            503,
            Some("1"),
            false,
            br#"{"error":"overloaded","message":"m"}"#,
        );
        assert_eq!(answer.error.as_deref(), Some("overloaded"));
        assert_eq!(answer.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(answer.describe(), "503 overloaded");
        let odd = Answer::new(502, Some("Wed, 21 Oct 2015 07:28:00 GMT"), false, b"<html>");
        assert_eq!(
            (odd.error, odd.retry_after, odd.body),
            (None, None, Value::Null)
        );
    }
}
