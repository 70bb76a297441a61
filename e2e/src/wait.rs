//! Waiting for a condition with a deadline: poll, never sleep blindly.

use std::{future::Future, time::Duration};

/// The condition did not hold before the deadline.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {waited:?} waiting for {what}; last observation: {last}")]
pub struct Timeout {
    /// What was waited for.
    pub what: String,
    /// How long.
    pub waited: Duration,
    /// The last thing the probe reported.
    pub last: String,
}

/// Calls `probe` every `interval` until it returns `Ok(value)` or `deadline`
/// passes. `Err(observation)` means "not yet" and is kept for the timeout
/// message, so a failing test says what it last saw. A probe that does not
/// answer is cut off at the deadline (or after one `interval`, for the last
/// look past it), so the wait ends whatever the probe does.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    deadline: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<T, Timeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = tokio::time::Instant::now();
    loop {
        let bound = deadline.saturating_sub(start.elapsed()).max(interval);
        let last = match tokio::time::timeout(bound, probe()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(observation)) => observation,
            Err(_) => format!("the probe did not answer within {bound:?}"),
        };
        if start.elapsed() >= deadline {
            return Err(Timeout {
                what: what.to_owned(),
                waited: start.elapsed(),
                last,
            });
        }
        tokio::time::sleep(interval).await;
    }
}

/// Waits up to `within` until the Redis stream `key` holds no entry (or is
/// gone): everything written to it was consumed and deleted. `conn` is any
/// async connection, to one server or a cluster.
pub async fn until_stream_empty<C>(conn: &C, key: &str, within: Duration) -> Result<(), Timeout>
where
    C: redis::aio::ConnectionLike + Clone + Send,
{
    poll_until(
        &format!("the stream {key} to be empty"),
        within,
        Duration::from_millis(10),
        || {
            let mut conn = conn.clone();
            let key = key.to_owned();
            async move {
                let left: u64 = redis::cmd("XLEN")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                match left {
                    0 => Ok(()),
                    left => Err(format!("{left} entries left")),
                }
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_first_success() {
        let mut calls = 0;
        let value = poll_until(
            "third call",
            Duration::from_secs(5),
            Duration::from_millis(10),
            || {
                calls += 1;
                let n = calls;
                async move {
                    if n >= 3 {
                        Ok(n)
                    } else {
                        Err(format!("call {n}"))
                    }
                }
            },
        )
        .await;
        assert_eq!(value.ok(), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn times_out_with_the_last_observation() {
        let err = poll_until(
            "never",
            Duration::from_millis(100),
            Duration::from_millis(10),
            || async { Err::<(), _>("still pending".to_owned()) },
        )
        .await
        .err();
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("waiting for never"), "{err}");
        assert!(err.contains("still pending"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_never_answers_ends_at_the_deadline() {
        let started = tokio::time::Instant::now();
        let err = poll_until(
            "a hung probe",
            Duration::from_secs(2),
            Duration::from_millis(10),
            std::future::pending::<Result<(), String>>,
        )
        .await
        .err();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("did not answer within 2s"), "{err}");
    }
}
