//! The gateway processes of one measurement, each with its own ops port on
//! loopback, following the sale's switches ConfigMap; killed when dropped.
//!
//! A gateway needs little to run its switch watch and ops endpoint: its sale
//! configuration, a token secret, an inventory URL and Kafka brokers (the
//! producer connects lazily; no order is sent). Neither the watch nor
//! `/metrics` waits for readiness: both start once the process is built.

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::Child,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use flashsale_controller_degradation::propagation::GENERATION_GAUGE;
use flashsale_e2e::gateway_command::GatewayCommand;
use flashsale_observe::probe::Probe;
use futures::future::join_all;

/// What every gateway of the benchmark is started with.
pub struct Setup {
    /// The gateway binary.
    pub bin: PathBuf,
    /// The sale's namespace.
    pub namespace: String,
    /// The switches ConfigMap the gateways follow.
    pub config_map: String,
    kafka: String,
    config: PathBuf,
    secret: PathBuf,
}

impl Setup {
    /// Writes the gateways' sale configuration and token secret to files
    /// named after `namespace` in the temporary folder.
    pub fn write(
        bin: &std::path::Path,
        namespace: &str,
        sale: &str,
        kafka: &str,
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir();
        let config = dir.join(format!("{namespace}-gateway.json"));
        let secret = dir.join(format!("{namespace}-jwt"));
        let json = serde_json::json!({
            "sale": sale,
            "items": [{"sku": "PHONE", "priceMinor": 100}],
            "currency": "CNY",
        });
        std::fs::write(&config, json.to_string())?;
        std::fs::write(&secret, "0123456789abcdef0123456789abcdef")?;
        Ok(Self {
            bin: bin.to_owned(),
            namespace: namespace.to_owned(),
            config_map: format!("{sale}-degradation"),
            kafka: kafka.to_owned(),
            config,
            secret,
        })
    }
}

/// Free loopback ports below the kernel's ephemeral range: a port given
/// out for port 0, or to an outgoing connection, never comes from there, so
/// one found free stays free until its gateway binds it (choosing from the
/// ephemeral range lost a port now and then on this busy machine).
struct Ports {
    next: u16,
    end: u16,
}

impl Ports {
    fn new() -> anyhow::Result<Self> {
        let end = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse().ok())
            .unwrap_or(32768);
        // Apart from the stack's fixed ports (up to about 20300), and from
        // another run of this benchmark by its process id.
        let start = 21000 + (std::process::id() % 50) as u16 * 200;
        anyhow::ensure!(start < end, "the ephemeral port range starts below {start}");
        Ok(Self { next: start, end })
    }

    fn take(&mut self) -> anyhow::Result<SocketAddr> {
        while self.next < self.end {
            let port = self.next;
            self.next += 1;
            if let Ok(free) = TcpListener::bind(("127.0.0.1", port)) {
                return Ok(free.local_addr()?);
            }
        }
        anyhow::bail!("no free port left below {}", self.end)
    }
}

/// Running gateway processes.
pub struct Fleet {
    children: Vec<Child>,
    /// Each gateway as (name, ops address), as the operator's probe takes them.
    pub replicas: Vec<(String, SocketAddr)>,
    logs: Vec<PathBuf>,
}

impl Fleet {
    /// Starts `count` gateways.
    pub fn start(setup: &Setup, count: usize) -> anyhow::Result<Self> {
        let mut ports = Ports::new()?;
        let mut fleet = Self {
            children: Vec::with_capacity(count),
            replicas: Vec::with_capacity(count),
            logs: Vec::with_capacity(count),
        };
        let kubeconfig = flashsale_e2e::stack::kubeconfig()?;
        for index in 0..count {
            let (listen, ops) = (ports.take()?, ports.take()?);
            let name = format!("gateway-{index}");
            let log = std::env::temp_dir().join(format!("{}-{name}.log", setup.namespace));
            let command = GatewayCommand {
                bin: &setup.bin,
                listen,
                ops,
                config: &setup.config,
                jwt_secret: &setup.secret,
                inventory_url: "http://127.0.0.1:9",
                kafka: &setup.kafka,
                log: &log,
            };
            let child = command
                .command()?
                .env("KUBECONFIG", &kubeconfig)
                .arg(format!("--degradation-config-map={}", setup.config_map))
                .arg(format!("--namespace={}", setup.namespace))
                .spawn()
                .with_context(|| format!("starting {}", setup.bin.display()))?;
            fleet.children.push(child);
            fleet.replicas.push((name, ops));
            fleet.logs.push(log);
        }
        Ok(fleet)
    }

    /// The processes' ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Waits until every gateway's `/metrics` reports a generation (0 until
    /// its watch has read the ConfigMap); fails when one exits.
    pub async fn await_up(&mut self, probe: &Probe, bound: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            for (child, log) in self.children.iter_mut().zip(&self.logs) {
                if let Some(status) = child.try_wait()? {
                    anyhow::bail!("a gateway exited with {status}; see {}", log.display());
                }
            }
            let readings = probe.replica_gauges(&self.replicas, GENERATION_GAUGE).await;
            let waiting: Vec<String> = readings
                .into_iter()
                .filter_map(|(name, reading)| match reading {
                    Ok(Some(_)) => None,
                    Ok(None) => Some(format!("{name}: no {GENERATION_GAUGE}")),
                    Err(err) => Some(format!("{name}: {err}")),
                })
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < bound,
                "{} of {} gateways not up after {bound:?}, e.g. {}",
                waiting.len(),
                self.replicas.len(),
                waiting.first().map_or("", String::as_str),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How long one ask of every gateway takes at once, each on its own as
    /// while a change travels: the resolution of the measurement.
    pub async fn poll_once(&self, probe: &Probe) -> Duration {
        let started = Instant::now();
        join_all(
            self.replicas.iter().map(|replica| {
                probe.replica_gauges(std::slice::from_ref(replica), GENERATION_GAUGE)
            }),
        )
        .await;
        started.elapsed()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}
