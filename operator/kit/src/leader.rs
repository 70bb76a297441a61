//! Leader election through a coordination.k8s.io/v1 Lease.
//!
//! Several replicas of the operator run, but only one may reconcile and write
//! at a time. They compete for one Lease with the semantics of client-go's
//! `leaderelection`:
//!
//! - A candidate takes the lease when it does not exist, names no holder, or
//!   has not changed for `leaseDurationSeconds` *as measured by the
//!   candidate's own monotonic clock from when it saw the record change*. The
//!   `renewTime` written by another machine is never compared with the local
//!   wall clock, so clock skew between nodes does not matter.
//! - Every write replaces the object read, with its `resourceVersion`; a 409
//!   Conflict means another replica wrote first, and we re-read.
//! - The leader renews every `retry_period`. If it has not renewed within
//!   `renew_deadline` (shorter than the lease duration) it steps down at once,
//!   before any other replica can consider the lease expired; if it sees
//!   another holder it steps down at once too.
//! - On shutdown the leader steps down, then clears the holder, so a standby
//!   takes over at its next poll instead of waiting out the lease.
//!
//! The rest of the process reads leadership through [`Leadership`], a cheap
//! synchronous view over a `watch` channel.

mod decide;
mod elector;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::{sync::watch, task::JoinHandle};

/// Settings of the election.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Namespace the Lease lives in.
    pub namespace: String,
    /// Name of the Lease, e.g. `flashsale-operator`.
    pub name: String,
    /// This replica's identity, written as the holder; unique per process,
    /// e.g. `<hostname>-<uuid8>`, so a restarted pod never mistakes its
    /// predecessor's lease for its own.
    pub identity: String,
    /// How long a lease stays valid for the others after they saw it change.
    /// Written to the Lease in whole seconds (rounded up). Default 15 s.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal. Must be
    /// shorter than `lease_duration` so the leader has stopped before anyone
    /// else may take over. Default 10 s.
    pub renew_deadline: Duration,
    /// How often candidates poll and the leader renews. Default 2 s.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// Settings with client-go's default timings: lease 15 s, renew deadline
    /// 10 s, retry period 2 s.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Checks that the names are set and `0 < retry_period < renew_deadline <
    /// lease_duration`: otherwise the leader could still act after the others
    /// consider its lease expired, or would step down between two renewals.
    pub fn check(&self) -> Result<(), LeaderError> {
        let invalid = |reason: String| Err(LeaderError::Settings(reason));
        if self.namespace.is_empty() {
            return invalid("namespace is empty".to_owned());
        }
        if self.name.is_empty() {
            return invalid("lease name is empty".to_owned());
        }
        if self.identity.is_empty() {
            return invalid("identity is empty".to_owned());
        }
        if self.retry_period.is_zero() {
            return invalid("retry_period must be greater than zero".to_owned());
        }
        if self.retry_period >= self.renew_deadline {
            return invalid(format!(
                "retry_period ({:?}) must be shorter than renew_deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid(format!(
                "renew_deadline ({:?}) must be shorter than lease_duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        if decide::duration_seconds(self.lease_duration).is_none() {
            return invalid(format!(
                "lease_duration ({:?}) does not fit leaseDurationSeconds",
                self.lease_duration
            ));
        }
        Ok(())
    }

    /// `namespace/name`, for logs and errors.
    fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why the election task ended with an error. Errors talking to the
/// apiserver while electing are not among them: those are logged and retried.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The settings are inconsistent (see [`LeaseSettings::check`]); the
    /// election never started and this replica never leads.
    #[error("invalid leader election settings: {0}")]
    Settings(String),
    /// Shutting down, the lease could not be released; the standby takes
    /// over once the lease expires instead of at once.
    #[error("could not release lease {lease}: {source}")]
    Release {
        /// `namespace/name` of the Lease.
        lease: String,
        /// What the apiserver said.
        #[source]
        source: kube::Error,
    },
    /// Shutting down, releasing the lease took too long and was abandoned.
    #[error("releasing lease {lease} timed out after {after:?}")]
    ReleaseTimedOut {
        /// `namespace/name` of the Lease.
        lease: String,
        /// How long we waited.
        after: Duration,
    },
}

/// Shared view of whether this replica leads right now. Clone is cheap.
///
/// Leading means: the election task has renewed the lease within the renew
/// deadline and has seen no other holder. It turns false before the lease
/// could expire for the others, when the task ends, and when it is aborted.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// Keeps the channel of [`Leadership::always`] open, so `lost` never
    /// resolves there; `None` for an election, whose task owns the sender.
    _always: Option<Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// A Leadership that always leads (leader election turned off: a single replica).
    pub fn always() -> Self {
        Self::fixed(true)
    }

    /// A Leadership that leads, or does not, for good.
    pub(crate) fn fixed(leads: bool) -> Self {
        let (tx, rx) = watch::channel(leads);
        Self {
            rx,
            _always: Some(Arc::new(tx)),
        }
    }

    /// Whether this replica leads right now. Cheap and synchronous: one read
    /// of a shared value, no I/O.
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves when this replica leads (at once if it does). Once the
    /// election has ended without leading it can never lead again, so this
    /// then never resolves.
    pub async fn acquired(&mut self) {
        if self.rx.wait_for(|leads| *leads).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when this replica stops leading (at once if it does not lead).
    pub async fn lost(&mut self) {
        // A closed channel means the election ended, which always clears the
        // flag first; either way this replica no longer leads.
        let _ = self.rx.wait_for(|leads| !*leads).await;
    }
}

/// Runs the election until `shutdown` resolves; then releases the lease if held. Returns the Leadership view at once and the task handle.
///
/// The task ends with an error only for invalid settings (at once) or a
/// failed release; apiserver errors while electing are logged and retried
/// every `retry_period`. Aborting the task (or a panic in it) clears the
/// leadership flag but cannot release the lease: the others then take over
/// once it expires.
pub fn spawn(
    client: kube::Client,
    settings: LeaseSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (Leadership, JoinHandle<Result<(), LeaderError>>) {
    let (tx, rx) = watch::channel(false);
    let handle = tokio::spawn(elector::run(
        client,
        settings,
        elector::Flag::new(tx),
        shutdown,
    ));
    (Leadership { rx, _always: None }, handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LeaseSettings {
        LeaseSettings::new("ns", "lease", "me")
    }

    #[test]
    fn defaults_are_client_go_timings_and_valid() {
        let s = settings();
        assert_eq!(s.lease_duration, Duration::from_secs(15));
        assert_eq!(s.renew_deadline, Duration::from_secs(10));
        assert_eq!(s.retry_period, Duration::from_secs(2));
        assert!(s.check().is_ok());
    }

    #[test]
    fn check_rejects_inconsistent_timings_and_empty_names() {
        let bad = [
            LeaseSettings {
                retry_period: Duration::ZERO,
                ..settings()
            },
            LeaseSettings {
                retry_period: Duration::from_secs(10),
                ..settings()
            },
            LeaseSettings {
                renew_deadline: Duration::from_secs(15),
                ..settings()
            },
            LeaseSettings {
                lease_duration: Duration::from_secs(u64::MAX),
                ..settings()
            },
            LeaseSettings {
                identity: String::new(),
                ..settings()
            },
            LeaseSettings {
                namespace: String::new(),
                ..settings()
            },
            LeaseSettings {
                name: String::new(),
                ..settings()
            },
        ];
        for s in bad {
            assert!(
                matches!(s.check(), Err(LeaderError::Settings(_))),
                "accepted {s:?}"
            );
        }
    }

    #[tokio::test]
    async fn always_leads_and_never_loses() {
        let mut leadership = Leadership::always();
        assert!(leadership.is_leader());
        leadership.acquired().await;
        let lost = tokio::time::timeout(Duration::from_millis(20), leadership.lost()).await;
        assert!(lost.is_err(), "lost() resolved on an always-leading view");
    }

    #[tokio::test]
    async fn views_follow_the_flag_and_end_not_leading() {
        let (tx, rx) = watch::channel(false);
        let flag = elector::Flag::new(tx);
        let mut leadership = Leadership { rx, _always: None };
        let mut other = leadership.clone();
        leadership.lost().await;
        flag.set(true);
        leadership.acquired().await;
        assert!(other.is_leader());
        // Dropping the task's flag (an aborted task) must read as not leading.
        drop(flag);
        other.lost().await;
        assert!(!leadership.is_leader());
        let acquired = tokio::time::timeout(Duration::from_millis(20), leadership.acquired()).await;
        assert!(
            acquired.is_err(),
            "acquired() resolved after the election ended"
        );
    }
}
