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

use std::{future::Future, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        Controller, controller,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::broadcast;

use crate::{
    api::ChaosDrill,
    degradation::signal::SignalReader,
    kit::{self, Context, health::WatchHealth, lenient},
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

/// How often a controller limited to one namespace reads that namespace's
/// kill switch: it cannot watch the Namespace (a namespaced Role grants
/// `get` on its own namespace, never `list` or `watch`).
pub const KILL_SWITCH_POLL: Duration = Duration::from_secs(2);

/// Runs the ChaosDrill controller until `shutdown` resolves. `namespace`
/// limits it to one namespace; `None` watches them all. A drill the
/// operator cannot read is left out and named in a Warning Event
/// ([`lenient`]) instead of stopping the watch of every other drill.
pub async fn run(
    ctx: Arc<Ctx>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Guards from an earlier term are not running any more: forget them,
    // so their runs count as stale and are stopped first.
    ctx.settings.guards.clear();
    let (drills, trigger) = lenient::watch::<ChaosDrill>(
        ctx.client.clone(),
        namespace,
        watcher::Config::default().any_semantic(),
        lenient::Rejections::of(&ctx),
    );
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
    let controller = Controller::for_stream(trigger, drills.clone());
    // The kill switch is an annotation on the namespace.
    let controller = match namespace {
        None => {
            let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
            controller.watches(
                namespaces,
                watcher::Config::default(),
                move |ns: Namespace| in_namespace(&drills, &ns.name_any()),
            )
        }
        Some(ns) => controller.reconcile_on(kill_switch_changes(
            ctx.client.clone(),
            ns.to_owned(),
            drills,
            WatchHealth::current(),
        )),
    };
    let results = controller
        .reconcile_on(woken)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, kit::error_policy, ctx.clone());
    kit::report(reconcile::IDENTITY, results.boxed()).await;
    ctx.settings.guards.clear();
}

/// The drills of `namespace` in `drills`.
fn in_namespace(drills: &Store<ChaosDrill>, namespace: &str) -> Vec<ObjectRef<ChaosDrill>> {
    drills
        .state()
        .into_iter()
        .filter(|drill| drill.namespace().as_deref() == Some(namespace))
        .map(|drill| ObjectRef::from_obj(drill.as_ref()))
        .collect()
}

/// Every drill of `namespace` each time its kill-switch annotation changes,
/// read every [`KILL_SWITCH_POLL`]. A failed read counts as a watch error
/// of the controller in `health`.
fn kill_switch_changes(
    client: Client,
    namespace: String,
    drills: Store<ChaosDrill>,
    health: Option<WatchHealth>,
) -> impl Stream<Item = ObjectRef<ChaosDrill>> + Send + 'static {
    let namespaces: Api<Namespace> = Api::all(client);
    let mut ticks = tokio::time::interval(KILL_SWITCH_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The last value read; `None` before the first reading, which only sets
    // the baseline (the controller's first list reconciles every drill).
    let last: Option<Option<String>> = None;
    futures::stream::unfold((ticks, last), move |(mut ticks, last)| {
        let (namespaces, namespace, drills, health) = (
            namespaces.clone(),
            namespace.clone(),
            drills.clone(),
            health.clone(),
        );
        async move {
            ticks.tick().await;
            let now = match namespaces.get_opt(&namespace).await {
                Ok(ns) => {
                    Some(ns.and_then(|ns| ns.annotations().get(KILL_SWITCH_ANNOTATION).cloned()))
                }
                Err(err) => {
                    let error = format!("reading namespace {namespace} for its kill switch: {err}");
                    tracing::warn!(controller = reconcile::IDENTITY.name, error, "watch failed");
                    if let Some(health) = &health {
                        health.failed(reconcile::IDENTITY.name, &error);
                    }
                    None
                }
            };
            let woken = match (&last, &now) {
                (Some(before), Some(after)) if before != after => in_namespace(&drills, &namespace),
                _ => Vec::new(),
            };
            Some((futures::stream::iter(woken), (ticks, now.or(last))))
        }
    })
    .flatten()
}
