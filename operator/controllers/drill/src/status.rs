//! A ChaosDrill's status as a pure function of one look: what the look
//! found (the drill's [`State`]) and what it did (the runs it ended or
//! skipped, the run-now request it handled). The reconcile gathers and
//! acts; this decides what the status says, and is tested without an
//! apiserver.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use flashsale_api::reasons::DrillReason;
use flashsale_api::{
    chaosdrill::{ChaosDrillStatus, DrillPhase, RunOutcome, RunRecord},
    conditions::{READY, STALLED, STANDBY_READY},
};

use super::readiness;

/// The message of `Ready` while the spec cannot run.
pub const CANNOT_RUN: &str = "the spec cannot be run; see Stalled";

/// Where a drill stands after one look.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// The kill switch is on: no run, nothing scheduled.
    KillSwitched {
        /// Which switch, in a sentence.
        why: String,
    },
    /// A run no guard of this replica drove was stopped (its record is
    /// among the look's ended runs); the next look schedules again.
    GuardLost,
    /// The spec cannot run.
    Invalid {
        /// Every problem, in a sentence each.
        problems: String,
        /// Whether a run is still in progress (its phase stays).
        running: bool,
    },
    /// A run is in progress.
    Running {
        /// The run as its guard reports it.
        record: RunRecord,
        /// The run's phase.
        phase: DrillPhase,
    },
    /// `spec.suspend` is set.
    Suspended,
    /// Waiting for the next run (a run that just ended or was skipped is
    /// among the look's ended runs).
    Scheduled {
        /// When the next run is due, if any tick is allowed.
        next_run: Option<Timestamp>,
    },
    /// A run started.
    Started {
        /// The new run.
        record: RunRecord,
        /// When the run after it is due.
        next_run: Option<Timestamp>,
    },
}

/// One look at a drill: the input of [`status`].
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    /// The drill's `metadata.generation`.
    pub generation: Option<i64>,
    /// When the look happened.
    pub now: Timestamp,
    /// Runs the look ended or skipped, oldest first.
    pub ended: Vec<RunRecord>,
    /// The run-now request the look handled (run, refused or skipped).
    pub handled_request: Option<String>,
    /// `spec.historyLimit`.
    pub history_limit: i32,
    /// Where the drill stands.
    pub state: State,
    /// The standby's readiness, if the look checked it.
    pub standby: StandbyLook,
}

/// What a look did about the standby's readiness.
#[derive(Debug, Clone, PartialEq)]
pub enum StandbyLook {
    /// The spec has no failover check: nothing to report.
    Unset,
    /// Not due: the last verdict stands.
    Kept,
    /// The look ended before the standby's turn (kill switch, a lost
    /// guard, an invalid spec): the last verdict stands, and no check is
    /// scheduled from it.
    NotLooked,
    /// Checked now.
    Checked(readiness::Verdict),
}

/// The status after `look`, from the status before it.
pub fn status(old: &ChaosDrillStatus, look: &Look) -> ChaosDrillStatus {
    let mut status = old.clone();
    let now = Time(look.now);
    status.observed.observed_generation = look.generation;
    if matches!(look.state, State::KillSwitched { .. }) {
        status.current_run = None;
    }
    for record in &look.ended {
        finish(&mut status, record.clone(), look.history_limit);
    }
    if let Some(request) = &look.handled_request {
        status.last_run_request = Some(request.clone());
    }
    standby(&mut status, &look.standby, &now);
    let spec_checked = !matches!(
        look.state,
        State::KillSwitched { .. } | State::GuardLost | State::Invalid { .. }
    );
    if spec_checked {
        let checked = "the spec passed every check";
        let valid = DrillReason::SpecValid;
        status.observed.set(STALLED, false, valid, checked, &now);
    }
    let running = "a run is in progress";
    match &look.state {
        State::KillSwitched { why } => {
            status.phase = Some(DrillPhase::Suspended);
            status.next_run_time = None;
            status
                .observed
                .set(READY, false, DrillReason::KillSwitch, why, &now);
        }
        State::GuardLost => status.phase = Some(DrillPhase::Scheduled),
        State::Invalid { problems, running } => {
            let invalid = DrillReason::InvalidSpec;
            status.observed.set(STALLED, true, invalid, problems, &now);
            status.observed.set(READY, false, invalid, CANNOT_RUN, &now);
            if !running {
                status.phase = Some(DrillPhase::Failed);
                status.next_run_time = None;
            }
        }
        State::Running { record, phase } => {
            status.current_run = Some(record.clone());
            status.phase = Some(*phase);
            status
                .observed
                .set(READY, true, DrillReason::Running, running, &now);
        }
        State::Suspended => {
            status.phase = Some(DrillPhase::Suspended);
            status.next_run_time = None;
            let suspended = "spec.suspend is set";
            status
                .observed
                .set(READY, false, DrillReason::Suspended, suspended, &now);
        }
        State::Scheduled { next_run } => {
            status.phase = Some(DrillPhase::Scheduled);
            status.next_run_time = next_run.map(Time);
            scheduled_ready(&mut status, &now);
        }
        State::Started { record, next_run } => {
            status.current_run = Some(record.clone());
            status.phase = Some(DrillPhase::SteadyState);
            status.next_run_time = next_run.map(Time);
            status
                .observed
                .set(READY, true, DrillReason::Running, running, &now);
        }
    }
    status
}

/// `status.failover` and `StandbyReady` after what the look did.
fn standby(status: &mut ChaosDrillStatus, look: &StandbyLook, now: &Time) {
    match look {
        StandbyLook::Unset => {
            status.failover = None;
            status.observed.remove(STANDBY_READY);
        }
        StandbyLook::Kept | StandbyLook::NotLooked => {}
        StandbyLook::Checked(verdict) => {
            status.failover = Some(verdict.status.clone());
            let (ready, reason) = (verdict.ready(), verdict.reason);
            status
                .observed
                .set(STANDBY_READY, ready, reason, verdict.message.clone(), now);
        }
    }
}

/// `Ready` while waiting: ready when a next run is scheduled.
fn scheduled_ready(status: &mut ChaosDrillStatus, now: &Time) {
    if status.next_run_time.is_some() {
        let waiting = "waiting for the next run";
        status
            .observed
            .set(READY, true, DrillReason::Scheduled, waiting, now);
    } else {
        status.observed.set(
            READY,
            false,
            DrillReason::NoAllowedRun,
            "no tick of the cron falls inside a window and outside every blackout in the years ahead",
            now,
        );
    }
}

/// Moves an ended run into the history (newest first, bounded).
fn finish(status: &mut ChaosDrillStatus, record: RunRecord, limit: i32) {
    if status
        .current_run
        .as_ref()
        .is_some_and(|current| current.id == record.id)
    {
        status.current_run = None;
    }
    status.last_outcome = record.outcome;
    if record.outcome == Some(RunOutcome::Aborted) {
        status.last_abort_latency = record.abort_latency;
    }
    status.history.retain(|old| old.id != record.id);
    status.history.insert(0, record);
    status
        .history
        .truncate(usize::try_from(limit.max(1)).unwrap_or(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, outcome: Option<RunOutcome>) -> RunRecord {
        RunRecord {
            id: id.to_owned(),
            outcome,
            ..RunRecord::default()
        }
    }

    fn look(state: State) -> Look {
        Look {
            generation: Some(3),
            now: Timestamp::UNIX_EPOCH,
            ended: Vec::new(),
            handled_request: None,
            history_limit: 2,
            state,
            standby: StandbyLook::Kept,
        }
    }

    fn condition<'a>(status: &'a ChaosDrillStatus, kind: &str) -> Option<(&'a str, &'a str)> {
        status
            .observed
            .get(kind)
            .map(|c| (c.status.as_str(), c.reason.as_str()))
    }

    #[test]
    fn the_kill_switch_ends_the_run_records_the_refusal_and_schedules_nothing() {
        let old = ChaosDrillStatus {
            current_run: Some(record("r1", None)),
            next_run_time: Some(Time(Timestamp::UNIX_EPOCH)),
            ..ChaosDrillStatus::default()
        };
        let mut killed = look(State::KillSwitched {
            why: "switch".to_owned(),
        });
        killed.ended = vec![
            record("r1", Some(RunOutcome::Aborted)),
            record("r2", Some(RunOutcome::Skipped)),
        ];
        killed.handled_request = Some("req".to_owned());
        let new = status(&old, &killed);
        assert_eq!(new.current_run, None);
        assert_eq!(new.phase, Some(DrillPhase::Suspended));
        assert_eq!(new.next_run_time, None);
        assert_eq!(new.last_run_request.as_deref(), Some("req"));
        let ids: Vec<&str> = new.history.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["r2", "r1"], "newest first");
        assert_eq!(new.last_outcome, Some(RunOutcome::Skipped));
        assert_eq!(condition(&new, READY), Some(("False", "KillSwitch")));
        assert_eq!(condition(&new, STALLED), None, "the spec was not looked at");
        assert_eq!(new.observed.observed_generation, Some(3));
    }

    #[test]
    fn an_invalid_spec_keeps_a_running_phase_and_fails_an_idle_drill() {
        let old = ChaosDrillStatus {
            phase: Some(DrillPhase::Injecting),
            ..ChaosDrillStatus::default()
        };
        let invalid = |running| State::Invalid {
            problems: "spec.schedule.cron: bad".to_owned(),
            running,
        };
        let new = status(&old, &look(invalid(true)));
        assert_eq!(new.phase, Some(DrillPhase::Injecting));
        assert_eq!(condition(&new, STALLED), Some(("True", "InvalidSpec")));
        assert_eq!(condition(&new, READY), Some(("False", "InvalidSpec")));
        let new = status(&old, &look(invalid(false)));
        assert_eq!(new.phase, Some(DrillPhase::Failed));
    }

    #[test]
    fn waiting_is_ready_only_with_a_next_run_and_the_history_stays_bounded() {
        let mut old = ChaosDrillStatus::default();
        for id in ["a", "b"] {
            finish(&mut old, record(id, Some(RunOutcome::Succeeded)), 2);
        }
        let mut waiting = look(State::Scheduled {
            next_run: Some(Timestamp::UNIX_EPOCH),
        });
        waiting.ended = vec![record("c", Some(RunOutcome::Skipped))];
        let new = status(&old, &waiting);
        let ids: Vec<&str> = new.history.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["c", "b"]);
        assert_eq!(condition(&new, READY), Some(("True", "Scheduled")));
        assert_eq!(condition(&new, STALLED), Some(("False", "SpecValid")));
        let new = status(&old, &look(State::Scheduled { next_run: None }));
        assert_eq!(condition(&new, READY), Some(("False", "NoAllowedRun")));
    }

    #[test]
    fn a_started_run_is_current_and_a_finished_one_leaves_the_current_slot() {
        let started = status(
            &ChaosDrillStatus::default(),
            &look(State::Started {
                record: record("r1", None),
                next_run: None,
            }),
        );
        assert_eq!(started.phase, Some(DrillPhase::SteadyState));
        assert_eq!(
            started.current_run.as_ref().map(|r| r.id.as_str()),
            Some("r1")
        );
        assert_eq!(condition(&started, READY), Some(("True", "Running")));
        let mut finished = look(State::Scheduled { next_run: None });
        finished.ended = vec![record("r1", Some(RunOutcome::Succeeded))];
        let after = status(&started, &finished);
        assert_eq!(after.current_run, None);
        assert_eq!(after.phase, Some(DrillPhase::Scheduled));
        assert_eq!(after.last_outcome, Some(RunOutcome::Succeeded));
    }

    #[test]
    fn finished_runs_go_first_into_a_bounded_history() {
        let mut status = ChaosDrillStatus {
            current_run: Some(RunRecord {
                id: "r3".into(),
                ..RunRecord::default()
            }),
            ..ChaosDrillStatus::default()
        };
        for id in ["r1", "r2", "r3"] {
            let record = RunRecord {
                id: id.into(),
                outcome: Some(RunOutcome::Aborted),
                abort_latency: Some(flashsale_api::Duration(std::time::Duration::from_millis(
                    40,
                ))),
                ..RunRecord::default()
            };
            finish(&mut status, record, 2);
        }
        let ids: Vec<&str> = status.history.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["r3", "r2"]);
        assert_eq!(status.current_run, None);
        assert_eq!(status.last_outcome, Some(RunOutcome::Aborted));
        assert_eq!(
            status.last_abort_latency,
            Some(flashsale_api::Duration(std::time::Duration::from_millis(
                40
            )))
        );
    }
}
