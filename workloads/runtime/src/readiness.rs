//! Readiness: named checks of the dependencies a process cannot serve without.

use std::{collections::BTreeMap, future::Future, sync::Arc, time::Duration};

use futures::future::{BoxFuture, join_all};
use serde::Serialize;

/// One named dependency check. It fails with a short human-readable reason.
pub trait ReadinessCheck: Send + Sync + 'static {
    /// Runs the check once.
    fn check(&self) -> BoxFuture<'static, Result<(), String>>;
}

impl<F, Fut> ReadinessCheck for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn check(&self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(self())
    }
}

/// The checks behind `/readyz`. With no checks a process is ready as soon as
/// it serves.
#[derive(Clone)]
pub struct Readiness {
    checks: Vec<(String, Arc<dyn ReadinessCheck>)>,
    timeout: Duration,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new(Duration::from_secs(1))
    }
}

/// The outcome of running every check, as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadinessReport {
    /// `true` when every check passed.
    pub ready: bool,
    /// Check name → `"ok"` or the reason it failed.
    pub checks: BTreeMap<String, String>,
}

impl Readiness {
    /// No checks yet; each check gets `timeout` before it counts as failed,
    /// so a hung dependency cannot hang the kubelet's probe.
    pub fn new(timeout: Duration) -> Self {
        Self {
            checks: Vec::new(),
            timeout,
        }
    }

    /// Adds a named check.
    pub fn with_check(mut self, name: impl Into<String>, check: impl ReadinessCheck) -> Self {
        self.checks.push((name.into(), Arc::new(check)));
        self
    }

    /// Runs every check concurrently, each under the timeout.
    pub async fn report(&self) -> ReadinessReport {
        let timeout = self.timeout;
        let results = join_all(self.checks.iter().map(|(name, check)| {
            let fut = check.check();
            async move {
                let outcome = match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(reason)) => Err(reason),
                    Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
                };
                (name.clone(), outcome)
            }
        }))
        .await;
        let ready = results.iter().all(|(_, outcome)| outcome.is_ok());
        let checks = results
            .into_iter()
            .map(|(name, outcome)| (name, outcome.err().unwrap_or_else(|| "ok".to_owned())))
            .collect();
        ReadinessReport { ready, checks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_checks_is_ready() {
        let report = Readiness::default().report().await;
        assert!(report.ready);
        assert!(report.checks.is_empty());
    }

    #[tokio::test]
    async fn one_failing_check_makes_it_unready_and_names_the_reason() {
        let report = Readiness::default()
            .with_check("redis", || async { Ok(()) })
            .with_check("kafka", || async { Err("connection refused".to_owned()) })
            .report()
            .await;
        assert!(!report.ready);
        assert_eq!(report.checks["redis"], "ok");
        assert_eq!(report.checks["kafka"], "connection refused");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_check_fails_at_the_timeout() {
        let report = Readiness::new(Duration::from_millis(50))
            .with_check("db", std::future::pending::<Result<(), String>>)
            .report()
            .await;
        assert!(!report.ready);
        assert_eq!(report.checks["db"], "no answer within 50 ms");
    }
}
