//! The pure part of the election: what the lease as last read means for this
//! replica, and what to write. No I/O and no clock of its own (`now` is an
//! argument), so every rule is unit-tested without a cluster or sleeping.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};
use tokio::time::Instant;

use super::LeaseSettings;

/// The election record: the parts of a Lease's spec the holder rewrites on
/// every renewal. Two reads with equal records mean the holder has not
/// renewed in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    /// `holderIdentity`; an empty string is read as no holder.
    pub holder: Option<String>,
    /// `leaseDurationSeconds`.
    pub lease_duration_seconds: Option<i32>,
    /// `acquireTime`.
    pub acquire_time: Option<Timestamp>,
    /// `renewTime`.
    pub renew_time: Option<Timestamp>,
    /// `leaseTransitions`.
    pub transitions: Option<i32>,
}

impl Record {
    /// The record of a Lease's spec (a Lease without spec has an empty one).
    pub fn of(spec: Option<&LeaseSpec>) -> Self {
        let Some(spec) = spec else {
            return Self {
                holder: None,
                lease_duration_seconds: None,
                acquire_time: None,
                renew_time: None,
                transitions: None,
            };
        };
        Self {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            lease_duration_seconds: spec.lease_duration_seconds,
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions,
        }
    }
}

/// What this replica last read of the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Observed {
    /// The Lease does not exist.
    Absent,
    /// The Lease exists.
    Present {
        /// Its election record.
        record: Record,
        /// When (by our monotonic clock) we first saw this record. Expiry is
        /// measured from here rather than from `renewTime`, which another
        /// machine's wall clock wrote.
        changed_at: Instant,
    },
}

/// Folds a fresh read into what we knew: the observation time moves only
/// when the record changed, so a holder that stopped renewing ages.
pub(super) fn observe(previous: Option<&Observed>, read: Option<Record>, now: Instant) -> Observed {
    let Some(record) = read else {
        return Observed::Absent;
    };
    let changed_at = match previous {
        Some(Observed::Present {
            record: seen,
            changed_at,
        }) if *seen == record => *changed_at,
        _ => now,
    };
    Observed::Present { record, changed_at }
}

/// Whether this replica leads, as far as the election loop knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Not leading: polling for a chance to acquire.
    Follower,
    /// Leading.
    Leader {
        /// When the last successful write of the lease was *sent*: the
        /// others saw it change no earlier than this, so stepping down by
        /// `last_renew + renew_deadline` is before any of them may take over.
        last_renew: Instant,
    },
}

/// Why the leader stops leading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StepDown {
    /// No successful renewal within the renew deadline.
    RenewDeadline,
    /// The lease no longer names us: someone overwrote, released or deleted
    /// it. `None` means no holder (or no lease).
    NotHolder(Option<String>),
}

impl std::fmt::Display for StepDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RenewDeadline => {
                f.write_str("renew deadline passed without a successful renewal")
            }
            Self::NotHolder(Some(holder)) => write!(f, "lease is held by {holder}"),
            Self::NotHolder(None) => f.write_str("lease no longer names a holder"),
        }
    }
}

/// What to do after reading the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    /// No lease: create it naming us.
    Create,
    /// Free, or expired by our observation: replace it naming us.
    Acquire {
        /// The holder we take over from, if any.
        previous: Option<String>,
    },
    /// We hold it: replace it with a fresh `renewTime`.
    Renew,
    /// Another holder's lease is valid: poll again next period.
    Wait {
        /// Who holds it.
        holder: String,
        /// How long until it expires by our observation, if not renewed.
        expires_in: Duration,
    },
    /// We lead but must stop at once.
    StepDown(StepDown),
}

/// Decides what this replica (`me`, in `role`) does given the lease as last
/// read. A leader that must step down gets [`Decision::StepDown`]; deciding
/// again as a follower gives what to do next.
pub(super) fn decide(
    observed: &Observed,
    me: &str,
    role: Role,
    now: Instant,
    settings: &LeaseSettings,
) -> Decision {
    let leading = match role {
        Role::Leader { last_renew } => {
            if deadline_passed(last_renew, now, settings) {
                return Decision::StepDown(StepDown::RenewDeadline);
            }
            true
        }
        Role::Follower => false,
    };
    let (record, changed_at) = match observed {
        Observed::Absent if leading => return Decision::StepDown(StepDown::NotHolder(None)),
        Observed::Absent => return Decision::Create,
        Observed::Present { record, changed_at } => (record, *changed_at),
    };
    match &record.holder {
        Some(holder) if holder == me => Decision::Renew,
        // Someone else wrote the lease while we lead: any replica may be
        // acquiring it now, so stop before it could act.
        other if leading => Decision::StepDown(StepDown::NotHolder(other.clone())),
        None => Decision::Acquire { previous: None },
        Some(holder) => {
            let duration = record
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map_or(settings.lease_duration, |s| {
                    Duration::from_secs(u64::from(s.unsigned_abs()))
                });
            let expires_at = changed_at + duration;
            if now >= expires_at {
                Decision::Acquire {
                    previous: Some(holder.clone()),
                }
            } else {
                Decision::Wait {
                    holder: holder.clone(),
                    expires_in: expires_at - now,
                }
            }
        }
    }
}

/// Whether a leader that last renewed at `last_renew` must have stepped down.
pub(super) fn deadline_passed(last_renew: Instant, now: Instant, settings: &LeaseSettings) -> bool {
    now >= last_renew + settings.renew_deadline
}

/// `lease_duration` in whole seconds, rounded up so the others never wait
/// less than configured; `None` if it does not fit the field.
pub(super) fn duration_seconds(lease_duration: Duration) -> Option<i32> {
    let secs = lease_duration
        .as_secs()
        .checked_add(u64::from(lease_duration.subsec_nanos() > 0))?;
    i32::try_from(secs).ok().filter(|s| *s > 0)
}

/// The spec to write for `decision` (Create, Acquire or Renew), starting from
/// the spec read so fields we do not manage (strategy, preferredHolder) stay.
pub(super) fn claim(
    read: Option<&LeaseSpec>,
    decision: &Decision,
    settings: &LeaseSettings,
    now: Timestamp,
) -> LeaseSpec {
    let mut spec = read.cloned().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    match decision {
        Decision::Renew => {
            // Same holder: acquireTime and leaseTransitions stay.
            if spec.acquire_time.is_none() {
                spec.acquire_time = Some(MicroTime(now));
            }
            spec.lease_transitions = Some(transitions);
        }
        Decision::Acquire { .. } => {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(transitions.saturating_add(1));
        }
        _ => {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(0);
        }
    }
    spec.holder_identity = Some(settings.identity.clone());
    spec.lease_duration_seconds = duration_seconds(settings.lease_duration);
    spec.renew_time = Some(MicroTime(now));
    spec
}

/// The spec that releases the lease: no holder, so every candidate acquires
/// at its next poll; a 1 s duration and fresh `renewTime` as well, so even a
/// client that ignores the empty holder waits at most a second.
pub(super) fn release(read: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
    let mut spec = read.cloned().unwrap_or_default();
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(now));
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";

    fn settings() -> LeaseSettings {
        LeaseSettings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            ..LeaseSettings::new("ns", "lease", ME)
        }
    }

    fn record(holder: Option<&str>) -> Record {
        Record {
            holder: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            acquire_time: Some(Timestamp::UNIX_EPOCH),
            renew_time: Some(Timestamp::UNIX_EPOCH),
            transitions: Some(3),
        }
    }

    fn held_by(holder: Option<&str>, changed_at: Instant) -> Observed {
        Observed::Present {
            record: record(holder),
            changed_at,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn no_lease_creates_it() {
        let now = Instant::now();
        let d = decide(&Observed::Absent, ME, Role::Follower, now, &settings());
        assert_eq!(d, Decision::Create);
    }

    #[test]
    fn a_lease_without_holder_is_acquired_at_once() {
        let now = Instant::now();
        let d = decide(&held_by(None, now), ME, Role::Follower, now, &settings());
        assert_eq!(d, Decision::Acquire { previous: None });
    }

    #[test]
    fn a_fresh_lease_of_another_is_waited_for() {
        let t0 = Instant::now();
        let d = decide(
            &held_by(Some("other"), t0),
            ME,
            Role::Follower,
            t0 + secs(5),
            &settings(),
        );
        assert_eq!(
            d,
            Decision::Wait {
                holder: "other".to_owned(),
                expires_in: secs(10)
            }
        );
    }

    #[test]
    fn a_lease_unchanged_for_its_duration_by_our_observation_is_taken_over() {
        let t0 = Instant::now();
        let d = decide(
            &held_by(Some("other"), t0),
            ME,
            Role::Follower,
            t0 + secs(15),
            &settings(),
        );
        assert_eq!(
            d,
            Decision::Acquire {
                previous: Some("other".to_owned())
            }
        );
    }

    #[test]
    fn expiry_uses_the_duration_written_in_the_lease() {
        let t0 = Instant::now();
        let mut observed = held_by(Some("other"), t0);
        if let Observed::Present { record, .. } = &mut observed {
            record.lease_duration_seconds = Some(40);
        }
        let d = decide(&observed, ME, Role::Follower, t0 + secs(20), &settings());
        assert!(matches!(d, Decision::Wait { .. }), "{d:?}");
    }

    #[test]
    fn expiry_ignores_the_renew_time_written_by_another_clock() {
        // The holder's clock is far behind ours: renewTime looks ancient, but
        // we only just saw the record, so it is fresh.
        let t0 = Instant::now();
        let first = observe(None, Some(record(Some("other"))), t0);
        let d = decide(&first, ME, Role::Follower, t0 + secs(1), &settings());
        assert!(matches!(d, Decision::Wait { .. }), "{d:?}");
    }

    #[test]
    fn observation_time_moves_only_when_the_record_changes() {
        let t0 = Instant::now();
        let first = observe(None, Some(record(Some("other"))), t0);
        let same = observe(Some(&first), Some(record(Some("other"))), t0 + secs(14));
        assert_eq!(same, first);
        let mut renewed = record(Some("other"));
        renewed.renew_time = Some(Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(2));
        let moved = observe(Some(&same), Some(renewed.clone()), t0 + secs(14));
        assert_eq!(
            moved,
            Observed::Present {
                record: renewed,
                changed_at: t0 + secs(14)
            }
        );
        assert_eq!(observe(Some(&moved), None, t0 + secs(15)), Observed::Absent);
    }

    #[test]
    fn a_lease_we_hold_is_renewed() {
        let t0 = Instant::now();
        let role = Role::Leader { last_renew: t0 };
        let d = decide(&held_by(Some(ME), t0), ME, role, t0 + secs(2), &settings());
        assert_eq!(d, Decision::Renew);
        // Also as a follower (we stepped down, nobody took it): OCC makes
        // taking it back safe.
        let d = decide(
            &held_by(Some(ME), t0),
            ME,
            Role::Follower,
            t0 + secs(30),
            &settings(),
        );
        assert_eq!(d, Decision::Renew);
    }

    #[test]
    fn a_leader_past_its_renew_deadline_steps_down() {
        let t0 = Instant::now();
        let role = Role::Leader { last_renew: t0 };
        let fresh = held_by(Some(ME), t0);
        let just_before = decide(
            &fresh,
            ME,
            role,
            t0 + secs(10) - Duration::from_millis(1),
            &settings(),
        );
        assert_eq!(just_before, Decision::Renew);
        let at = decide(&fresh, ME, role, t0 + secs(10), &settings());
        assert_eq!(at, Decision::StepDown(StepDown::RenewDeadline));
        assert!(deadline_passed(t0, t0 + secs(10), &settings()));
    }

    #[test]
    fn a_leader_that_sees_another_holder_steps_down_at_once() {
        let t0 = Instant::now();
        let role = Role::Leader { last_renew: t0 };
        let d = decide(&held_by(Some("intruder"), t0), ME, role, t0, &settings());
        assert_eq!(
            d,
            Decision::StepDown(StepDown::NotHolder(Some("intruder".to_owned())))
        );
        let d = decide(&held_by(None, t0), ME, role, t0, &settings());
        assert_eq!(d, Decision::StepDown(StepDown::NotHolder(None)));
        let d = decide(&Observed::Absent, ME, role, t0, &settings());
        assert_eq!(d, Decision::StepDown(StepDown::NotHolder(None)));
        // Deciding again as a follower waits out the intruder's lease.
        let d = decide(
            &held_by(Some("intruder"), t0),
            ME,
            Role::Follower,
            t0,
            &settings(),
        );
        assert!(matches!(d, Decision::Wait { .. }), "{d:?}");
    }

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(duration_seconds(secs(15)), Some(15));
        assert_eq!(duration_seconds(Duration::from_millis(2500)), Some(3));
        assert_eq!(duration_seconds(Duration::from_millis(1)), Some(1));
        assert_eq!(duration_seconds(Duration::ZERO), None);
        assert_eq!(duration_seconds(secs(u64::MAX)), None);
    }

    fn spec_held_by(holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            renew_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            lease_transitions: Some(3),
            strategy: Some("kept".to_owned()),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn claims_write_the_record_client_go_writes() {
        let now = Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(100);
        let s = settings();

        let created = claim(None, &Decision::Create, &s, now);
        assert_eq!(created.holder_identity.as_deref(), Some(ME));
        assert_eq!(created.lease_duration_seconds, Some(15));
        assert_eq!(created.acquire_time, Some(MicroTime(now)));
        assert_eq!(created.renew_time, Some(MicroTime(now)));
        assert_eq!(created.lease_transitions, Some(0));

        let read = spec_held_by("other");
        let taken = claim(Some(&read), &Decision::Acquire { previous: None }, &s, now);
        assert_eq!(taken.holder_identity.as_deref(), Some(ME));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.strategy.as_deref(), Some("kept"));

        let read = spec_held_by(ME);
        let renewed = claim(Some(&read), &Decision::Renew, &s, now);
        assert_eq!(renewed.acquire_time, Some(MicroTime(Timestamp::UNIX_EPOCH)));
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
        assert_eq!(renewed.lease_transitions, Some(3));

        let released = release(Some(&read), now);
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.lease_duration_seconds, Some(1));
        assert_eq!(released.renew_time, Some(MicroTime(now)));
        assert_eq!(released.lease_transitions, Some(3));
        assert_eq!(Record::of(Some(&released)).holder, None);
    }

    #[test]
    fn an_empty_holder_is_no_holder() {
        let spec = LeaseSpec {
            holder_identity: Some(String::new()),
            ..LeaseSpec::default()
        };
        assert_eq!(Record::of(Some(&spec)).holder, None);
        assert_eq!(Record::of(None).holder, None);
    }
}
