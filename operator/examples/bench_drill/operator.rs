//! The release `flashsale-operator run` process, with the flags and the
//! interface of the tests' `Operator` (`operator/tests/common/mod.rs`), so
//! the tests' drill scene starts this one: limited to the benchmark's
//! namespace (its Lease there too), the tests' short lease timings, killed
//! by its PID when dropped. The tests' own cannot be shared: it runs the
//! test build (`CARGO_BIN_EXE_…`, which examples do not get).

use std::{
    path::PathBuf,
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use flashsale_e2e::{
    kube::{client, install_crds},
    operator::{FAST_LEASE, OperatorProcess},
};
use kube::Client;

use super::observe;

/// The binary every [`Operator`] runs, set once by `main`: the scene starts
/// operators through the tests' signature, which has no place for it.
static BINARY: OnceLock<PathBuf> = OnceLock::new();

/// How long an operator may take to lead: a lease left by a killed one
/// expires after 4 s.
const LEAD_BOUND: Duration = Duration::from_secs(30);

/// Makes every [`Operator`] run `path`.
pub fn use_binary(path: PathBuf) {
    // Set once, before any operator starts.
    let _ = BINARY.set(path);
}

/// A client of the local control plane with the CRDs installed, as the
/// tests' `setup`.
pub async fn setup() -> anyhow::Result<Client> {
    let client = client().await?;
    install_crds(&client, &flashsale_api::crds(), "flashsale-bench").await?;
    Ok(client)
}

/// One operator process.
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
    /// Starts an operator for `namespace` with `extra` flags and `env`
    /// variables (the scene's: the chart's kubeconfig).
    pub fn start_with_env(
        namespace: &str,
        identity: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let binary = BINARY
            .get()
            .context("no operator binary chosen before the first operator")?;
        let mut args = vec!["--identity", identity];
        args.extend(FAST_LEASE);
        args.extend(["--status-refresh", "2s", "--log-filter", "info"]);
        args.extend(extra);
        let process = OperatorProcess::start(binary, namespace, identity, &args, env)
            .with_context(|| format!("starting {}", binary.display()))?;
        eprintln!(
            "operator {identity}: pid {} (log {})",
            process.pid(),
            process.log.display()
        );
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

    /// Waits until it holds the lease and runs its controllers; fails at
    /// once when the process has exited.
    pub async fn until_leads(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.process.exited()? {
                anyhow::bail!(
                    "operator {} exited with {status}; see {}",
                    self.identity,
                    self.log.display()
                );
            }
            if observe::sum_samples(&self.metrics().await, "flashsale_operator_leader", "") >= 1.0 {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < LEAD_BOUND,
                "operator {} did not lead within {LEAD_BOUND:?}; see {}",
                self.identity,
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its `/metrics` text; empty while it does not answer.
    async fn metrics(&self) -> String {
        match reqwest::get(format!("http://{}/metrics", self.ops)).await {
            Ok(answer) => answer.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}
