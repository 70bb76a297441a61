//! Reads a policy's load signal from Prometheus, bounded in time, and says
//! exactly why when there is no usable value: the decision treats every
//! failure as a lost signal, and the reason becomes the condition's reason.
//!
//! Staleness is checked twice. The query runs with Prometheus's
//! `lookback_delta` set to `staleAfter`, so an instant selector whose series
//! has no sample that recent returns nothing (Empty). And the answer's
//! timestamp must not be older than `staleAfter`: Prometheus stamps an instant
//! result with its evaluation time, so this catches a Prometheus whose clock
//! or answer lags behind ours. A range selector (`rate(x[5m])`) still sees
//! samples up to its own range back; the query's author bounds that.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use prometheus_http_query::{
    Client,
    error::{Error as QueryError, PrometheusErrorType},
    response::{Data, InstantVector, Sample as PromSample},
};

use crate::probe::causes;

pub use flashsale_api::reasons::SignalLoss;

/// One value of the signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The load ratio (finite).
    pub value: f64,
    /// When Prometheus evaluated it.
    pub at: Timestamp,
}

/// What one evaluation of the signal gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// A usable value.
    Value(Sample),
    /// No usable value, and why.
    Lost(Loss),
}

/// Why the signal has no usable value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// The category, for the condition's reason.
    pub cause: SignalLoss,
    /// A short human explanation, with Prometheus's own message if any.
    pub detail: String,
}

impl Reading {
    fn lost(cause: SignalLoss, detail: impl Into<String>) -> Self {
        Self::Lost(Loss {
            cause,
            detail: detail.into(),
        })
    }
}

/// The reader could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client for Prometheus: {0}")]
pub struct SignalError(#[source] reqwest::Error);

/// Asks Prometheus for signals; one connection pool for every policy.
#[derive(Debug, Clone)]
pub struct SignalReader {
    http: reqwest::Client,
}

impl SignalReader {
    /// A reader with its own connection pool. Requests carry no timeout of
    /// their own: each [`read`](Self::read) is bounded by its `timeout`.
    pub fn new() -> Result<Self, SignalError> {
        let http = reqwest::Client::builder().build().map_err(SignalError)?;
        Ok(Self { http })
    }

    /// Evaluates `query` as an instant query on the Prometheus at `base_url`.
    /// The whole exchange is bounded by `timeout`, which Prometheus also gets
    /// as its evaluation timeout; samples older than `stale_after` (at `now`)
    /// do not count. Never fails: a failure is a [`Reading::Lost`].
    pub async fn read(
        &self,
        base_url: &str,
        query: &str,
        timeout: Duration,
        stale_after: Duration,
        now: Timestamp,
    ) -> Reading {
        let client = match Client::from(self.http.clone(), base_url) {
            Ok(client) => client,
            Err(err) => {
                return Reading::lost(
                    SignalLoss::PrometheusUnreachable,
                    format!(
                        "{base_url:?} is not a usable Prometheus URL: {}",
                        causes(&err)
                    ),
                );
            }
        };
        // POST: a query of up to 4 KiB stays out of URL length limits.
        let ask = client
            .query(query)
            .timeout(millis(timeout))
            .query("lookback_delta", format!("{}ms", millis(stale_after)))
            .post();
        match tokio::time::timeout(timeout, ask).await {
            Err(_) => Reading::lost(
                SignalLoss::PrometheusUnreachable,
                format!(
                    "{base_url} did not answer within {}",
                    flashsale_api::Duration(timeout)
                ),
            ),
            Ok(Err(err)) => Reading::Lost(failure(base_url, &err)),
            Ok(Ok(result)) => answer(result.into_inner().0, now, stale_after),
        }
    }
}

/// Whole milliseconds, at least 1: Prometheus reads 0 as "use the default".
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis())
        .unwrap_or(i64::MAX)
        .max(1)
}

/// Why a query failed.
fn failure(base_url: &str, err: &QueryError) -> Loss {
    let (cause, detail) = match err {
        QueryError::Prometheus(err) => match err.error_type() {
            PrometheusErrorType::BadData => (
                SignalLoss::InvalidQuery,
                format!("Prometheus rejects the query: {}", err.message()),
            ),
            PrometheusErrorType::Execution => (
                SignalLoss::InvalidQuery,
                format!("Prometheus cannot evaluate the query: {}", err.message()),
            ),
            // Timeout, overload, internal: Prometheus is there but not usable.
            _ => (
                SignalLoss::PrometheusUnreachable,
                format!("{base_url} answers {}: {}", err.error_type(), err.message()),
            ),
        },
        other => (
            SignalLoss::PrometheusUnreachable,
            format!("{base_url}: {}", causes(other)),
        ),
    };
    Loss { cause, detail }
}

/// Series named in an ambiguity message; more would not help a reader.
const SERIES_SHOWN: usize = 3;

/// What a successful answer means for the signal.
fn answer(data: Data, now: Timestamp, stale_after: Duration) -> Reading {
    match data {
        Data::Scalar(sample) => sampled(sample, now, stale_after),
        Data::Vector(series) => match series.as_slice() {
            [] => Reading::lost(
                SignalLoss::EmptyResult,
                format!(
                    "the query selects no sample (none within staleAfter {})",
                    flashsale_api::Duration(stale_after)
                ),
            ),
            [one] => sampled(*one.sample(), now, stale_after),
            many => {
                let shown: Vec<String> = many.iter().take(SERIES_SHOWN).map(labels).collect();
                let more = if many.len() > SERIES_SHOWN {
                    ", …"
                } else {
                    ""
                };
                Reading::lost(
                    SignalLoss::AmbiguousResult,
                    format!(
                        "the query returns {} series ({}{more}); it must aggregate to one \
                         sample, e.g. with sum() or max()",
                        many.len(),
                        shown.join(", ")
                    ),
                )
            }
        },
        Data::Matrix(_) => Reading::lost(
            SignalLoss::InvalidQuery,
            "the query returns a range vector; it must return one instant sample, e.g. \
             with rate() around the range",
        ),
    }
}

/// One series' labels as PromQL writes them, sorted.
fn labels(series: &InstantVector) -> String {
    let mut pairs: Vec<String> = series
        .metric()
        .iter()
        .map(|(name, value)| format!("{name}={value:?}"))
        .collect();
    pairs.sort();
    format!("{{{}}}", pairs.join(", "))
}

/// One sample, if recent and a number.
fn sampled(sample: PromSample, now: Timestamp, stale_after: Duration) -> Reading {
    let value = sample.value();
    let at = SignedDuration::try_from_secs_f64(sample.timestamp())
        .ok()
        .and_then(|since_epoch| Timestamp::from_duration(since_epoch).ok());
    let Some(at) = at else {
        return Reading::lost(
            SignalLoss::StaleSample,
            format!(
                "the sample's timestamp {} is not a time",
                sample.timestamp()
            ),
        );
    };
    let age = now.duration_since(at);
    if age > SignedDuration::try_from(stale_after).unwrap_or(SignedDuration::MAX) {
        return Reading::lost(
            SignalLoss::StaleSample,
            format!(
                "the sample is from {at}, older than staleAfter {}",
                flashsale_api::Duration(stale_after)
            ),
        );
    }
    if !value.is_finite() {
        return Reading::lost(
            SignalLoss::NotANumber,
            format!("the query's value is {value}, not a load ratio"),
        );
    }
    Reading::Value(Sample { value, at })
}

#[cfg(test)]
mod tests {
    use prometheus_http_query::{error::PrometheusError, response::PromqlResult};

    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse()
            .unwrap_or_else(|err| panic!("bad time {text}: {err}"))
    }

    /// 2026-11-11T00:00:00Z, as Prometheus writes it.
    const EVALUATED: f64 = 1_794_355_200.0;

    /// The `data` of a Prometheus query answer.
    fn data(json: serde_json::Value) -> Data {
        match serde_json::from_value::<PromqlResult>(json) {
            Ok(result) => result.into_inner().0,
            Err(err) => panic!("not a query answer: {err}"),
        }
    }

    fn vector(values: &[(&str, &str)]) -> Data {
        let result: Vec<serde_json::Value> = values
            .iter()
            .map(|(exporter, value)| {
                serde_json::json!({
                    "metric": {"exporter": exporter},
                    "value": [EVALUATED, value],
                })
            })
            .collect();
        data(serde_json::json!({"resultType": "vector", "result": result}))
    }

    fn classify(data: Data) -> Reading {
        answer(data, at("2026-11-11T00:00:01Z"), Duration::from_secs(3))
    }

    fn cause(reading: &Reading) -> Option<SignalLoss> {
        match reading {
            Reading::Lost(loss) => Some(loss.cause),
            Reading::Value(_) => None,
        }
    }

    #[test]
    fn one_series_or_a_scalar_is_the_value() {
        let sample = Sample {
            value: 0.97,
            at: at("2026-11-11T00:00:00Z"),
        };
        assert_eq!(classify(vector(&[("a", "0.97")])), Reading::Value(sample));
        let scalar = data(serde_json::json!({
            "resultType": "scalar", "result": [EVALUATED, "0.97"],
        }));
        assert_eq!(classify(scalar), Reading::Value(sample));
    }

    #[test]
    fn every_unusable_answer_has_its_cause() {
        assert_eq!(cause(&classify(vector(&[]))), Some(SignalLoss::EmptyResult));
        for bad in ["NaN", "+Inf", "-Inf"] {
            let reading = classify(vector(&[("a", bad)]));
            assert_eq!(cause(&reading), Some(SignalLoss::NotANumber), "{bad}");
        }
        let two = classify(vector(&[("b", "1"), ("a", "2")]));
        let Reading::Lost(loss) = two else {
            panic!("two series read as one: {two:?}");
        };
        assert_eq!(loss.cause, SignalLoss::AmbiguousResult);
        assert!(loss.detail.contains("2 series"), "{}", loss.detail);
        assert!(loss.detail.contains(r#"{exporter="b"}"#), "{}", loss.detail);
        assert!(loss.detail.contains("sum()"), "{}", loss.detail);
        let matrix = data(serde_json::json!({
            "resultType": "matrix",
            "result": [{"metric": {}, "values": [[EVALUATED, "1"]]}],
        }));
        assert_eq!(cause(&classify(matrix)), Some(SignalLoss::InvalidQuery));
    }

    #[test]
    fn a_sample_older_than_stale_after_is_stale() {
        let data = vector(&[("a", "0.5")]);
        let fresh = answer(
            data.clone(),
            at("2026-11-11T00:00:03Z"),
            Duration::from_secs(3),
        );
        assert!(matches!(fresh, Reading::Value(_)), "{fresh:?}");
        let stale = answer(data, at("2026-11-11T00:00:03.001Z"), Duration::from_secs(3));
        let Reading::Lost(loss) = stale else {
            panic!("a stale sample was used: {stale:?}");
        };
        assert_eq!(loss.cause, SignalLoss::StaleSample);
        assert!(loss.detail.contains("staleAfter 3s"), "{}", loss.detail);
    }

    fn prometheus_error(error_type: &str, message: &str) -> QueryError {
        let json = serde_json::json!({"errorType": error_type, "error": message});
        match serde_json::from_value::<PrometheusError>(json) {
            Ok(err) => QueryError::Prometheus(err),
            Err(err) => panic!("not a Prometheus error: {err}"),
        }
    }

    #[test]
    fn prometheus_errors_tell_a_bad_query_from_an_unusable_server() {
        let parse = "1:14: parse error: unclosed left parenthesis";
        let loss = failure("http://p", &prometheus_error("bad_data", parse));
        assert_eq!(loss.cause, SignalLoss::InvalidQuery);
        assert!(loss.detail.contains(parse), "{}", loss.detail);
        let loss = failure("http://p", &prometheus_error("execution", "many-to-many"));
        assert_eq!(loss.cause, SignalLoss::InvalidQuery);
        for busy in ["timeout", "unavailable", "internal", "canceled"] {
            let loss = failure("http://p", &prometheus_error(busy, "query timed out"));
            assert_eq!(loss.cause, SignalLoss::PrometheusUnreachable, "{busy}");
            assert!(loss.detail.contains("query timed out"), "{}", loss.detail);
        }
    }

    #[test]
    fn reasons_are_stable() {
        let reasons: Vec<&str> = [
            SignalLoss::PrometheusUnreachable,
            SignalLoss::InvalidQuery,
            SignalLoss::EmptyResult,
            SignalLoss::NotANumber,
            SignalLoss::StaleSample,
            SignalLoss::AmbiguousResult,
        ]
        .iter()
        .map(|cause| cause.as_str())
        .collect();
        assert_eq!(
            reasons,
            [
                "PrometheusUnreachable",
                "InvalidQuery",
                "EmptyResult",
                "NotANumber",
                "StaleSample",
                "AmbiguousResult"
            ]
        );
    }
}
