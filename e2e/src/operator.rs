//! An operator process for tests and benchmarks: `flashsale-operator run`
//! limited to one namespace (its Lease there too), its ops endpoints on a
//! free loopback port, its output in a log file, killed by its PID when
//! dropped. Callers add their own flags (lease timings, Prometheus, …).

use std::{
    fs::File,
    io,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
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

/// One running operator.
#[derive(Debug)]
pub struct OperatorProcess {
    child: Child,
    /// Address of its ops endpoints (`/healthz`, `/readyz`, `/metrics`).
    pub ops: String,
    /// Its log file, in the temporary folder.
    pub log: PathBuf,
}

impl OperatorProcess {
    /// Starts `bin run` for `namespace` with `args` and `env`; `name` tells
    /// its log file (`<namespace>-<name>.log`) from other operators'.
    pub fn start(
        bin: &Path,
        namespace: &str,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> io::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let ops = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!("{namespace}-{name}.log"));
        let file = File::create(&log)?;
        let child = Command::new(bin)
            .args([
                "run",
                "--namespace",
                namespace,
                "--lease-namespace",
                namespace,
            ])
            .args(["--ops-addr", &ops])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()?;
        Ok(Self { child, ops, log })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How it exited, if it has.
    pub fn exited(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Kills it at once (SIGKILL: no lease release, as in a crash).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
