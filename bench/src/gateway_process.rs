//! The gateway as a process of its own, as a peer such as nginx runs: the
//! release binary over a funnel's sale, inventory, Redis and brokers, on a
//! free loopback port, killed when dropped. A gateway inside the benchmark's
//! process shares its runtime with the load generator; this one does not.

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::Child,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use flashsale_e2e::{
    funnel::{INVENTORY_TOKEN, JWT_SECRET},
    gateway_command::GatewayCommand,
    stack,
};

use crate::{funnel::Funnel, release_binary};

/// How long a fresh gateway may take to listen.
const LISTEN_BOUND: Duration = Duration::from_secs(30);

/// A running gateway process.
pub struct GatewayProcess {
    /// Its base URL.
    pub url: String,
    child: Child,
    dir: PathBuf,
}

impl GatewayProcess {
    /// Starts the release `gateway` binary for `funnel`'s sale and waits
    /// until it listens.
    pub async fn start(funnel: &Funnel) -> anyhow::Result<Self> {
        let bin = release_binary("gateway", None)?;
        let dir = std::env::temp_dir().join(format!("{}-gateway-process", funnel.sale));
        std::fs::create_dir_all(&dir)?;
        let write = |name: &str, bytes: &[u8]| -> anyhow::Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, bytes)?;
            Ok(path)
        };
        let config = write("config.json", &serde_json::to_vec(&funnel.config_file)?)?;
        let jwt = write("jwt-secret", JWT_SECRET)?;
        let token = write("inventory-token", INVENTORY_TOKEN.as_bytes())?;
        let listen = free_port()?;
        let command = GatewayCommand {
            bin: &bin,
            listen,
            ops: free_port()?,
            config: &config,
            jwt_secret: &jwt,
            inventory_url: &funnel.inventory.url,
            kafka: &funnel.brokers,
            log: &dir.join("gateway.log"),
        };
        let child = command
            .command()?
            // As the in-process gateway has them: its store and its topic.
            .arg(format!("--inventory-token-file={}", token.display()))
            .arg(format!("--redis-url={}", stack::redis_url()?))
            .arg(format!("--orders-topic={}", funnel.topic))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut process = Self {
            url: format!("http://{listen}"),
            child,
            dir,
        };
        process.until_listening(listen).await?;
        Ok(process)
    }

    async fn until_listening(&mut self, addr: SocketAddr) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "the gateway exited with {status}; see {}",
                    self.dir.join("gateway.log").display()
                );
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < LISTEN_BOUND,
                "the gateway does not listen after {LISTEN_BOUND:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback address free now.
fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}
