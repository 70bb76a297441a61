//! Disruption budgets for every workload and the gateway's autoscaler.

use k8s_openapi::{
    api::{
        autoscaling::v2::{
            CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec,
            MetricSpec, MetricTarget, ResourceMetricSource,
        },
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};

use super::{
    Owner, labels,
    names::{self, Component},
};
use flashsale_api::flashsale::Autoscaling;

/// The PodDisruptionBudget `<sale>-<component>`: voluntary evictions (node
/// drains) take one pod of a workload at a time.
pub(super) fn pod_disruption_budget(
    owner: &Owner<'_>,
    component: Component,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: owner.object_meta(names::workload(owner.sale, component), component),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(labels::selector(owner.name, component)),
                ..LabelSelector::default()
            }),
            // A pod that is not ready serves nothing; letting a drain evict it
            // keeps a crash-looping pod from blocking node maintenance.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".to_owned()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// The HorizontalPodAutoscaler `<sale>-gateway`, scaling the gateway's
/// Deployment on average CPU utilisation.
pub(super) fn gateway_autoscaler(
    owner: &Owner<'_>,
    autoscaling: &Autoscaling,
) -> HorizontalPodAutoscaler {
    HorizontalPodAutoscaler {
        metadata: owner.object_meta(names::gateway_autoscaler(owner.sale), Component::Gateway),
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".to_owned()),
                kind: "Deployment".to_owned(),
                name: names::workload(owner.sale, Component::Gateway),
            },
            min_replicas: Some(autoscaling.min_replicas),
            max_replicas: autoscaling.max_replicas,
            metrics: Some(vec![MetricSpec {
                type_: "Resource".to_owned(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".to_owned(),
                    target: MetricTarget {
                        type_: "Utilization".to_owned(),
                        average_utilization: Some(autoscaling.target_cpu_utilization_percent),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            ..HorizontalPodAutoscalerSpec::default()
        },
        ..HorizontalPodAutoscaler::default()
    }
}
