//! The order-writer replicas to ask about the group's lag, and what each
//! said. The verdict over the readings is the FlashSale controller's.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

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
        .filter(|pod| crate::pods::is_ready(pod))
        .filter_map(|pod| {
            let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
            Some((pod.name_any(), SocketAddr::new(ip, port)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

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
