//! Pieces every workload's pod shares: env helpers, ports, probes, resources,
//! hardening, volumes and spreading.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Capabilities, ConfigMapVolumeSource, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
        KeyToPath, ObjectFieldSelector, PodSecurityContext, Probe, ResourceRequirements,
        SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
        TopologySpreadConstraint, Volume, VolumeMount,
    },
    apimachinery::pkg::{
        api::resource::Quantity, apis::meta::v1::LabelSelector, util::intstr::IntOrString,
    },
};

use super::names::Component;
use flashsale_api::common::SecretKeyRef;

/// Port of the public API (gateway) or reservation API (inventory).
pub(super) const HTTP_PORT: i32 = 8080;
/// Port of `/healthz`, `/readyz` and `/metrics`, on every workload.
pub(super) const OPS_PORT: i32 = super::OPS_PORT_NUMBER as i32;
/// Name of the API port, referenced by probes and Services.
pub(super) const HTTP_PORT_NAME: &str = "http";
/// Name of the ops port.
pub(super) const OPS_PORT_NAME: &str = "ops";
/// The distroless `nonroot` user the images run as.
const NON_ROOT_UID: i64 = 65532;
/// Where a workload's ConfigMap is mounted.
pub(super) const CONFIG_DIR: &str = "/etc/flashsale/config";
/// File name a mounted Secret key gets, so paths do not depend on key names.
pub(super) const SECRET_FILE: &str = "key";

/// The pod template's annotations: the configuration hash that rolls the
/// pods when their configuration changes, and the conventional
/// `prometheus.io/*` ones by which Prometheus's Kubernetes discovery finds
/// every workload's `/metrics`.
pub(super) fn annotations(config_hash: String) -> BTreeMap<String, String> {
    [
        (super::CONFIG_HASH_ANNOTATION, config_hash),
        ("prometheus.io/scrape", "true".to_owned()),
        ("prometheus.io/port", OPS_PORT.to_string()),
        ("prometheus.io/path", "/metrics".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// `name=value`.
pub(super) fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// `name` from a key of a Secret.
pub(super) fn env_secret(name: &str, secret: &SecretKeyRef) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.name.clone(),
                key: secret.key.clone(),
                ..SecretKeySelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// `name` from a field of the pod (downward API).
pub(super) fn env_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        // Part of the list's merge key: set so server-side apply never has to
        // guess it.
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

/// The container's ports: `http` for the workloads that serve an API, `ops`
/// for all.
pub(super) fn container_ports(component: Component) -> Vec<ContainerPort> {
    let mut ports = Vec::with_capacity(2);
    if component != Component::OrderWriter {
        ports.push(container_port(HTTP_PORT_NAME, HTTP_PORT));
    }
    ports.push(container_port(OPS_PORT_NAME, OPS_PORT));
    ports
}

fn http_probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String(OPS_PORT_NAME.to_owned()),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    }
}

/// `/readyz` on the ops port.
pub(super) fn readiness_probe() -> Probe {
    http_probe("/readyz")
}

/// `/healthz` on the ops port.
pub(super) fn liveness_probe() -> Probe {
    http_probe("/healthz")
}

/// The spec's resources as given, or the defaults: requests sized for a
/// small sale, memory limited to 4× the request, and no CPU limit because
/// CFS throttling in a spike hurts latency more than sharing spare CPU.
pub(super) fn resources(
    spec: Option<&ResourceRequirements>,
    component: Component,
) -> ResourceRequirements {
    if let Some(spec) = spec {
        return spec.clone();
    }
    let (cpu, memory, memory_limit) = match component {
        Component::Gateway => ("250m", "128Mi", "512Mi"),
        Component::Inventory => ("100m", "64Mi", "256Mi"),
        Component::OrderWriter => ("100m", "128Mi", "512Mi"),
    };
    let quantity = |value: &str| Quantity(value.to_owned());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), quantity(cpu)),
            ("memory".to_owned(), quantity(memory)),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            quantity(memory_limit),
        )])),
        ..ResourceRequirements::default()
    }
}

/// The Pod Security Standard "restricted" profile for the container.
pub(super) fn security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NON_ROOT_UID),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Capabilities::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        }),
        ..SecurityContext::default()
    }
}

/// Pod-level: mounted files belong to the container's group, so Secret files
/// can be group-readable only (see [`secret_volume`]).
pub(super) fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        fs_group: Some(NON_ROOT_UID),
        ..PodSecurityContext::default()
    }
}

/// Spreads a workload's pods over nodes, so one node going down takes only
/// its share; a preference, since a small cluster must still run the sale.
pub(super) fn topology_spread(selector: &BTreeMap<String, String>) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".to_owned(),
        when_unsatisfiable: "ScheduleAnyway".to_owned(),
        label_selector: Some(LabelSelector {
            match_labels: Some(selector.clone()),
            ..LabelSelector::default()
        }),
        // Count only the pods of the same revision, so a rolling update
        // spreads the new pods instead of packing them next to old ones.
        match_label_keys: Some(vec!["pod-template-hash".to_owned()]),
        ..TopologySpreadConstraint::default()
    }
}

/// A ConfigMap mounted read-only at [`CONFIG_DIR`].
pub(super) fn config_volume(volume: &str, config_map: String) -> (Volume, VolumeMount) {
    (
        Volume {
            name: volume.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map,
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        VolumeMount {
            name: volume.to_owned(),
            mount_path: CONFIG_DIR.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    )
}

/// One key of a Secret mounted as `<dir>/key`.
pub(super) fn secret_volume(
    volume: &str,
    dir: &str,
    secret: &SecretKeyRef,
) -> (Volume, VolumeMount) {
    secret_files(volume, dir, &secret.name, &[(&secret.key, SECRET_FILE)])
}

/// Keys of the Secret `secret_name` mounted in `dir`, each as the file name
/// paired with it; the files are readable by the container's group only
/// (0440 with fsGroup), not by every user.
pub(super) fn secret_files(
    volume: &str,
    dir: &str,
    secret_name: &str,
    files: &[(&str, &str)],
) -> (Volume, VolumeMount) {
    let items = files
        .iter()
        .map(|&(key, file)| KeyToPath {
            key: key.to_owned(),
            path: file.to_owned(),
            ..KeyToPath::default()
        })
        .collect();
    (
        Volume {
            name: volume.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name.to_owned()),
                items: Some(items),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        VolumeMount {
            name: volume.to_owned(),
            mount_path: dir.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    )
}
