//! What the benchmark reads besides the FlashSales: /proc (memory and CPU of
//! the operator and of the stack's processes), Prometheus text from the
//! operator, the controller-manager and the scheduler, and the timestamps of
//! the objects each stage of the pipeline creates.

use std::{process::Command, time::Duration};

use flashsale_bench::Recorder;
use flashsale_e2e::metrics::sum_samples;

use jiff::Timestamp;
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{Api, Client, api::ListParams};

/// `VmRSS` or `VmHWM` of `pid` in MB, from /proc/<pid>/status.
pub fn memory_mb(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU time (user + system) `pid` has used so far, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it do not.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every usual Linux).
pub fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Open sockets of `pid` (its connections, mostly to the apiserver).
pub fn sockets(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// The apiserver's own metrics, through `kubectl get --raw` (the stack's
/// kubeconfig); `None` when kubectl is not on PATH or fails.
pub fn scrape_apiserver() -> Option<String> {
    let out = Command::new("kubectl")
        .args(["get", "--raw", "/metrics"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the apiserver answered: requests that hit its 60 s timeout (504),
/// and the IPAddress objects ClusterIP allocation created and deleted.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiserverCounters {
    pub requests: f64,
    pub timeouts_services: f64,
    pub timeouts_other: f64,
    pub ip_creates: f64,
    pub ip_deletes: f64,
}

impl ApiserverCounters {
    pub fn scrape() -> Option<Self> {
        let text = scrape_apiserver()?;
        let name = "apiserver_request_total";
        let timeouts = sum_samples(&text, name, r#"code="504""#);
        let timeouts_services = text
            .lines()
            .filter(|l| {
                l.starts_with(name)
                    && l.contains(r#"code="504""#)
                    && l.contains(r#"resource="services""#)
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .fold(0.0, |sum, v| sum + v);
        let ip = |verb: &str| {
            text.lines()
                .filter(|l| {
                    l.starts_with(name)
                        && l.contains(r#"resource="ipaddresses""#)
                        && l.contains(&format!(r#"verb="{verb}""#))
                        && (l.contains(r#"code="200""#) || l.contains(r#"code="201""#))
                })
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                .fold(0.0, |sum, v| sum + v)
        };
        Some(Self {
            requests: sum_samples(&text, name, ""),
            timeouts_services,
            timeouts_other: timeouts - timeouts_services,
            ip_creates: ip("POST"),
            ip_deletes: ip("DELETE"),
        })
    }

    pub fn since(self, before: Self) -> Self {
        Self {
            requests: self.requests - before.requests,
            timeouts_services: self.timeouts_services - before.timeouts_services,
            timeouts_other: self.timeouts_other - before.timeouts_other,
            ip_creates: self.ip_creates - before.ip_creates,
            ip_deletes: self.ip_deletes - before.ip_deletes,
        }
    }
}

/// Prometheus text of an HTTPS endpoint of the stack (self-signed, metrics
/// path allowed without credentials), through curl; `None` when unreachable.
pub fn scrape_https(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-ksS", "--max-time", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The operator's counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct OperatorCounters {
    pub reconciles: f64,
    pub reconcile_errors: f64,
    pub reconcile_seconds: f64,
    pub writes: f64,
}

impl OperatorCounters {
    pub fn parse(text: &str) -> Self {
        Self {
            reconciles: sum_samples(text, "flashsale_operator_reconcile_total", ""),
            reconcile_errors: sum_samples(
                text,
                "flashsale_operator_reconcile_total",
                r#"result="error""#,
            ),
            reconcile_seconds: sum_samples(
                text,
                "flashsale_operator_reconcile_duration_seconds_sum",
                "",
            ),
            writes: sum_samples(text, "flashsale_operator_writes_total", ""),
        }
    }

    /// Mean reconcile duration in ms.
    pub fn mean_reconcile_ms(&self) -> f64 {
        if self.reconciles > 0.0 {
            1000.0 * self.reconcile_seconds / self.reconciles
        } else {
            0.0
        }
    }
}

/// Client-side rate limiting of a Kubernetes component (client-go's
/// `rest_client_rate_limiter_duration_seconds`), plus its requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct Throttle {
    /// Seconds requests spent waiting for the rate limiter, summed.
    pub wait_seconds: f64,
    /// Requests that went through the rate limiter.
    pub requests: f64,
    /// Requests that waited more than 1 s.
    pub over_1s: f64,
}

impl Throttle {
    pub fn scrape(url: &str) -> Option<Self> {
        let text = scrape_https(url)?;
        let name = "rest_client_rate_limiter_duration_seconds";
        let requests = sum_samples(&text, &format!("{name}_count"), "");
        Some(Self {
            wait_seconds: sum_samples(&text, &format!("{name}_sum"), ""),
            requests,
            over_1s: requests - sum_samples(&text, &format!("{name}_bucket"), r#"le="1""#),
        })
    }

    pub fn since(self, before: Self) -> Self {
        Self {
            wait_seconds: self.wait_seconds - before.wait_seconds,
            requests: self.requests - before.requests,
            over_1s: self.over_1s - before.over_1s,
        }
    }
}

/// When the objects of one stage appeared, in seconds since the sales were
/// created (timestamps have 1 s resolution).
#[derive(Debug, Clone, Default)]
pub struct Stage {
    pub name: &'static str,
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub last: f64,
}

impl Stage {
    fn of(name: &'static str, since: Timestamp, times: impl Iterator<Item = Timestamp>) -> Self {
        // Timestamps have whole seconds, so one may fall before `since`:
        // it counts as at once.
        let offsets: Recorder = times
            .map(|t| Duration::try_from(t.duration_since(since)).unwrap_or_default())
            .collect();
        let at = |q: f64| offsets.quantile(q).map_or(f64::NAN, |d| d.as_secs_f64());
        Self {
            name,
            count: usize::try_from(offsets.len()).unwrap_or(usize::MAX),
            p50: at(0.5),
            p90: at(0.9),
            last: at(1.0),
        }
    }
}

/// The pipeline's stages from the objects' timestamps: Deployments (written
/// by the operator), ReplicaSets (controller-manager's deployment
/// controller), pods created (its replicaset controller), bound (scheduler)
/// and Ready (kwok).
pub async fn timeline(client: &Client, ns: &str, since: Timestamp) -> anyhow::Result<Vec<Stage>> {
    let created = |t: Option<&Time>| t.map(|t| t.0);
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
        .list_metadata(&ListParams::default())
        .await?;
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list_metadata(&ListParams::default())
        .await?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let condition = |pod: &Pod, type_: &str| {
        pod.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")?
            .last_transition_time
            .as_ref()
            .map(|t| t.0)
    };
    Ok(vec![
        Stage::of(
            "Deployment created",
            since,
            deployments
                .items
                .iter()
                .filter_map(|d| created(d.metadata.creation_timestamp.as_ref())),
        ),
        Stage::of(
            "ReplicaSet created",
            since,
            replica_sets
                .items
                .iter()
                .filter_map(|r| created(r.metadata.creation_timestamp.as_ref())),
        ),
        Stage::of(
            "Pod created",
            since,
            pods.items
                .iter()
                .filter_map(|p| created(p.metadata.creation_timestamp.as_ref())),
        ),
        Stage::of(
            "Pod scheduled",
            since,
            pods.items
                .iter()
                .filter_map(|p| condition(p, "PodScheduled")),
        ),
        Stage::of(
            "Pod Ready",
            since,
            pods.items.iter().filter_map(|p| condition(p, "Ready")),
        ),
    ])
}
