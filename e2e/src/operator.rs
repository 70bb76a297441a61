//! Operator processes for tests, benchmarks and the play: `flashsale-operator
//! run` limited to one namespace (its Lease there too), its ops endpoints on
//! a free loopback port, its output in a log file, killed by its PID when
//! dropped. A [`Launcher`] holds the binary and the flags every operator of
//! a caller gets (a test build with debug logs, a release build with quiet
//! ones); each start adds its own.

use std::{
    fs::File,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::Mutex,
    time::Duration,
};

use anyhow::Context as _;
use kube::Client;

use crate::{
    kube::{client, install_crds},
    metrics::sum_samples,
};

/// Lease timings short enough for tests: a standby takes over within 4 s.
pub const FAST_LEASE: [&str; 8] = [
    "--lease-duration",
    "4s",
    "--lease-renew-deadline",
    "3s",
    "--lease-retry-period",
    "500ms",
    "--probe-timeout",
    "300ms",
];

/// How long an operator may take to lead: a lease left by a killed one
/// expires after 4 s ([`FAST_LEASE`]; 10 s for the real node's operators),
/// and a loaded machine starts processes slowly.
const LEAD_BOUND: Duration = Duration::from_secs(30);

/// How long a fresh process may take to answer on its ops port.
const SERVE_BOUND: Duration = Duration::from_secs(15);

/// Which binary operators run, and the flags each gets unless its start
/// gives the same flag.
#[derive(Debug, Clone)]
pub struct Launcher {
    binary: PathBuf,
    defaults: Vec<(String, String)>,
}

impl Launcher {
    /// Operators of `binary`, with no flags beyond those every start sets.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            defaults: Vec::new(),
        }
    }

    /// Adds flag-value pairs (`["--flag", "value", …]`, as [`FAST_LEASE`])
    /// to every operator's flags.
    pub fn with(mut self, pairs: &[&str]) -> Self {
        for pair in pairs.chunks(2) {
            if let [flag, value] = pair {
                self.defaults
                    .push(((*flag).to_owned(), (*value).to_owned()));
            }
        }
        self
    }

    /// The binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The flags of `run` for an operator of `namespace` named `identity`,
    /// serving its ops endpoints at `ops`: the namespace (its Lease there
    /// too), the defaults that `extra` does not give, then `extra`.
    pub fn flags(&self, namespace: &str, identity: &str, ops: &str, extra: &[&str]) -> Vec<String> {
        let given = |flag: &str| {
            extra.iter().any(|arg| {
                *arg == flag || arg.strip_prefix(flag).is_some_and(|v| v.starts_with('='))
            })
        };
        let mut flags: Vec<String> = [
            "--namespace",
            namespace,
            "--lease-namespace",
            namespace,
            "--ops-addr",
            ops,
            "--identity",
            identity,
        ]
        .map(str::to_owned)
        .to_vec();
        for (flag, value) in &self.defaults {
            if !given(flag) {
                flags.extend([flag.clone(), value.clone()]);
            }
        }
        flags.extend(extra.iter().map(|arg| (*arg).to_owned()));
        flags
    }

    /// Starts `binary run` for `namespace` with `extra` flags and `env`;
    /// `identity` names it in the Lease and names its log file
    /// (`<namespace>-<identity>.log` in the temporary folder).
    pub fn start(
        &self,
        namespace: &str,
        identity: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Operator> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let ops = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!("{namespace}-{identity}.log"));
        let file = File::create(&log)?;
        let child = Command::new(&self.binary)
            .arg("run")
            .args(self.flags(namespace, identity, &ops, extra))
            .envs(env.iter().copied())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        Ok(Operator {
            pid: child.id(),
            child: Mutex::new(child),
            ops,
            identity: identity.to_owned(),
            log,
        })
    }
}

/// One running operator, killed when dropped.
#[derive(Debug)]
pub struct Operator {
    child: Mutex<Child>,
    pid: u32,
    /// Address of its ops endpoints (`/healthz`, `/readyz`, `/metrics`).
    pub ops: String,
    /// Its identity in the Lease.
    pub identity: String,
    /// Its log file.
    pub log: PathBuf,
}

impl Operator {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How it exited, if it has.
    pub fn exited(&self) -> anyhow::Result<Option<ExitStatus>> {
        let mut child = self
            .child
            .lock()
            .map_err(|_| anyhow::anyhow!("the operator's process handle is poisoned"))?;
        Ok(child.try_wait()?)
    }

    /// Kills it at once (SIGKILL: no lease release, as in a crash).
    pub fn kill(&mut self) {
        if let Ok(child) = self.child.get_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its `/metrics` text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let url = format!("http://{}/metrics", self.ops);
        Ok(reqwest::get(&url).await?.error_for_status()?.text().await?)
    }

    /// The sum of every sample of `name` (any labels) in its metrics; 0 when
    /// absent.
    pub async fn metric_sum(&self, name: &str) -> anyhow::Result<f64> {
        Ok(sum_samples(&self.metrics().await?, name, ""))
    }

    /// Waits until its ops server answers: a process just started may not
    /// listen yet.
    pub async fn until_serves(&self) -> anyhow::Result<()> {
        crate::wait::poll_until(
            &format!("{} serves /metrics", self.identity),
            SERVE_BOUND,
            Duration::from_millis(100),
            || async { self.metrics().await.map_err(|e| e.to_string()) },
        )
        .await?;
        Ok(())
    }

    /// Waits until it holds the lease and runs its controllers; fails at
    /// once when the process has exited.
    pub async fn until_leads(&self) -> anyhow::Result<()> {
        crate::wait::poll_until(
            &format!("{} leads", self.identity),
            LEAD_BOUND,
            Duration::from_millis(50),
            || async {
                if let Ok(Some(status)) = self.exited() {
                    return Ok(Err(status));
                }
                match self.metric_sum("flashsale_operator_leader").await {
                    Ok(leads) if leads >= 1.0 => Ok(Ok(())),
                    Ok(_) => Err("not yet".to_owned()),
                    Err(error) => Err(error.to_string()),
                }
            },
        )
        .await?
        .map_err(|status| {
            anyhow::anyhow!(
                "operator {} exited with {status}; see {}",
                self.identity,
                self.log.display()
            )
        })
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("operator {} log: {}", self.identity, self.log.display());
        }
    }
}

static CRDS_INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// A client of the local control plane, with the operator's CRDs installed
/// (once per process) and Established.
pub async fn setup() -> anyhow::Result<Client> {
    let client = client().await?;
    CRDS_INSTALLED
        .get_or_try_init(|| async {
            install_crds(&client, &flashsale_api::crds(), "flashsale-e2e").await
        })
        .await?;
    Ok(client)
}
