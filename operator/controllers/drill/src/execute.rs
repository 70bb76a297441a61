//! Drives one run of a drill, as the task its [`Guard`] stands for:
//! steady state, the choice of target pods, injection, the guard loop that
//! aborts, the stop, and the verification that the SLOs hold again.
//!
//! The task belongs to the controller: when the replica stops leading it
//! stops at once (and falls silent, so Chaos Mesh's StatusCheck backstop
//! ends the chaos unless the new leader already has). Decisions are the
//! pure functions of [`verdict`], [`blast`] and the calendar; this module
//! only gathers, times and writes.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::future::join_all;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
};
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, ListParams, PostParams},
};

use super::{
    Ctx, blast,
    budget::Ask,
    buyer::{Signer, Tally},
    chaos,
    chaos::Backstop,
    chaos::Kind,
    chaos::TARGET_LABEL,
    failover::{Buyers, PROBE_EVERY, Probe, SUSTAINED},
    guard::Guard,
    promote, readings,
    reconcile::SaleState,
    reconcile::SaleView,
    rpo, stop,
    stop::Stopped,
    verdict,
    verdict::Observed,
    verdict::Verdict,
};
use flashsale_api::{
    ChaosDrill, calendar::Allowance, calendar::Calendar, chaosdrill::DrillPhase,
    chaosdrill::Experiment, chaosdrill::FailoverMode, chaosdrill::RunOutcome, children::MANAGED_BY,
    children::MANAGED_BY_KEY, children::selector, reasons::DrillReason,
};
use flashsale_kit::clock::Moment;
use flashsale_observe::signal::Reading;

/// Longest message a run's record holds (`RunRecord.message`): every
/// sentence of an active failover run; its Event carries the first
/// 1,024 bytes, the apiserver's bound on a note.
const RUN_MESSAGE_BOUND: usize = 2048;
/// How long Chaos Mesh may take to create a run's StatusCheck.
const STATUS_CHECK_BOUND: Duration = Duration::from_secs(15);
/// How long a stop waits for Chaos Mesh to remove the experiments.
pub const STOP_BOUND: Duration = Duration::from_secs(60);
/// Longest Chaos Mesh may take to report an experiment injected; it
/// retries failed applies with backoff, so a transient failure still lands.
const INJECT_BOUND: Duration = Duration::from_secs(20);
/// How often a run reads its sale again (between reads it judges the
/// sale's schedule as last read, every tick).
const SALE_REREAD: Duration = Duration::from_secs(1);
/// The shortest experiment worth injecting before a window closes.
const SHORTEST: Duration = Duration::from_secs(1);
/// The least time the primary region gets to serve buyers again after an
/// active failover run's faults were removed (`maxRTO` when longer): its
/// gateways restart and pass the endpoint's health checks.
const FAILBACK_BOUND: Duration = Duration::from_secs(60);
/// The annotation Chaos Mesh sets on a Workflow its StatusCheck aborted.
const WORKFLOW_ABORT_ANNOTATION: &str = "workflow.chaos-mesh.org/abort";

/// What a run needs, fixed when it starts: a spec edited mid-run applies
/// to the next run.
pub struct Plan {
    /// The drill as it was when the run started.
    pub drill: Arc<ChaosDrill>,
    /// The run id.
    pub run: String,
    /// Prometheus to ask.
    pub prometheus_url: String,
    /// The drill's windows and blackouts, checked at every look of the run;
    /// `None` for a forced run, which they do not bind.
    pub calendar: Option<Calendar>,
    /// Where Chaos Mesh probes this run's guard.
    pub guard_url: String,
}

impl Plan {
    /// `namespace/drill/run`, the run's key in the budget.
    pub fn key(&self) -> String {
        format!("{}/{}", flashsale_kit::key(self.drill.as_ref()), self.run)
    }
}

/// Whether a run may go on at `now`: inside its windows and outside every
/// blackout (unless forced, `calendar` then `None`), and, under
/// `avoidLiveSale`, while the sale is not Live. The reason and sentence
/// that end it otherwise.
pub fn still_allowed(
    calendar: Option<&Calendar>,
    sale: SaleState,
    avoid_live_sale: bool,
    now: Timestamp,
) -> Result<(), Ending> {
    if avoid_live_sale && sale == SaleState::Live {
        return Err(Ending::new(
            RunOutcome::Aborted,
            DrillReason::SaleWentLive,
            "the sale went Live and spec.avoidLiveSale is set",
        ));
    }
    match calendar.map(|c| c.allowance(now)) {
        None | Some(Allowance::Allowed) => Ok(()),
        Some(Allowance::OutsideWindows) => Err(Ending::new(
            RunOutcome::Aborted,
            DrillReason::WindowClosed,
            "the allowed window of spec.windows closed",
        )),
        Some(Allowance::InBlackout { reason, until }) => Err(Ending::new(
            RunOutcome::Aborted,
            DrillReason::BlackoutStarted,
            format!(
                "a blackout started, until {until}{}",
                reason.map(|r| format!(" ({r})")).unwrap_or_default()
            ),
        )),
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// The outcome.
    pub outcome: RunOutcome,
    /// A CamelCase reason.
    pub reason: DrillReason,
    /// The reason in a sentence.
    pub message: String,
}

impl Ending {
    fn new(outcome: RunOutcome, reason: DrillReason, message: impl Into<String>) -> Self {
        Self {
            outcome,
            reason,
            message: message.into(),
        }
    }

    /// The run failed: the operator could not do its part.
    fn failed(reason: DrillReason, err: &dyn std::fmt::Display) -> Self {
        Self::new(RunOutcome::Failed, reason, err.to_string())
    }

    /// The run was skipped before anything was injected.
    fn skipped(reason: DrillReason, message: impl Into<String>) -> Self {
        Self::new(RunOutcome::Skipped, reason, message)
    }
}

/// Drives the run to its end and records the ending in the guard; stops
/// without a word when this replica stops leading.
pub async fn execute(ctx: Arc<Ctx>, plan: Plan, guard: Arc<Guard>) {
    let mut leadership = ctx.leadership.clone();
    let mut ending = tokio::select! {
        ending = drive(&ctx, &plan, &guard) => ending,
        () = leadership.lost() => {
            guard.silence(DrillReason::NotLeader);
            return;
        }
    };
    // However the run ended, what it promoted follows the primary again.
    if let Some(said) = give_back(&ctx, &plan, &guard).await {
        ending.message = format!("{}; {said}", ending.message);
    }
    guard.silence(DrillReason::Ended);
    let now = ctx.clock.now();
    let drill = &plan.drill;
    let namespace = drill.namespace().unwrap_or_default();
    ctx.settings.budgets.release(&namespace, &plan.key());
    ctx.metrics.drill_run(drill.as_ref(), ending.outcome.name());
    let record = guard.progress().record;
    if let Some(rto) = record.failover_rto {
        ctx.metrics.drill_failover(drill.as_ref(), rto.0);
    }
    if let Some(units) = record.oversold_units {
        ctx.metrics.drill_failover_oversold(drill.as_ref(), units);
    }
    if matches!(ending.reason, DrillReason::Signal(_)) {
        ctx.metrics.drill_guard_blind(drill.as_ref());
    }
    let mut message = ending.message.clone();
    // The record's schema bound: a longer one would fail the status write.
    flashsale_api::common::truncate(&mut message, RUN_MESSAGE_BOUND);
    guard.update(|progress| {
        progress.record.outcome = Some(ending.outcome);
        progress.record.reason = Some(ending.reason.to_string());
        progress.record.message = Some(message);
        progress.record.ended_at = Some(Time(now));
    });
    tracing::info!(
        drill = %flashsale_kit::key(drill.as_ref()), run = plan.run, outcome = ending.outcome.name(),
        reason = ending.reason.as_str(), message = ending.message, "run ended"
    );
    ctx.settings.wake(drill);
}

async fn drive(ctx: &Ctx, plan: &Plan, guard: &Guard) -> Ending {
    let spec = &plan.drill.spec;
    let steady = spec.slo_guard.steady_state.0;
    let mut sampler = Sampler::new(ctx, plan);
    let mut mandate = match Mandate::new(ctx, plan).await {
        Ok(mandate) => mandate,
        Err(err) => return Ending::failed(DrillReason::ReadFailed, &err),
    };
    if let Err(mut ending) = hold(
        ctx,
        &mut sampler,
        guard,
        Some(&mut mandate),
        steady,
        DrillReason::SteadyStateNotReached,
    )
    .await
    {
        // Nothing was injected: whatever stopped it, the run is skipped.
        ending.outcome = RunOutcome::Skipped;
        return ending;
    }
    // An active failover run watches buyers' answers from before the
    // faults, so it sees the moment they lose the primary.
    let probe = match failover_probe(ctx, plan, &mandate.sale).await {
        Ok(probe) => probe,
        Err(ending) => return ending,
    };
    // The guard goes on judging while the objects are created (Chaos Mesh
    // takes up to seconds to start the StatusCheck): its endpoint stays
    // fresh for a healthy run, and a breach meanwhile aborts at once.
    let sale_uid = mandate.sale.uid.clone().unwrap_or_default();
    let injecting = tokio::select! {
        injected = inject(ctx, plan, guard, &sale_uid) => Ok(injected),
        cause = keep(ctx, guard, &mut sampler, &mut mandate) => Err(cause),
    };
    let injected = match injecting {
        Ok(Ok(injected)) => injected,
        Ok(Err(ending)) => return ending,
        Err(cause) => return abort(ctx, plan, guard, cause).await,
    };
    set_phase(ctx, plan, guard, DrillPhase::Injecting);
    let watched = watch(
        ctx,
        plan,
        guard,
        (&mut sampler, &mut mandate),
        probe.as_ref(),
        injected,
    )
    .await;
    if let Some(ending) = watched {
        if let Some(mut probe) = probe {
            note_orders(guard, &mut probe).await;
        }
        return ending;
    }
    finish(ctx, plan, guard, steady, probe).await
}

/// The probe of an active failover run, started; `None` for any other run.
async fn failover_probe(ctx: &Ctx, plan: &Plan, sale: &SaleView) -> Result<Option<Probe>, Ending> {
    let Some(failover) = &plan.drill.spec.failover else {
        return Ok(None);
    };
    if failover.mode != FailoverMode::Active {
        return Ok(None);
    }
    let Some(url) = failover.endpoint.as_ref().and_then(|e| e.url.clone()) else {
        return Err(Ending::skipped(
            DrillReason::InvalidSpec,
            "an active failover run needs spec.failover.endpoint.url",
        ));
    };
    if sale.region.is_empty() {
        return Err(Ending::skipped(
            DrillReason::RegionUnnamed,
            "an active failover run tells the regions apart by the region their gateways stamp \
             on each answer: set the sale's spec.region",
        ));
    }
    let signer = drill_signer(ctx, plan, sale).await.map_err(|why| {
        Ending::skipped(
            DrillReason::DrillKeyUnreadable,
            format!(
                "an active failover run orders through the endpoint as the sale's drill buyer, \
                 signing with its drill key: {why}"
            ),
        )
    })?;
    let direct = failover.standby.gateway_url.clone();
    Ok(Some(Probe::start(
        (url, direct),
        sale.region.clone(),
        signer,
        ctx.clock.clone(),
    )))
}

/// Signs the run's drill orders with the sale's drill key; why not, in a
/// sentence.
async fn drill_signer(ctx: &Ctx, plan: &Plan, sale: &SaleView) -> Result<Signer, String> {
    let (Some(key), Some(sale_id)) = (&sale.drill_key, &sale.sale_id) else {
        return Err("the sale does not exist".to_owned());
    };
    let namespace = plan.drill.namespace().unwrap_or_default();
    let bytes = readings::secret_bytes(&ctx.client, &namespace, key).await?;
    // Buyers named `drill:<drill>:<run>:<n>`: each run's orders apart.
    let run = format!("{}:{}", plan.drill.name_any(), plan.run);
    Signer::new(bytes, sale_id.clone(), run).map_err(|err| {
        format!(
            "Secret {namespace}/{} key {}: {err} (a Secret made before drill keys existed has \
             none: name one in the sale's spec.gateway.drillKeySecretRef)",
            key.name, key.key
        )
    })
}

/// Writes what the probe measured so far into the run's record; whether
/// that changed it.
fn note_failover(guard: &Guard, probe: &Probe) -> bool {
    let (timeline, orders) = (probe.timeline(), probe.orders().timeline);
    let rto = timeline.rto().map(flashsale_api::Duration);
    let order_rto = orders.rto().map(flashsale_api::Duration);
    // The standby sells nothing until promoted: dated from the outage
    // buyers saw through the endpoint.
    let direct_rto = probe.direct_orders().and_then(|direct| {
        let (taken, _) = direct.timeline.failed_over?;
        Some(flashsale_api::Duration(
            taken.saturating_sub(timeline.outage?),
        ))
    });
    let region = timeline.failed_over.as_ref().map(|(_, r)| r.clone());
    let failback = timeline.failback().map(flashsale_api::Duration);
    let record = guard.progress().record;
    if (
        &record.failover_rto,
        &record.order_rto,
        &record.direct_order_rto,
        &record.failed_over_to,
        &record.failback,
    ) == (&rto, &order_rto, &direct_rto, &region, &failback)
    {
        return false;
    }
    guard.update(|progress| {
        progress.record.failover_rto = rto;
        progress.record.order_rto = order_rto;
        progress.record.direct_order_rto = direct_rto;
        progress.record.failed_over_to = region;
        progress.record.failback = failback;
    });
    true
}

/// Stops the buyer and writes its orders, each answered or given up, into
/// the run's record; their sentence. Once, as the probe stops: they change
/// five times a second.
async fn note_orders(guard: &Guard, probe: &mut Probe) -> (Tally, Option<Tally>) {
    let orders = probe.settle().await.tally;
    let direct = probe.direct_orders().map(|direct| direct.tally);
    guard.update(|progress| {
        progress.record.drill_orders = Some(orders.record());
        progress.record.direct_orders = direct.as_ref().map(Tally::record);
    });
    (orders, direct)
}

/// Looks the orders the regions acknowledged up in both regions'
/// databases, once the primary took buyers back, when the drill names
/// them (`failover.orders`): writes the RPO and the lost orders into the
/// run's record, adds the run's orders either database holds to `stored`,
/// and says how it went, or ends the run when more are
/// missing than `maxRPO` allows, any is lost, or a database cannot be read.
async fn look_up_orders(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    (buyers, acknowledged, stored): (
        &Buyers,
        &std::collections::BTreeMap<String, Vec<String>>,
        &mut BTreeSet<String>,
    ),
) -> Result<Option<String>, Ending> {
    let failover = plan.drill.spec.failover.as_ref();
    let Some(check) = rpo::check(failover) else {
        return Ok(None);
    };
    let max_rpo = failover.map_or(0, |f| f.max_rpo);
    let namespace = plan.drill.namespace().unwrap_or_default();
    let lookup = rpo::look_up(
        (&ctx.client, ctx.clock.as_ref()),
        &namespace,
        check,
        (buyers, acknowledged),
    )
    .await
    .map_err(|why| {
        Ending::new(
            RunOutcome::Failed,
            DrillReason::OrdersUnreadable,
            format!("the run's orders could not be looked up: {why}"),
        )
    })?;
    stored.extend(lookup.stored.iter().cloned());
    guard.update(|progress| {
        progress.record.failover_rpo = Some(lookup.rpo());
        if let Some(recorded) = &mut progress.record.drill_orders {
            recorded.lost = Some(lookup.lost());
        }
    });
    ctx.metrics
        .drill_failover_rpo(plan.drill.as_ref(), lookup.rpo());
    let sentence = lookup.sentence(max_rpo);
    if !lookup.lost.is_empty() {
        return Err(Ending::new(
            RunOutcome::Failed,
            DrillReason::OrdersLost,
            sentence,
        ));
    }
    if lookup.rpo() > max_rpo {
        return Err(Ending::new(
            RunOutcome::Failed,
            DrillReason::RpoExceeded,
            sentence,
        ));
    }
    Ok(Some(sentence))
}

/// After the faults of an active failover run were removed (their stop
/// began at `removed`, which the probe was told): waits for the primary to
/// serve again, then judges the failover. The sentence that
/// says how it went, or the ending of a failover that did not happen.
async fn failback(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    (probe, removed): (&Probe, Duration),
) -> Result<String, Ending> {
    let max_rto = plan
        .drill
        .spec
        .failover
        .as_ref()
        .map(|f| f.max_rto.0)
        .unwrap_or_default();
    let bound = max_rto.max(FAILBACK_BOUND);
    let mut timeline = probe.timeline();
    while timeline.restored.is_none()
        && timeline.outage.is_some()
        && ctx.clock.monotonic().saturating_sub(removed) < bound
    {
        tokio::time::sleep(PROBE_EVERY).await;
        timeline = probe.timeline();
    }
    note_failover(guard, probe);
    let shown = |d: Duration| flashsale_api::Duration(d).to_string();
    let Some(outage) = timeline.outage else {
        return Err(Ending::new(
            RunOutcome::Failed,
            DrillReason::NoOutage,
            format!(
                "all {} answers through the global endpoint came from the primary region: the \
                 experiments did not make it unavailable to buyers",
                timeline.answers
            ),
        ));
    };
    let (Some(rto), Some((_, region))) = (timeline.rto(), timeline.failed_over.as_ref()) else {
        return Err(Ending::new(
            RunOutcome::Failed,
            DrillReason::NoFailover,
            format!(
                "the experiments ended {} after buyers lost the primary region, before another \
                 region served them; make them last longer than maxRTO ({})",
                shown(removed.saturating_sub(outage)),
                shown(max_rto)
            ),
        ));
    };
    let Some(back) = timeline.failback() else {
        return Err(Ending::new(
            RunOutcome::Failed,
            DrillReason::PrimaryNotRestored,
            format!(
                "region {region} served buyers {} after they lost the primary region, but \
                 the primary did not serve them again within {} of the faults' removal",
                shown(rto),
                shown(bound)
            ),
        ));
    };
    // Pages are not orders: a standby that answers but cannot sell has not
    // taken buyers over.
    let orders = probe.orders().timeline;
    let Some((order_rto, (_, order_region))) = orders.rto().zip(orders.failed_over.as_ref()) else {
        return Err(Ending::new(
            RunOutcome::Failed,
            DrillReason::OrdersNotTaken,
            format!(
                "region {region} served buyers {} after they lost the primary region, but no \
                 region acknowledged {SUSTAINED} of their orders in a row before the faults' \
                 removal",
                shown(rto)
            ),
        ));
    };
    Ok(format!(
        "region {region} served buyers {} after they lost the primary region (maxRTO {}), \
         buyers going at most {} without an answer (the slowest answer meanwhile took {}), \
         region {order_region} acknowledged their orders {} after the first one the primary \
         did not, and the primary served them again {} after the faults' removal",
        shown(rto),
        shown(max_rto),
        shown(timeline.longest_unserved),
        shown(timeline.slowest),
        shown(order_rto),
        shown(back)
    ))
}

/// After the faults of an active failover run were removed (at
/// `stopping`): judges the failback, stops the buyer, has the standby
/// follow the primary again, and looks the run's orders up; what it
/// measured in a sentence, or the ending of a failover that failed.
async fn judge_failover(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    (probe, stopping): (&mut Probe, Duration),
) -> Result<String, Ending> {
    let judged = failback(ctx, plan, guard, (probe, stopping)).await;
    let (orders, direct) = note_orders(guard, probe).await;
    let mut tallied = orders.sentence("through it");
    if let Some(direct) = &direct {
        tallied = format!(
            "{tallied}; {}",
            direct.sentence("at the standby's gateways directly")
        );
    }
    let acknowledged = orders.acknowledged_with(direct.as_ref());
    let sentence = judged.map_err(|mut ending| {
        ending.message = format!("{}; {tallied}", ending.message);
        ending
    })?;
    // The primary serves again: the standby follows it before the orders
    // are looked up and the SLOs verified.
    let mut said = vec![sentence, tallied];
    said.extend(promote::divergence(&guard.progress().record.promoted));
    said.extend(give_back(ctx, plan, guard).await);
    let mut failed: Option<Ending> = None;
    let mut stored = BTreeSet::new();
    let looked = look_up_orders(
        ctx,
        plan,
        guard,
        (probe.buyers(), &acknowledged, &mut stored),
    )
    .await;
    let mut records: BTreeSet<String> = acknowledged.values().flatten().cloned().collect();
    records.extend(stored);
    for checked in [
        looked,
        check_stock(ctx, plan, guard, (&probe.buyers().sale_id, records)).await,
    ] {
        match checked {
            Ok(sentence) => said.extend(sentence),
            Err(ending) => {
                said.push(ending.message.clone());
                failed.get_or_insert(ending);
            }
        }
    }
    match failed {
        Some(mut ending) => {
            ending.message = said.join("; ");
            Err(ending)
        }
        None => Ok(said.join("; ")),
    }
}

/// Checks that every promoted Redis was handed back and that the
/// primary's stock then holds the reservation of every order of the run
/// either region acknowledged or stored (`records`), so no unit either
/// sold is sold again:
/// writes the count into the run's record and says how it went, or ends
/// the run when a Redis was not handed back, a reservation is missing or
/// the primary's Redis cannot be read.
async fn check_stock(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    (sale, records): (&str, BTreeSet<String>),
) -> Result<Option<String>, Ending> {
    let promoted = guard.progress().record.promoted;
    if promoted.is_empty() {
        return Ok(None);
    }
    if promoted.iter().any(|p| p.restored_at.is_none()) {
        return Err(Ending::new(
            RunOutcome::Failed,
            DrillReason::SwitchbackFailed,
            "the primary's Redis is not primary again, so its stock was not checked",
        ));
    }
    let records: Vec<String> = records.into_iter().collect();
    let namespace = plan.drill.namespace().unwrap_or_default();
    let spec = plan.drill.spec.failover.as_ref();
    let unreserved = promote::unreserved(
        &ctx.client,
        &namespace,
        spec,
        (&promoted, sale, records.clone()),
    )
    .await
    .map_err(|why| {
        Ending::new(
            RunOutcome::Failed,
            DrillReason::StockInconsistent,
            format!("the primary's stock could not be read after the switchback: {why}"),
        )
    })?;
    let count = i64::try_from(unreserved.len()).unwrap_or(i64::MAX);
    guard.update(|progress| progress.record.unreserved_orders = Some(count));
    if unreserved.is_empty() {
        return Ok(Some(format!(
            "the primary's stock holds all {} orders the regions acknowledged or stored",
            records.len()
        )));
    }
    Err(Ending::new(
        RunOutcome::Failed,
        DrillReason::StockInconsistent,
        format!(
            "after the switchback the primary's stock lacks the reservations of {count} of the \
             {} orders the regions acknowledged or stored ({}): it would sell those units again",
            records.len(),
            rpo::named(&unreserved)
        ),
    ))
}

/// After the experiments' time: stops them, tells whether Chaos Mesh's
/// backstop ended them first, judges an active failover, and verifies the
/// SLO recovers for `steady`.
async fn finish(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    steady: Duration,
    mut probe: Option<Probe>,
) -> Ending {
    // The experiments ran their course, unless Chaos Mesh's backstop
    // already ended them: then that is what ended the run.
    let backstop = backstop_fired(ctx, plan).await;
    // The failback counts from here: Chaos Mesh undoes a fault before its
    // object is gone, and the primary may serve again meanwhile.
    let stopping = ctx.clock.monotonic();
    if let Some(probe) = &probe {
        probe.restoring(stopping);
    }
    let stopped = match stop_run(ctx, plan, guard).await {
        Ok(stopped) => stopped,
        Err(err) => return Ending::failed(DrillReason::StopFailed, &err),
    };
    if backstop {
        return Ending::new(
            RunOutcome::Aborted,
            DrillReason::BackstopFired,
            "Chaos Mesh's StatusCheck found the guard silent and aborted the run's Workflow before its time was up",
        );
    }
    if let Some(left) = stopped.not_removed() {
        return Ending::new(
            RunOutcome::Failed,
            DrillReason::ExperimentsNotRemoved,
            format!("the experiments' time was up; {left}"),
        );
    }
    set_phase(ctx, plan, guard, DrillPhase::Verifying);
    let failed_over = match &mut probe {
        Some(probe) => match judge_failover(ctx, plan, guard, (probe, stopping)).await {
            Ok(sentence) => Some(sentence),
            Err(ending) => return ending,
        },
        None => None,
    };
    drop(probe);
    let mut sampler = Sampler::new(ctx, plan);
    match hold(
        ctx,
        &mut sampler,
        guard,
        None,
        steady,
        DrillReason::SloNotRecovered,
    )
    .await
    {
        Ok(()) => {
            let held = format!(
                "every objective held through the run and again for {} after it",
                flashsale_api::Duration(steady)
            );
            match failed_over {
                Some(sentence) => Ending::new(
                    RunOutcome::Succeeded,
                    DrillReason::FailedOver,
                    format!("{sentence}; {held}"),
                ),
                None => Ending::new(RunOutcome::Succeeded, DrillReason::SloHeld, held),
            }
        }
        Err(mut ending) => {
            ending.outcome = RunOutcome::Failed;
            ending
        }
    }
}

fn set_phase(ctx: &Ctx, plan: &Plan, guard: &Guard, phase: DrillPhase) {
    guard.update(|progress| progress.phase = phase);
    ctx.settings.wake(&plan.drill);
}

/// What a run must still have at every look besides healthy SLOs: its
/// windows and blackouts, a sale that is not Live (under `avoidLiveSale`),
/// and no request from the reconcile to end.
struct Mandate<'a> {
    ctx: &'a Ctx,
    plan: &'a Plan,
    sale: SaleView,
    read_at: Duration,
}

impl<'a> Mandate<'a> {
    async fn new(ctx: &'a Ctx, plan: &'a Plan) -> Result<Self, flashsale_kit::Error> {
        let drill = &plan.drill;
        let namespace = drill.namespace().unwrap_or_default();
        let sale = SaleView::read(ctx, &namespace, &drill.spec.sale_ref.name).await?;
        Ok(Self {
            ctx,
            plan,
            sale,
            read_at: ctx.clock.monotonic(),
        })
    }

    /// Whether the run may go on now; the ending otherwise (outcome
    /// `Aborted`: the caller says what it is before injection).
    async fn check(&mut self, guard: &Guard) -> Result<(), Ending> {
        if let Some((reason, message)) = guard.end_asked() {
            return Err(Ending::new(RunOutcome::Aborted, reason, message));
        }
        let now = self.ctx.clock.moment();
        if now.mono.saturating_sub(self.read_at) >= SALE_REREAD {
            let drill = &self.plan.drill;
            let namespace = drill.namespace().unwrap_or_default();
            // A failed read keeps the last view: its schedule still decides.
            match SaleView::read(self.ctx, &namespace, &drill.spec.sale_ref.name).await {
                Ok(view) => self.sale = view,
                Err(err) => tracing::debug!(%err, "reading the sale again failed"),
            }
            self.read_at = now.mono;
        }
        still_allowed(
            self.plan.calendar.as_ref(),
            self.sale.state(now.wall),
            self.plan.drill.spec.avoid_live_sale,
            now.wall,
        )
    }
}

/// Waits until every objective held for `period`, giving up after twice
/// the period plus `staleAfter` with `reason`, or as soon as the `mandate`
/// (when given) is lost.
async fn hold(
    ctx: &Ctx,
    sampler: &mut Sampler<'_>,
    guard: &Guard,
    mut mandate: Option<&mut Mandate<'_>>,
    period: Duration,
    reason: DrillReason,
) -> Result<(), Ending> {
    let guard_spec = &sampler.plan.drill.spec.slo_guard;
    let limit = period * 2 + guard_spec.stale_after.0;
    let bound = ctx.clock.monotonic() + limit;
    let mut since = None;
    let mut ticks = ticker(guard_spec.interval.0);
    loop {
        ticks.tick().await;
        if let Some(mandate) = mandate.as_deref_mut() {
            mandate.check(guard).await?;
        }
        let verdict = sampler.evaluate().await;
        guard.verdict(verdict.reason(), verdict == Verdict::Healthy);
        let now = ctx.clock.monotonic();
        since = verdict::steady_since(since, &verdict, now);
        if verdict::held_for(since, period, now) {
            return Ok(());
        }
        if now >= bound {
            return Err(Ending::new(
                RunOutcome::Skipped,
                reason,
                format!(
                    "the objectives did not hold for {} within {}; last verdict {}",
                    flashsale_api::Duration(period),
                    flashsale_api::Duration(limit),
                    describe(&verdict)
                ),
            ));
        }
    }
}

/// Judges the run until it must be aborted, and says why: the guard's side
/// of the injection.
async fn keep(
    ctx: &Ctx,
    guard: &Guard,
    sampler: &mut Sampler<'_>,
    mandate: &mut Mandate<'_>,
) -> Cause {
    let mut ticks = ticker(sampler.plan.drill.spec.slo_guard.interval.0);
    loop {
        ticks.tick().await;
        if let Some(cause) = look(ctx, guard, sampler, mandate).await {
            return cause;
        }
    }
}

/// One look of the guard: the mandate, then the SLOs; why the run must be
/// aborted, if it must.
async fn look(
    ctx: &Ctx,
    guard: &Guard,
    sampler: &mut Sampler<'_>,
    mandate: &mut Mandate<'_>,
) -> Option<Cause> {
    if let Err(ending) = mandate.check(guard).await {
        return Some(Cause {
            reason: ending.reason,
            message: ending.message,
            detected: ctx.clock.now(),
        });
    }
    let verdict = sampler.evaluate().await;
    guard.verdict(verdict.reason(), verdict == Verdict::Healthy);
    guard.update(|progress| sampler.record_extremes(&mut progress.record.slo_extremes));
    verdict.aborts().then(|| Cause {
        reason: verdict.reason(),
        message: describe(&verdict),
        detected: match &verdict {
            Verdict::Breach { sampled_at, .. } => *sampled_at,
            _ => ctx.clock.now(),
        },
    })
}

/// Why a run is aborted, and when the cause was first seen (Prometheus's
/// evaluation time for a breach).
struct Cause {
    reason: DrillReason,
    message: String,
    detected: Timestamp,
}

/// The run's injection: until when, on the monotonic clock, the
/// experiments last.
struct Injected {
    until: Duration,
}

/// Chooses the targets under the namespace's budget, creates the Workflow,
/// waits for its StatusCheck and creates the experiments under it, each
/// experiment cut to the time left in the window.
async fn inject(ctx: &Ctx, plan: &Plan, guard: &Guard, sale_uid: &str) -> Result<Injected, Ending> {
    let left = time_left(ctx, plan)?;
    let choices = choose(ctx, plan, sale_uid, left).await?;
    let longest = choices
        .iter()
        .map(|(e, _)| e.duration.0)
        .max()
        .unwrap_or_default();
    let (mut objects, status_check) = start_workflow(ctx, plan, guard, longest).await?;
    let mut targets = Vec::new();
    for (experiment, pods) in &choices {
        match create_experiment(ctx, plan, guard, experiment, pods, &status_check).await {
            Ok(created) => {
                objects.push(created);
                let namespace = plan.drill.namespace().unwrap_or_default();
                targets.extend(pods.iter().map(|p| format!("{namespace}/{p}")));
                // Recorded as they are created: a run that fails before its
                // injection is confirmed still names what it touched.
                guard.update(|progress| {
                    progress.record.objects = objects.clone();
                    progress.record.targets = targets.clone();
                });
            }
            Err(err) => {
                let _ = stop_run(ctx, plan, guard).await;
                return Err(Ending::failed(DrillReason::CreateFailed, &err));
            }
        }
    }
    if let Err(mut ending) = await_injected(ctx, plan, &objects).await {
        // Chaos Mesh recovers only what it injected: an experiment whose
        // apply keeps failing keeps its finalizer, which the operator does
        // not strip; the run says so, naming what is left.
        match stop_run(ctx, plan, guard).await {
            Ok(stopped) => {
                if let Some(left) = stopped.not_removed() {
                    ending.message.push_str(&format!(
                        "; {left} (an experiment Chaos Mesh could not inject stays until its \
                         apply succeeds or the target pod is gone)"
                    ));
                }
            }
            Err(err) => ending
                .message
                .push_str(&format!("; stopping failed: {err}")),
        }
        return Err(ending);
    }
    let now = ctx.clock.moment();
    guard.update(|progress| {
        progress.record.injected_at = Some(MicroTime(now.wall));
        progress.record.targeted_pods = i32::try_from(targets.len()).ok();
        progress.record.targets = targets;
        progress.record.objects = objects;
    });
    Ok(Injected {
        until: now.mono + longest,
    })
}

/// How long the experiments may last: the experiments end with the window
/// they start in (`None` without windows); a window too nearly closed skips
/// the run.
fn time_left(ctx: &Ctx, plan: &Plan) -> Result<Option<Duration>, Ending> {
    let Some(calendar) = &plan.calendar else {
        return Ok(None);
    };
    let now = ctx.clock.now();
    let Some(until) = calendar.allowed_until(now) else {
        return Err(Ending::skipped(
            DrillReason::OutsideWindow,
            "the allowed window closed while the SLOs were settling",
        ));
    };
    let left = unsigned(until.duration_since(now));
    if left < SHORTEST {
        return Err(Ending::skipped(
            DrillReason::OutsideWindow,
            format!(
                "less than {} of the window was left",
                flashsale_api::Duration(SHORTEST)
            ),
        ));
    }
    Ok(Some(left))
}

/// Each experiment with the pods chosen for it under the namespace's
/// budget, its duration cut to `left`.
async fn choose(
    ctx: &Ctx,
    plan: &Plan,
    sale_uid: &str,
    left: Option<Duration>,
) -> Result<Vec<(Experiment, Vec<String>)>, Ending> {
    let drill = &plan.drill;
    let namespace = drill.namespace().unwrap_or_default();
    // Pods any Chaos Mesh object of the namespace names: what earlier
    // leaders' runs hold, which this replica's budget does not know.
    let others = stop::list_all(
        &ctx.client,
        &namespace,
        &chaos::managed_selector(),
        &Kind::EXPERIMENTS,
    )
    .await
    .map_err(|err| Ending::failed(DrillReason::ReadFailed, &err))?;
    let mut gathered = Vec::new();
    for experiment in &drill.spec.experiments {
        let component = chaos::component(experiment.target).label();
        let candidates = candidates(
            ctx,
            &namespace,
            &drill.spec.sale_ref.name,
            sale_uid,
            experiment,
        )
        .await
        .map_err(|err| Ending::failed(DrillReason::ReadFailed, &err))?;
        let listed = held_pods(&others, &namespace, component);
        let kills = experiment
            .pod_chaos
            .as_ref()
            .is_some_and(|p| p.action == flashsale_api::chaosdrill::PodChaosKind::PodKill);
        gathered.push((component, candidates, listed, kills));
    }
    let asks: Vec<Ask<'_>> = gathered
        .iter()
        .zip(&drill.spec.experiments)
        .map(|((component, candidates, listed, kills), experiment)| Ask {
            component,
            candidates,
            listed,
            radius: &drill.spec.blast_radius,
            seed: seed(&plan.run, &experiment.name),
            kills: *kills,
        })
        .collect();
    let chosen = ctx
        .settings
        .budgets
        .reserve(&namespace, &plan.key(), &asks)
        .map_err(|(i, refused)| {
            Ending::skipped(
                refused.reason(),
                format!(
                    "experiment {}: {}",
                    drill.spec.experiments[i].name,
                    refused.message()
                ),
            )
        })?;
    Ok(drill
        .spec
        .experiments
        .iter()
        .zip(chosen)
        .map(|(experiment, pods)| {
            let mut experiment = experiment.clone();
            if let Some(left) = left {
                experiment.duration = flashsale_api::Duration(experiment.duration.0.min(left));
            }
            (experiment, pods)
        })
        .collect())
}

/// The pods of `component` that the namespace's Chaos Mesh objects
/// (`others`) name.
fn held_pods(
    others: &[(Kind, DynamicObject)],
    namespace: &str,
    component: &str,
) -> BTreeSet<String> {
    others
        .iter()
        .filter(|(_, o)| o.labels().get(TARGET_LABEL).map(String::as_str) == Some(component))
        .flat_map(|(_, o)| chaos::selected_pods(o))
        .filter_map(|pod| {
            pod.strip_prefix(&format!("{namespace}/"))
                .map(str::to_owned)
        })
        .collect()
}

/// Creates the run's Workflow with its StatusCheck backstop and waits for
/// Chaos Mesh to start the check: the objects created so far, and the
/// check's name and uid the experiments are owned by.
async fn start_workflow(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    longest: Duration,
) -> Result<(Vec<String>, (String, String)), Ending> {
    let drill = &plan.drill;
    let namespace = drill.namespace().unwrap_or_default();
    let stale_after = drill.spec.slo_guard.stale_after.0;
    let backstop = Backstop {
        url: plan.guard_url.clone(),
        failure_threshold: stale_after.as_secs_f64().ceil().max(1.0) as u64,
        // Past the experiments, so the check outlives them, but bounded.
        deadline: longest + stale_after + Duration::from_secs(30),
    };
    let invalid = |err: &dyn std::fmt::Display| Ending::failed(DrillReason::InvalidObject, err);
    let workflow = chaos::workflow(drill, &plan.run, &backstop)
        .map_err(|err| invalid(&err))
        .and_then(|w| chaos::dynamic(w).map_err(|err| invalid(&err)))?;
    create(ctx, guard, &namespace, Kind::Workflow, &workflow)
        .await
        .map_err(|err| Ending::failed(DrillReason::CreateFailed, &err))?;
    let objects = vec![format!("Workflow/{}", workflow.name_any())];
    guard.update(|progress| progress.record.objects = objects.clone());
    match await_status_check(ctx, &namespace, &workflow.name_any()).await {
        Ok(Some(found)) => Ok((objects, found)),
        Ok(None) => {
            let _ = stop_run(ctx, plan, guard).await;
            Err(Ending::new(
                RunOutcome::Failed,
                DrillReason::ChaosMeshNotResponding,
                format!(
                    "Chaos Mesh did not start the Workflow {}'s StatusCheck within {}; is chaos-controller-manager running?",
                    workflow.name_any(),
                    flashsale_api::Duration(STATUS_CHECK_BOUND)
                ),
            ))
        }
        Err(err) => {
            let _ = stop_run(ctx, plan, guard).await;
            Err(Ending::failed(DrillReason::ReadFailed, &err))
        }
    }
}

/// Creates one experiment on `pods` under the StatusCheck; its
/// `Kind/name` for the run record.
async fn create_experiment(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    experiment: &Experiment,
    pods: &[String],
    status_check: &(String, String),
) -> Result<String, flashsale_kit::Error> {
    let namespace = plan.drill.namespace().unwrap_or_default();
    let object = chaos::experiment(
        &plan.drill,
        &plan.run,
        experiment,
        pods,
        (&status_check.0, &status_check.1),
    );
    let object = chaos::dynamic(object).map_err(flashsale_kit::Error::Encode)?;
    create(ctx, guard, &namespace, Kind::of(experiment), &object).await?;
    Ok(format!(
        "{}/{}",
        Kind::of(experiment).name(),
        object.name_any()
    ))
}

/// Whether Chaos Mesh's StatusCheck aborted the run's Workflow (or it is
/// gone): the backstop, not the operator, ended the chaos.
async fn backstop_fired(ctx: &Ctx, plan: &Plan) -> bool {
    let namespace = plan.drill.namespace().unwrap_or_default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &Kind::Workflow.resource());
    let name = chaos::workflow_name(&plan.drill.name_any(), &plan.run);
    match api.get_opt(&name).await {
        Ok(Some(workflow)) => workflow
            .annotations()
            .get(WORKFLOW_ABORT_ANNOTATION)
            .is_some_and(|v| v == "true"),
        Ok(None) => true,
        // Unknown: the run's own record stands.
        Err(err) => {
            tracing::debug!(%err, workflow = name, "reading the Workflow failed");
            false
        }
    }
}

/// A reproducible seed per run and experiment, so a run's choice can be
/// explained afterwards.
fn seed(run: &str, experiment: &str) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{run}/{experiment}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(bytes)
}

/// The pods of the experiment's target workload: those with the sale's
/// labels, the operator's managed-by label and an owner chain up to the
/// sale (`sale_uid`), so a hand-made pod with copied labels is never one.
async fn candidates(
    ctx: &Ctx,
    namespace: &str,
    sale: &str,
    sale_uid: &str,
    experiment: &flashsale_api::chaosdrill::Experiment,
) -> Result<Vec<blast::Candidate>, flashsale_kit::Error> {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    let labels = selector(sale, chaos::component(experiment.target))
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let params = ListParams::default().labels(&labels);
    let list_error = |kind: &'static str| {
        flashsale_kit::Error::kube(flashsale_kit::Verb::List, kind, labels.clone())
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let sets: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
    let (pods, sets, deployments) = tokio::join!(
        pods.list(&params),
        sets.list(&params),
        deployments.list(&params),
    );
    let pods = pods.map_err(list_error("Pod"))?;
    let sets = sets.map_err(list_error("ReplicaSet"))?;
    let deployments = deployments.map_err(list_error("Deployment"))?;
    let owners: std::collections::BTreeMap<String, blast::Owner> = sets
        .items
        .iter()
        .map(|o| (o.uid(), controller(&o.metadata)))
        .chain(
            deployments
                .items
                .iter()
                .map(|o| (o.uid(), controller(&o.metadata))),
        )
        .filter_map(|(uid, owner)| Some((uid?, owner?)))
        .collect();
    Ok(pods
        .items
        .iter()
        .filter(|pod| {
            pod.labels().get(MANAGED_BY_KEY).map(String::as_str) == Some(MANAGED_BY)
                && blast::owned_by_sale(controller(&pod.metadata).as_ref(), &owners, sale_uid)
        })
        .map(|pod| blast::Candidate {
            name: pod.name_any(),
            ready: flashsale_observe::pods::is_ready(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        })
        .collect())
}

/// An object's controller owner, `(kind, uid)`.
fn controller(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<blast::Owner> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.uid.clone()))
}

/// Creates one Chaos Mesh object of the run, through the run's and the
/// namespace's gates: never once the run is being stopped or while the
/// kill switch is on, nor after this replica stopped leading. The request
/// runs in a task of its own that holds both passes until the apiserver
/// answers, so a stop that closes a gate waits for it even when the task
/// driving the run was stopped in the middle of it.
async fn create(
    ctx: &Ctx,
    guard: &Guard,
    namespace: &str,
    kind: Kind,
    object: &DynamicObject,
) -> Result<(), flashsale_kit::Error> {
    let refused = |err: &dyn std::fmt::Display| flashsale_kit::Error::KillSwitch(err.to_string());
    if ctx.settings.kill_switch {
        return Err(refused(&super::budget::GateClosed));
    }
    let run_pass = guard
        .create_pass()
        .await
        .ok_or(flashsale_kit::Error::RunStopped)?;
    let namespace_pass = ctx
        .settings
        .budgets
        .enter(namespace)
        .await
        .map_err(|err| refused(&err))?;
    if !ctx.leadership.is_leader() {
        return Err(flashsale_kit::Error::NotLeader);
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &kind.resource());
    let failed =
        flashsale_kit::Error::kube(flashsale_kit::Verb::Create, kind.name(), object.name_any());
    let sent = object.clone();
    let request = tokio::spawn(async move {
        let _passes = (run_pass, namespace_pass);
        api.create(&PostParams::default(), &sent).await
    });
    match request.await {
        Ok(answer) => answer.map(|_| ()).map_err(failed)?,
        Err(joined) => {
            return Err(failed(kube::Error::Service(joined.into())));
        }
    }
    flashsale_kit::apply::wrote(
        ctx,
        flashsale_kit::Verb::Create,
        kind.name(),
        namespace,
        &object.name_any(),
    );
    Ok(())
}

/// The name and uid of the StatusCheck Chaos Mesh spawns for `workflow`,
/// once it exists; `None` after the bound.
async fn await_status_check(
    ctx: &Ctx,
    namespace: &str,
    workflow: &str,
) -> Result<Option<(String, String)>, flashsale_kit::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &Kind::StatusCheck.resource());
    let params = ListParams::default().labels(&format!("{}={workflow}", chaos::WORKFLOW_LABEL));
    let until = tokio::time::Instant::now() + STATUS_CHECK_BOUND;
    loop {
        let list = api.list(&params).await.map_err(flashsale_kit::Error::kube(
            flashsale_kit::Verb::List,
            "StatusCheck",
            workflow,
        ))?;
        if let Some(found) = list
            .items
            .iter()
            .find_map(|sc| Some((sc.name_any(), sc.uid()?)))
        {
            return Ok(Some(found));
        }
        if tokio::time::Instant::now() >= until {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until Chaos Mesh says every experiment of `objects` (`Kind/name`,
/// the Workflow aside) is injected into all its targets, at most
/// [`INJECT_BOUND`]: Chaos Mesh retries a failed apply, and a fault that
/// cannot be injected (a kernel without netem, a node without chaos-daemon)
/// must fail the run, not let it pass as "the SLO held".
async fn await_injected(ctx: &Ctx, plan: &Plan, objects: &[String]) -> Result<(), Ending> {
    let namespace = plan.drill.namespace().unwrap_or_default();
    let experiments: Vec<(Kind, &str)> = objects
        .iter()
        .filter_map(|o| o.split_once('/'))
        .filter_map(|(kind, name)| Some((Kind::from_name(kind)?, name)))
        .filter(|(kind, _)| Kind::EXPERIMENTS.contains(kind))
        .collect();
    let until = tokio::time::Instant::now() + INJECT_BOUND;
    let mut pending = experiments;
    loop {
        let mut still = Vec::new();
        let mut failing = Vec::new();
        for (kind, name) in pending {
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &namespace, &kind.resource());
            let object = api
                .get(name)
                .await
                .map_err(|err| Ending::failed(DrillReason::ReadFailed, &err))?;
            match chaos::injection(&object) {
                chaos::Injection::Injected => {}
                chaos::Injection::Pending => still.push((kind, name)),
                chaos::Injection::Failing(target, why) => {
                    failing.push(format!("{}/{name} on {target}: {why}", kind.name()));
                    still.push((kind, name));
                }
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= until {
            let what = if failing.is_empty() {
                let names: Vec<String> = still
                    .iter()
                    .map(|(k, n)| format!("{}/{n}", k.name()))
                    .collect();
                format!("no injection reported for {}", names.join(", "))
            } else {
                failing.join("; ")
            };
            return Err(Ending::new(
                RunOutcome::Failed,
                DrillReason::NotInjected,
                format!(
                    "Chaos Mesh did not inject within {}: {what}",
                    flashsale_api::Duration(INJECT_BOUND)
                ),
            ));
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Guards the injected run until its experiments' time is up (`None`) or
/// it must be aborted (the ending): by the guard's look, or, in an active
/// failover run, once buyers went without a serving region for `maxRTO`.
async fn watch(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    (sampler, mandate): (&mut Sampler<'_>, &mut Mandate<'_>),
    probe: Option<&Probe>,
    injected: Injected,
) -> Option<Ending> {
    let mut ticks = ticker(plan.drill.spec.slo_guard.interval.0);
    let mut promoted = false;
    loop {
        ticks.tick().await;
        let mut cause = look(ctx, guard, sampler, mandate).await;
        if let (None, Some(probe)) = (&cause, probe) {
            cause = match promote_on_outage(ctx, plan, guard, (probe, &mut promoted)).await {
                Some(cause) => Some(cause),
                None => unserved(ctx, plan, guard, probe),
            };
        }
        if let Some(cause) = cause {
            return Some(abort(ctx, plan, guard, cause).await);
        }
        if ctx.clock.monotonic() >= injected.until {
            return None;
        }
    }
}

/// Once buyers lost the primary region, promotes the standby's Redis, as
/// a region failover's runbook would (once a run); the cause to abort when
/// it cannot be.
async fn promote_on_outage(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    (probe, done): (&Probe, &mut bool),
) -> Option<Cause> {
    if *done || probe.timeline().outage.is_none() {
        return None;
    }
    *done = true;
    let spec = plan.drill.spec.failover.as_ref()?;
    let namespace = plan.drill.namespace().unwrap_or_default();
    let now = || ctx.clock.now();
    let sale = (namespace.as_str(), probe.buyers().sale_id.as_str());
    match promote::promote(&ctx.client, sale, spec, (guard, &now)).await {
        Ok(0) => None,
        Ok(_) => {
            ctx.settings.wake(&plan.drill);
            None
        }
        Err(why) => Some(Cause {
            reason: DrillReason::PromotionFailed,
            message: format!("buyers lost the primary region, but {why}"),
            detected: ctx.clock.now(),
        }),
    }
}

/// Has the standby Redis servers the run promoted follow the primary
/// again; the sentence that says so, if there were any.
async fn give_back(ctx: &Ctx, plan: &Plan, guard: &Guard) -> Option<String> {
    let mut promoted = guard.progress().record.promoted;
    if promoted.iter().all(|p| p.restored_at.is_some()) {
        return None;
    }
    let namespace = plan.drill.namespace().unwrap_or_default();
    let spec = plan.drill.spec.failover.as_ref();
    let now = ctx.clock.now();
    let said = promote::restore(&ctx.client, &namespace, spec, (&mut promoted, now)).await;
    guard.update(|progress| progress.record.promoted = promoted);
    said
}

/// Notes the failover so far; the cause to abort once buyers went without
/// a serving region for longer than `maxRTO`.
fn unserved(ctx: &Ctx, plan: &Plan, guard: &Guard, probe: &Probe) -> Option<Cause> {
    let timeline = probe.timeline();
    if note_failover(guard, probe) {
        // The status shows the failover as it happens.
        ctx.settings.wake(&plan.drill);
    }
    let max_rto = plan.drill.spec.failover.as_ref()?.max_rto.0;
    let unserved = timeline.unserved_for(ctx.clock.monotonic())?;
    (unserved > max_rto).then(|| Cause {
        reason: DrillReason::RtoExceeded,
        message: format!(
            "buyers went {} without a serving region through the global endpoint, past maxRTO {}",
            flashsale_api::Duration(unserved),
            flashsale_api::Duration(max_rto)
        ),
        detected: ctx.clock.now(),
    })
}

/// The abort: silence the endpoint, stop everything of the run at once,
/// and record when each step happened.
async fn abort(ctx: &Ctx, plan: &Plan, guard: &Guard, cause: Cause) -> Ending {
    let decided = ctx.clock.moment();
    guard.silence(cause.reason);
    guard.update(|progress| {
        progress.phase = DrillPhase::Aborting;
        progress.record.detected_at = Some(MicroTime(cause.detected));
        progress.record.decided_at = Some(MicroTime(decided.wall));
        progress.record.detection_latency = Some(flashsale_api::Duration(unsigned(
            decided.wall.duration_since(cause.detected),
        )));
    });
    ctx.settings.wake(&plan.drill);
    let stopped = stop_run(ctx, plan, guard).await;
    match stopped {
        Ok(stopped) => {
            // Measured on the monotonic clock; the wall-clock instants are
            // what the record shows.
            let latency = stopped
                .gone_after
                .map(|gone| gone.saturating_sub(decided.mono));
            if let Some(latency) = latency {
                ctx.metrics.drill_aborted(plan.drill.as_ref(), latency);
            }
            guard.update(|progress| {
                progress.record.recovered_at = stopped.recovered_at.map(MicroTime);
                progress.record.gone_at = stopped.gone_at.map(MicroTime);
                progress.record.abort_latency = latency.map(flashsale_api::Duration);
            });
            match stopped.not_removed() {
                // The abort did not end the fault: the run failed, and
                // says why it was aborted.
                Some(left) => Ending::new(
                    RunOutcome::Failed,
                    DrillReason::ExperimentsNotRemoved,
                    format!("Aborted ({}: {}); {left}", cause.reason, cause.message),
                ),
                None => Ending::new(RunOutcome::Aborted, cause.reason, cause.message),
            }
        }
        Err(err) => Ending::new(
            RunOutcome::Aborted,
            cause.reason,
            format!("{}; stopping failed: {err}", cause.message),
        ),
    }
}

/// Stops the run's objects, once no create of the run is in flight; those
/// the guard recorded are deleted without waiting for the list.
async fn stop_run(ctx: &Ctx, plan: &Plan, guard: &Guard) -> Result<Stopped, flashsale_kit::Error> {
    guard.close_creates().await;
    let namespace = plan.drill.namespace().unwrap_or_default();
    let known = chaos::parse_objects(&guard.progress().record.objects);
    stop::stop(
        &ctx.client,
        &ctx.leadership,
        ctx.clock.as_ref(),
        stop::Scope {
            namespace: &namespace,
            selector: &chaos::run_selector(&plan.drill.name_any(), &plan.run),
            known: &known,
        },
        STOP_BOUND,
    )
    .await
}

/// A verdict in a sentence.
pub fn describe(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Healthy => "every objective holds".to_owned(),
        Verdict::Waiting { objective } => format!("no usable answer yet for {objective}"),
        Verdict::Breach {
            objective,
            value,
            threshold,
            breach_when,
            ..
        } => {
            let side = match breach_when {
                flashsale_api::chaosdrill::BreachWhen::Above => "above",
                flashsale_api::chaosdrill::BreachWhen::Below => "below",
            };
            format!("{objective} = {value} is {side} its threshold {threshold}")
        }
        Verdict::Blind {
            objective,
            cause,
            detail,
        } => format!("{objective} is blind ({}): {detail}", cause),
    }
}

/// Asks Prometheus for every objective at once, remembering when each last
/// gave a usable value.
struct Sampler<'a> {
    ctx: &'a Ctx,
    plan: &'a Plan,
    /// Each objective's query for this drill's namespace and sale.
    queries: Vec<String>,
    started: Duration,
    latest: Vec<Option<Reading>>,
    last_usable: Vec<Option<Duration>>,
}

impl<'a> Sampler<'a> {
    fn new(ctx: &'a Ctx, plan: &'a Plan) -> Self {
        let drill = &plan.drill;
        let namespace = drill.namespace().unwrap_or_default();
        let queries: Vec<String> = drill
            .spec
            .slo_guard
            .objectives
            .iter()
            .map(|o| o.query_in(&namespace, &drill.spec.sale_ref.name))
            .collect();
        let n = queries.len();
        Self {
            ctx,
            plan,
            queries,
            started: ctx.clock.monotonic(),
            latest: vec![None; n],
            last_usable: vec![None; n],
        }
    }

    async fn evaluate(&mut self) -> Verdict {
        let spec = &self.plan.drill.spec.slo_guard;
        let stale_after = spec.stale_after.0;
        // Each query is bounded, so a hanging Prometheus cannot hold the
        // guard past staleAfter.
        let timeout = spec
            .interval
            .0
            .max(Duration::from_millis(250))
            .min(stale_after);
        let now = self.ctx.clock.now();
        let reads = self.queries.iter().map(|query| {
            self.ctx.settings.signal.read(
                &self.plan.prometheus_url,
                query,
                timeout,
                stale_after,
                now,
            )
        });
        let readings = join_all(reads).await;
        let answered: Moment = self.ctx.clock.moment();
        for (i, reading) in readings.into_iter().enumerate() {
            if matches!(reading, Reading::Value(_)) {
                self.last_usable[i] = Some(answered.mono);
            }
            self.latest[i] = Some(reading);
        }
        let observed: Vec<Observed<'_>> = spec
            .objectives
            .iter()
            .enumerate()
            .map(|(i, objective)| Observed {
                objective,
                latest: self.latest[i].as_ref(),
                last_usable: self.last_usable[i],
            })
            .collect();
        verdict::verdict(&observed, self.started, signed(stale_after), answered)
    }

    /// Keeps the worst value of each objective.
    fn record_extremes(&self, extremes: &mut std::collections::BTreeMap<String, f64>) {
        for (objective, reading) in self
            .plan
            .drill
            .spec
            .slo_guard
            .objectives
            .iter()
            .zip(&self.latest)
        {
            let Some(Reading::Value(sample)) = reading else {
                continue;
            };
            let worse = |old: f64| match objective.breach_when {
                flashsale_api::chaosdrill::BreachWhen::Above => sample.value > old,
                flashsale_api::chaosdrill::BreachWhen::Below => sample.value < old,
            };
            match extremes.get(&objective.name) {
                Some(old) if !worse(*old) => {}
                _ => {
                    extremes.insert(objective.name.clone(), sample.value);
                }
            }
        }
    }
}

fn ticker(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

fn signed(duration: Duration) -> SignedDuration {
    SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX)
}

fn unsigned(duration: SignedDuration) -> Duration {
    Duration::try_from(duration).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{reconcile::tests::at, reconcile::tests::calendar};

    fn reason(result: Result<(), Ending>) -> &'static str {
        result
            .err()
            .map_or("Allowed", |ending| ending.reason.as_str())
    }

    #[test]
    fn a_run_ends_when_its_window_closes_a_blackout_starts_or_the_sale_goes_live()
    -> anyhow::Result<()> {
        let calendar = calendar()?;
        // The example: Tuesdays and Thursdays 14:00-16:00 in Tokyo, and a
        // blackout over 11.11. 2026-12-01 is a Tuesday.
        let inside = at("2026-12-01T15:59:59+09:00[Asia/Tokyo]")?;
        let closed = at("2026-12-01T16:00:00+09:00[Asia/Tokyo]")?;
        let blackout = at("2026-11-10T14:30:00+09:00[Asia/Tokyo]")?;
        let cases = [
            (Some(&calendar), SaleState::NotLive, true, inside, "Allowed"),
            (
                Some(&calendar),
                SaleState::NotLive,
                true,
                closed,
                "WindowClosed",
            ),
            (
                Some(&calendar),
                SaleState::NotLive,
                true,
                blackout,
                "BlackoutStarted",
            ),
            (
                Some(&calendar),
                SaleState::Live,
                true,
                inside,
                "SaleWentLive",
            ),
            // avoidLiveSale off: a Live sale does not end it.
            (Some(&calendar), SaleState::Live, false, inside, "Allowed"),
            // A forced run is bound by no window or blackout, but still by
            // a Live sale.
            (None, SaleState::NotLive, true, closed, "Allowed"),
            (None, SaleState::NotLive, true, blackout, "Allowed"),
            (None, SaleState::Live, true, blackout, "SaleWentLive"),
        ];
        for (calendar, sale, avoid, now, want) in cases {
            let got = reason(still_allowed(calendar, sale, avoid, now));
            assert_eq!(
                got,
                want,
                "{sale:?} avoid={avoid} forced={} at {now}",
                calendar.is_none()
            );
        }
        Ok(())
    }
}
