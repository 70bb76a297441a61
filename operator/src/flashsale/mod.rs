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

use std::{future::Future, sync::Arc};

use futures::StreamExt;
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

use crate::{api::FlashSale, apply::Namespaced, context::Context};

/// Runs the FlashSale controller until `shutdown` resolves. `namespace`
/// limits it to one namespace; `None` watches them all.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let sales: Api<FlashSale> = api(&ctx, namespace);
    // Only the operator's own children: a change to one (a hand edit, a
    // deletion, new ready replicas) wakes its sale.
    let children = watcher::Config::default().labels(&format!(
        "app.kubernetes.io/managed-by={}",
        build::MANAGED_BY
    ));
    // Bounded concurrency: hundreds of sales created at once must not become
    // thousands of requests in flight, which time out at the apiserver and
    // hold memory here.
    let config = controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::new(sales, watcher::Config::default().any_semantic())
        .with_config(config)
        .owns(api::<Deployment>(&ctx, namespace), children.clone())
        .owns(api::<Service>(&ctx, namespace), children.clone())
        .owns(api::<ConfigMap>(&ctx, namespace), children.clone())
        .owns(
            api::<PodDisruptionBudget>(&ctx, namespace),
            children.clone(),
        )
        .owns(
            api::<HorizontalPodAutoscaler>(&ctx, namespace),
            children.clone(),
        )
        .owns(api::<NetworkPolicy>(&ctx, namespace), children.clone())
        .owns(api::<ServiceAccount>(&ctx, namespace), children.clone())
        .owns(api::<Role>(&ctx, namespace), children.clone())
        .owns(api::<RoleBinding>(&ctx, namespace), children.clone())
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
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(%err, "reconcile not completed");
            }
        })
        .await;
}

fn api<K: Namespaced>(ctx: &Context, namespace: Option<&str>) -> Api<K> {
    match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    }
}
