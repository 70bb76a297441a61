//! One reconcile of a ChaosDrill: the kill switch first, whatever the spec
//! or the run → stop a run no live guard of this replica drives → check the
//! spec → mirror the running guard's progress → decide whether a run starts
//! (pure: [`decide_start`]) → the status (pure: [`status::status`]) and
//! Events.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::core::v1::Namespace,
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};

use super::{
    ABORT_ANNOTATION, ABORT_REASON_ANNOTATION, CHECK_ANNOTATION, Ctx, FORCE_ANNOTATION,
    KILL_SWITCH_ANNOTATION, RUN_NOW_ANNOTATION, chaos, execute,
    execute::Plan,
    guard::{Guard, Progress},
    promote, readiness, readings,
    status::{self, Look, StandbyLook, State},
    stop,
};
use flashsale_api::children::{Owner, names};
use flashsale_api::common::SecretKeyRef;
use flashsale_api::reasons::DrillReason;
use flashsale_api::{
    ChaosDrill, FlashSale,
    calendar::{Allowance, Calendar},
    chaosdrill::{
        ChaosDrillStatus, DrillPhase, FailoverCheck, FailoverMode, FailoverStatus, RunOutcome,
        RunRecord,
    },
    flashsale::SalePhase,
    timeline::Timeline,
    validate,
};
use flashsale_kit::{Error, Identity, Verb, apply};

/// The ChaosDrill controller.
pub const IDENTITY: Identity = Identity {
    name: "chaosdrill",
    field_manager: "flashsale-operator-chaosdrill",
};

/// A scheduled run later than this is skipped as missed (the operator was
/// down at its time), rather than started late and outside its intent.
const MISSED_BOUND: SignedDuration = SignedDuration::from_secs(60);
/// The longest a drill sleeps between looks when nothing is due.
const IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// Reconciles one drill; every error is also a Warning Event and a metric.
pub async fn reconcile(drill: Arc<ChaosDrill>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    flashsale_kit::reconcile(drill, ctx, |drill, ctx| async move {
        reconcile_drill(&drill, &ctx).await
    })
    .await
}

async fn reconcile_drill(drill: &ChaosDrill, ctx: &Arc<Ctx>) -> Result<Action, Error> {
    ctx.metrics.drill_seen(drill);
    let mut pass = Pass::new(drill, ctx)?;
    pass.take_requests().await?;
    let (state, after) = pass.look().await?;
    let old = drill.status.clone().unwrap_or_default();
    let new = status::status(
        &old,
        &Look {
            generation: drill.metadata.generation,
            now: pass.now,
            ended: pass.ended,
            handled_request: pass.handled,
            history_limit: drill.spec.history_limit,
            state,
            standby: pass.standby.clone(),
        },
    );
    apply::write_status(ctx, drill, &new).await?;
    // Readiness is checked continuously while the drill exists.
    // Only a look that reached the standby's check schedules the next one:
    // the kill switch, a lost guard or an invalid spec wait for a change.
    let due = match (&drill.spec.failover, &new.failover, &pass.standby) {
        (Some(failover), Some(checked), StandbyLook::Kept | StandbyLook::Checked(_)) => Some(
            readiness_due(failover, checked, pass.now).max(std::time::Duration::from_millis(100)),
        ),
        _ => None,
    };
    Ok(match after {
        After::Change => due.map_or_else(Action::await_change, Action::requeue),
        After::Soon(wait) => Action::requeue(due.map_or(wait, |due| due.min(wait))),
        After::NextRun => next_look(&new, pass.now, due),
    })
}

/// How long until the standby's readiness is due again.
fn readiness_due(
    failover: &FailoverCheck,
    checked: &FailoverStatus,
    now: Timestamp,
) -> std::time::Duration {
    let next = checked
        .checked_at
        .as_ref()
        .and_then(|at| at.0.checked_add(failover.check_every.0).ok())
        .unwrap_or(now);
    // Zero when due (or overdue).
    std::time::Duration::try_from(next.duration_since(now)).unwrap_or_default()
}

/// When to look at the drill again.
enum After {
    /// On a change of the drill (or its namespace's kill switch).
    Change,
    /// After this long.
    Soon(std::time::Duration),
    /// When the next run is due, or after [`IDLE`].
    NextRun,
}

/// The guard's steps wake the reconcile; this is a backstop.
const RUNNING_LOOK: std::time::Duration = std::time::Duration::from_secs(30);

/// One look at a drill: what it reads, and what it did on the way.
struct Pass<'a> {
    ctx: &'a Arc<Ctx>,
    drill: &'a ChaosDrill,
    namespace: String,
    uid: String,
    now: Timestamp,
    /// The drill's status as read.
    old: ChaosDrillStatus,
    /// The guard of this replica that drives the drill's run, if any.
    guard: Option<Arc<Guard>>,
    /// A run-now request not handled yet.
    request: Option<String>,
    /// The force annotation's reason, if any.
    force: Option<String>,
    /// Runs this look ended or skipped, oldest first.
    ended: Vec<RunRecord>,
    /// The request this look handled.
    handled: Option<String>,
    /// What this look did about the standby's readiness.
    standby: StandbyLook,
    /// The primary sale as this look read it.
    primary: SaleView,
}

impl<'a> Pass<'a> {
    fn new(drill: &'a ChaosDrill, ctx: &'a Arc<Ctx>) -> Result<Self, Error> {
        let namespace = drill
            .namespace()
            .ok_or(Error::MissingMetadata("metadata.namespace"))?;
        let uid = drill.uid().ok_or(Error::MissingMetadata("metadata.uid"))?;
        let key = flashsale_kit::key(drill);
        let old = drill.status.clone().unwrap_or_default();
        let mut guard = ctx.settings.guards.get(&key).filter(|g| g.uid == uid);
        // A finished run the status already holds needs its guard no more.
        if let Some(done) = &guard
            && done.progress().finished()
            && old.current_run.as_ref().is_none_or(|c| c.id != done.run)
            && old.history.iter().any(|h| h.id == done.run)
        {
            ctx.settings.guards.remove(&key);
            guard = None;
        }
        Ok(Self {
            ctx,
            drill,
            namespace,
            uid,
            now: ctx.clock.now(),
            old,
            guard,
            request: None,
            force: None,
            ended: Vec::new(),
            handled: None,
            standby: if drill.spec.failover.is_some() {
                StandbyLook::NotLooked
            } else {
                StandbyLook::Unset
            },
            primary: SaleView::default(),
        })
    }

    /// Reads the run-now request and the force. A force lifts the windows
    /// for the one request it came with, never a later one: it is taken
    /// off the drill whether it was used or not.
    async fn take_requests(&mut self) -> Result<(), Error> {
        let annotations = self.drill.annotations();
        let unhandled = annotations
            .get(RUN_NOW_ANNOTATION)
            .filter(|r| self.old.last_run_request.as_ref() != Some(*r))
            .cloned();
        // The request that started this replica's run is handled whatever
        // the status says: a status written from a read older than the
        // run's start lacks it, and it must not be taken for a new one.
        match unhandled {
            Some(r) if self.guard.as_ref().is_some_and(|g| g.started(&r)) => {
                self.handled = Some(r);
            }
            other => self.request = other,
        }
        self.force = annotations.get(FORCE_ANNOTATION).cloned();
        let Some(force) = &self.force else {
            return Ok(());
        };
        consume_force(self.ctx, self.drill, force).await?;
        if self.request.is_none() {
            let note = format!(
                "{FORCE_ANNOTATION} was set without a new {RUN_NOW_ANNOTATION} request; it applies only to the request it comes with, so it was removed"
            );
            self.ctx
                .event(self.drill, true, DrillReason::ForceIgnored, note)
                .await;
        }
        Ok(())
    }

    /// Where the drill stands, in the order the safety rules demand: the
    /// kill switch first, whatever the spec or the run; then a run no
    /// guard drives; then the spec; then the run in progress; then the
    /// schedule.
    async fn look(&mut self) -> Result<(State, After), Error> {
        if let Some(why) = kill_switch(self.ctx, &self.namespace).await? {
            return self.kill(why).await;
        }
        self.ctx.settings.budgets.open(&self.namespace).await;
        if let Some(current) = self.unguarded_run() {
            let ended = stop_stale(self.ctx, self.drill, &self.namespace, current).await?;
            self.end(ended).await;
            return Ok((
                State::GuardLost,
                After::Soon(std::time::Duration::from_secs(1)),
            ));
        }
        let calendar = match self.check_spec() {
            Ok(calendar) => calendar,
            Err(problems) => return Ok(self.invalid(problems).await),
        };
        let spec = &self.drill.spec;
        self.primary = SaleView::read(self.ctx, &self.namespace, &spec.sale_ref.name).await?;
        let sale = self.primary.state(self.now);
        if let Some(guard) = self.guard.clone() {
            let followed = self.follow(&guard, &calendar, sale).await;
            self.check_standby(false).await;
            return Ok(followed);
        }
        self.check_standby(false).await;
        if spec.suspend {
            self.refuse_request(DrillReason::Suspended, "spec.suspend is set")
                .await;
            return Ok((State::Suspended, After::Change));
        }
        Ok(self.schedule(&calendar, sale).await)
    }

    /// Every run of the namespace and every object the operator made there
    /// go.
    async fn kill(&mut self, why: String) -> Result<(State, After), Error> {
        let stopped = super::sweep(self.ctx, &self.namespace).await?;
        if let Some(mut current) = self.old.current_run.clone() {
            let given_back = give_back(
                self.ctx,
                self.drill,
                &self.namespace,
                &mut current,
                self.now,
            )
            .await;
            let message = format!(
                "{why}: every experiment deleted{}{given_back}",
                failover_stopped(self.drill, &stopped)
            );
            let aborted = RunOutcome::Aborted;
            self.end(ended(
                current,
                aborted,
                DrillReason::KillSwitch,
                message,
                self.now,
                &stopped,
            ))
            .await;
        }
        self.refuse_request(DrillReason::KillSwitch, &why).await;
        Ok((State::KillSwitched { why }, After::Change))
    }

    /// The run in the status that no guard of this replica drives: it lost
    /// its guard (the operator restarted, or this replica just took the
    /// lease), and its chaos is stopped before anything else.
    fn unguarded_run(&self) -> Option<RunRecord> {
        let current = self.old.current_run.as_ref()?;
        let driven = self
            .guard
            .as_ref()
            .is_some_and(|g| g.run == current.id && (g.running() || g.progress().finished()));
        (!driven).then(|| current.clone())
    }

    /// The drill's calendar, or every problem of its spec.
    fn check_spec(&self) -> Result<Calendar, String> {
        let problems = validate::chaos_drill(&self.drill.spec);
        if !problems.is_empty() {
            let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
            return Err(messages.join("; "));
        }
        Calendar::new(&self.drill.spec).map_err(|err| err.to_string())
    }

    async fn invalid(&mut self, problems: String) -> (State, After) {
        self.refuse_request(DrillReason::InvalidSpec, status::CANNOT_RUN)
            .await;
        let running = self.guard.is_some();
        (State::Invalid { problems, running }, After::Change)
    }

    /// Mirrors the guard's run; the spec as it is now binds the run too: a
    /// blackout added, a window shortened or avoidLiveSale set end it.
    async fn follow(
        &mut self,
        guard: &Guard,
        calendar: &Calendar,
        sale: SaleState,
    ) -> (State, After) {
        let progress = guard.progress();
        if progress.finished() {
            self.end(progress.record).await;
            if self.request.is_some() {
                self.handled = self.request.clone();
            }
            let next_run = calendar.next_run(self.now);
            return (State::Scheduled { next_run }, After::NextRun);
        }
        if self.request.is_some() {
            let message = format!("run {} is in progress", guard.run);
            self.refuse_request(DrillReason::RunInProgress, &message)
                .await;
        }
        if let Some(why) = abort_request(self.drill, &guard.run) {
            guard.ask_to_end(DrillReason::AbortRequested, why);
        }
        let binding = progress.record.forced.is_none().then_some(calendar);
        let avoid_live_sale = self.drill.spec.avoid_live_sale;
        if let Err(ending) = execute::still_allowed(binding, sale, avoid_live_sale, self.now) {
            guard.ask_to_end(ending.reason, ending.message);
        }
        let (record, phase) = (progress.record, progress.phase);
        (State::Running { record, phase }, After::Soon(RUNNING_LOOK))
    }

    /// Decides whether a run starts now ([`decide_start`]) and acts on it.
    async fn schedule(&mut self, calendar: &Calendar, sale: SaleState) -> (State, After) {
        let spec = &self.drill.spec;
        // A spec edit (or a first look) reschedules from now.
        let next_run = match (
            &self.old.next_run_time,
            self.old.observed.observed_generation,
        ) {
            (Some(next), seen) if seen == self.drill.metadata.generation => Some(next.0),
            _ => calendar.next_run(self.now),
        };
        let decision = decide_start(&Facts {
            now: self.now,
            calendar,
            next_run,
            request: self.request.as_deref(),
            force: self.force.as_deref(),
            sale,
            avoid_live_sale: spec.avoid_live_sale,
        });
        self.handled = self.request.clone();
        match decision {
            Start::Wait => (State::Scheduled { next_run }, After::NextRun),
            Start::Skip { reason, message } => {
                self.skip(reason, message).await;
                let next_run = calendar.next_run(self.now);
                (State::Scheduled { next_run }, After::NextRun)
            }
            Start::Run { .. } if !self.standby_allows_run().await => {
                let (reason, message) = self.standby_refusal();
                self.skip(reason, message).await;
                let next_run = calendar.next_run(self.now);
                (State::Scheduled { next_run }, After::NextRun)
            }
            Start::Run { forced } => {
                let request = self.request.clone();
                let record = start(
                    self.ctx, self.drill, &self.uid, calendar, self.now, forced, request,
                );
                let note = format!(
                    "run {} started; injecting once every objective held for {}",
                    record.id, spec.slo_guard.steady_state
                );
                self.ctx
                    .event_of(self.drill, false, DrillReason::RunStarted, &record.id, note)
                    .await;
                let next_run = calendar.next_run(self.now);
                (
                    State::Started { record, next_run },
                    After::Soon(RUNNING_LOOK),
                )
            }
        }
    }

    /// Checks the standby's readiness when it is due (or `now`): on a first
    /// look, a spec edit, or `checkEvery` after the last check.
    async fn check_standby(&mut self, now: bool) {
        let Some(failover) = &self.drill.spec.failover else {
            self.ctx.metrics.drill_standby(self.drill, None);
            return;
        };
        let previous = self.old.failover.as_ref();
        let edited = self.old.observed.observed_generation != self.drill.metadata.generation;
        let due = previous.is_none_or(|p| readiness_due(failover, p, self.now).is_zero());
        let request = self.drill.annotations().get(CHECK_ANNOTATION).cloned();
        let asked = previous.is_some_and(|p| check_requested(request.as_deref(), p));
        if !(now || edited || due || asked) {
            self.standby = StandbyLook::Kept;
            return;
        }
        tracing::debug!(now, edited, due, asked, "checking the standby's readiness");
        let prometheus_url = prometheus_url(self.ctx, self.drill);
        let source = readings::Source {
            ctx: self.ctx,
            namespace: &self.namespace,
            sale: &self.drill.spec.sale_ref.name,
            primary: &self.primary,
            prometheus_url: &prometheus_url,
        };
        let read = readings::read(&source, failover, self.now).await;
        let mut verdict = readiness::assess(failover, &read, previous, self.ctx.clock.now());
        verdict.status.request = request;
        self.ctx
            .metrics
            .drill_standby(self.drill, Some(verdict.ready()));
        if previous.is_none_or(|p| p.ready != verdict.ready()) {
            let warning = !verdict.ready();
            let (reason, message) = (verdict.reason, verdict.message.clone());
            self.ctx
                .event_of(self.drill, warning, reason, "readiness", message)
                .await;
        }
        self.standby = StandbyLook::Checked(verdict);
    }

    /// Whether a run may start as far as the standby goes: an active
    /// failover drill needs a standby that is ready now, checked afresh.
    async fn standby_allows_run(&mut self) -> bool {
        let active = self
            .drill
            .spec
            .failover
            .as_ref()
            .is_some_and(|f| f.mode == FailoverMode::Active);
        if !active {
            return true;
        }
        if !matches!(&self.standby, StandbyLook::Checked(v) if v.status.checked_at.as_ref().is_some_and(|at| at.0 >= self.now))
        {
            self.check_standby(true).await;
        }
        matches!(&self.standby, StandbyLook::Checked(v) if v.ready())
    }

    /// Why the standby refuses an active run.
    fn standby_refusal(&self) -> (DrillReason, String) {
        match &self.standby {
            StandbyLook::Checked(verdict) => (
                verdict.reason,
                format!(
                    "the standby is not ready for an active failover: {}",
                    verdict.message
                ),
            ),
            _ => (
                DrillReason::ReadinessUnknown,
                "the standby's readiness could not be checked".to_owned(),
            ),
        }
    }

    /// An ended run: its Event, and its place in the history.
    async fn end(&mut self, record: RunRecord) {
        announce(self.ctx, self.drill, &record).await;
        self.ended.push(record);
    }

    /// Records a run that was due but did not start: a `Skipped` history
    /// entry, its Event and its count.
    async fn skip(&mut self, reason: DrillReason, message: String) {
        let now = self.ctx.clock.now();
        let record = RunRecord {
            id: run_id(now),
            started_at: Some(Time(now)),
            ended_at: Some(Time(now)),
            outcome: Some(RunOutcome::Skipped),
            reason: Some(reason.to_string()),
            message: Some(message),
            request: self.request.clone(),
            ..RunRecord::default()
        };
        let skipped = RunOutcome::Skipped.name();
        self.ctx.metrics.drill_run(self.drill, skipped);
        self.end(record).await;
    }

    /// Refuses the run-now request, if there is one, when it arrives (kill
    /// switch, suspended, invalid spec, a run in progress): it is recorded
    /// as skipped and handled, never kept to fire when the obstacle is
    /// gone.
    async fn refuse_request(&mut self, reason: DrillReason, why: &str) {
        let Some(request) = self.request.clone() else {
            return;
        };
        self.skip(reason, format!("run-now request {request} refused: {why}"))
            .await;
        self.handled = Some(request);
    }
}

/// The abort asked of the run `run` (`flashsale.dev/abort-run` names it),
/// as the run's message says it: who asked and why, when they said.
fn abort_request(drill: &ChaosDrill, run: &str) -> Option<String> {
    let annotations = drill.annotations();
    if annotations.get(ABORT_ANNOTATION)? != run {
        return None;
    }
    Some(match annotations.get(ABORT_REASON_ANNOTATION) {
        Some(why) => format!("aborted on request: {why}"),
        None => "aborted on request".to_owned(),
    })
}

/// Whether `request` (`flashsale.dev/check-readiness`) asks for a check
/// the last one did not answer.
fn check_requested(request: Option<&str>, last: &FailoverStatus) -> bool {
    request.is_some_and(|r| last.request.as_deref() != Some(r))
}

/// Sleep until the next run is due, looking again at least every
/// [`IDLE`] (windows and the sale's phase can change meanwhile).
fn next_look(
    status: &ChaosDrillStatus,
    now: Timestamp,
    readiness: Option<std::time::Duration>,
) -> Action {
    let until = status
        .next_run_time
        .as_ref()
        .and_then(|next| std::time::Duration::try_from(next.0 - now).ok())
        .unwrap_or(IDLE)
        .min(readiness.unwrap_or(IDLE));
    Action::requeue(until.min(IDLE).max(std::time::Duration::from_millis(100)))
}

/// The Prometheus the drill's guard (and its readiness checks) ask.
fn prometheus_url(ctx: &Ctx, drill: &ChaosDrill) -> String {
    drill
        .spec
        .slo_guard
        .prometheus_url
        .clone()
        .or_else(|| ctx.settings.prometheus_url.clone())
        .unwrap_or_default()
}

/// Starts a run: a guard, and the task that drives it.
fn start(
    ctx: &Arc<Ctx>,
    drill: &ChaosDrill,
    uid: &str,
    calendar: &Calendar,
    now: Timestamp,
    forced: Option<String>,
    request: Option<String>,
) -> RunRecord {
    let prometheus_url = prometheus_url(ctx, drill);
    let record = RunRecord {
        id: run_id(now),
        started_at: Some(Time(now)),
        forced: forced.clone(),
        request: request.clone(),
        ..RunRecord::default()
    };
    let guard = Arc::new(
        Guard::new(
            uid.to_owned(),
            record.id.clone(),
            drill.spec.slo_guard.stale_after.0,
            Progress {
                phase: DrillPhase::SteadyState,
                record: record.clone(),
            },
        )
        .started_by(request),
    );
    let plan = Plan {
        drill: Arc::new(drill.clone()),
        run: record.id.clone(),
        guard_url: ctx.settings.guard_url(
            &drill.namespace().unwrap_or_default(),
            &drill.name_any(),
            &record.id,
        ),
        prometheus_url,
        calendar: forced.is_none().then(|| calendar.clone()),
    };
    let key = flashsale_kit::key(drill);
    ctx.settings.guards.insert(&key, guard.clone());
    let task = tokio::spawn(execute::execute(ctx.clone(), plan, guard.clone()));
    guard.attach(task.abort_handle());
    record
}

/// Stops the chaos of a run whose guard is gone and records it aborted.
async fn stop_stale(
    ctx: &Ctx,
    drill: &ChaosDrill,
    namespace: &str,
    current: RunRecord,
) -> Result<RunRecord, Error> {
    let decided = ctx.clock.moment();
    let stopped = stop::stop(
        &ctx.client,
        &ctx.leadership,
        ctx.clock.as_ref(),
        stop::Scope {
            namespace,
            selector: &chaos::run_selector(&drill.name_any(), &current.id),
            known: &chaos::parse_objects(&current.objects),
        },
        execute::STOP_BOUND,
    )
    .await?;
    let mut current = current;
    let given_back = give_back(ctx, drill, namespace, &mut current, decided.wall).await;
    let mut record = ended(
        current,
        RunOutcome::Aborted,
        DrillReason::GuardLost,
        format!(
            "no guard of this replica drives the run (the operator restarted or the lease changed \
             hands): its chaos was stopped{}{given_back}",
            failover_stopped(drill, &stopped)
        ),
        decided.wall,
        &stopped,
    );
    record.decided_at = Some(MicroTime(decided.wall));
    if let Some(gone) = stopped.gone_after {
        let latency = gone.saturating_sub(decided.mono);
        record.abort_latency = Some(flashsale_api::Duration(latency));
        ctx.metrics.drill_aborted(drill, latency);
    }
    ctx.metrics.drill_run(drill, RunOutcome::Aborted.name());
    Ok(record)
}

/// Has what the run of `record` promoted follow the primary again, as
/// the run's own end would have, for a stop from outside its task; what
/// to add to its message.
async fn give_back(
    ctx: &Ctx,
    drill: &ChaosDrill,
    namespace: &str,
    record: &mut RunRecord,
    now: Timestamp,
) -> String {
    let spec = drill.spec.failover.as_ref();
    promote::restore(&ctx.client, namespace, spec, (&mut record.promoted, now))
        .await
        .map(|said| format!("; {said}"))
        .unwrap_or_default()
}

/// What a stop from outside the run's task adds for an active failover
/// run whose experiments are all gone: the primary can take buyers back,
/// though no one watched it do so.
fn failover_stopped(drill: &ChaosDrill, stopped: &stop::Stopped) -> &'static str {
    let active = drill
        .spec
        .failover
        .as_ref()
        .is_some_and(|f| f.mode == FailoverMode::Active);
    if active && stopped.not_removed().is_none() {
        "; the primary region's faults are gone, so it can take buyers back (its failback was \
         not measured)"
    } else {
        ""
    }
}

/// `record`, ended now with `outcome`, and what the stop saw: a stop that
/// left experiments behind fails the run, naming them.
fn ended(
    mut record: RunRecord,
    outcome: RunOutcome,
    reason: DrillReason,
    message: String,
    now: Timestamp,
    stopped: &stop::Stopped,
) -> RunRecord {
    let (outcome, reason, message) = match stopped.not_removed() {
        Some(left) => (
            RunOutcome::Failed,
            DrillReason::ExperimentsNotRemoved,
            format!("{} ({reason}: {message}); {left}", outcome.name()),
        ),
        None => (outcome, reason, message),
    };
    record.outcome = Some(outcome);
    record.reason = Some(reason.to_string());
    record.message = Some(message);
    record.ended_at = Some(Time(now));
    record.recovered_at = stopped.recovered_at.map(MicroTime).or(record.recovered_at);
    record.gone_at = stopped.gone_at.map(MicroTime).or(record.gone_at);
    record
}

/// Takes the force annotation off the drill, if it still has the value
/// `force` (an edit meanwhile is left for the next reconcile).
async fn consume_force(ctx: &Ctx, drill: &ChaosDrill, force: &str) -> Result<(), Error> {
    if !ctx.leadership.is_leader() {
        return Err(Error::NotLeader);
    }
    let namespace = drill.namespace().unwrap_or_default();
    let name = drill.name_any();
    let api: Api<ChaosDrill> = Api::namespaced(ctx.client.clone(), &namespace);
    // The resourceVersion makes the removal conditional: it fails rather
    // than remove a force given with a newer request.
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": drill.resource_version(),
        "annotations": {FORCE_ANNOTATION: null},
    }});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::debug!(
                force,
                "the drill changed meanwhile; its next reconcile consumes the force"
            );
        }
        Err(err) => return Err(Error::kube(Verb::Apply, "ChaosDrill", &name)(err)),
    }
    apply::wrote(ctx, Verb::Apply, "ChaosDrill", &namespace, &name);
    Ok(())
}

/// An Event per ended run: Warning when aborted or failed.
async fn announce(ctx: &Ctx, drill: &ChaosDrill, record: &RunRecord) {
    let Some(outcome) = record.outcome else {
        return;
    };
    let warning = matches!(outcome, RunOutcome::Aborted | RunOutcome::Failed);
    let mut note = format!(
        "run {} {}: {}",
        record.id,
        outcome.name().to_lowercase(),
        record.message.as_deref().unwrap_or("")
    );
    if let Some(latency) = &record.abort_latency {
        note.push_str(&format!(" (abort took {latency})"));
    }
    ctx.event_of(
        drill,
        warning,
        DrillReason::run_ended(outcome),
        &record.id,
        note,
    )
    .await;
}

/// Why the kill switch is on, if it is.
async fn kill_switch(ctx: &Ctx, namespace: &str) -> Result<Option<String>, Error> {
    if ctx.settings.kill_switch {
        return Ok(Some("the operator's --chaos-kill-switch is on".to_owned()));
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let ns = namespaces.get_opt(namespace).await.map_err(Error::kube(
        Verb::Read,
        "Namespace",
        namespace,
    ))?;
    let on = ns.is_some_and(|ns| {
        ns.annotations()
            .get(KILL_SWITCH_ANNOTATION)
            .is_some_and(|v| v == "true")
    });
    Ok(on
        .then(|| format!("namespace {namespace} has the annotation {KILL_SWITCH_ANNOTATION}=true")))
}

/// The target sale as the start gates see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleState {
    /// It does not exist.
    Missing,
    /// It is Live.
    Live,
    /// It exists and is not Live.
    NotLive,
}

/// The target sale as a run's gates and the failover checks read it:
/// whether it exists, its schedule, whether its status says Live and
/// Ready, and its region.
#[derive(Debug, Clone, Default)]
pub struct SaleView {
    /// The sale's uid; `None` when it does not exist.
    pub uid: Option<String>,
    /// Its schedule.
    timeline: Option<Timeline>,
    /// Whether its status says Live.
    status_live: bool,
    /// Whether its `Ready` condition is True.
    pub ready: bool,
    /// Its `spec.region`.
    pub region: String,
    /// The id its workloads key it by (`spec.saleID` or the derived one).
    pub sale_id: Option<String>,
    /// Where its drill key is (`names::drill_key`).
    pub drill_key: Option<SecretKeyRef>,
}

impl SaleView {
    /// Reads `namespace/name`.
    pub async fn read(ctx: &Ctx, namespace: &str, name: &str) -> Result<Self, Error> {
        let sales: Api<FlashSale> = Api::namespaced(ctx.client.clone(), namespace);
        let sale = sales
            .get_opt(name)
            .await
            .map_err(Error::kube(Verb::Read, "FlashSale", name))?;
        Ok(sale.map_or_else(Self::default, |sale| Self {
            sale_id: Owner::new(&sale).ok().map(|owner| owner.sale_id()),
            drill_key: Some(names::drill_key(&sale)),
            uid: sale.uid(),
            timeline: Some(Timeline::of(&sale.spec)),
            status_live: sale.status.as_ref().and_then(|s| s.phase) == Some(SalePhase::Live),
            ready: sale
                .status
                .as_ref()
                .is_some_and(|s| s.observed.is_true(flashsale_api::conditions::READY)),
            region: sale.spec.region,
        }))
    }

    /// The sale at `now`. Live means inside its schedule, whatever its
    /// status says (a sale whose status is `Failed` may still serve), or a
    /// status that says Live.
    pub fn state(&self, now: Timestamp) -> SaleState {
        match &self.timeline {
            None => SaleState::Missing,
            Some(timeline) if self.status_live || timeline.phase_at(now).0 == SalePhase::Live => {
                SaleState::Live
            }
            Some(_) => SaleState::NotLive,
        }
    }
}

/// What [`decide_start`] looks at.
pub struct Facts<'a> {
    /// Now.
    pub now: Timestamp,
    /// The drill's calendar.
    pub calendar: &'a Calendar,
    /// When the next scheduled run is due.
    pub next_run: Option<Timestamp>,
    /// A run-now request not handled yet.
    pub request: Option<&'a str>,
    /// The force annotation's reason, if any.
    pub force: Option<&'a str>,
    /// The target sale.
    pub sale: SaleState,
    /// `spec.avoidLiveSale`.
    pub avoid_live_sale: bool,
}

/// Whether a run starts now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Nothing is due.
    Wait,
    /// A run is due but may not start: recorded as skipped.
    Skip {
        /// CamelCase reason.
        reason: DrillReason,
        /// The reason in a sentence.
        message: String,
    },
    /// A run starts; `forced` says who lifted the windows and why.
    Run {
        /// The force reason, for a forced run-now.
        forced: Option<String>,
    },
}

/// Decides whether a run starts: due (a scheduled time passed, or a new
/// run-now request), then the gates in order — missed schedule, sale
/// missing, sale Live, windows and blackouts (lifted only by a forced
/// request).
pub fn decide_start(facts: &Facts<'_>) -> Start {
    let scheduled = facts.next_run.filter(|next| *next <= facts.now);
    if facts.request.is_none() && scheduled.is_none() {
        return Start::Wait;
    }
    let skip = |reason: DrillReason, message: String| Start::Skip { reason, message };
    if let (None, Some(next)) = (facts.request, scheduled)
        && facts.now.duration_since(next) > MISSED_BOUND
    {
        return skip(
            DrillReason::MissedSchedule,
            format!(
                "the run due at {next} was missed by more than {}; the next one is scheduled",
                flashsale_api::Duration(
                    std::time::Duration::try_from(MISSED_BOUND).unwrap_or_default()
                )
            ),
        );
    }
    match facts.sale {
        SaleState::Missing => {
            return skip(
                DrillReason::SaleNotFound,
                "the FlashSale of spec.saleRef does not exist".to_owned(),
            );
        }
        SaleState::Live if facts.avoid_live_sale => {
            return skip(
                DrillReason::SaleLive,
                "the sale is Live and spec.avoidLiveSale is set".to_owned(),
            );
        }
        _ => {}
    }
    let forced = facts.request.and(facts.force).map(str::to_owned);
    if forced.is_none() {
        match facts.calendar.allowance(facts.now) {
            Allowance::Allowed => {}
            refused => {
                let message = match &refused {
                    Allowance::InBlackout { reason, until } => format!(
                        "inside a blackout until {until}{}",
                        reason
                            .as_deref()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    ),
                    _ => "outside every window of spec.windows".to_owned(),
                };
                return skip(refused.reason(), message);
            }
        }
    }
    Start::Run { forced }
}

/// A run's id: its start time in UTC to the millisecond,
/// `YYYYMMDD-HHMMSS-mmm`, so a request right after a skip is another run.
pub fn run_id(now: Timestamp) -> String {
    now.strftime("%Y%m%d-%H%M%S-%3f").to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The shipped example's calendar: Tuesdays and Thursdays 14:00-16:00
    /// in Tokyo, and a blackout over 11.11.
    pub(crate) fn calendar() -> anyhow::Result<Calendar> {
        let drill: ChaosDrill = serde_yaml_ng::from_str(include_str!(
            "../../../../crds/examples/chaosdrill-pod-kill.yaml"
        ))?;
        Ok(Calendar::new(&drill.spec)?)
    }

    /// An instant written with its zone.
    pub(crate) fn at(text: &str) -> anyhow::Result<Timestamp> {
        Ok(text.parse::<jiff::Zoned>()?.timestamp())
    }

    /// The shipped example drill with `annotations`.
    fn annotated(annotations: &[(&str, &str)]) -> anyhow::Result<ChaosDrill> {
        let mut drill: ChaosDrill = serde_yaml_ng::from_str(include_str!(
            "../../../../crds/examples/chaosdrill-pod-kill.yaml"
        ))?;
        for (key, value) in annotations {
            drill
                .annotations_mut()
                .insert((*key).to_owned(), (*value).to_owned());
        }
        Ok(drill)
    }

    #[test]
    fn an_abort_request_ends_only_the_run_it_names() -> anyhow::Result<()> {
        let run = "2026-11-10T05:00:00.000Z";
        let asked = annotated(&[(ABORT_ANNOTATION, run)])?;
        assert_eq!(
            abort_request(&asked, run).as_deref(),
            Some("aborted on request")
        );
        // A request for an earlier run never ends a later one.
        assert_eq!(abort_request(&asked, "2026-11-10T06:00:00.000Z"), None);
        assert_eq!(abort_request(&annotated(&[])?, run), None);
        let said = annotated(&[
            (ABORT_ANNOTATION, run),
            (ABORT_REASON_ANNOTATION, "alice: checkout errors rising"),
        ])?;
        assert_eq!(
            abort_request(&said, run).as_deref(),
            Some("aborted on request: alice: checkout errors rising")
        );
        Ok(())
    }

    #[test]
    fn each_new_check_request_makes_one_check() {
        let answered = |request: Option<&str>| FailoverStatus {
            request: request.map(str::to_owned),
            ..FailoverStatus::default()
        };
        assert!(check_requested(Some("r1"), &answered(None)));
        assert!(!check_requested(Some("r1"), &answered(Some("r1"))));
        assert!(check_requested(Some("r2"), &answered(Some("r1"))));
        assert!(!check_requested(None, &answered(None)));
        assert!(!check_requested(None, &answered(Some("r1"))));
    }

    #[test]
    fn a_sale_inside_its_schedule_is_live_whatever_its_status_says() -> anyhow::Result<()> {
        let sale: FlashSale = serde_json::from_value(serde_json::json!({
            "apiVersion": "flashsale.dev/v1alpha1",
            "kind": "FlashSale",
            "metadata": {"name": "s", "namespace": "shop", "uid": "u"},
            "spec": {
                "schedule": {"start": "2026-11-11T00:00:00Z", "end": "2026-11-11T02:00:00Z"},
                "region": "local",
                "items": [{"sku": "PHONE", "stock": 1, "priceMinor": 100}],
                "gateway": {"auth": {"hs256SecretRef": {"name": "jwt", "key": "k"}}},
                "inventory": {"redis": {"url": "redis://redis:6379"}},
                "orderWriter": {"kafka": {"brokers": ["kafka:9092"]},
                                "database": {"driver": "postgres", "urlSecretRef": {"name": "db", "key": "url"}}}
            }
        }))?;
        let view = |status_live: bool| SaleView {
            uid: sale.uid(),
            timeline: Some(Timeline::of(&sale.spec)),
            status_live,
            ..SaleView::default()
        };
        // Its status says Failed (a Secret is missing), but its pods serve.
        let cases = [
            ("2026-11-10T23:59:59Z", false, SaleState::NotLive),
            ("2026-11-11T00:00:00Z", false, SaleState::Live),
            ("2026-11-11T01:59:59Z", false, SaleState::Live),
            ("2026-11-11T02:00:00Z", false, SaleState::NotLive),
            // A status that says Live is believed too.
            ("2026-11-10T23:00:00Z", true, SaleState::Live),
        ];
        for (now, status_live, want) in cases {
            assert_eq!(view(status_live).state(now.parse()?), want, "{now}");
        }
        assert_eq!(
            SaleView::default().state(at("2026-11-11T01:00:00Z[UTC]")?),
            SaleState::Missing
        );
        Ok(())
    }

    #[test]
    fn a_stop_that_left_an_experiment_fails_the_run_naming_it_and_why_it_ended()
    -> anyhow::Result<()> {
        let now = at("2026-11-11T01:00:00Z[UTC]")?;
        let stopped = |remaining: Vec<String>| stop::Stopped {
            experiments: 1,
            workflows: 1,
            recovered_at: None,
            gone_at: remaining.is_empty().then_some(now),
            gone_after: None,
            remaining,
            waited: std::time::Duration::from_secs(60),
        };
        let end = |stopped: &stop::Stopped| {
            ended(
                RunRecord::default(),
                RunOutcome::Aborted,
                DrillReason::KillSwitch,
                "the kill switch is on: every experiment deleted".to_owned(),
                now,
                stopped,
            )
        };
        let clean = end(&stopped(vec![]));
        assert_eq!(clean.outcome, Some(RunOutcome::Aborted));
        assert_eq!(clean.reason.as_deref(), Some("KillSwitch"));
        let left = end(&stopped(vec!["NetworkChaos/cut".to_owned()]));
        assert_eq!(left.outcome, Some(RunOutcome::Failed));
        assert_eq!(left.reason.as_deref(), Some("ExperimentsNotRemoved"));
        let message = left.message.unwrap_or_default();
        for part in [
            "Aborted (KillSwitch",
            "NetworkChaos/cut",
            "1m",
            "chaos-daemon",
        ] {
            assert!(message.contains(part), "{part} not in {message}");
        }
        Ok(())
    }

    fn facts<'a>(calendar: &'a Calendar, now: Timestamp, next_run: Timestamp) -> Facts<'a> {
        Facts {
            now,
            calendar,
            next_run: Some(next_run),
            request: None,
            force: None,
            sale: SaleState::NotLive,
            avoid_live_sale: true,
        }
    }

    fn reason(start: &Start) -> &'static str {
        match start {
            Start::Wait => "Wait",
            Start::Skip { reason, .. } => reason.as_str(),
            Start::Run { .. } => "Run",
        }
    }

    #[test]
    fn a_request_at_tuesday_1359_tokyo_is_outside_the_window_and_1400_runs() -> anyhow::Result<()> {
        let calendar = calendar()?;
        let later = at("2026-12-31T00:00:00+09:00[Asia/Tokyo]")?;
        // 2026-12-01 is a Tuesday.
        let cases = [
            ("2026-12-01T13:59:00+09:00[Asia/Tokyo]", "OutsideWindow"),
            ("2026-12-01T14:00:00+09:00[Asia/Tokyo]", "Run"),
            ("2026-12-01T15:59:59+09:00[Asia/Tokyo]", "Run"),
            ("2026-12-01T16:00:00+09:00[Asia/Tokyo]", "OutsideWindow"),
            ("2026-12-02T14:30:00+09:00[Asia/Tokyo]", "OutsideWindow"),
            // The same instant seen from UTC: still 14:00 in Tokyo.
            ("2026-12-01T05:00:00+00:00[UTC]", "Run"),
        ];
        for (now, expected) in cases {
            let mut f = facts(&calendar, at(now)?, later);
            f.request = Some("manual-1");
            assert_eq!(reason(&decide_start(&f)), expected, "{now}");
        }
        Ok(())
    }

    #[test]
    fn nothing_starts_before_the_next_run_and_the_scheduled_one_starts_on_time()
    -> anyhow::Result<()> {
        let calendar = calendar()?;
        let next = at("2026-12-01T14:30:00+09:00[Asia/Tokyo]")?;
        let before = at("2026-12-01T14:29:59+09:00[Asia/Tokyo]")?;
        assert_eq!(decide_start(&facts(&calendar, before, next)), Start::Wait);
        assert_eq!(
            decide_start(&facts(&calendar, next, next)),
            Start::Run { forced: None }
        );
        // Late by more than the missed bound: skipped, not run late.
        let late = at("2026-12-01T14:31:01+09:00[Asia/Tokyo]")?;
        assert_eq!(
            reason(&decide_start(&facts(&calendar, late, next))),
            "MissedSchedule"
        );
        Ok(())
    }

    #[test]
    fn a_blackout_beats_the_window_and_only_a_forced_request_lifts_both() -> anyhow::Result<()> {
        let calendar = calendar()?;
        // Tuesday 2026-11-10, 14:30 Tokyo: inside the window and inside the
        // singles-day blackout of the example.
        let now = at("2026-11-10T14:30:00+09:00[Asia/Tokyo]")?;
        let mut f = facts(&calendar, now, now);
        assert_eq!(reason(&decide_start(&f)), "InBlackout");
        f.request = Some("manual-2");
        f.force = Some("alice: failover rehearsal");
        assert_eq!(
            decide_start(&f),
            Start::Run {
                forced: Some("alice: failover rehearsal".into())
            }
        );
        // A force annotation without a request forces nothing.
        f.request = None;
        assert_eq!(reason(&decide_start(&f)), "InBlackout");
        Ok(())
    }

    #[test]
    fn a_live_sale_blocks_even_a_forced_run_unless_the_drill_allows_it() -> anyhow::Result<()> {
        let calendar = calendar()?;
        let now = at("2026-12-01T14:30:00+09:00[Asia/Tokyo]")?;
        let mut f = facts(&calendar, now, now);
        f.sale = SaleState::Live;
        f.request = Some("manual-3");
        f.force = Some("bob");
        assert_eq!(reason(&decide_start(&f)), "SaleLive");
        f.avoid_live_sale = false;
        assert_eq!(reason(&decide_start(&f)), "Run");
        f.sale = SaleState::Missing;
        assert_eq!(reason(&decide_start(&f)), "SaleNotFound");
        Ok(())
    }

    #[test]
    fn run_ids_are_the_start_time_in_utc() -> anyhow::Result<()> {
        assert_eq!(
            run_id(at("2026-12-01T14:30:05.0429+09:00[Asia/Tokyo]")?),
            "20261201-053005-042"
        );
        Ok(())
    }

    /// The shipped example drill in namespace `shop`, and operator
    /// settings over `guards`.
    fn scripted_drill(
        guards: crate::guard::Guards,
    ) -> anyhow::Result<(ChaosDrill, crate::Settings)> {
        let mut drill: ChaosDrill = serde_yaml_ng::from_str(include_str!(
            "../../../../crds/examples/chaosdrill-pod-kill.yaml"
        ))?;
        drill.metadata.namespace = Some("shop".to_owned());
        drill.metadata.uid = Some("uid-1".to_owned());
        // The standby's readiness reads of its own are not what these
        // scripts are about.
        drill.spec.failover = None;
        let settings = crate::Settings::new(
            None,
            flashsale_observe::signal::SignalReader::new()?,
            "http://127.0.0.1:9".to_owned(),
            false,
            guards,
        );
        Ok((drill, settings))
    }

    /// The namespace read for its kill switch, here off.
    fn namespace_without_switch() -> flashsale_kit::mock::Step {
        flashsale_kit::mock::Step::expect(http::Method::GET, "/api/v1/namespaces/shop").answer(
            http::StatusCode::OK,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
        )
    }

    /// The drill's status write, holding `pointer` = `value`.
    fn status_write(
        drill: &ChaosDrill,
        holds: &[(&str, serde_json::Value)],
    ) -> anyhow::Result<flashsale_kit::mock::Step> {
        let name = drill.name_any();
        let path =
            format!("/apis/flashsale.dev/v1alpha1/namespaces/shop/chaosdrills/{name}/status");
        let step = holds.iter().fold(
            flashsale_kit::mock::Step::expect(http::Method::PATCH, path),
            |step, (pointer, value)| step.holding(pointer, value.clone()),
        );
        Ok(step.answer(http::StatusCode::OK, serde_json::to_value(drill)?))
    }

    /// The request sequence on a scripted apiserver: the namespace's kill
    /// switch is read first, then an invalid spec is a status, not a run:
    /// nothing else is asked or written.
    #[tokio::test]
    async fn an_invalid_spec_reads_the_kill_switch_then_writes_only_its_status()
    -> anyhow::Result<()> {
        use flashsale_kit::mock::Scripted;

        let (mut drill, settings) = scripted_drill(crate::guard::Guards::default())?;
        drill.spec.schedule.cron = "every tuesday".to_owned();
        let script = vec![
            namespace_without_switch(),
            status_write(&drill, &[("/status/phase", serde_json::json!("Failed"))])?,
        ];
        let scripted = Scripted::new(IDENTITY, settings, script);
        let outcome = reconcile_drill(&drill, &scripted.ctx).await;
        let action = scripted.check(outcome).await.map_err(anyhow::Error::msg)?;
        assert_eq!(
            action,
            Action::await_change(),
            "an invalid spec waits for an edit"
        );
        Ok(())
    }

    /// A run-now request refused on arrival is recorded with the request
    /// it refused, so whoever asked finds the answer by the request alone.
    #[tokio::test]
    async fn a_refused_request_is_named_in_its_skipped_record() -> anyhow::Result<()> {
        use flashsale_kit::mock::Scripted;
        use serde_json::json;

        let (mut drill, settings) = scripted_drill(crate::guard::Guards::default())?;
        drill.spec.schedule.cron = "every tuesday".to_owned();
        drill
            .annotations_mut()
            .insert(RUN_NOW_ANNOTATION.to_owned(), "r1".to_owned());
        // The refusal's Event, then the status.
        let event = flashsale_kit::mock::Step::expect(
            http::Method::POST,
            "/apis/events.k8s.io/v1/namespaces/shop/events",
        )
        .holding("/reason", json!("RunSkipped"))
        .answer(http::StatusCode::CREATED, json!({}));
        let script = vec![
            namespace_without_switch(),
            event,
            status_write(
                &drill,
                &[
                    ("/status/lastRunRequest", json!("r1")),
                    ("/status/history/0/outcome", json!("Skipped")),
                    ("/status/history/0/reason", json!("InvalidSpec")),
                    ("/status/history/0/request", json!("r1")),
                ],
            )?,
        ];
        let scripted = Scripted::new(IDENTITY, settings, script);
        let outcome = reconcile_drill(&drill, &scripted.ctx).await;
        scripted.check(outcome).await.map_err(anyhow::Error::msg)?;
        Ok(())
    }

    /// A look made from a read older than the run's start (the watch had
    /// not caught up) sees the run-now request that started the run as
    /// new. It is the run's own request: the status written keeps it as
    /// handled, rather than leaving it to be refused as a second request,
    /// which the kill switch then recorded as a skipped run.
    #[tokio::test]
    async fn the_request_that_started_the_run_stays_handled_after_a_stale_read()
    -> anyhow::Result<()> {
        use flashsale_kit::mock::Scripted;
        use serde_json::json;

        let guards = crate::guard::Guards::default();
        let (mut drill, settings) = scripted_drill(guards.clone())?;
        drill
            .annotations_mut()
            .insert(RUN_NOW_ANNOTATION.to_owned(), "r1".to_owned());
        let record = RunRecord {
            id: "20261111-010000-000".to_owned(),
            ..RunRecord::default()
        };
        let progress = Progress {
            phase: DrillPhase::SteadyState,
            record: record.clone(),
        };
        let guard = Guard::new(
            "uid-1".to_owned(),
            record.id.clone(),
            drill.spec.slo_guard.stale_after.0,
            progress,
        )
        .started_by(Some("r1".to_owned()));
        // The task that drives the run, still under way.
        let task = tokio::spawn(std::future::pending::<()>());
        guard.attach(task.abort_handle());
        guards.insert(&flashsale_kit::key(&drill), Arc::new(guard));
        // The status as a write from the stale read left it: the run, and
        // no handled request.
        drill.status = Some(ChaosDrillStatus {
            current_run: Some(record.clone()),
            ..ChaosDrillStatus::default()
        });
        let sale = format!(
            "/apis/flashsale.dev/v1alpha1/namespaces/shop/flashsales/{}",
            drill.spec.sale_ref.name
        );
        let script = vec![
            namespace_without_switch(),
            flashsale_kit::mock::Step::expect(http::Method::GET, sale).not_found(),
            status_write(
                &drill,
                &[
                    ("/status/lastRunRequest", json!("r1")),
                    ("/status/currentRun/id", json!(record.id)),
                ],
            )?,
        ];
        let scripted = Scripted::new(IDENTITY, settings, script);
        let outcome = reconcile_drill(&drill, &scripted.ctx).await;
        scripted.check(outcome).await.map_err(anyhow::Error::msg)?;
        Ok(())
    }
}
