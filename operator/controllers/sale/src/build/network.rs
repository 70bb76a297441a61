//! One NetworkPolicy per workload: who may open a connection to its pods.
//! Only ingress is restricted (the workloads' own calls go to Redis, Kafka
//! and the database wherever those run). Ports are named, so a change of
//! port number needs no change here.
//!
//! | workload | `http` (API) from | `ops` (metrics, probes) from |
//! |---|---|---|
//! | gateway | anywhere | the sale's namespace |
//! | inventory | the sale's gateway pods, the operator's namespace | the sale's namespace |
//! | order-writer | (no API) | the sale's namespace, the operator's namespace |
//!
//! The operator reads stock from the inventory API and the drain from the
//! order-writer's metrics, hence its namespace; the inventory API takes the
//! gateway's reservations and confirmations, hence the gateway pods.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::networking::v1::{
        NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
        NetworkPolicySpec,
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};

use super::{
    Owner, labels,
    names::{self, Component},
    pod::{HTTP_PORT_NAME, OPS_PORT_NAME},
};

/// The label every namespace carries with its own name (set by the
/// apiserver, so it cannot be forged by whoever labels namespaces).
const NAMESPACE_NAME_KEY: &str = "kubernetes.io/metadata.name";

fn port(name: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..NetworkPolicyPort::default()
    }
}

fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    }
}

/// Every pod of the policy's own namespace.
fn same_namespace() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..NetworkPolicyPeer::default()
    }
}

/// Every pod of the namespace `name`.
fn namespace(name: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(selector(BTreeMap::from([(
            NAMESPACE_NAME_KEY.to_owned(),
            name.to_owned(),
        )]))),
        ..NetworkPolicyPeer::default()
    }
}

/// `ports` open to `from`; `None` means from anywhere.
fn rule(from: Option<Vec<NetworkPolicyPeer>>, ports: &[&str]) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from,
        ports: Some(ports.iter().map(|p| port(p)).collect()),
    }
}

/// The NetworkPolicy `<sale>-<component>` selecting the workload's pods;
/// `operator_namespace` is where the operator runs.
pub(super) fn network_policy(
    owner: &Owner<'_>,
    component: Component,
    operator_namespace: &str,
) -> NetworkPolicy {
    let ingress = match component {
        // The operator reads which switches generation each gateway applied
        // from its metrics, to measure propagation.
        Component::Gateway => vec![
            rule(None, &[HTTP_PORT_NAME]),
            rule(
                Some(vec![same_namespace(), namespace(operator_namespace)]),
                &[OPS_PORT_NAME],
            ),
        ],
        Component::Inventory => {
            let gateways = NetworkPolicyPeer {
                pod_selector: Some(selector(labels::selector(owner.name, Component::Gateway))),
                ..NetworkPolicyPeer::default()
            };
            vec![
                rule(
                    Some(vec![gateways, namespace(operator_namespace)]),
                    &[HTTP_PORT_NAME],
                ),
                rule(Some(vec![same_namespace()]), &[OPS_PORT_NAME]),
            ]
        }
        Component::OrderWriter => vec![rule(
            Some(vec![same_namespace(), namespace(operator_namespace)]),
            &[OPS_PORT_NAME],
        )],
    };
    NetworkPolicy {
        metadata: owner.object_meta(names::network_policy(owner.sale, component), component),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(labels::selector(owner.name, component))),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(ingress),
            ..NetworkPolicySpec::default()
        }),
    }
}
