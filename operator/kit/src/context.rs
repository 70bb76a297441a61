//! A controller's context: what every controller shares (client, metrics,
//! clock, leadership), who this controller is, its own backoff and its own
//! settings.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use std::sync::Arc;

use kube::{
    Client, Resource, ResourceExt,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

use flashsale_api::reasons::Reason;

use crate::{clock::Clock, leader::Leadership, metrics::OperatorMetrics};

/// The longest Event note the apiserver takes (events.k8s.io/v1), in bytes.
pub const EVENT_NOTE_BOUND: usize = 1024;

/// Who a controller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Its name: the `controller` label of the metrics, the reporting
    /// controller of its Events, the `controller` field of its logs.
    pub name: &'static str,
    /// The field manager of its writes, so `managedFields` tells which
    /// controller set a field and one controller's apply never takes fields
    /// from another.
    pub field_manager: &'static str,
}

/// What every controller of this process shares.
#[derive(Clone)]
pub struct Shared {
    /// Kubernetes client.
    pub client: Client,
    /// The operator's metrics.
    pub metrics: OperatorMetrics,
    /// Time, injected.
    pub clock: Arc<dyn Clock>,
    /// Whether this replica may write.
    pub leadership: Leadership,
    /// This replica's name in Events.
    pub instance: String,
    /// Reconciles run at once, per controller.
    pub concurrency: u16,
}

/// One controller's context.
pub struct Context<S> {
    /// Kubernetes client.
    pub client: Client,
    /// The operator's metrics.
    pub metrics: OperatorMetrics,
    /// Time, injected.
    pub clock: Arc<dyn Clock>,
    /// Whether this replica may write.
    pub leadership: Leadership,
    /// Reconciles run at once.
    pub concurrency: u16,
    /// Who this controller is.
    pub id: Identity,
    /// This controller's own settings.
    pub settings: S,
    /// What it last applied to its children and what their watches saw.
    pub ledger: super::Ledger,
    recorder: Recorder,
    backoff: Backoff,
}

impl<S> Context<S> {
    /// The context of controller `id` over what the process shares.
    pub fn new(shared: &Shared, id: Identity, settings: S) -> Self {
        let reporter = Reporter {
            controller: id.field_manager.to_owned(),
            instance: Some(shared.instance.clone()),
        };
        Self {
            recorder: Recorder::new(shared.client.clone(), reporter),
            client: shared.client.clone(),
            metrics: shared.metrics.clone(),
            clock: shared.clock.clone(),
            leadership: shared.leadership.clone(),
            concurrency: shared.concurrency,
            id,
            settings,
            ledger: super::Ledger::default(),
            backoff: Backoff::default(),
        }
    }

    /// Publishes an Event on `object`. Events are best effort: a failure is
    /// logged, never returned, so it cannot turn a success into a retry.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: bool,
        reason: impl Reason,
        note: String,
    ) {
        self.event_of(object, warning, reason, "Reconcile", note)
            .await;
    }

    /// Publishes an Event of `action`. Events of one reason and action on
    /// one object fold into a series that keeps the first note, so an action
    /// that differs per occurrence (`Tier1To2`) keeps each one readable.
    /// Only the leader publishes: an Event is a write like any other, and a
    /// standby's would tell of runs and tiers it does not drive.
    pub async fn event_of<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: bool,
        reason: impl Reason,
        action: &str,
        note: String,
    ) {
        let reason = reason.as_str();
        let mut note = note;
        // The apiserver refuses a longer note, and with it the Event.
        flashsale_api::common::truncate(&mut note, EVENT_NOTE_BOUND);
        if !self.leadership.is_leader() {
            tracing::debug!(object = object.name_any(), reason, "not leading: no Event");
            return;
        }
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(object = object.name_any(), reason, %err, "publishing an Event failed");
        }
    }

    /// The next retry delay for `key` after one more failure in a row.
    pub fn backoff(&self, key: &str) -> Duration {
        self.backoff.next(key)
    }

    /// Forgets `key`'s failures after a success.
    pub fn reset_backoff(&self, key: &str) {
        self.backoff.reset(key);
    }
}

/// Per-object exponential backoff: 1 s, 2 s, 4 s … capped at 2 minutes. One
/// per controller, so objects of two kinds with one name never share a
/// count. Kept here rather than in the error policy because a missing Secret
/// is not an error (it is reported in the status) but still needs spacing out.
#[derive(Default)]
struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_CAP: Duration = Duration::from_secs(120);

impl Backoff {
    fn next(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = BACKOFF_FIRST
            .saturating_mul(1u32.checked_shl(*count).unwrap_or(u32::MAX))
            .min(BACKOFF_CAP);
        *count = count.saturating_add(1);
        delay
    }

    fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use flashsale_api::reasons::ErrorReason;
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    /// A context over a client whose every request is counted and answered
    /// `{}`, leading or not.
    pub(crate) fn counted(leads: bool) -> (Context<()>, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut answer = http::Response::new(kube::client::Body::from(b"{}".to_vec()));
            *answer.status_mut() = http::StatusCode::CREATED;
            std::future::ready(Ok::<_, std::convert::Infallible>(answer))
        });
        let shared = Shared {
            client: Client::new(service, "default"),
            metrics: OperatorMetrics::default(),
            clock: Arc::new(crate::clock::SystemClock),
            leadership: Leadership::fixed(leads),
            instance: "test".to_owned(),
            concurrency: 1,
        };
        let id = Identity {
            name: "test",
            field_manager: "flashsale-operator-test",
        };
        (Context::new(&shared, id, ()), requests)
    }

    /// A ConfigMap to hang Events on.
    pub(crate) fn object() -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("sale-degradation".to_owned()),
                namespace: Some("shop".to_owned()),
                ..kube::api::ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[tokio::test]
    async fn only_the_leader_publishes_events() {
        let (standby, requests) = counted(false);
        standby
            .event(
                &object(),
                true,
                ErrorReason::RunStopped,
                "a note".to_owned(),
            )
            .await;
        assert_eq!(
            requests.load(Ordering::SeqCst),
            0,
            "a standby wrote an Event"
        );
        let (leader, requests) = counted(true);
        leader
            .event(
                &object(),
                true,
                ErrorReason::RunStopped,
                "a note".to_owned(),
            )
            .await;
        assert!(
            requests.load(Ordering::SeqCst) > 0,
            "the leader wrote no Event"
        );
    }

    #[test]
    fn backoff_doubles_per_object_caps_and_resets() {
        let backoff = Backoff::default();
        let delays: Vec<u64> = (0..10).map(|_| backoff.next("a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 120, 120, 120]);
        assert_eq!(backoff.next("b"), Duration::from_secs(1));
        backoff.reset("a");
        assert_eq!(backoff.next("a"), Duration::from_secs(1));
        for _ in 0..100 {
            backoff.next("c");
        }
        assert_eq!(backoff.next("c"), BACKOFF_CAP);
    }
}
