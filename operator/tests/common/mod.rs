//! What the operator's integration tests share: the test kit's operator
//! process started as the tests start it (the test build, short lease
//! timings, debug logs), reading its metrics, and the worlds of the
//! controllers' tests.

#![allow(dead_code)] // each test binary uses a different part

pub mod drill;
pub mod real_node;
pub mod scene;

use std::{
    ops::{Deref, DerefMut},
    time::Duration,
};

#[allow(unused_imports)] // not every test binary creates Secrets
pub use flashsale_e2e::kube::create_secret as secret;
use flashsale_e2e::operator::{FAST_LEASE, Launcher};
#[allow(unused_imports)] // each test binary uses a different part
pub use flashsale_e2e::{chart, exporter, operator::setup, sales::condition};

/// Lease timings short enough for tests: a standby takes over within 4 s.
pub const LEASE_DURATION: Duration = Duration::from_secs(4);

/// How the tests start operators: the test build, the short lease
/// timings, the operator's own logs at debug, and a status refresh every
/// 2 s unless a test sets its own.
pub fn launcher() -> Launcher {
    Launcher::new(env!("CARGO_BIN_EXE_flashsale-operator"))
        .with(&FAST_LEASE)
        .with(&["--log-filter", "info,flashsale_operator=debug"])
        .with(&["--status-refresh", "2s"])
}

/// One `flashsale-operator run` process of the tests, limited to a test's
/// namespace (its Lease there too), killed by its PID when dropped: the
/// test kit's, started by [`launcher`].
pub struct Operator(flashsale_e2e::operator::Operator);

impl Operator {
    /// Starts an operator for `namespace` with `extra` flags.
    pub fn start(namespace: &str, identity: &str, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_env(namespace, identity, extra, &[])
    }

    /// Starts an operator for `namespace` with `extra` flags and `env`
    /// variables.
    pub fn start_with_env(
        namespace: &str,
        identity: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Ok(Self(launcher().start(namespace, identity, extra, env)?))
    }
}

impl Deref for Operator {
    type Target = flashsale_e2e::operator::Operator;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Operator {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// The moment a component stopped answering, on both clocks.
pub type Silence = (tokio::time::Instant, jiff::Timestamp);

/// Asks `prometheus` a query every 10 ms until it stops answering, and
/// resolves to the first instant it did not (connection refused, an error
/// status or no answer within a second): the moment an outage began for
/// the readers, whatever the stop itself took. Gives up after a minute.
pub fn first_silence(prometheus: &str) -> tokio::task::JoinHandle<anyhow::Result<Silence>> {
    let url = format!(
        "{}/api/v1/query?query=vector(1)",
        prometheus.trim_end_matches('/')
    );
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < until {
            let asked = (tokio::time::Instant::now(), jiff::Timestamp::now());
            match client.get(&url).send().await {
                Ok(answer) if answer.status().is_success() => {}
                _ => return Ok(asked),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        anyhow::bail!("Prometheus kept answering for a minute")
    })
}

/// The sum of every sample of `name` (any labels) in Prometheus text.
pub fn sum_samples(text: &str, name: &str) -> f64 {
    flashsale_e2e::metrics::sum_samples(text, name, "")
}
