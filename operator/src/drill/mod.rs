//! The ChaosDrill controller: runs Chaos Mesh experiments against a sale
//! on a cron in a time zone, only inside allowed windows, on pods it picks
//! itself under a blast-radius cap and a namespace budget, under an SLO
//! guard that aborts the run in milliseconds and fails closed, with Chaos
//! Mesh's own StatusCheck as the backstop when the operator goes silent.
//!
//! - [`calendar`]: when a run may start (cron, time zone, windows,
//!   blackouts), pure.
//! - [`blast`]: which pods, pure.
//! - [`verdict`]: whether the SLOs hold, pure.
//! - [`chaos`]: the Chaos Mesh objects of a run.
//! - [`execute`]: the task that drives one run; [`guard`] what it shares.
//! - [`stop`]: the one stop path (abort, end of run, takeover, kill switch).
//! - [`reconcile`]: scheduling, gates, status and Events.

pub mod blast;
pub mod calendar;
pub mod chaos;
pub mod execute;
pub mod guard;
pub mod reconcile;
pub mod stop;
pub mod verdict;

use std::{future::Future, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller, reflector::ObjectRef, watcher},
};
use tokio::sync::broadcast;

use crate::{
    api::ChaosDrill,
    degradation::signal::SignalReader,
    kit::{self, Context},
};

/// Annotation on a drill asking for a run now; its value names the
/// request, and each new value starts one run (still inside the windows).
pub const RUN_NOW_ANNOTATION: &str = "flashsale.dev/run-now";
/// Annotation on a drill that, together with a run-now request, lifts the
/// windows and blackouts for that run; its value says who and why.
pub const FORCE_ANNOTATION: &str = "flashsale.dev/force-reason";
/// Annotation on a namespace that stops every run in it and removes every
/// experiment the operator created there, while it is `"true"`.
pub const KILL_SWITCH_ANNOTATION: &str = "flashsale.dev/chaos-kill-switch";

/// The ChaosDrill controller's settings.
pub struct Settings {
    /// Prometheus for drills that name none.
    pub prometheus_url: Option<String>,
    /// Asks Prometheus.
    pub signal: SignalReader,
    /// Base URL at which Chaos Mesh reaches this replica's ops server.
    pub guard_base_url: String,
    /// The operator-wide kill switch (`--chaos-kill-switch`).
    pub kill_switch: bool,
    /// The guards of the runs this replica drives.
    pub guards: guard::Guards,
    wake: broadcast::Sender<ObjectRef<ChaosDrill>>,
}

impl Settings {
    /// The settings; the guards are shared with the ops server's
    /// `/guard` endpoint.
    pub fn new(
        prometheus_url: Option<String>,
        signal: SignalReader,
        guard_base_url: String,
        kill_switch: bool,
        guards: guard::Guards,
    ) -> Self {
        let (wake, _) = broadcast::channel(1024);
        Self {
            prometheus_url,
            signal,
            guard_base_url: guard_base_url.trim_end_matches('/').to_owned(),
            kill_switch,
            guards,
            wake,
        }
    }

    /// Asks for a reconcile of `drill` now (its run moved on).
    pub fn wake(&self, drill: &ChaosDrill) {
        // No receiver means the controller is not running: nothing to wake.
        let _ = self.wake.send(ObjectRef::from_obj(drill));
    }

    /// The URL of `namespace/drill`'s guard.
    pub fn guard_url(&self, namespace: &str, drill: &str) -> String {
        format!("{}/guard/{namespace}/{drill}", self.guard_base_url)
    }
}

/// The ChaosDrill controller's context.
pub type Ctx = Context<Settings>;

/// Runs the ChaosDrill controller until `shutdown` resolves. `namespace`
/// limits it to one namespace; `None` watches them all.
pub async fn run(
    ctx: Arc<Ctx>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Guards from an earlier term are not running any more: forget them,
    // so their runs count as stale and are stopped first.
    ctx.settings.guards.clear();
    let drills: Api<ChaosDrill> = kit::api(&ctx.client, namespace);
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let namespaces_config = match namespace {
        Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
        None => watcher::Config::default(),
    };
    let wake = ctx.settings.wake.subscribe();
    let woken = futures::stream::unfold(wake, |mut wake| async move {
        loop {
            match wake.recv().await {
                Ok(object) => return Some((object, wake)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let config = controller::Config::default().concurrency(ctx.concurrency);
    let controller = Controller::new(drills, watcher::Config::default().any_semantic());
    let store = controller.store();
    let results = controller
        // The kill switch is an annotation on the namespace.
        .watches(namespaces, namespaces_config, move |ns: Namespace| {
            let name = ns.name_any();
            store
                .state()
                .into_iter()
                .filter(|drill| drill.namespace().as_deref() == Some(name.as_str()))
                .map(|drill| ObjectRef::from_obj(drill.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_on(woken)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, kit::error_policy, ctx.clone());
    kit::report(reconcile::IDENTITY, results.boxed()).await;
    ctx.settings.guards.clear();
}
