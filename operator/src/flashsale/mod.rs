//! The FlashSale controller: deploys a sale's workloads, walks it through its
//! phases on exact timers, and reports it in its status.

pub mod allowlist;
pub mod build;
pub mod drain;
pub mod lifecycle;
pub mod pods;
pub mod probe;
pub mod reconcile;
pub mod status;
pub mod tokens;

use std::{future::Future, sync::Arc, time::Duration};

use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Pod, Service, ServiceAccount},
    networking::v1::NetworkPolicy,
    policy::v1::PodDisruptionBudget,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, ResourceExt,
    core::PartialObjectMeta,
    runtime::{Controller, controller, reflector::ObjectRef, watcher},
};

use crate::{
    api::FlashSale,
    kit::{self, Context},
};

/// The FlashSale controller's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Default images of the workloads.
    pub images: build::Images,
    /// The images a FlashSale may name.
    pub allowed_images: allowlist::ImageAllowlist,
    /// The operator's own namespace, let through the sales' NetworkPolicies
    /// to the inventory API and the order-writer's metrics.
    pub operator_namespace: String,
    /// How often a running sale's status (replicas, stock) is refreshed when
    /// nothing else wakes the controller.
    pub refresh: Duration,
    /// Reads the workloads' own view (stock, lag).
    pub probe: probe::Probe,
}

/// The FlashSale controller's context.
pub type Ctx = Context<Settings>;

/// Runs the FlashSale controller until `shutdown` resolves. `namespace`
/// limits it to one namespace; `None` watches them all.
pub async fn run(
    ctx: Arc<Ctx>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let sales: Api<FlashSale> = kit::api(&ctx.client, namespace);
    // Only the operator's own children: a change to one (a hand edit, a
    // deletion, new ready replicas) wakes its sale.
    let children = watcher::Config::default().labels(&format!(
        "app.kubernetes.io/managed-by={}",
        build::MANAGED_BY
    ));
    // Bounded concurrency: hundreds of sales created at once must not become
    // thousands of requests in flight, which time out at the apiserver and
    // hold memory here.
    let config = controller::Config::default().concurrency(ctx.concurrency);
    let results = Controller::new(sales, watcher::Config::default().any_semantic())
        .with_config(config)
        .owns(
            kit::api::<Deployment>(&ctx.client, namespace),
            children.clone(),
        )
        .owns(
            kit::api::<Service>(&ctx.client, namespace),
            children.clone(),
        )
        .owns(
            kit::api::<ConfigMap>(&ctx.client, namespace),
            children.clone(),
        )
        .owns(
            kit::api::<PodDisruptionBudget>(&ctx.client, namespace),
            children.clone(),
        )
        .owns(
            kit::api::<HorizontalPodAutoscaler>(&ctx.client, namespace),
            children.clone(),
        )
        .owns(
            kit::api::<NetworkPolicy>(&ctx.client, namespace),
            children.clone(),
        )
        .owns(
            kit::api::<ServiceAccount>(&ctx.client, namespace),
            children.clone(),
        )
        .owns(kit::api::<Role>(&ctx.client, namespace), children.clone())
        .owns(
            kit::api::<RoleBinding>(&ctx.client, namespace),
            children.clone(),
        )
        // Pods belong to ReplicaSets, not to the sale: a pod that starts,
        // becomes ready or fails wakes the sale named by its part-of label.
        // Metadata only: every change still arrives, at a fraction of the
        // memory; the reconcile reads full pods only while some are short.
        .watches(
            match namespace {
                Some(ns) => Api::<PartialObjectMeta<Pod>>::namespaced(ctx.client.clone(), ns),
                None => Api::all(ctx.client.clone()),
            },
            children,
            |pod| {
                let sale = pod.labels().get(build::PART_OF_KEY)?;
                Some(ObjectRef::new(sale).within(&pod.namespace()?))
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, kit::error_policy, ctx);
    kit::report(reconcile::IDENTITY, results).await;
}
