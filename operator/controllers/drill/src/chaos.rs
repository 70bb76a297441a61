//! The Chaos Mesh objects of a run, built as plain JSON so the operator
//! needs none of Chaos Mesh's Go types: one Workflow holding the run's
//! dead-man StatusCheck, and one experiment per `spec.experiments` entry.
//!
//! Ownership chain: drill → Workflow → WorkflowNode → StatusCheck →
//! experiments. Chaos Mesh creates the StatusCheck with the
//! `foregroundDeletion` finalizer and deletes it when the check fails (or
//! the run's deadline passes), so the garbage collector removes the
//! experiments — each recovering its targets through its own finalizer —
//! even when the operator is gone. The experiments are owned by the
//! StatusCheck alone: a second, living owner (the drill) would keep them.
//! Deleting the drill removes the whole chain.

use std::collections::BTreeMap;

use kube::{
    ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind},
};
use serde_json::{Value, json};

use flashsale_api::{
    ChaosDrill, chaosdrill::Experiment, chaosdrill::NetworkChaosAction,
    chaosdrill::NetworkChaosKind, chaosdrill::PodChaosAction, chaosdrill::PodChaosKind,
    chaosdrill::StressChaosAction, chaosdrill::TargetWorkload, children::Component,
    children::MANAGED_BY, children::MANAGED_BY_KEY,
};

/// Chaos Mesh's API group and version.
pub const CHAOS_MESH_API_VERSION: &str = "chaos-mesh.org/v1alpha1";
/// Label on every object of a drill: the drill's name.
pub const DRILL_LABEL: &str = "flashsale.dev/drill";
/// Label on every object of a run: the run id.
pub const RUN_LABEL: &str = "flashsale.dev/run";
/// Label on every experiment: the target workload.
pub const TARGET_LABEL: &str = "flashsale.dev/target";
/// Chaos Mesh's pause annotation; only `"true"` pauses.
pub const PAUSE_ANNOTATION: &str = "experiment.chaos-mesh.org/pause";
/// The label Chaos Mesh puts on what a Workflow spawns.
pub const WORKFLOW_LABEL: &str = "chaos-mesh.org/workflow";

/// The Chaos Mesh kinds the operator creates or reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Kills or fails pods.
    PodChaos,
    /// Delays, drops or partitions traffic.
    NetworkChaos,
    /// Burns CPU or memory.
    StressChaos,
    /// Skews clocks.
    TimeChaos,
    /// Holds a run's StatusCheck.
    Workflow,
    /// Probes the operator's guard.
    StatusCheck,
}

impl Kind {
    /// The experiment kinds, in the order a stop handles them.
    pub const EXPERIMENTS: [Kind; 4] = [
        Kind::PodChaos,
        Kind::NetworkChaos,
        Kind::StressChaos,
        Kind::TimeChaos,
    ];

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::PodChaos => "PodChaos",
            Self::NetworkChaos => "NetworkChaos",
            Self::StressChaos => "StressChaos",
            Self::TimeChaos => "TimeChaos",
            Self::Workflow => "Workflow",
            Self::StatusCheck => "StatusCheck",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Self::PodChaos => "podchaos",
            Self::NetworkChaos => "networkchaos",
            Self::StressChaos => "stresschaos",
            Self::TimeChaos => "timechaos",
            Self::Workflow => "workflows",
            Self::StatusCheck => "statuschecks",
        }
    }

    /// The kind of this name, if the operator knows it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::EXPERIMENTS
            .into_iter()
            .chain([Self::Workflow, Self::StatusCheck])
            .find(|kind| kind.name() == name)
    }

    /// The kind as a dynamic API resource.
    pub fn resource(self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("chaos-mesh.org", "v1alpha1", self.name()),
            self.plural(),
        )
    }

    /// The kind of an experiment of the spec.
    pub fn of(experiment: &Experiment) -> Self {
        if experiment.network_chaos.is_some() {
            Self::NetworkChaos
        } else if experiment.stress_chaos.is_some() {
            Self::StressChaos
        } else if experiment.time_chaos.is_some() {
            Self::TimeChaos
        } else {
            Self::PodChaos
        }
    }
}

/// The component a target workload is.
pub fn component(target: TargetWorkload) -> Component {
    match target {
        TargetWorkload::Gateway => Component::Gateway,
        TargetWorkload::Inventory => Component::Inventory,
        TargetWorkload::OrderWriter => Component::OrderWriter,
    }
}

/// The name of a run's Workflow, `<drill>-<run>`: at most 63 characters,
/// because Chaos Mesh puts it in a label. A long drill name is cut and
/// made unique again with a hash of the whole name.
pub fn workflow_name(drill: &str, run: &str) -> String {
    const ROOM: usize = 63 - 20; // the run id and its dash
    let prefix = if drill.len() <= ROOM {
        drill.to_owned()
    } else {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(drill.as_bytes());
        let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        let cut = drill[..ROOM - 9].trim_end_matches('-');
        format!("{cut}-{hash}")
    };
    format!("{prefix}-{run}")
}

/// The name of one experiment of a run: `<workflow>-<experiment>`.
pub fn experiment_name(drill: &str, run: &str, experiment: &str) -> String {
    format!("{}-{experiment}", workflow_name(drill, run))
}

/// Labels of every object of a run.
pub fn run_labels(drill: &str, run: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_KEY.to_owned(), MANAGED_BY.to_owned()),
        (DRILL_LABEL.to_owned(), drill.to_owned()),
        (RUN_LABEL.to_owned(), run.to_owned()),
    ])
}

/// `app.kubernetes.io/managed-by=flashsale-operator`: everything the
/// operator created, for the kill switch.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY_KEY}={MANAGED_BY}")
}

/// The label selector of one run's objects.
pub fn run_selector(drill: &str, run: &str) -> String {
    format!("{MANAGED_BY_KEY}={MANAGED_BY},{DRILL_LABEL}={drill},{RUN_LABEL}={run}")
}

/// How the run's StatusCheck probes the guard.
#[derive(Debug, Clone, PartialEq)]
pub struct Backstop {
    /// `<base>/guard/<namespace>/<drill>/<run>`.
    pub url: String,
    /// Consecutive failed probes (one a second) before Chaos Mesh aborts:
    /// `staleAfter` rounded up to whole seconds, at least one.
    pub failure_threshold: u64,
    /// How long the check runs: the run's injection time plus a margin.
    pub deadline: std::time::Duration,
}

/// The run's Workflow: a single Continuous StatusCheck against the guard,
/// with `abortWithStatusCheck`, owned by the drill.
pub fn workflow(drill: &ChaosDrill, run: &str, backstop: &Backstop) -> Result<Value, MissingUid> {
    let name = workflow_name(&drill.name_any(), run);
    Ok(json!({
        "apiVersion": CHAOS_MESH_API_VERSION,
        "kind": "Workflow",
        "metadata": {
            "name": name,
            "namespace": drill.namespace(),
            "labels": run_labels(&drill.name_any(), run),
            // Chaos Mesh's abort path writes into the Workflow's
            // annotations and panics when there are none.
            "annotations": {DRILL_LABEL: drill.name_any(), RUN_LABEL: run},
            "ownerReferences": [owner(drill)?],
        },
        "spec": {
            "entry": "guard",
            "templates": [{
                "name": "guard",
                "templateType": "StatusCheck",
                "deadline": go_duration(backstop.deadline),
                "abortWithStatusCheck": true,
                "statusCheck": {
                    // The webhook that would default the mode is not
                    // registered everywhere: say it.
                    "mode": "Continuous",
                    "type": "HTTP",
                    "intervalSeconds": 1,
                    "timeoutSeconds": 1,
                    "failureThreshold": backstop.failure_threshold,
                    "successThreshold": 1,
                    "recordsHistoryLimit": 100,
                    "http": {
                        "url": backstop.url,
                        "method": "GET",
                        "criteria": {"statusCode": "200"},
                    },
                },
            }],
        },
    }))
}

/// The drill has no uid yet (not read from the apiserver).
#[derive(Debug, thiserror::Error)]
#[error("the ChaosDrill has no metadata.uid")]
pub struct MissingUid;

fn owner(drill: &ChaosDrill) -> Result<Value, MissingUid> {
    Ok(json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "ChaosDrill",
        "name": drill.name_any(),
        "uid": drill.uid().ok_or(MissingUid)?,
        "controller": true,
        "blockOwnerDeletion": true,
    }))
}

/// One experiment of a run, naming its target pods, owned by the run's
/// StatusCheck (`status_check` = name and uid).
pub fn experiment(
    drill: &ChaosDrill,
    run: &str,
    experiment: &Experiment,
    pods: &[String],
    status_check: (&str, &str),
) -> Value {
    let drill_name = drill.name_any();
    let namespace = drill.namespace().unwrap_or_default();
    let kind = Kind::of(experiment);
    let mut labels = run_labels(&drill_name, run);
    labels.insert(
        TARGET_LABEL.to_owned(),
        component(experiment.target).label().to_owned(),
    );
    // Namespaces are explicit: without Chaos Mesh's webhook an empty list
    // matches every namespace of the cluster.
    let selector = json!({
        "namespaces": [namespace],
        "pods": {namespace.as_str(): pods},
    });
    let mut spec = json!({"mode": "all", "selector": selector});
    let duration = go_duration(experiment.duration.0);
    if let Some(pod) = &experiment.pod_chaos {
        pod_spec(&mut spec, pod, duration, experiment.target);
    } else if let Some(net) = &experiment.network_chaos {
        spec["duration"] = json!(duration);
        network_spec(&mut spec, net, &drill.spec.sale_ref.name, &namespace);
    } else if let Some(stress) = &experiment.stress_chaos {
        spec["duration"] = json!(duration);
        spec["stressors"] = stressors(stress);
    } else if let Some(time) = &experiment.time_chaos {
        spec["duration"] = json!(duration);
        spec["timeOffset"] = json!(time.offset);
        // Chaos Mesh's default, written since no webhook fills it in.
        spec["clockIds"] = json!(["CLOCK_REALTIME"]);
        spec["containerNames"] = json!([component(experiment.target).label()]);
    }
    json!({
        "apiVersion": CHAOS_MESH_API_VERSION,
        "kind": kind.name(),
        "metadata": {
            "name": experiment_name(&drill_name, run, &experiment.name),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": CHAOS_MESH_API_VERSION,
                "kind": "StatusCheck",
                "name": status_check.0,
                "uid": status_check.1,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": spec,
    })
}

/// A PodChaos's action, duration and, for container-kill, the one
/// container of `target`'s pods it kills.
fn pod_spec(spec: &mut Value, pod: &PodChaosAction, duration: String, target: TargetWorkload) {
    spec["action"] = json!(pod_action(pod.action));
    match pod.action {
        // One-shot: Chaos Mesh ignores a duration.
        PodChaosKind::PodKill => {}
        PodChaosKind::PodFailure => spec["duration"] = json!(duration),
        PodChaosKind::ContainerKill => {
            spec["duration"] = json!(duration);
            // Without names Chaos Mesh would kill every container of the pod.
            let container = pod
                .container
                .clone()
                .unwrap_or_else(|| component(target).label().to_owned());
            spec["containerNames"] = json!([container]);
        }
    }
}

/// A NetworkChaos's action, its parameters and, for traffic towards another
/// component of `sale` or named addresses, the target side.
fn network_spec(spec: &mut Value, net: &NetworkChaosAction, sale: &str, namespace: &str) {
    spec["action"] = json!(network_action(net.action));
    // Chaos Mesh parses the correlation as a number and has no default for
    // it without its webhook: it is always written.
    let correlation = net.correlation_percent.unwrap_or(0.0).to_string();
    match net.action {
        NetworkChaosKind::Delay => {
            let mut delay = json!({"correlation": correlation});
            if let Some(latency) = &net.latency {
                delay["latency"] = json!(go_duration(latency.0));
            }
            // Chaos Mesh's webhook defaults the jitter to 0ms; without it an
            // absent jitter fails every apply ("time: invalid duration").
            delay["jitter"] = json!(
                net.jitter
                    .map_or_else(|| "0ms".to_owned(), |j| go_duration(j.0))
            );
            spec["delay"] = delay;
        }
        NetworkChaosKind::Loss => {
            spec["loss"] = json!({
                "loss": net.loss_percent.unwrap_or(0.0).to_string(),
                "correlation": correlation,
            });
        }
        NetworkChaosKind::Partition => {}
    }
    if net.to.is_some() || !net.to_addresses.is_empty() {
        spec["direction"] = json!("to");
    }
    if !net.to_addresses.is_empty() {
        spec["externalTargets"] = json!(net.to_addresses);
    }
    if let Some(to) = net.to {
        spec["target"] = json!({
            "mode": "all",
            "selector": {
                "namespaces": [namespace],
                "labelSelectors": flashsale_api::children::selector(sale, component(to)),
            },
        });
    }
}

/// A StressChaos's stressors.
fn stressors(stress: &StressChaosAction) -> Value {
    let mut stressors = json!({});
    if let Some(workers) = stress.cpu_workers {
        stressors["cpu"] =
            json!({"workers": workers, "load": stress.cpu_load_percent.unwrap_or(100)});
    }
    if let Some(workers) = stress.memory_workers {
        let mut memory = json!({"workers": workers});
        if let Some(size) = &stress.memory_size {
            memory["size"] = json!(size);
        }
        stressors["memory"] = memory;
    }
    stressors
}

fn pod_action(kind: PodChaosKind) -> &'static str {
    match kind {
        PodChaosKind::PodKill => "pod-kill",
        PodChaosKind::PodFailure => "pod-failure",
        PodChaosKind::ContainerKill => "container-kill",
    }
}

fn network_action(kind: NetworkChaosKind) -> &'static str {
    match kind {
        NetworkChaosKind::Delay => "delay",
        NetworkChaosKind::Loss => "loss",
        NetworkChaosKind::Partition => "partition",
    }
}

/// A duration as Go's `time.ParseDuration` reads it (`1500ms`, `2m0s` …):
/// whole milliseconds, which Chaos Mesh accepts everywhere.
pub fn go_duration(duration: std::time::Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

/// A built object as a `DynamicObject`.
pub fn dynamic(value: Value) -> Result<DynamicObject, serde_json::Error> {
    serde_json::from_value(value)
}

/// `Kind/name` entries (a run's `objects`) as kinds and names; entries of
/// unknown kinds are left out.
pub fn parse_objects(objects: &[String]) -> Vec<(Kind, String)> {
    objects
        .iter()
        .filter_map(|entry| {
            let (kind, name) = entry.split_once('/')?;
            Some((Kind::from_name(kind)?, name.to_owned()))
        })
        .collect()
}

/// The pods an experiment object names in its selector, `namespace/name`.
pub fn selected_pods(object: &DynamicObject) -> Vec<String> {
    let Some(pods) = object.data["spec"]["selector"]["pods"].as_object() else {
        return Vec::new();
    };
    pods.iter()
        .flat_map(|(ns, names)| {
            names
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .map(move |n| format!("{ns}/{n}"))
        })
        .collect()
}

/// Whether Chaos Mesh injected an experiment into every target it selected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// Every record is `Injected`.
    Injected,
    /// Not yet; no record failed.
    Pending,
    /// A record's latest event is a failed apply: the target (`ns/pod`)
    /// and Chaos Mesh's message (it retries; the caller decides how long
    /// to wait).
    Failing(String, String),
}

/// How far Chaos Mesh got injecting `object`, from its records.
pub fn injection(object: &DynamicObject) -> Injection {
    let records = object.data["status"]["experiment"]["containerRecords"].as_array();
    let Some(records) = records.filter(|r| !r.is_empty()) else {
        return Injection::Pending;
    };
    if records
        .iter()
        .all(|r| r["phase"].as_str() == Some("Injected"))
    {
        return Injection::Injected;
    }
    let failing = records.iter().find_map(|r| {
        let last = r["events"].as_array()?.last()?;
        (last["type"].as_str() == Some("Failed")).then(|| {
            let id = r["id"].as_str().unwrap_or("?").to_owned();
            let message = last["message"].as_str().unwrap_or("no message").trim();
            Injection::Failing(id, message.to_owned())
        })
    });
    failing.unwrap_or(Injection::Pending)
}

/// What Chaos Mesh says of an experiment: recovered once it wants it
/// stopped and no record is injected any more.
pub fn recovered(object: &DynamicObject) -> bool {
    let experiment = &object.data["status"]["experiment"];
    let stopped = experiment["desiredPhase"].as_str() == Some("Stop");
    let records = experiment["containerRecords"].as_array();
    stopped
        && records.is_none_or(|records| {
            records
                .iter()
                .all(|r| r["phase"].as_str() == Some("Not Injected"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drill() -> anyhow::Result<ChaosDrill> {
        let mut drill: ChaosDrill = serde_yaml_ng::from_str(include_str!(
            "../../../../crds/examples/chaosdrill-pod-kill.yaml"
        ))?;
        drill.metadata.uid = Some("drill-uid".into());
        Ok(drill)
    }

    #[test]
    fn names_fit_chaos_meshs_labels_and_stay_unique_when_cut() {
        assert_eq!(
            workflow_name("gateway-pod-kill", "20261201-143000-000"),
            "gateway-pod-kill-20261201-143000-000"
        );
        let long_a = format!("{}-a", "x".repeat(80));
        let long_b = format!("{}-b", "x".repeat(80));
        let a = workflow_name(&long_a, "20261201-143000-000");
        let b = workflow_name(&long_b, "20261201-143000-000");
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(
            experiment_name("d", "20261201-143000-000", "kill-gateway"),
            "d-20261201-143000-000-kill-gateway"
        );
    }

    #[test]
    fn an_experiment_names_its_pods_and_namespace_and_is_owned_by_the_status_check()
    -> anyhow::Result<()> {
        let drill = drill()?;
        let pods = vec!["gw-1".to_owned(), "gw-2".to_owned()];
        let object = experiment(
            &drill,
            "20261201-143000-000",
            &drill.spec.experiments[0],
            &pods,
            ("sc", "sc-uid"),
        );
        assert_eq!(object["kind"], "PodChaos");
        assert_eq!(object["spec"]["action"], "pod-kill");
        assert_eq!(object["spec"]["mode"], "all");
        assert_eq!(object["spec"]["selector"]["namespaces"], json!(["default"]));
        assert_eq!(
            object["spec"]["selector"]["pods"],
            json!({"default": ["gw-1", "gw-2"]})
        );
        // pod-kill is one-shot: no duration.
        assert!(object["spec"].get("duration").is_none());
        let owners = &object["metadata"]["ownerReferences"];
        assert_eq!(owners.as_array().map(Vec::len), Some(1));
        assert_eq!(owners[0]["kind"], "StatusCheck");
        assert_eq!(owners[0]["uid"], "sc-uid");
        assert_eq!(
            object["metadata"]["labels"][RUN_LABEL],
            "20261201-143000-000"
        );
        assert_eq!(object["metadata"]["labels"][TARGET_LABEL], "gateway");
        let dynamic = dynamic(object)?;
        assert_eq!(selected_pods(&dynamic), ["default/gw-1", "default/gw-2"]);
        Ok(())
    }

    /// The drill's experiment turned into a NetworkChaos `action`.
    fn network(
        action: NetworkChaosKind,
        correlation: Option<f64>,
        jitter: Option<u64>,
    ) -> anyhow::Result<Value> {
        let mut drill = drill()?;
        let exp = &mut drill.spec.experiments[0];
        exp.pod_chaos = None;
        exp.network_chaos = Some(NetworkChaosAction {
            action,
            latency: Some(flashsale_api::Duration(std::time::Duration::from_millis(
                150,
            ))),
            jitter: jitter.map(|ms| flashsale_api::Duration(std::time::Duration::from_millis(ms))),
            loss_percent: Some(25.0),
            correlation_percent: correlation,
            to: None,
            to_addresses: Vec::new(),
        });
        Ok(experiment(
            &drill,
            "r",
            &drill.spec.experiments[0],
            &[],
            ("s", "u"),
        ))
    }

    #[test]
    fn delay_and_loss_always_carry_a_correlation_chaos_mesh_can_parse() -> anyhow::Result<()> {
        // Without its webhook Chaos Mesh defaults nothing, and an empty
        // correlation fails every apply ("strconv.ParseFloat: parsing \"\"").
        let delay = network(NetworkChaosKind::Delay, None, Some(20))?;
        assert_eq!(delay["kind"], "NetworkChaos");
        assert_eq!(
            delay["spec"]["delay"],
            json!({"latency": "150ms", "jitter": "20ms", "correlation": "0"})
        );
        // Nor a jitter: one not given is written as none.
        let steady = network(NetworkChaosKind::Delay, None, None)?;
        assert_eq!(steady["spec"]["delay"]["jitter"], "0ms");
        let loss = network(NetworkChaosKind::Loss, Some(50.0), Some(20))?;
        assert_eq!(
            loss["spec"]["loss"],
            json!({"loss": "25", "correlation": "50"})
        );
        for object in [&delay, &loss] {
            assert_eq!(object["spec"]["duration"], "120000ms");
            assert!(object["spec"].get("direction").is_none(), "{object}");
        }
        Ok(())
    }

    #[test]
    fn a_partition_towards_addresses_names_them_for_chaos_mesh_to_resolve() -> anyhow::Result<()> {
        let mut drill = drill()?;
        let store = "redis.shop.svc.cluster.local:6379".to_owned();
        let mut cut = |to: Option<TargetWorkload>, to_addresses: Vec<String>| {
            let exp = &mut drill.spec.experiments[0];
            exp.pod_chaos = None;
            exp.network_chaos = Some(NetworkChaosAction {
                action: NetworkChaosKind::Partition,
                latency: None,
                jitter: None,
                loss_percent: None,
                correlation_percent: None,
                to,
                to_addresses,
            });
            experiment(&drill, "r", &drill.spec.experiments[0], &[], ("s", "u"))
        };
        // A store alone: only traffic to it, no pods on the other side.
        let alone = cut(None, vec![store.clone()]);
        assert_eq!(alone["spec"]["direction"], "to");
        assert_eq!(alone["spec"]["externalTargets"], json!([store]));
        assert!(alone["spec"].get("target").is_none(), "{alone}");
        // With a workload: both sides of the cut.
        let both = cut(Some(TargetWorkload::Inventory), vec![store.clone()]);
        assert_eq!(both["spec"]["externalTargets"], json!([store]));
        assert_eq!(both["spec"]["target"]["mode"], "all");
        // Neither: all traffic, no direction.
        let all = cut(None, Vec::new());
        assert!(all["spec"].get("direction").is_none(), "{all}");
        assert!(all["spec"].get("externalTargets").is_none(), "{all}");
        Ok(())
    }

    #[test]
    fn pod_failure_carries_the_duration_as_a_hard_bound() -> anyhow::Result<()> {
        let mut drill = drill()?;
        let exp = &mut drill.spec.experiments[0];
        exp.pod_chaos = Some(flashsale_api::chaosdrill::PodChaosAction {
            action: PodChaosKind::PodFailure,
            container: None,
        });
        let object = experiment(&drill, "r", &drill.spec.experiments[0], &[], ("s", "u"));
        assert_eq!(object["spec"]["duration"], "120000ms");
        Ok(())
    }

    #[test]
    fn container_kill_names_one_container_the_workloads_own_unless_told() -> anyhow::Result<()> {
        let mut drill = drill()?;
        let target = drill.spec.experiments[0].target;
        let mut kill = |container: Option<&str>| {
            drill.spec.experiments[0].pod_chaos = Some(PodChaosAction {
                action: PodChaosKind::ContainerKill,
                container: container.map(str::to_owned),
            });
            experiment(&drill, "r", &drill.spec.experiments[0], &[], ("s", "u"))
        };
        let own = kill(None);
        assert_eq!(own["spec"]["action"], "container-kill");
        assert_eq!(
            own["spec"]["containerNames"],
            json!([component(target).label()])
        );
        assert_eq!(
            kill(Some("sidecar"))["spec"]["containerNames"],
            json!(["sidecar"])
        );
        Ok(())
    }

    #[test]
    fn time_chaos_moves_the_wall_clock_of_the_workloads_container() -> anyhow::Result<()> {
        let mut drill = drill()?;
        let exp = &mut drill.spec.experiments[0];
        exp.pod_chaos = None;
        exp.time_chaos = Some(flashsale_api::chaosdrill::TimeChaosAction {
            offset: "-30s".into(),
        });
        let target = exp.target;
        let object = experiment(&drill, "r", &drill.spec.experiments[0], &[], ("s", "u"));
        assert_eq!(object["kind"], "TimeChaos");
        assert_eq!(object["spec"]["timeOffset"], "-30s");
        assert_eq!(object["spec"]["clockIds"], json!(["CLOCK_REALTIME"]));
        assert_eq!(
            object["spec"]["containerNames"],
            json!([component(target).label()])
        );
        assert_eq!(object["spec"]["duration"], "120000ms");
        Ok(())
    }

    #[test]
    fn the_workflow_is_annotated_owned_by_the_drill_and_checks_continuously() -> anyhow::Result<()>
    {
        let drill = drill()?;
        let backstop = Backstop {
            url: "http://10.0.0.1:8080/guard/default/gateway-pod-kill/20261201-053000-000".into(),
            failure_threshold: 2,
            deadline: std::time::Duration::from_secs(150),
        };
        let wf = workflow(&drill, "20261201-143000-000", &backstop)?;
        assert!(
            wf["metadata"]["annotations"]
                .as_object()
                .is_some_and(|a| !a.is_empty())
        );
        assert_eq!(wf["metadata"]["ownerReferences"][0]["uid"], "drill-uid");
        let template = &wf["spec"]["templates"][0];
        assert_eq!(template["abortWithStatusCheck"], true);
        assert_eq!(template["deadline"], "150000ms");
        assert_eq!(template["statusCheck"]["mode"], "Continuous");
        assert_eq!(template["statusCheck"]["failureThreshold"], 2);
        assert_eq!(template["statusCheck"]["http"]["url"], backstop.url);
        let mut orphan = drill;
        orphan.metadata.uid = None;
        assert!(workflow(&orphan, "r", &backstop).is_err());
        Ok(())
    }

    #[test]
    fn a_runs_objects_read_back_as_kinds_and_names() {
        let objects = [
            "Workflow/d-r".to_owned(),
            "PodChaos/d-r-kill".to_owned(),
            "Deployment/x".to_owned(),
            "no-slash".to_owned(),
        ];
        assert_eq!(
            parse_objects(&objects),
            [
                (Kind::Workflow, "d-r".to_owned()),
                (Kind::PodChaos, "d-r-kill".to_owned())
            ]
        );
    }

    #[test]
    fn injection_is_read_from_the_records_and_names_a_failing_target() -> anyhow::Result<()> {
        let with = |records: Value| -> anyhow::Result<Injection> {
            Ok(injection(&dynamic(json!({
                "apiVersion": CHAOS_MESH_API_VERSION, "kind": "NetworkChaos",
                "metadata": {"name": "x"},
                "status": {"experiment": {"desiredPhase": "Run", "containerRecords": records}},
            }))?))
        };
        assert_eq!(with(json!(null))?, Injection::Pending);
        assert_eq!(with(json!([]))?, Injection::Pending);
        let injected = json!({"id": "ns/a", "phase": "Injected",
            "events": [{"type": "Succeeded", "operation": "Apply"}]});
        assert_eq!(with(json!([injected]))?, Injection::Injected);
        let waiting = json!({"id": "ns/b", "phase": "Not Injected/Wait", "events": []});
        assert_eq!(with(json!([injected, waiting]))?, Injection::Pending);
        let failing = json!({"id": "ns/b", "phase": "Not Injected/Wait", "events": [
            {"type": "Failed", "operation": "Apply", "message": "unable to set tcs for pod b"},
            {"type": "Failed", "operation": "Apply",
             "message": "Error: Specified qdisc kind is unknown.\n"}]});
        assert_eq!(
            with(json!([injected, failing]))?,
            Injection::Failing(
                "ns/b".to_owned(),
                "Error: Specified qdisc kind is unknown.".to_owned()
            )
        );
        Ok(())
    }

    #[test]
    fn recovery_is_read_from_chaos_meshs_status() -> anyhow::Result<()> {
        let with = |status: Value| -> anyhow::Result<bool> {
            Ok(recovered(&dynamic(json!({
                "apiVersion": CHAOS_MESH_API_VERSION, "kind": "PodChaos",
                "metadata": {"name": "x"}, "status": status,
            }))?))
        };
        assert!(!with(json!({}))?);
        assert!(!with(json!({"experiment": {"desiredPhase": "Run",
            "containerRecords": [{"phase": "Not Injected"}]}}))?);
        assert!(!with(json!({"experiment": {"desiredPhase": "Stop",
            "containerRecords": [{"phase": "Injected"}, {"phase": "Not Injected"}]}}))?);
        assert!(with(json!({"experiment": {"desiredPhase": "Stop",
            "containerRecords": [{"phase": "Not Injected"}]}}))?);
        Ok(())
    }
}
