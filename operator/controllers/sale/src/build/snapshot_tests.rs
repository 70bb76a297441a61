//! Snapshots of whole builds: review the `.snap` files like code.

use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Service, ServiceAccount},
    networking::v1::NetworkPolicy,
    policy::v1::PodDisruptionBudget,
    rbac::v1::{Role, RoleBinding},
};
use serde::Serialize;

use super::{Desired, Input, InternalTokens, Stage, build, fixtures, internal_secret};

/// `Desired` as one serializable document, kinds in a fixed order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Snapshot<'a> {
    deployments: &'a [Deployment],
    services: &'a [Service],
    config_maps: &'a [ConfigMap],
    pod_disruption_budgets: &'a [PodDisruptionBudget],
    network_policies: &'a [NetworkPolicy],
    horizontal_pod_autoscalers: &'a [HorizontalPodAutoscaler],
    service_accounts: &'a [ServiceAccount],
    roles: &'a [Role],
    role_bindings: &'a [RoleBinding],
}

impl<'a> From<&'a Desired> for Snapshot<'a> {
    fn from(d: &'a Desired) -> Self {
        Self {
            deployments: &d.deployments,
            services: &d.services,
            config_maps: &d.config_maps,
            pod_disruption_budgets: &d.pod_disruption_budgets,
            network_policies: &d.network_policies,
            horizontal_pod_autoscalers: &d.horizontal_pod_autoscalers,
            service_accounts: &d.service_accounts,
            roles: &d.roles,
            role_bindings: &d.role_bindings,
        }
    }
}

#[test]
fn big_sale_active() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let images = fixtures::images();
    let desired = build(&Input {
        sale: &sale,
        images: &images,
        stage: Stage::Active,
        operator_namespace: "flashsale-system",
    })?;
    insta::assert_yaml_snapshot!("big_sale_active", Snapshot::from(&desired));
    Ok(())
}

#[test]
fn small_sale_pending() -> anyhow::Result<()> {
    let sale = fixtures::small_sale()?;
    let images = fixtures::images();
    let desired = build(&Input {
        sale: &sale,
        images: &images,
        stage: Stage::Pending,
        operator_namespace: "flashsale-system",
    })?;
    insta::assert_yaml_snapshot!("small_sale_pending", Snapshot::from(&desired));
    // Fixed tokens: the operator makes random ones once.
    let tokens = InternalTokens {
        api: "a".repeat(64),
        admin: "b".repeat(64),
        drill: "c".repeat(64),
    };
    insta::assert_yaml_snapshot!("small_sale_internal", internal_secret(&sale, &tokens)?);
    Ok(())
}
