//! Names of a sale's children, in one place so the controller, the prune step
//! and the tests agree on them.

use crate::{FlashSale, common::SecretKeyRef};
use kube::ResourceExt;

/// The three workloads of a sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    /// The public entry.
    Gateway,
    /// Stock reservations in Redis.
    Inventory,
    /// Kafka → SQL order persistence.
    OrderWriter,
}

impl Component {
    /// Every component, in name order (so lists built from it are sorted).
    pub const ALL: [Self; 3] = [Self::Gateway, Self::Inventory, Self::OrderWriter];

    /// The `app.kubernetes.io/component` value and the suffix of child names.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Gateway => "gateway",
            Self::Inventory => "inventory",
            Self::OrderWriter => "order-writer",
        }
    }
}

/// `<sale>-<component>`: the Deployment, Service and PodDisruptionBudget of a
/// workload.
pub fn workload(sale: &FlashSale, component: Component) -> String {
    child(&sale.name_any(), component.label())
}

/// `<sale>-<component>`: the NetworkPolicy of a workload's pods.
pub fn network_policy(sale: &FlashSale, component: Component) -> String {
    workload(sale, component)
}

/// `<sale>-degradation`: the switches ConfigMap the gateways watch.
pub fn degradation(sale: &FlashSale) -> String {
    child(&sale.name_any(), "degradation")
}

/// `<sale>-gateway`: the ConfigMap holding `gateway.json`.
pub fn gateway_config(sale: &FlashSale) -> String {
    workload(sale, Component::Gateway)
}

/// `<sale>-inventory`: the ConfigMap holding `sale.json`.
pub fn inventory_config(sale: &FlashSale) -> String {
    workload(sale, Component::Inventory)
}

/// `<sale>-gateway`: the gateway's HorizontalPodAutoscaler.
pub fn gateway_autoscaler(sale: &FlashSale) -> String {
    workload(sale, Component::Gateway)
}

/// `<sale>-gateway`: the ServiceAccount the gateway pods run as.
pub fn gateway_service_account(sale: &FlashSale) -> String {
    workload(sale, Component::Gateway)
}

/// `<sale>-gateway`: the Role letting the gateway read its degradation
/// ConfigMap.
pub fn gateway_role(sale: &FlashSale) -> String {
    workload(sale, Component::Gateway)
}

/// `<sale>-gateway`: the RoleBinding of that Role to that ServiceAccount.
pub fn gateway_role_binding(sale: &FlashSale) -> String {
    workload(sale, Component::Gateway)
}

/// `<sale>-internal`: the Secret holding the inventory API's tokens.
pub fn internal_secret(sale: &FlashSale) -> String {
    child(&sale.name_any(), "internal")
}

/// Key of the internal Secret's drill key: drill buyer tokens are signed
/// with it (`flashsale_drill_buyer`). Held by the gateways, and read by the
/// operator, which signs them.
pub const DRILL_KEY: &str = "drill-buyer-key";

/// The sale's drill key: `spec.gateway.drillKeySecretRef`, or else the
/// internal Secret's.
pub fn drill_key(sale: &FlashSale) -> SecretKeyRef {
    sale.spec
        .gateway
        .drill_key_secret_ref
        .clone()
        .unwrap_or_else(|| SecretKeyRef {
            name: internal_secret(sale),
            key: DRILL_KEY.to_owned(),
        })
}

/// `flashsale-order-writer.<namespace>.<sale>`: one Kafka consumer group per
/// sale, so two sales (or two namespaces) never share offsets.
pub fn order_writer_group(namespace: &str, sale_name: &str) -> String {
    format!("flashsale-order-writer.{namespace}.{sale_name}")
}

/// The sale id the workloads key everything by (Redis keys, inventory URL
/// paths, order events and rows): `<namespace>.<name>.<uid8>`, where `uid8` is
/// the first 8 hex digits of metadata.uid without dashes. The name alone is
/// not enough: two namespaces may hold sales of one name, and a sale deleted
/// and created again must not find the old one's stock or counters. At most
/// 63 + 1 + 50 + 1 + 8 = 123 characters, within the workloads' 128.
pub fn sale_id(namespace: &str, name: &str, uid: &str) -> String {
    let uid8: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    format!("{namespace}.{name}.{uid8}")
}

fn child(sale_name: &str, suffix: &str) -> String {
    format!("{sale_name}-{suffix}")
}
