//! The FlashSale controller: deploys a sale's workloads, walks it through its
//! phases on exact timers, and reports it in its status.

pub mod allowlist;
pub mod build;
pub mod drain;
pub mod lifecycle;
pub mod pace;
pub mod reconcile;
pub mod status;
pub mod tokens;
pub mod triggers;

use std::{future::Future, sync::Arc, time::Duration};

use kube::runtime::{Controller, WatchStreamExt, controller, predicates, watcher};

use flashsale_api::FlashSale;
use flashsale_kit::Context;

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
    pub probe: flashsale_observe::probe::Probe,
    /// The sales' Deployments as last watched, for the status.
    pub workloads: Arc<triggers::Workloads>,
    /// When each sale's stock is read next.
    pub stock_pace: Arc<pace::StockPace>,
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
    // One sale the Rust type cannot read is named and left out, instead of
    // failing the watch of every other sale.
    let (reader, trigger) = flashsale_kit::guarded::watch::<FlashSale>(
        ctx.client.clone(),
        namespace,
        watcher::Config::default().any_semantic(),
        flashsale_kit::guarded::Rejections::of(&ctx),
    );
    // A sale is reconciled when its spec changes (its generation), not when
    // its status does: the status is the operator's own write.
    let sales = trigger.predicate_filter(predicates::generation, Default::default());
    // Bounded concurrency: hundreds of sales created at once must not become
    // thousands of requests in flight, which time out at the apiserver and
    // hold memory here.
    let config = controller::Config::default().concurrency(ctx.concurrency);
    let results = Controller::for_stream(sales, reader)
        .with_config(config)
        .reconcile_on(triggers::triggers(&ctx, namespace))
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, flashsale_kit::error_policy, ctx);
    flashsale_kit::report(reconcile::IDENTITY, results).await;
}
