//! The faults the benchmark stops, each as a run's experiment names it, and
//! how its effect is seen from the target pod rather than read from Chaos
//! Mesh's status.

use std::{net::SocketAddr, time::Duration};

use clap::ValueEnum;
use flashsale_api::{ChaosDrill, children::OPS_PORT_NUMBER};
use flashsale_controller_drill::chaos;
use flashsale_e2e::inside;
use jiff::{SignedDuration, Timestamp};
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// The drill label of the benchmark's experiments.
pub const DRILL: &str = "bench-faults";

/// The stress helpers chaos-daemon starts in the target's cgroups.
const STRESSORS: [&str; 2] = ["stress-ng", "memStress"];

/// How long one connect across a partition may take before it counts as
/// cut: a connect between two pods of the node takes well under a
/// millisecond, so this bounds how late the partition's end is seen.
const CONNECT: Duration = Duration::from_millis(25);

/// The clock offset of the time fault: behind, so that the gateway's
/// `Date` header (cached by the second until its clock passes the next
/// second) stands still while injected and is fresh the moment the clock
/// is back.
const OFFSET: SignedDuration = SignedDuration::from_secs(-120);

/// One fault kind, as a ChaosDrill experiment on one gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// PodChaos `pod-failure`: the container's image swapped for pause.
    PodFailure,
    /// PodChaos `container-kill`: one-shot, nothing to undo.
    ContainerKill,
    /// NetworkChaos `delay` 150 ms ± 20 ms (needs netem in the kernel).
    Delay,
    /// NetworkChaos `partition` from the sale's inventory.
    Partition,
    /// StressChaos: one CPU worker at 30 % and 64 MB of memory.
    Stress,
    /// TimeChaos: the wall clock two minutes behind.
    Time,
}

/// What a probe of the target saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The fault acts on the target.
    Active,
    /// The target is as before the fault.
    Gone,
    /// Neither yet (a clock between the two bounds).
    Unsure,
}

/// Where a probe looks: the target pod's IP, its gateway's host process,
/// and the inventory pod the partition cuts it off from.
#[derive(Debug, Clone)]
pub struct Target {
    /// The gateway pod's IP.
    pub ip: String,
    /// The gateway container's process on the host.
    pub pid: u32,
    /// The inventory pod's serving address.
    pub inventory: SocketAddr,
}

impl Fault {
    /// The kind's name as the table prints it.
    pub fn label(self) -> &'static str {
        match self {
            Self::PodFailure => "pod-failure",
            Self::ContainerKill => "container-kill",
            Self::Delay => "delay",
            Self::Partition => "partition",
            Self::Stress => "stress",
            Self::Time => "time",
        }
    }

    /// The experiment in a ChaosDrill's spec, lasting ten minutes unless
    /// stopped.
    fn experiment(self) -> Value {
        let fault = match self {
            Self::PodFailure => json!({"podChaos": {"action": "pod-failure"}}),
            Self::ContainerKill => json!({"podChaos": {"action": "container-kill"}}),
            Self::Delay => json!({"networkChaos": {
                "action": "delay", "latency": "150ms", "jitter": "20ms"}}),
            Self::Partition => {
                json!({"networkChaos": {"action": "partition", "to": "inventory"}})
            }
            Self::Stress => json!({"stressChaos": {
                "cpuWorkers": 1, "cpuLoadPercent": 30, "memoryWorkers": 1, "memorySize": "64MB"}}),
            Self::Time => json!({"timeChaos": {"offset": format!("{}s", OFFSET.as_secs())}}),
        };
        let mut experiment = json!({"name": "fault", "target": "gateway", "duration": "10m"});
        if let (Some(into), Some(from)) = (experiment.as_object_mut(), fault.as_object()) {
            into.extend(from.clone());
        }
        experiment
    }

    /// The Chaos Mesh object a run `run` of a drill on `sale` would create
    /// for this fault on `pod`, built by the operator's own code, without
    /// the owner (a run's StatusCheck) that would have the garbage
    /// collector remove it.
    pub fn object(
        self,
        namespace: &str,
        sale: &str,
        run: &str,
        pod: &str,
    ) -> anyhow::Result<(chaos::Kind, DynamicObject)> {
        let drill: ChaosDrill = serde_json::from_value(json!({
            "apiVersion": "flashsale.dev/v1alpha1",
            "kind": "ChaosDrill",
            "metadata": {"name": DRILL, "namespace": namespace},
            "spec": {
                "saleRef": {"name": sale},
                "schedule": {"cron": "0 0 1 1 *", "timeZone": "UTC"},
                "experiments": [self.experiment()],
                "blastRadius": {"maxPercent": 50, "maxPods": 1},
                "sloGuard": {"objectives": [{"name": "none", "query": "vector(0)",
                                             "threshold": 1, "breachWhen": "Above"}]}
            }
        }))?;
        let experiment = drill
            .spec
            .experiments
            .first()
            .ok_or_else(|| anyhow::anyhow!("no experiment"))?;
        let mut value = chaos::experiment(&drill, run, experiment, &[pod.to_owned()], ("", ""));
        if let Some(metadata) = value["metadata"].as_object_mut() {
            metadata.remove("ownerReferences");
        }
        Ok((chaos::Kind::of(experiment), chaos::dynamic(value)?))
    }

    /// Whether the end of this fault is timed from the pod. A killed
    /// container is restarted by the kubelet whatever Chaos Mesh does; a
    /// clock's end is not: under a TimeChaos some of the gateway's answers
    /// carry the real time (the `Date` header is rendered by whichever
    /// worker serves the request), so a fresh header does not mean the
    /// fault ended, while a stale one still shows it was injected.
    pub fn end_is_seen(self) -> bool {
        !matches!(self, Self::ContainerKill | Self::Time)
    }

    /// What a look at `target` sees of this fault now. A killed container
    /// is seen by its process being gone.
    pub async fn seen(self, target: &Target, http: &reqwest::Client) -> anyhow::Result<Seen> {
        let target = target.clone();
        let active = match self {
            Self::PodFailure => !serves(http, &target.ip).await,
            Self::Time => return clock_seen(http, &target.ip).await,
            Self::ContainerKill => !std::path::Path::new(&format!("/proc/{}", target.pid)).exists(),
            Self::Delay => {
                blocking(move || Ok(inside::qdiscs(target.pid)?.contains("netem"))).await?
            }
            Self::Partition => {
                blocking(move || {
                    Ok(!inside::connects_from(
                        target.pid,
                        target.inventory,
                        CONNECT,
                    )?)
                })
                .await?
            }
            Self::Stress => {
                blocking(move || Ok(!inside::processes_beside(target.pid, &STRESSORS)?.is_empty()))
                    .await?
            }
        };
        Ok(if active { Seen::Active } else { Seen::Gone })
    }
}

/// Runs a blocking look at the host off the async threads.
async fn blocking(
    look: impl FnOnce() -> anyhow::Result<bool> + Send + 'static,
) -> anyhow::Result<bool> {
    tokio::task::spawn_blocking(look).await?
}

/// Whether the gateway at `ip` answers its liveness probe.
async fn serves(http: &reqwest::Client, ip: &str) -> bool {
    let url = format!("http://{ip}:{OPS_PORT_NUMBER}/healthz");
    http.get(url)
        .send()
        .await
        .is_ok_and(|answer| answer.status().is_success())
}

/// The gateway's clock as its own answers show it: the `Date` header of
/// its liveness probe against this host's clock. Behind by more than 3 s:
/// active (the cached date stands still under the offset); within 1.5 s:
/// gone (the header has a second's resolution).
async fn clock_seen(http: &reqwest::Client, ip: &str) -> anyhow::Result<Seen> {
    let url = format!("http://{ip}:{OPS_PORT_NUMBER}/healthz");
    let answer = http.get(url).send().await?;
    let date = answer
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|d| d.to_str().ok())
        .ok_or_else(|| anyhow::anyhow!("the gateway's answer has no Date"))?;
    let date = jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(date)?;
    let behind = Timestamp::now().duration_since(date).as_secs_f64();
    Ok(if behind > 3.0 {
        Seen::Active
    } else if behind.abs() <= 1.5 {
        Seen::Gone
    } else {
        Seen::Unsure
    })
}
