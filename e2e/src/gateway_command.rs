//! The command line of a gateway started as a process of its own (by a
//! benchmark, beside its load generator): the flags every such gateway
//! needs, and nothing from the caller's environment.

use std::{
    fs::File,
    net::SocketAddr,
    path::Path,
    process::{Command, Stdio},
};

/// What every gateway process is given; callers add their own flags to
/// [`GatewayCommand::command`].
#[derive(Debug, Clone, Copy)]
pub struct GatewayCommand<'a> {
    /// The `gateway` binary.
    pub bin: &'a Path,
    /// Where it serves buyers.
    pub listen: SocketAddr,
    /// Where it serves `/metrics` and its probes.
    pub ops: SocketAddr,
    /// The sale's configuration file.
    pub config: &'a Path,
    /// The file holding the buyers' token secret.
    pub jwt_secret: &'a Path,
    /// The inventory's base URL.
    pub inventory_url: &'a str,
    /// Kafka bootstrap servers (the producer connects on the first send).
    pub kafka: &'a str,
    /// Where its output goes, created anew.
    pub log: &'a Path,
}

impl GatewayCommand<'_> {
    /// The command, warnings logged. Its environment is cleared: the
    /// stack's variables (`REDIS_URL` and others) would add connections the
    /// caller did not ask for.
    pub fn command(&self) -> std::io::Result<Command> {
        let log = File::create(self.log)?;
        let mut command = Command::new(self.bin);
        command
            .env_clear()
            .arg(format!("--listen={}", self.listen))
            .arg(format!("--ops-addr={}", self.ops))
            .arg(format!("--config={}", self.config.display()))
            .arg(format!(
                "--jwt-hs256-secret-file={}",
                self.jwt_secret.display()
            ))
            .arg(format!("--inventory-url={}", self.inventory_url))
            .arg(format!("--kafka-brokers={}", self.kafka))
            .arg("--log-filter=warn")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        Ok(command)
    }
}
