//! The pure build step: the objects a FlashSale needs.
//!
//! [`build`] turns a sale, the default images and the sale's [`Stage`] into
//! every child object, ready for server-side apply: only the fields the
//! operator has an opinion on are set, because whatever is set is owned and
//! enforced on every apply. No I/O and no clock: the controller decides the
//! stage, this module only renders it.

mod config;
mod deployments;
mod internal;
mod network;
mod pod;
mod policy;
mod rbac;
mod secrets;
mod services;
mod workloads;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod tests;

use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Service, ServiceAccount},
    networking::v1::NetworkPolicy,
    policy::v1::PodDisruptionBudget,
    rbac::v1::{Role, RoleBinding},
};
use kube::Resource;

pub use config::{CONFIG_HASH_ANNOTATION, GATEWAY_CONFIG_KEY, INVENTORY_CONFIG_KEY};
pub use flashsale_api::children::{
    BuildError, COMPONENT_KEY, Component, MANAGED_BY, MANAGED_BY_KEY, NAME_KEY, OPS_PORT_NUMBER,
    Owner, PART_OF_KEY, degradation_config_map, labels, names, selector,
};
pub use internal::{ADMIN_TOKEN_KEY, API_TOKEN_KEY, DRILL_KEY, InternalTokens, internal_secret};
pub use secrets::secret_refs;

use flashsale_api::FlashSale;

/// Container images of the three workloads (the operator's flags give
/// defaults; a workload's `image` in the spec overrides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// Default gateway image.
    pub gateway: String,
    /// Default inventory image.
    pub inventory: String,
    /// Default order-writer image.
    pub order_writer: String,
}

/// How big the workloads are, decided by the sale's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before warm-up: every workload at 1 replica (0 if its spec asks 0), so
    /// a broken config shows days before the sale, at little cost. No HPA.
    Pending,
    /// Warming up or live: the spec's replicas (defaults gateway 2, inventory
    /// 2, order-writer 2). A gateway with `autoscaling` has NO replicas field
    /// in its Deployment (so the HPA owns it) and an HPA is built.
    Active,
    /// Ended but the order-writer may still have work: gateway 1 (answers
    /// "sale ended", takes payments of open reservations), inventory 1
    /// (confirms those payments; its sweeper returns unpaid stock),
    /// order-writer at the spec's replicas. No HPA. (A workload whose spec
    /// asks 0 replicas stays at 0.)
    Ending,
    /// Ended, reservations expired and the order-writer drained: everything
    /// at 0. No HPA.
    Drained,
}

/// What the build needs. `sale` must have metadata.name, metadata.namespace
/// and metadata.uid.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The sale, as read from the apiserver.
    pub sale: &'a FlashSale,
    /// Default images.
    pub images: &'a Images,
    /// Where the sale is in its life.
    pub stage: Stage,
    /// The operator's own namespace, whose pods may reach the inventory API
    /// and the order-writer's metrics.
    pub operator_namespace: &'a str,
}

/// Everything a sale needs, one Vec per kind, each sorted by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Desired {
    /// `<sale>-gateway`, `<sale>-inventory`, `<sale>-order-writer`.
    pub deployments: Vec<Deployment>,
    /// One per workload, same names.
    pub services: Vec<Service>,
    /// `<sale>-gateway` (`gateway.json`) and `<sale>-inventory` (`sale.json`);
    /// not the degradation map, see [`degradation_config_map`].
    pub config_maps: Vec<ConfigMap>,
    /// One per workload, same names.
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
    /// One per workload, same names: who may connect to its pods.
    pub network_policies: Vec<NetworkPolicy>,
    /// `<sale>-gateway` while [`Stage::Active`] with autoscaling, else none.
    pub horizontal_pod_autoscalers: Vec<HorizontalPodAutoscaler>,
    /// `<sale>-gateway`.
    pub service_accounts: Vec<ServiceAccount>,
    /// `<sale>-gateway`.
    pub roles: Vec<Role>,
    /// `<sale>-gateway`.
    pub role_bindings: Vec<RoleBinding>,
}

/// Builds every object the sale needs at its stage.
pub fn build(input: &Input<'_>) -> Result<Desired, BuildError> {
    let Input {
        sale,
        images,
        stage,
        operator_namespace,
    } = *input;
    let owner = Owner::new(sale)?;
    let sale_id = owner.sale_id();
    let gateway_config = config::gateway_json(sale, &sale_id)?;
    let sale_config = config::sale_json(sale, &sale_id)?;
    let templates = [
        (
            Component::Gateway,
            workloads::gateway(&owner, images, &gateway_config)?,
        ),
        (
            Component::Inventory,
            workloads::inventory(&owner, images, &sale_config)?,
        ),
        (
            Component::OrderWriter,
            workloads::order_writer(&owner, images)?,
        ),
    ];
    let autoscaler = sale
        .spec
        .gateway
        .autoscaling
        .as_ref()
        .filter(|_| deployments::gateway_autoscaled(sale, stage))
        .map(|autoscaling| policy::gateway_autoscaler(&owner, autoscaling));
    Ok(Desired {
        deployments: by_name(
            templates
                .into_iter()
                .map(|(component, template)| {
                    deployments::deployment(&owner, stage, component, template)
                })
                .collect(),
        ),
        services: by_name(
            Component::ALL
                .iter()
                .map(|&c| services::service(&owner, c))
                .collect(),
        ),
        config_maps: by_name(vec![
            config::gateway_config_map(&owner, &gateway_config),
            config::inventory_config_map(&owner, &sale_config),
        ]),
        pod_disruption_budgets: by_name(
            Component::ALL
                .iter()
                .map(|&c| policy::pod_disruption_budget(&owner, c))
                .collect(),
        ),
        network_policies: by_name(
            Component::ALL
                .iter()
                .map(|&c| network::network_policy(&owner, c, operator_namespace))
                .collect(),
        ),
        horizontal_pod_autoscalers: autoscaler.into_iter().collect(),
        service_accounts: vec![rbac::gateway_service_account(&owner)],
        roles: vec![rbac::gateway_role(&owner)],
        role_bindings: vec![rbac::gateway_role_binding(&owner)],
    })
}

/// The sale id the workloads know the sale by (`<namespace>.<name>.<uid8>`,
/// see [`names::sale_id`]); the operator's own calls to the inventory use it.
pub fn sale_id(sale: &FlashSale) -> Result<String, BuildError> {
    Ok(Owner::new(sale)?.sale_id())
}

/// Sorts objects by name, so the result does not depend on build order.
fn by_name<K: Resource>(mut objects: Vec<K>) -> Vec<K> {
    objects.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    objects
}
