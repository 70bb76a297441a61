//! What every controller plugs into: its context ([`Context`], with its
//! [`Identity`], backoff and settings), the one reconcile wrapper (timing,
//! metrics, span, leadership, warning log and Event), the one error policy
//! and the reporting of the controller's stream.
//!
//! A controller is its reconcile body — a function of (object, context)
//! that gathers, decides with pure functions, and writes through
//! [`crate::apply`] — plus a `run` that builds its `kube` Controller and
//! hands the stream to [`report`].
//!
//! Beside it: the apply choke point ([`apply`]), the injected clock
//! ([`clock`]), leader election ([`leader`]) and the operator's metrics
//! ([`metrics`]). The kit knows the API types but no controller.

pub mod apply;
pub mod clock;
pub mod context;
pub mod error;
pub mod guarded;
pub mod health;
pub mod leader;
pub mod ledger;
pub mod metrics;
#[cfg(feature = "mock")]
pub mod mock;

use std::{future::Future, sync::Arc, time::Instant};

use futures::{Stream, StreamExt};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        controller::{self, Action},
        reflector::ObjectRef,
        watcher,
    },
};
use tracing::Instrument;

use crate::apply::Namespaced;

pub use context::{Context, Identity, Shared};
pub use error::{Error, Failure, ReconcileError, Verb};
pub use ledger::{ChildKey, Ledger};

/// What stops an object before its controller acts on it; reported as a
/// condition and, when it changes, a Warning Event, with a reason of the
/// object's kind (`R`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker<R> {
    /// Condition reason (`InvalidSpec`, `SecretMissing`, `SaleNotFound`…).
    pub reason: R,
    /// What is wrong and what to do, naming the object or field.
    pub message: String,
}

/// An `Api` over one namespace, or over all of them when `namespace` is
/// `None` (a controller's watch scope).
pub fn api<K: Namespaced>(client: &Client, namespace: Option<&str>) -> Api<K> {
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// `namespace/name`, the key of an object in logs, spans and the backoff.
pub fn key<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Runs `body` as one reconcile of `object`: in a span naming the
/// controller and the object, timed and counted, and on failure logged and
/// published as a Warning Event under the error's reason — except when the
/// replica merely stopped leading, which must not write, Events included. A
/// success resets the object's backoff.
pub async fn reconcile<K, S, E, F, Fut>(
    object: Arc<K>,
    ctx: Arc<Context<S>>,
    body: F,
) -> Result<Action, E>
where
    K: Resource<DynamicType = ()>,
    E: ReconcileError,
    F: FnOnce(Arc<K>, Arc<Context<S>>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
{
    let key = key(object.as_ref());
    let span = tracing::info_span!("reconcile", controller = ctx.id.name, object = %key);
    async move {
        let started = Instant::now();
        let result = body(object.clone(), ctx.clone()).await;
        let name = ctx.id.name;
        ctx.metrics
            .reconciled(name, result.is_ok(), started.elapsed());
        // A success ends the run of failures: the next one retries after
        // the first step again, not after the last.
        if result.is_ok() {
            ctx.reset_backoff(&key);
        }
        if let Err(err) = &result {
            ctx.metrics.failed(name, err.reason().as_str());
            if !err.not_leader() {
                tracing::warn!(reason = err.reason().as_str(), %err, "reconcile failed");
                ctx.event(object.as_ref(), true, err.reason(), err.to_string())
                    .await;
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// After a failed reconcile: retry with the object's exponential backoff,
/// counted per controller.
pub fn error_policy<K: Resource, S, E>(object: Arc<K>, _err: &E, ctx: Arc<Context<S>>) -> Action {
    Action::requeue(ctx.backoff(&key(object.as_ref())))
}

/// Drives a controller's stream to its end. Reconcile failures were already
/// logged and published by [`reconcile`]; what remains is reported here:
///
/// - a watch that fails (a list or watch refused for lack of permission, a
///   missing CRD, a broken stream) is a warning, counted in
///   `flashsale_operator_watch_errors_total{controller}` and recorded in the
///   task's [`health::WatchHealth`] (set by [`health::WatchHealth::scope`]), which fails the
///   controller's `/readyz` check until its watches go quiet;
/// - a watch that merely expired (410 Gone: the watcher lists again) is a
///   debug line, as is a reconcile scheduled for an object that has since
///   left the store;
/// - anything else the runtime reports is a warning.
pub async fn report<K, E>(
    id: Identity,
    results: impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, watcher::Error>>>,
) where
    K: Resource,
    E: std::error::Error + 'static,
{
    let health = health::WatchHealth::current();
    let health = &health;
    results
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                Err(controller::Error::ReconcilerFailed(err, object)) => {
                    tracing::debug!(controller = id.name, %object, %err, "reconcile not completed");
                }
                Err(controller::Error::ObjectNotFound(object)) => {
                    tracing::debug!(controller = id.name, %object, "object left the store before its reconcile");
                }
                Err(controller::Error::QueueError(err)) if watch_expired(&err) => {
                    tracing::debug!(controller = id.name, error = %err, "watch expired: listing again");
                }
                Err(controller::Error::QueueError(err)) => {
                    tracing::warn!(controller = id.name, error = %err, "watch failed");
                    match health {
                        Some(health) => health.failed(id.name, &err),
                        None => tracing::debug!(
                            controller = id.name,
                            "no watch health in this task: the error is only logged"
                        ),
                    }
                }
                Err(err) => {
                    tracing::warn!(controller = id.name, error = %err, "controller stream error")
                }
            }
        })
        .await;
}

/// Whether `err` only says the watch's resource version expired (410 Gone),
/// after which the watcher lists again: routine, not a failure.
fn watch_expired(err: &watcher::Error) -> bool {
    matches!(err, watcher::Error::WatchError(status) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_success_resets_the_objects_backoff() {
        let (ctx, _) = context::tests::counted(true);
        let ctx = Arc::new(ctx);
        let object = Arc::new(context::tests::object());
        let key = key(object.as_ref());
        // Seven failures in a row: the next retry would wait 2 minutes.
        for _ in 0..7 {
            ctx.backoff(&key);
        }
        assert_eq!(ctx.backoff(&key), std::time::Duration::from_secs(120));
        let done: Result<Action, Error> = reconcile(object, ctx.clone(), |_, _| async {
            Ok(Action::await_change())
        })
        .await;
        assert!(done.is_ok());
        assert_eq!(ctx.backoff(&key), std::time::Duration::from_secs(1));
    }
}
