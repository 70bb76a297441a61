//! The three Deployments, sized by the sale's [`Stage`].

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment},
        core::v1::PodTemplateSpec,
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};

use super::{
    Owner, Stage, labels,
    names::{self, Component},
    workloads::workload_spec,
};
use flashsale_api::FlashSale;

/// Replicas while warming up or live when the spec says nothing.
const DEFAULT_REPLICAS: i32 = 2;

/// Whether the HPA, not the Deployment, decides the gateway's replicas.
pub(super) fn gateway_autoscaled(sale: &FlashSale, stage: Stage) -> bool {
    stage == Stage::Active && sale.spec.gateway.autoscaling.is_some()
}

/// The `replicas` field of a workload's Deployment; `None` leaves it to the
/// HPA (a Deployment that sets it would fight the autoscaler on every apply).
pub(super) fn replicas(sale: &FlashSale, stage: Stage, component: Component) -> Option<i32> {
    let spec = workload_spec(sale, component)
        .replicas
        .unwrap_or(DEFAULT_REPLICAS)
        .max(0);
    // One replica at most, but a workload the spec switched off (0) stays off.
    let one = spec.min(1);
    match stage {
        Stage::Pending => Some(one),
        Stage::Active if component == Component::Gateway && gateway_autoscaled(sale, stage) => None,
        Stage::Active => Some(spec),
        Stage::Ending => match component {
            // Enough to answer "sale ended" and to take and confirm payments
            // of reservations still open; the order-writer drains at size.
            Component::Gateway | Component::Inventory => Some(one),
            Component::OrderWriter => Some(spec),
        },
        Stage::Drained => Some(0),
    }
}

/// Gateway and inventory never drop below their size during a rollout (a
/// sale cannot afford the dip); the order-writer replaces one pod at a time
/// without surging, so two generations never fight over partitions.
fn strategy(component: Component) -> DeploymentStrategy {
    let (max_unavailable, max_surge) = match component {
        Component::Gateway | Component::Inventory => {
            (IntOrString::Int(0), IntOrString::String("25%".to_owned()))
        }
        Component::OrderWriter => (IntOrString::Int(1), IntOrString::Int(0)),
    };
    DeploymentStrategy {
        type_: Some("RollingUpdate".to_owned()),
        rolling_update: Some(RollingUpdateDeployment {
            max_unavailable: Some(max_unavailable),
            max_surge: Some(max_surge),
        }),
    }
}

/// The Deployment `<sale>-<component>` running `template`.
pub(super) fn deployment(
    owner: &Owner<'_>,
    stage: Stage,
    component: Component,
    template: PodTemplateSpec,
) -> Deployment {
    Deployment {
        metadata: owner.object_meta(names::workload(owner.sale, component), component),
        spec: DeploymentSpec {
            replicas: replicas(owner.sale, stage, component),
            selector: LabelSelector {
                match_labels: Some(labels::selector(owner.name, component)),
                ..LabelSelector::default()
            },
            strategy: Some(strategy(component)),
            revision_history_limit: Some(3),
            template,
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    }
}
