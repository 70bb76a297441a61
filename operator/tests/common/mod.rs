//! What the operator's integration tests share: the CRDs installed once per
//! test process, an operator process of its own per test, and reading its
//! metrics.

#![allow(dead_code)] // each test binary uses a different part

pub mod chart;
pub mod drill;
pub mod exporter;
pub mod scene;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

#[allow(unused_imports)] // not every test binary creates Secrets
pub use flashsale_e2e::kube::create_secret as secret;
use flashsale_e2e::{
    kube::{client, install_crds},
    operator::{FAST_LEASE, OperatorProcess},
};
use kube::Client;

static CRDS_INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// A client of the local control plane, with the CRDs installed (once per
/// test process) and Established.
pub async fn setup() -> anyhow::Result<Client> {
    let client = client().await?;
    CRDS_INSTALLED
        .get_or_try_init(|| async {
            install_crds(&client, &flashsale_api::crds(), "flashsale-operator-tests").await
        })
        .await?;
    Ok(client)
}

/// The sale's `type_` condition as (status, reason, message), if set.
pub fn condition(sale: &flashsale_api::FlashSale, type_: &str) -> Option<(String, String, String)> {
    sale.status
        .as_ref()?
        .observed
        .get(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Lease timings short enough for tests: a standby takes over within 4 s.
pub const LEASE_DURATION: Duration = Duration::from_secs(4);

/// One `flashsale-operator run` process, limited to a test's namespace (its
/// Lease lives there too), killed by its PID when dropped.
pub struct Operator {
    process: OperatorProcess,
    /// Address of its ops endpoints.
    pub ops: String,
    /// Its identity in the Lease.
    pub identity: String,
    /// Its log file.
    pub log: PathBuf,
}

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
        let mut args = vec!["--identity", identity];
        args.extend(FAST_LEASE);
        args.extend(["--log-filter", "info,flashsale_operator=debug"]);
        if !extra.contains(&"--status-refresh") {
            args.extend(["--status-refresh", "2s"]);
        }
        args.extend(extra);
        let process = OperatorProcess::start(
            Path::new(env!("CARGO_BIN_EXE_flashsale-operator")),
            namespace,
            identity,
            &args,
            env,
        )?;
        Ok(Self {
            ops: process.ops.clone(),
            log: process.log.clone(),
            identity: identity.to_owned(),
            process,
        })
    }

    /// Kills the process at once (SIGKILL: no lease release, as in a crash).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Waits until it holds the lease and runs its controllers.
    pub async fn until_leads(&self) -> anyhow::Result<()> {
        flashsale_e2e::wait::poll_until(
            &format!("{} leads", self.identity),
            Duration::from_secs(15),
            Duration::from_millis(100),
            || async {
                let leads = self
                    .metric_sum("flashsale_operator_leader")
                    .await
                    .map_err(|e| e.to_string())?;
                (leads == 1.0)
                    .then_some(())
                    .ok_or_else(|| "not yet".to_owned())
            },
        )
        .await?;
        Ok(())
    }

    /// Waits until its ops server answers: a process just started may not
    /// listen yet.
    pub async fn until_serves(&self) -> anyhow::Result<()> {
        flashsale_e2e::wait::poll_until(
            &format!("{} serves /metrics", self.identity),
            Duration::from_secs(15),
            Duration::from_millis(100),
            || async { self.metrics().await.map_err(|e| e.to_string()) },
        )
        .await?;
        Ok(())
    }

    /// Its `/metrics` text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let url = format!("http://{}/metrics", self.ops);
        Ok(reqwest::get(&url).await?.error_for_status()?.text().await?)
    }

    /// The sum of every sample of `name` (any labels) in its metrics; 0 when
    /// absent.
    pub async fn metric_sum(&self, name: &str) -> anyhow::Result<f64> {
        Ok(sum_samples(&self.metrics().await?, name))
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

/// The sum of every sample of `name` in Prometheus text.
pub fn sum_samples(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = if let Some(labelled) = rest.strip_prefix('{') {
                labelled.split_once("} ")?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("operator {} log: {}", self.identity, self.log.display());
        }
    }
}
