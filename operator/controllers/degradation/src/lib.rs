//! The DegradationPolicy controller: reads a sale's load signal from
//! Prometheus, decides the degradation tier with hysteresis, a hold-down, a
//! signal-loss rule and on-call's override, writes the sale's switches
//! ConfigMap (`<sale>-degradation`, see the `flashsale-degradation` crate)
//! and measures how fast every gateway applies it.
//!
//! The policy is the only writer of that ConfigMap's data: it alone knows
//! the tier, and a second writer (the FlashSale controller recreating it at
//! tier 0, say) could put a sale back to full load in the middle of a spike.
//! A sale without a policy has no switches and its gateways run at tier 0.

pub mod decide;
pub mod expiry;
pub mod pace;
pub mod propagation;
pub mod reconcile;
pub mod status;

use std::{future::Future, sync::Arc, time::Duration};

use kube::runtime::{Controller, controller, watcher};

use flashsale_api::DegradationPolicy;
use flashsale_kit::{Context, guarded, health::WatchHealth};
use flashsale_observe::probe::Probe;

/// Held on every policy until its deletion has lifted the sale's
/// degradation.
pub const FINALIZER: &str = "flashsale.dev/lift-degradation";

/// The DegradationPolicy controller's settings.
pub struct Settings {
    /// Prometheus for policies that name none.
    pub prometheus_url: Option<String>,
    /// Reads the signal.
    pub signal: flashsale_observe::signal::SignalReader,
    /// Reads the gateways' applied generation.
    pub probe: Probe,
    /// How long a change may take to reach every gateway before the ones
    /// that lag are named in the `Propagated` condition.
    pub propagation_bound: Duration,
    /// When each policy is next evaluated.
    pub pace: pace::Pace,
}

/// The DegradationPolicy controller's context.
pub type Ctx = Context<Settings>;

/// Runs the DegradationPolicy controller until `shutdown` resolves.
/// `namespace` limits it to one namespace; `None` watches them all. A
/// policy the operator cannot read is left out and named in a Warning Event
/// ([`guarded`]) instead of stopping the watch of every other policy.
pub async fn run(
    ctx: Arc<Ctx>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (policies, trigger) = guarded::watch::<DegradationPolicy>(
        ctx.client.clone(),
        namespace,
        watcher::Config::default().any_semantic(),
        guarded::Rejections::of(&ctx),
    );
    let config = controller::Config::default().concurrency(ctx.concurrency);
    // A lapsed override is lifted even when its policy cannot be
    // evaluated or read ([`expiry`]).
    let keeper = expiry::run(ctx.clone(), namespace, WatchHealth::current());
    let results = Controller::for_stream(trigger, policies)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, flashsale_kit::error_policy, ctx);
    tokio::select! {
        () = flashsale_kit::report(reconcile::IDENTITY, results) => {}
        () = keeper => {}
    }
}
