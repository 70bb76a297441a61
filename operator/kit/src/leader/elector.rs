//! The election loop: reads and writes the Lease, applies [`decide`], and
//! publishes leadership. All apiserver errors are logged and retried.

use std::future::Future;

use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::{
    sync::watch,
    time::{Instant, sleep_until, timeout_at},
};
use tracing::{debug, info, warn};

use super::{
    LeaderError, LeaseSettings,
    decide::{self, Decision, Observed, Record, Role, StepDown},
};

/// How many times one poll re-reads after a 409 Conflict before waiting for
/// the next period: a conflict means another replica just wrote, and the
/// re-read shows who; more than that in a row means heavy contention.
const CONFLICT_RETRIES: usize = 2;

/// How many times releasing re-reads after a conflict (our own in-flight
/// renewal may have landed after we stopped waiting for it).
const RELEASE_ATTEMPTS: usize = 3;

/// The task's side of [`super::Leadership`]. Dropping it (task ended,
/// aborted or panicked) clears the flag, so no view keeps claiming
/// leadership for an election nobody runs any more.
#[derive(Debug)]
pub(super) struct Flag(watch::Sender<bool>);

impl Flag {
    pub(super) fn new(tx: watch::Sender<bool>) -> Self {
        Self(tx)
    }

    /// Publishes `leads`, waking the views only on a change.
    pub(super) fn set(&self, leads: bool) {
        self.0.send_if_modified(|current| {
            let changed = *current != leads;
            *current = leads;
            changed
        });
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Runs the election until `shutdown` resolves, then releases the lease if
/// we lead.
pub(super) async fn run(
    client: Client,
    settings: LeaseSettings,
    flag: Flag,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), LeaderError> {
    settings.check()?;
    let mut elector = Elector {
        api: Api::namespaced(client, &settings.namespace),
        lease_ref: settings.lease_ref(),
        settings,
        flag,
        role: Role::Follower,
        observed: None,
        lease: None,
    };
    info!(
        identity = %elector.settings.identity,
        lease = %elector.lease_ref,
        "joining leader election"
    );
    tokio::pin!(shutdown);
    loop {
        let next_poll = Instant::now() + elector.settings.retry_period;
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            () = elector.poll() => {}
        }
        // A leader wakes at its renew deadline even if that comes before the
        // next poll, so it steps down on time however the apiserver behaves.
        let wake = match elector.role {
            Role::Leader { last_renew } => {
                next_poll.min(last_renew + elector.settings.renew_deadline)
            }
            Role::Follower => next_poll,
        };
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            () = sleep_until(wake) => {}
        }
    }
    elector.shut_down().await
}

/// State of one replica's election.
struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// `namespace/name`, for logs.
    lease_ref: String,
    flag: Flag,
    role: Role,
    /// What we last read (or wrote); `None` before the first read.
    observed: Option<Observed>,
    /// The Lease as last read or written: its spec is the base of the next
    /// write and its resourceVersion makes that write conditional.
    lease: Option<Lease>,
}

/// How one read-decide-write round ended.
enum Round {
    /// Nothing more to do this period.
    Done,
    /// Our write lost a race (409): read again at once.
    Conflict,
}

impl Elector {
    /// One period: read the lease, decide, write if needed.
    async fn poll(&mut self) {
        self.check_deadline();
        for _ in 0..=CONFLICT_RETRIES {
            match self.round().await {
                Round::Done => return,
                Round::Conflict => continue,
            }
        }
    }

    async fn round(&mut self) -> Round {
        let until = self.call_deadline();
        let read = match timeout_at(until, self.api.get_opt(&self.settings.name)).await {
            Ok(Ok(read)) => read,
            Ok(Err(error)) => {
                warn!(lease = %self.lease_ref, %error, "reading the lease failed; retrying next period");
                return Round::Done;
            }
            Err(_) => {
                self.timed_out();
                return Round::Done;
            }
        };
        let now = Instant::now();
        let record = read.as_ref().map(|lease| Record::of(lease.spec.as_ref()));
        let observed = decide::observe(self.observed.as_ref(), record, now);
        self.lease = read;
        let mut decision = decide::decide(
            &observed,
            &self.settings.identity,
            self.role,
            now,
            &self.settings,
        );
        self.observed = Some(observed);
        if let Decision::StepDown(reason) = decision {
            self.step_down(&reason);
            let Some(observed) = &self.observed else {
                return Round::Done;
            };
            decision = decide::decide(
                observed,
                &self.settings.identity,
                self.role,
                now,
                &self.settings,
            );
        }
        match decision {
            Decision::Wait { holder, expires_in } => {
                debug!(lease = %self.lease_ref, %holder, ?expires_in, "lease held by another replica");
                Round::Done
            }
            Decision::Create | Decision::Acquire { .. } | Decision::Renew => {
                self.claim(&decision).await
            }
            // Deciding as a follower never steps down.
            Decision::StepDown(_) => Round::Done,
        }
    }

    /// Writes ourselves as holder (create, or replace conditionally on the
    /// resourceVersion read).
    async fn claim(&mut self, decision: &Decision) -> Round {
        let spec = decide::claim(
            self.lease.as_ref().and_then(|l| l.spec.as_ref()),
            decision,
            &self.settings,
            Timestamp::now(),
        );
        let params = write_params();
        let until = self.call_deadline();
        let sent_at = Instant::now();
        let written = match (decision, &self.lease) {
            (Decision::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                timeout_at(until, self.api.create(&params, &lease)).await
            }
            (_, Some(read)) => {
                // The read object keeps its resourceVersion: the replace
                // fails with 409 if anyone wrote since.
                let lease = Lease {
                    metadata: read.metadata.clone(),
                    spec: Some(spec),
                };
                timeout_at(
                    until,
                    self.api.replace(&self.settings.name, &params, &lease),
                )
                .await
            }
        };
        match written {
            Ok(Ok(lease)) => {
                self.observed = Some(Observed::Present {
                    record: Record::of(lease.spec.as_ref()),
                    changed_at: sent_at,
                });
                self.lease = Some(lease);
                self.lead(sent_at, decision);
                Round::Done
            }
            Ok(Err(error)) if is_conflict(&error) => {
                debug!(lease = %self.lease_ref, ?decision, "another replica wrote the lease first; re-reading");
                Round::Conflict
            }
            Ok(Err(error)) => {
                warn!(lease = %self.lease_ref, ?decision, %error, "writing the lease failed; retrying next period");
                Round::Done
            }
            Err(_) => {
                self.timed_out();
                Round::Done
            }
        }
    }

    /// Records a successful write sent at `sent_at`.
    fn lead(&mut self, sent_at: Instant, decision: &Decision) {
        // A write that took longer than the renew deadline is already too
        // old to lead on: the others may consider it expired soon.
        if decide::deadline_passed(sent_at, Instant::now(), &self.settings) {
            self.check_deadline();
            return;
        }
        let was_leader = matches!(self.role, Role::Leader { .. });
        self.role = Role::Leader {
            last_renew: sent_at,
        };
        if !was_leader {
            let previous = match decision {
                Decision::Acquire { previous } => previous.as_deref(),
                _ => None,
            };
            info!(
                identity = %self.settings.identity,
                lease = %self.lease_ref,
                previous_holder = previous.unwrap_or(""),
                "became leader"
            );
            self.flag.set(true);
        }
    }

    /// Steps down if we lead and the renew deadline has passed.
    fn check_deadline(&mut self) {
        if let Role::Leader { last_renew } = self.role
            && decide::deadline_passed(last_renew, Instant::now(), &self.settings)
        {
            self.step_down(&StepDown::RenewDeadline);
        }
    }

    fn step_down(&mut self, reason: &dyn std::fmt::Display) {
        if matches!(self.role, Role::Leader { .. }) {
            // Clear the flag first: from here on the process must not act
            // as leader.
            self.flag.set(false);
            self.role = Role::Follower;
            info!(
                identity = %self.settings.identity,
                lease = %self.lease_ref,
                reason = %reason,
                "lost leadership"
            );
        }
    }

    /// Until when an apiserver call may take, so the loop never hangs: the
    /// renew deadline while leading (reaching it steps down), the lease
    /// duration otherwise.
    fn call_deadline(&self) -> Instant {
        match self.role {
            Role::Leader { last_renew } => last_renew + self.settings.renew_deadline,
            Role::Follower => Instant::now() + self.settings.lease_duration,
        }
    }

    /// A call ran into [`Self::call_deadline`].
    fn timed_out(&mut self) {
        if matches!(self.role, Role::Leader { .. }) {
            self.check_deadline();
        } else {
            warn!(lease = %self.lease_ref, "apiserver call timed out; retrying next period");
        }
    }

    /// Stops leading, then releases the lease if it still names us.
    async fn shut_down(mut self) -> Result<(), LeaderError> {
        let was_leader = matches!(self.role, Role::Leader { .. });
        // Stop acting as leader before freeing the lease, so the next leader
        // never overlaps with us.
        self.step_down(&"shutting down");
        self.flag.set(false);
        if !was_leader {
            info!(identity = %self.settings.identity, lease = %self.lease_ref, "left leader election");
            return Ok(());
        }
        let limit = self.settings.renew_deadline;
        match tokio::time::timeout(limit, self.release()).await {
            Ok(result) => result,
            Err(_) => Err(LeaderError::ReleaseTimedOut {
                lease: self.lease_ref.clone(),
                after: limit,
            }),
        }
    }

    /// Clears the holder, conditionally on the resourceVersion: if another
    /// replica took the lease meanwhile, it is theirs and stays untouched.
    async fn release(&mut self) -> Result<(), LeaderError> {
        let mut lease = self.lease.take();
        for attempt in 1..=RELEASE_ATTEMPTS {
            let Some(current) = lease else {
                return Ok(());
            };
            let ours = Record::of(current.spec.as_ref()).holder.as_deref()
                == Some(self.settings.identity.as_str());
            if !ours {
                return Ok(());
            }
            let released = Lease {
                spec: Some(decide::release(current.spec.as_ref(), Timestamp::now())),
                metadata: current.metadata,
            };
            let error = match self
                .api
                .replace(&self.settings.name, &write_params(), &released)
                .await
            {
                Ok(_) => {
                    info!(identity = %self.settings.identity, lease = %self.lease_ref, "released lease");
                    return Ok(());
                }
                Err(error) => error,
            };
            if !is_conflict(&error) || attempt == RELEASE_ATTEMPTS {
                return Err(self.release_error(error));
            }
            // Our last renewal may have landed after we stopped waiting for
            // it: read again and release that if it is still ours.
            lease = self
                .api
                .get_opt(&self.settings.name)
                .await
                .map_err(|error| self.release_error(error))?;
        }
        Ok(())
    }

    fn release_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Release {
            lease: self.lease_ref.clone(),
            source,
        }
    }
}

/// Parameters of our writes; the field manager names the election in the
/// Lease's managedFields, so an operator can tell who wrote it.
fn write_params() -> PostParams {
    PostParams {
        field_manager: Some("flashsale-operator-leader".to_owned()),
        ..PostParams::default()
    }
}

/// 409: the object changed since we read it (replace) or already exists
/// (create); either way another replica wrote first.
fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_wakes_views_only_on_change_and_clears_on_drop() {
        let (tx, mut rx) = watch::channel(false);
        let flag = Flag::new(tx);
        flag.set(false);
        assert!(!rx.has_changed().unwrap_or(true));
        flag.set(true);
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        flag.set(true);
        assert!(!rx.has_changed().unwrap_or(true));
        drop(flag);
        assert!(!*rx.borrow());
    }

    #[test]
    fn conflicts_are_409() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..kube::core::Status::default()
            }))
        };
        assert!(is_conflict(&status(409)));
        assert!(!is_conflict(&status(404)));
        assert!(!is_conflict(&status(500)));
    }
}
