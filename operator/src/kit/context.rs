//! What every controller shares: the client, the event recorder, metrics, the
//! clock, the leadership view and the operator's settings.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::{
    Client, Resource, ResourceExt,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

use crate::{
    clock::Clock,
    flashsale::{allowlist::ImageAllowlist, build::Images, probe::Probe},
    leader::Leadership,
    metrics::OperatorMetrics,
};

/// The field manager of every server-side apply, and the Events' reporter.
pub const MANAGER: &str = "flashsale-operator";

/// Operator-wide settings the controllers read.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Default images of the workloads.
    pub images: Images,
    /// The images a FlashSale may name.
    pub allowed_images: ImageAllowlist,
    /// The operator's own namespace, let through the sales' NetworkPolicies
    /// to the inventory API and the order-writer's metrics.
    pub operator_namespace: String,
    /// How often a running sale's status (replicas, stock) is refreshed when
    /// nothing else wakes the controller.
    pub refresh: Duration,
    /// Reconciles run at once, per controller.
    pub concurrency: u16,
}

/// The shared context of the controllers.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Records Events on the objects reconciled.
    pub recorder: Recorder,
    /// The operator's metrics.
    pub metrics: OperatorMetrics,
    /// Time, injected.
    pub clock: Arc<dyn Clock>,
    /// Whether this replica may write.
    pub leadership: Leadership,
    /// Reads the workloads' own view (stock, lag).
    pub probe: Probe,
    /// Operator-wide settings.
    pub settings: Settings,
    backoff: Backoff,
}

impl Context {
    /// A context; `instance` names this replica in Events.
    pub fn new(
        client: Client,
        instance: &str,
        metrics: OperatorMetrics,
        clock: Arc<dyn Clock>,
        leadership: Leadership,
        probe: Probe,
        settings: Settings,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_owned(),
            instance: Some(instance.to_owned()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            clock,
            leadership,
            probe,
            settings,
            backoff: Backoff::default(),
        }
    }

    /// Publishes an Event on `object`. Events are best effort: a failure is
    /// logged, never returned, so it cannot turn a success into a retry.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".to_owned(),
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

/// Per-object exponential backoff: 1 s, 2 s, 4 s … capped at 2 minutes. Kept
/// here rather than in the controller's error policy because a missing Secret
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
mod tests {
    use super::*;

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
