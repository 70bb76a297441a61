//! Whether an ended sale's order-writer has drained: a pure verdict over what
//! each ready replica reported.
//!
//! Every replica's `order_writer_consumer_lag` is the lag of the whole
//! consumer group over every partition of the topic, so the replicas report
//! the same quantity seen at slightly different times: the verdict takes the
//! largest (a sum would count the backlog once per replica). The gauge is
//! absent until a replica's first measurement succeeded, and absent is not
//! zero: the sale counts as drained only when every ready replica reported a
//! measured 0, and a replica that has not measured (or could not be asked) is
//! named in the condition message.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::status::Drain;

/// What one order-writer replica said about the group's lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LagReading {
    /// It measured this lag.
    Measured(i64),
    /// Its metrics have no lag gauge yet: it has not measured.
    NotMeasured,
    /// It could not be asked, or its answer was unusable.
    Failed(String),
}

/// One replica's reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaLag {
    /// The pod's name, for the condition message.
    pub pod: String,
    /// What it said.
    pub reading: LagReading,
}

/// The replicas to ask: pods that are Ready, not terminating, and have an
/// address, as (name, ops endpoint on `port`). A pod that is not ready may
/// never have measured, and is not serving anyway.
pub fn ready_replicas(pods: &[Pod], port: u16) -> Vec<(String, SocketAddr)> {
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| super::pods::is_ready(pod))
        .filter_map(|pod| {
            let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
            Some((pod.name_any(), SocketAddr::new(ip, port)))
        })
        .collect()
}

/// The drain as the replicas' readings show it.
pub fn verdict(readings: &[ReplicaLag]) -> Drain {
    if readings.is_empty() {
        return Drain::Unknown("no ready order-writer replica to ask".to_owned());
    }
    let mut unknown = Vec::new();
    let mut largest: Option<i64> = None;
    for replica in readings {
        match &replica.reading {
            LagReading::Measured(lag) => largest = largest.max(Some(*lag)),
            LagReading::NotMeasured => unknown.push(format!(
                "{} has not measured its lag yet (no order_writer_consumer_lag in its metrics)",
                replica.pod
            )),
            LagReading::Failed(err) => unknown.push(format!("{}: {err}", replica.pod)),
        }
    }
    match largest {
        _ if !unknown.is_empty() => {
            let mut message = unknown.join("; ");
            if let Some(lag) = largest.filter(|lag| *lag > 0) {
                message.push_str(&format!("; the others report {lag} events to write"));
            }
            Drain::Unknown(message)
        }
        Some(0) => Drain::Drained,
        Some(lag) => Drain::Lag(lag),
        None => Drain::Unknown("no replica reported its lag".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn replica(pod: &str, reading: LagReading) -> ReplicaLag {
        ReplicaLag {
            pod: pod.to_owned(),
            reading,
        }
    }

    #[test]
    fn drained_only_when_every_replica_measured_zero() {
        use LagReading::{Failed, Measured, NotMeasured};
        let zero = |pod| replica(pod, Measured(0));
        assert_eq!(verdict(&[zero("a"), zero("b")]), Drain::Drained);
        // The same group lag seen by two replicas: the largest, not the sum.
        assert_eq!(
            verdict(&[replica("a", Measured(3)), replica("b", Measured(5))]),
            Drain::Lag(5)
        );
        // A replica that has not measured is not a zero.
        let Drain::Unknown(message) = verdict(&[zero("a"), replica("b", NotMeasured)]) else {
            panic!("a missing gauge counted as drained");
        };
        assert!(
            message.contains("b has not measured its lag yet"),
            "{message}"
        );
        let Drain::Unknown(message) = verdict(&[
            replica("a", Measured(7)),
            replica("b", Failed("connection refused".into())),
        ]) else {
            panic!("an unreachable replica counted");
        };
        assert_eq!(
            message,
            "b: connection refused; the others report 7 events to write"
        );
        assert!(matches!(verdict(&[]), Drain::Unknown(m) if m.contains("no ready")));
    }

    fn pod(name: &str, ip: Option<&str>, ready: &str, leaving: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                deletion_timestamp: leaving.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_owned),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: ready.to_owned(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn only_ready_replicas_with_an_address_are_asked() {
        let pods = [
            pod("ready", Some("10.0.0.1"), "True", false),
            pod("starting", Some("10.0.0.2"), "False", false),
            pod("unplaced", None, "True", false),
            pod("leaving", Some("10.0.0.3"), "True", true),
            pod("v6", Some("fd00::7"), "True", false),
        ];
        let asked: Vec<(String, String)> = ready_replicas(&pods, 9090)
            .into_iter()
            .map(|(name, addr)| (name, addr.to_string()))
            .collect();
        assert_eq!(
            asked,
            [
                ("ready".to_owned(), "10.0.0.1:9090".to_owned()),
                ("v6".to_owned(), "[fd00::7]:9090".to_owned()),
            ]
        );
    }
}
