//! The ChaosDrill controller: runs Chaos Mesh experiments against a sale
//! on a cron in a time zone, only inside allowed windows, on pods it picks
//! itself under a blast-radius cap and a namespace budget, under an SLO
//! guard that aborts the run in milliseconds and fails closed, with Chaos
//! Mesh's own StatusCheck as the backstop when the operator goes silent.
//!
//! - [`calendar`]: when a run may start (cron, time zone, windows,
//!   blackouts), pure.
//! - [`blast`]: which pods, pure; [`budget`]: the namespace's cap held
//!   across runs, and the gate the kill switch closes.
//! - [`verdict`]: whether the SLOs hold, pure.
//! - [`chaos`]: the Chaos Mesh objects of a run.
//! - [`execute`]: the task that drives one run; [`guard`] what it shares;
//!   [`failover`] what an active failover run measures from buyers' side.
//! - [`stop`]: the one stop path (abort, end of run, takeover, kill switch).
//! - [`reconcile`]: scheduling, gates, status and Events.

pub mod blast;
pub mod budget;
pub mod buyer;
pub mod chaos;
pub mod execute;
pub mod failover;
pub mod guard;
pub mod promote;
pub mod readiness;
pub mod readings;
pub mod reconcile;
pub mod rpo;
pub mod status;
pub mod stop;
pub mod verdict;

use std::{
    collections::{BTreeSet, HashMap},
    future::Future,
    sync::Arc,
    time::Duration,
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt, controller,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::broadcast;

use flashsale_api::ChaosDrill;
use flashsale_api::reasons::DrillReason;
use flashsale_kit::{Context, Error, guarded, health::WatchHealth};
use flashsale_observe::signal::SignalReader;

pub use flashsale_api::chaosdrill::{
    ABORT_ANNOTATION, ABORT_REASON_ANNOTATION, CHECK_ANNOTATION, FORCE_ANNOTATION,
    KILL_SWITCH_ANNOTATION, RUN_NOW_ANNOTATION,
};

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
    /// The namespaces' budgets and kill gates.
    pub budgets: budget::Budgets,
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
            budgets: budget::Budgets::default(),
            wake,
        }
    }

    /// Asks for a reconcile of `drill` now (its run moved on).
    pub fn wake(&self, drill: &ChaosDrill) {
        // No receiver means the controller is not running: nothing to wake.
        let _ = self.wake.send(ObjectRef::from_obj(drill));
    }

    /// The URL of the guard of `namespace/drill`'s run `run`.
    pub fn guard_url(&self, namespace: &str, drill: &str, run: &str) -> String {
        format!("{}/guard/{namespace}/{drill}/{run}", self.guard_base_url)
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
/// ([`guarded`]) instead of stopping the watch of every other drill; the
/// kill switch and a drill's deletion still reach its run, since they act
/// on the operator's record of its runs and on the objects' labels.
pub async fn run(
    ctx: Arc<Ctx>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Guards from an earlier term are not running any more: forget them,
    // so their runs count as stale and are stopped first.
    ctx.settings.guards.clear();
    ctx.settings.budgets.clear();
    let (drills, trigger) = guarded::watch::<ChaosDrill>(
        ctx.client.clone(),
        namespace,
        watcher::Config::default().any_semantic(),
        guarded::Rejections::of(&ctx),
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
    let health = WatchHealth::current();
    // The kill switch is an annotation on the namespace.
    let switches = match namespace {
        None => namespace_watch(ctx.client.clone(), health.clone()).boxed(),
        Some(ns) => namespace_poll(ctx.client.clone(), ns.to_owned(), health.clone()).boxed(),
    };
    let switched = kill_switch_changes(ctx.clone(), switches, drills.clone());
    let deleted = deletions(ctx.clone(), namespace, health);
    let results = Controller::for_stream(trigger, drills)
        .reconcile_on(switched)
        .reconcile_on(woken)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile::reconcile,
            flashsale_kit::error_policy,
            ctx.clone(),
        );
    tokio::select! {
        () = flashsale_kit::report(reconcile::IDENTITY, results.boxed()) => {}
        () = deleted => {}
    }
    ctx.settings.guards.clear();
    ctx.settings.budgets.clear();
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

/// Stops every run the operator drives in `namespace` and removes every
/// Chaos Mesh object it made there, whichever drill they belong to and
/// whether or not that drill can still be read: the gate closes first (no
/// create under way can land after the sweep), then the guards end, then
/// the objects go.
pub async fn sweep(ctx: &Ctx, namespace: &str) -> Result<stop::Stopped, Error> {
    ctx.settings.budgets.close(namespace).await;
    for (key, guard) in ctx.settings.guards.remove_namespace(namespace) {
        guard.silence(DrillReason::KillSwitch);
        tracing::info!(
            drill = key,
            run = guard.run,
            "the kill switch ended the run"
        );
    }
    let stopped = stop::stop(
        &ctx.client,
        &ctx.leadership,
        ctx.clock.as_ref(),
        stop::Scope {
            namespace,
            selector: &chaos::managed_selector(),
            known: &[],
        },
        execute::STOP_BOUND,
    )
    .await?;
    ctx.settings.budgets.release_namespace(namespace);
    Ok(stopped)
}

/// Whether a namespace carries the kill switch.
fn switched_on(ns: &Namespace) -> bool {
    ns.annotations()
        .get(KILL_SWITCH_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// Every namespace's kill switch, as the watch of namespaces sees it.
fn namespace_watch(
    client: Client,
    health: Option<WatchHealth>,
) -> impl Stream<Item = (String, bool)> + Send + 'static {
    let namespaces: Api<Namespace> = Api::all(client);
    watcher::watcher(namespaces, watcher::Config::default())
        .touched_objects()
        .filter_map(move |result| {
            let health = health.clone();
            async move {
                match result {
                    Ok(ns) => Some((ns.name_any(), switched_on(&ns))),
                    Err(err) => {
                        let error = format!("watching namespaces for the kill switch: {err}");
                        tracing::warn!(
                            controller = reconcile::IDENTITY.name,
                            error,
                            "watch failed"
                        );
                        if let Some(health) = &health {
                            health.failed(reconcile::IDENTITY.name, &error);
                        }
                        None
                    }
                }
            }
        })
}

/// `namespace`'s kill switch, read every [`KILL_SWITCH_POLL`]. A failed read
/// counts as a watch error of the controller in `health`.
fn namespace_poll(
    client: Client,
    namespace: String,
    health: Option<WatchHealth>,
) -> impl Stream<Item = (String, bool)> + Send + 'static {
    let namespaces: Api<Namespace> = Api::all(client);
    let mut ticks = tokio::time::interval(KILL_SWITCH_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold(ticks, move |mut ticks| {
        let (namespaces, namespace, health) =
            (namespaces.clone(), namespace.clone(), health.clone());
        async move {
            ticks.tick().await;
            let read = match namespaces.get_opt(&namespace).await {
                Ok(ns) => Some((namespace, ns.as_ref().is_some_and(switched_on))),
                Err(err) => {
                    let error = format!("reading namespace {namespace} for its kill switch: {err}");
                    tracing::warn!(controller = reconcile::IDENTITY.name, error, "watch failed");
                    if let Some(health) = &health {
                        health.failed(reconcile::IDENTITY.name, &error);
                    }
                    None
                }
            };
            Some((read, ticks))
        }
    })
    .filter_map(futures::future::ready)
}

/// The drills to reconcile each time a namespace's kill switch changes. A
/// switch turned on is swept at once, before any drill is looked at: the
/// sweep reaches runs of drills the watch cannot read, and of drills whose
/// spec no longer validates.
fn kill_switch_changes(
    ctx: Arc<Ctx>,
    switches: impl Stream<Item = (String, bool)> + Send + 'static,
    drills: Store<ChaosDrill>,
) -> impl Stream<Item = ObjectRef<ChaosDrill>> + Send + 'static {
    let mut last: HashMap<String, bool> = HashMap::new();
    switches
        .filter_map(move |(namespace, on)| {
            // The first look at a namespace with the switch off changes
            // nothing: the controller's first list reconciles every drill.
            let changed = last.insert(namespace.clone(), on).map_or(on, |was| was != on);
            let woken = if changed {
                if on {
                    let ctx = ctx.clone();
                    let namespace = namespace.clone();
                    tokio::spawn(async move {
                        if let Err(err) = sweep(&ctx, &namespace).await {
                            tracing::warn!(namespace, %err, "the kill switch's sweep failed; each drill's reconcile sweeps again");
                        }
                    });
                }
                in_namespace(&drills, &namespace)
            } else {
                Vec::new()
            };
            futures::future::ready(Some(futures::stream::iter(woken)))
        })
        .flatten()
}

/// Ends the run of every drill that is deleted (or gone when the watch
/// lists again): its guard stops and its objects go at once, rather than
/// when the garbage collector gets to them. Watched as metadata only, so a
/// drill whose spec cannot be read is seen too. Also drops a deleted
/// drill's metric series.
async fn deletions(ctx: Arc<Ctx>, namespace: Option<&str>, health: Option<WatchHealth>) {
    let api: Api<PartialObjectMeta<ChaosDrill>> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
    let mut listing: BTreeSet<String> = BTreeSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Delete(drill)) => {
                let (key, uid) = (flashsale_kit::key(&drill), drill.uid().unwrap_or_default());
                end_deleted(&ctx, &key, &uid);
                ctx.metrics.forget_drill(&drill);
            }
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(drill)) => {
                listing.extend(drill.uid());
            }
            Ok(watcher::Event::InitDone) => {
                for (key, guard) in ctx.settings.guards.all() {
                    if !listing.contains(&guard.uid) {
                        end_deleted(&ctx, &key, &guard.uid);
                    }
                }
            }
            Ok(watcher::Event::Apply(_)) => {}
            Err(err) => {
                let error = format!("watching ChaosDrills for deletions: {err}");
                tracing::warn!(controller = reconcile::IDENTITY.name, error, "watch failed");
                if let Some(health) = &health {
                    health.failed(reconcile::IDENTITY.name, &error);
                }
            }
        }
    }
}

/// Stops the run of the deleted drill `key` (`uid`), if this replica
/// drives one.
fn end_deleted(ctx: &Arc<Ctx>, key: &str, uid: &str) {
    let Some(guard) = ctx.settings.guards.remove_drill(key, uid) else {
        return;
    };
    guard.silence(DrillReason::DrillDeleted);
    // Its spec, which names the promoted Redis, is gone with it.
    for promotion in guard.progress().record.promoted {
        if promotion.restored_at.is_none() {
            tracing::warn!(
                drill = key,
                redis = promotion.name,
                follows = promotion.follows,
                "the drill was deleted while the standby's Redis it promoted had not followed its primary again: have it follow by hand (REPLICAOF)"
            );
        }
    }
    let (namespace, drill) = key.split_once('/').unwrap_or_default();
    let (namespace, drill) = (namespace.to_owned(), drill.to_owned());
    let objects = chaos::parse_objects(&guard.progress().record.objects);
    let ctx = ctx.clone();
    tracing::info!(
        drill = key,
        run = guard.run,
        "the drill was deleted: its run ends now"
    );
    tokio::spawn(async move {
        // A create the stopped task left in flight lands before the list.
        guard.close_creates().await;
        let stopped = stop::stop(
            &ctx.client,
            &ctx.leadership,
            ctx.clock.as_ref(),
            stop::Scope {
                namespace: &namespace,
                selector: &chaos::run_selector(&drill, &guard.run),
                known: &objects,
            },
            execute::STOP_BOUND,
        )
        .await;
        ctx.settings
            .budgets
            .release(&namespace, &format!("{namespace}/{drill}/{}", guard.run));
        if let Err(err) = stopped {
            tracing::warn!(namespace, drill, %err, "stopping a deleted drill's run failed");
        }
    });
}
