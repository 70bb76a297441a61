//! Why a sale's pods do not run, in Kubernetes' own words: a Deployment only
//! says "0/2 ready", while the pods say `ImagePullBackOff` or
//! `CrashLoopBackOff`. Pure, so each case is unit-tested.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use flashsale_api::{children::COMPONENT_KEY, reasons::PodFailure};

/// Whether `pod` has its `Ready` condition `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Longest message kept from a pod, so a status stays readable.
const MESSAGE_LIMIT: usize = 300;

/// One pod that cannot run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProblem {
    /// The pod's component label (gateway, inventory, order-writer).
    pub component: String,
    /// The pod's name.
    pub pod: String,
    /// The Kubernetes reason (`ImagePullBackOff`, `CrashLoopBackOff`,
    /// `Unschedulable`, …), usable as a condition and Event reason.
    pub reason: PodFailure,
    /// What the kubelet or scheduler said, with the last exit of a crashing
    /// container.
    pub message: String,
}

impl std::fmt::Display for PodProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} pod {}: {}: {}",
            self.component, self.pod, self.reason, self.message
        )
    }
}

/// The problems of the pods given, ordered by component then pod name; pods
/// being deleted are ignored (they are on their way out anyway).
pub fn problems(pods: &[Pod]) -> Vec<PodProblem> {
    let mut found: Vec<PodProblem> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(problem)
        .collect();
    found.sort_by(|a, b| (&a.component, &a.pod).cmp(&(&b.component, &b.pod)));
    found
}

fn problem(pod: &Pod) -> Option<PodProblem> {
    let status = pod.status.as_ref()?;
    let component = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(COMPONENT_KEY))
        .cloned()
        .unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let make = |reason: PodFailure, message: String| PodProblem {
        component: component.clone(),
        pod: pod_name.clone(),
        reason,
        message: truncate(message),
    };
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(condition) = unschedulable {
        return Some(make(
            PodFailure::Unschedulable,
            condition.message.clone().unwrap_or_default(),
        ));
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    containers
        .filter_map(|c| failing(c).map(|(reason, message)| make(reason, message)))
        .next()
}

/// The failing waiting reason of a container and a message saying what
/// happened, naming the container and its last exit.
fn failing(container: &ContainerStatus) -> Option<(PodFailure, String)> {
    let waiting = container.state.as_ref()?.waiting.as_ref()?;
    // Only the kubelet's failing waiting reasons: `ContainerCreating` and
    // the like end by themselves.
    let reason = PodFailure::all()
        .into_iter()
        .filter(|r| *r != PodFailure::Unschedulable)
        .find(|r| waiting.reason.as_deref() == Some(r.as_str()))?;
    let mut message = format!("container {}", container.name);
    if let Some(text) = waiting.message.as_deref().filter(|m| !m.is_empty()) {
        message.push_str(": ");
        message.push_str(text);
    }
    let last_exit = container
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    if let Some(exit) = last_exit {
        message.push_str(&format!(
            "; last exit code {} ({}), {} restarts",
            exit.exit_code,
            exit.reason.as_deref().unwrap_or("no reason"),
            container.restart_count
        ));
    }
    Some((reason, message))
}

fn truncate(mut message: String) -> String {
    flashsale_api::common::truncate(&mut message, MESSAGE_LIMIT);
    message
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{
            ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodCondition,
            PodStatus,
        },
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn pod(name: &str, component: &str, status: PodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(COMPONENT_KEY.to_owned(), component.to_owned())].into()),
                ..ObjectMeta::default()
            },
            status: Some(status),
            ..Pod::default()
        }
    }

    fn waiting(reason: &str, message: &str) -> ContainerStatus {
        ContainerStatus {
            name: "gateway".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }
    }

    fn with_containers(containers: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            container_statuses: Some(containers),
            ..PodStatus::default()
        }
    }

    #[test]
    fn a_bad_image_is_named_with_the_kubelets_reason() {
        let pods = [pod(
            "s-gateway-1",
            "gateway",
            with_containers(vec![waiting(
                "ImagePullBackOff",
                "Back-off pulling image \"nope:1\"",
            )]),
        )];
        assert_eq!(
            problems(&pods),
            vec![PodProblem {
                component: "gateway".into(),
                pod: "s-gateway-1".into(),
                reason: PodFailure::ImagePullBackOff,
                message: "container gateway: Back-off pulling image \"nope:1\"".into(),
            }]
        );
    }

    #[test]
    fn a_crash_loop_says_how_the_container_last_exited() {
        let mut crashing = waiting(
            "CrashLoopBackOff",
            "back-off 10s restarting failed container",
        );
        crashing.restart_count = 3;
        crashing.last_state = Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 2,
                reason: Some("Error".into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        });
        let found = problems(&[pod(
            "s-inventory-1",
            "inventory",
            with_containers(vec![crashing]),
        )]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].reason, PodFailure::CrashLoopBackOff);
        assert!(
            found[0]
                .message
                .ends_with("last exit code 2 (Error), 3 restarts"),
            "{}",
            found[0].message
        );
    }

    #[test]
    fn starting_pods_and_pods_being_deleted_are_not_problems() {
        let starting = pod(
            "s-gateway-1",
            "gateway",
            with_containers(vec![waiting("ContainerCreating", "")]),
        );
        let mut leaving = pod(
            "s-gateway-2",
            "gateway",
            with_containers(vec![waiting("CrashLoopBackOff", "")]),
        );
        leaving.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(problems(&[starting, leaving]).is_empty());
    }

    #[test]
    fn an_unschedulable_pod_carries_the_schedulers_message() {
        let status = PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/4 nodes are available: 4 Insufficient cpu.".into()),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        };
        let found = problems(&[pod("s-order-writer-1", "order-writer", status)]);
        assert_eq!(found[0].reason, PodFailure::Unschedulable);
        assert_eq!(
            found[0].message,
            "0/4 nodes are available: 4 Insufficient cpu."
        );
    }

    #[test]
    fn problems_are_ordered_and_long_messages_cut() {
        let long = "x".repeat(1000);
        let pods = [
            pod(
                "b",
                "inventory",
                with_containers(vec![waiting("ErrImagePull", &long)]),
            ),
            pod(
                "a",
                "gateway",
                with_containers(vec![waiting("ErrImagePull", "")]),
            ),
        ];
        let found = problems(&pods);
        assert_eq!(
            found.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(found[1].message.chars().count() <= MESSAGE_LIMIT + 1);
    }
}
