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
    chaos::{self, Backstop, Kind, TARGET_LABEL},
    guard::Guard,
    stop::{self, Stopped},
    verdict::{self, Observed, Verdict},
};
use crate::{
    api::{
        self, ChaosDrill,
        chaosdrill::{DrillPhase, RunOutcome},
    },
    degradation::signal::Reading,
    flashsale::build::selector,
};

/// How long Chaos Mesh may take to create a run's StatusCheck.
const STATUS_CHECK_BOUND: Duration = Duration::from_secs(15);
/// How long a stop waits for Chaos Mesh to remove the experiments.
pub const STOP_BOUND: Duration = Duration::from_secs(60);

/// What a run needs, fixed when it starts: a spec edited mid-run applies
/// to the next run.
pub struct Plan {
    /// The drill as it was when the run started.
    pub drill: Arc<ChaosDrill>,
    /// The run id.
    pub run: String,
    /// Prometheus to ask.
    pub prometheus_url: String,
    /// The end of the allowed period the run started in; `None` for a
    /// forced run.
    pub allowed_until: Option<Timestamp>,
    /// Where Chaos Mesh probes this run's guard.
    pub guard_url: String,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// The outcome.
    pub outcome: RunOutcome,
    /// A CamelCase reason.
    pub reason: &'static str,
    /// The reason in a sentence.
    pub message: String,
}

impl Ending {
    fn new(outcome: RunOutcome, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            outcome,
            reason,
            message: message.into(),
        }
    }
}

/// Drives the run to its end and records the ending in the guard; stops
/// without a word when this replica stops leading.
pub async fn execute(ctx: Arc<Ctx>, plan: Plan, guard: Arc<Guard>) {
    let mut leadership = ctx.leadership.clone();
    let ending = tokio::select! {
        ending = drive(&ctx, &plan, &guard) => ending,
        () = leadership.lost() => {
            guard.silence("NotLeader");
            return;
        }
    };
    guard.silence("Ended");
    let now = ctx.clock.now();
    let drill = &plan.drill;
    let namespace = drill.namespace().unwrap_or_default();
    ctx.metrics
        .drill_run(&namespace, &drill.name_any(), outcome_name(ending.outcome));
    guard.update(|progress| {
        progress.record.outcome = Some(ending.outcome);
        progress.record.reason = Some(ending.reason.to_owned());
        progress.record.message = Some(ending.message.clone());
        progress.record.ended_at = Some(Time(now));
    });
    tracing::info!(
        drill = %crate::kit::key(drill.as_ref()), run = plan.run, outcome = outcome_name(ending.outcome),
        reason = ending.reason, message = ending.message, "run ended"
    );
    ctx.settings.wake(drill);
}

/// The outcome's name, as in the status and the metrics.
pub fn outcome_name(outcome: RunOutcome) -> &'static str {
    match outcome {
        RunOutcome::Succeeded => "Succeeded",
        RunOutcome::Aborted => "Aborted",
        RunOutcome::Skipped => "Skipped",
        RunOutcome::Failed => "Failed",
    }
}

async fn drive(ctx: &Ctx, plan: &Plan, guard: &Guard) -> Ending {
    let spec = &plan.drill.spec;
    let steady = spec.slo_guard.steady_state.0;
    let mut sampler = Sampler::new(ctx, plan);
    if let Err(ending) = hold(ctx, &mut sampler, guard, steady, "SteadyStateNotReached").await {
        return ending;
    }
    if let Some(until) = plan.allowed_until
        && ctx.clock.now() >= until
    {
        return Ending::new(
            RunOutcome::Skipped,
            "OutsideWindow",
            "the allowed window closed while the SLOs were settling",
        );
    }
    let injected = match inject(ctx, plan, guard).await {
        Ok(injected) => injected,
        Err(ending) => return ending,
    };
    set_phase(ctx, plan, guard, DrillPhase::Injecting);
    if let Some(ending) = watch(ctx, plan, guard, &mut sampler, injected).await {
        return ending;
    }
    // The experiments ran their course: remove them and check the SLOs
    // come back.
    let stopped = match stop_run(ctx, plan, guard).await {
        Ok(stopped) => stopped,
        Err(err) => return Ending::new(RunOutcome::Failed, "StopFailed", err.to_string()),
    };
    if !stopped.remaining.is_empty() {
        return Ending::new(
            RunOutcome::Failed,
            "ExperimentsNotRemoved",
            format!(
                "Chaos Mesh did not remove {} within {}",
                stopped.remaining.join(", "),
                api::Duration(STOP_BOUND)
            ),
        );
    }
    set_phase(ctx, plan, guard, DrillPhase::Verifying);
    let mut sampler = Sampler::new(ctx, plan);
    match hold(ctx, &mut sampler, guard, steady, "SloNotRecovered").await {
        Ok(()) => Ending::new(
            RunOutcome::Succeeded,
            "SloHeld",
            format!(
                "every objective held through the run and again for {} after it",
                api::Duration(steady)
            ),
        ),
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

/// Waits until every objective held for `period`, giving up after twice
/// the period plus `staleAfter` with `reason`.
async fn hold(
    ctx: &Ctx,
    sampler: &mut Sampler<'_>,
    guard: &Guard,
    period: Duration,
    reason: &'static str,
) -> Result<(), Ending> {
    let guard_spec = &sampler.plan.drill.spec.slo_guard;
    let period_signed = signed(period);
    let bound = ctx.clock.now() + signed(period * 2 + guard_spec.stale_after.0);
    let mut since = None;
    let mut ticks = ticker(guard_spec.interval.0);
    loop {
        ticks.tick().await;
        let verdict = sampler.evaluate().await;
        guard.verdict(verdict.reason(), verdict == Verdict::Healthy);
        let now = ctx.clock.now();
        since = verdict::steady_since(since, &verdict, now);
        if verdict::held_for(since, period_signed, now) {
            return Ok(());
        }
        if now >= bound {
            return Err(Ending::new(
                RunOutcome::Skipped,
                reason,
                format!(
                    "the objectives did not hold for {} within {}; last verdict {}",
                    api::Duration(period),
                    api::Duration(period * 2 + guard_spec.stale_after.0),
                    describe(&verdict)
                ),
            ));
        }
    }
}

/// The run's injection: when, and until when the experiments last.
struct Injected {
    until: Timestamp,
}

/// Chooses the targets, creates the Workflow, waits for its StatusCheck
/// and creates the experiments under it.
async fn inject(ctx: &Ctx, plan: &Plan, guard: &Guard) -> Result<Injected, Ending> {
    let drill = &plan.drill;
    let namespace = drill.namespace().unwrap_or_default();
    let failed = |reason: &'static str, err: &dyn std::fmt::Display| {
        Ending::new(RunOutcome::Failed, reason, err.to_string())
    };
    // Pods already under chaos in the namespace, by any drill: the budget.
    let others = stop::list_all(
        &ctx.client,
        &namespace,
        &chaos::managed_selector(),
        &Kind::EXPERIMENTS,
    )
    .await
    .map_err(|err| failed("ReadFailed", &err))?;
    let mut choices = Vec::new();
    let mut held: Vec<(String, BTreeSet<String>)> = Vec::new();
    for experiment in &drill.spec.experiments {
        let component = chaos::component(experiment.target).label();
        let candidates = candidates(ctx, &namespace, &drill.spec.sale_ref.name, experiment)
            .await
            .map_err(|err| failed("ReadFailed", &err))?;
        let mut under_chaos: BTreeSet<String> = others
            .iter()
            .filter(|(_, o)| o.labels().get(TARGET_LABEL).map(String::as_str) == Some(component))
            .flat_map(|(_, o)| chaos::selected_pods(o))
            .filter_map(|pod| {
                pod.strip_prefix(&format!("{namespace}/"))
                    .map(str::to_owned)
            })
            .collect();
        for (target, pods) in &held {
            if target == component {
                under_chaos.extend(pods.iter().cloned());
            }
        }
        let seed = seed(&plan.run, &experiment.name);
        match blast::select(&candidates, &under_chaos, &drill.spec.blast_radius, seed) {
            blast::Selection::Chosen { pods, .. } => {
                held.push((component.to_owned(), pods.iter().cloned().collect()));
                choices.push((experiment.clone(), pods));
            }
            refused => {
                return Err(Ending::new(
                    RunOutcome::Skipped,
                    refused.reason(),
                    format!("experiment {}: {}", experiment.name, refused.message()),
                ));
            }
        }
    }
    let longest = choices
        .iter()
        .map(|(e, _)| e.duration.0)
        .max()
        .unwrap_or_default();
    let stale_after = drill.spec.slo_guard.stale_after.0;
    let backstop = Backstop {
        url: plan.guard_url.clone(),
        failure_threshold: stale_after.as_secs_f64().ceil().max(1.0) as u64,
        // Past the experiments, so the check outlives them, but bounded.
        deadline: longest + stale_after + Duration::from_secs(30),
    };
    let workflow = chaos::workflow(drill, &plan.run, &backstop)
        .map_err(|err| failed("InvalidObject", &err))
        .and_then(|w| chaos::dynamic(w).map_err(|err| failed("InvalidObject", &err)))?;
    create(ctx, &namespace, Kind::Workflow, &workflow)
        .await
        .map_err(|err| failed("CreateFailed", &err))?;
    let mut objects = vec![format!("Workflow/{}", workflow.name_any())];
    let status_check = match await_status_check(ctx, &namespace, &workflow.name_any()).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            let _ = stop_run(ctx, plan, guard).await;
            return Err(Ending::new(
                RunOutcome::Failed,
                "ChaosMeshNotResponding",
                format!(
                    "Chaos Mesh did not start the Workflow {}'s StatusCheck within {}; is chaos-controller-manager running?",
                    workflow.name_any(),
                    api::Duration(STATUS_CHECK_BOUND)
                ),
            ));
        }
        Err(err) => {
            let _ = stop_run(ctx, plan, guard).await;
            return Err(failed("ReadFailed", &err));
        }
    };
    let mut targets = Vec::new();
    for (experiment, pods) in &choices {
        let object = chaos::experiment(
            drill,
            &plan.run,
            experiment,
            pods,
            (&status_check.0, &status_check.1),
        );
        let created = match chaos::dynamic(object) {
            Ok(object) => create(ctx, &namespace, Kind::of(experiment), &object)
                .await
                .map(|()| object),
            Err(err) => Err(crate::kit::Error::Encode(err)),
        };
        match created {
            Ok(object) => {
                objects.push(format!(
                    "{}/{}",
                    Kind::of(experiment).name(),
                    object.name_any()
                ));
                targets.extend(pods.iter().map(|p| format!("{namespace}/{p}")));
            }
            Err(err) => {
                let _ = stop_run(ctx, plan, guard).await;
                return Err(failed("CreateFailed", &err));
            }
        }
    }
    let now = ctx.clock.now();
    guard.update(|progress| {
        progress.record.injected_at = Some(MicroTime(now));
        progress.record.targeted_pods = i32::try_from(targets.len()).ok();
        progress.record.targets = targets;
        progress.record.objects = objects;
    });
    Ok(Injected {
        until: now + signed(longest),
    })
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

/// The pods of the experiment's target workload.
async fn candidates(
    ctx: &Ctx,
    namespace: &str,
    sale: &str,
    experiment: &api::chaosdrill::Experiment,
) -> Result<Vec<blast::Candidate>, crate::kit::Error> {
    let labels = selector(sale, chaos::component(experiment.target))
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&labels))
        .await
        .map_err(crate::kit::Error::kube(
            crate::kit::Verb::List,
            "Pod",
            labels.clone(),
        ))?;
    Ok(list
        .items
        .iter()
        .map(|pod| blast::Candidate {
            name: pod.name_any(),
            ready: crate::flashsale::pods::is_ready(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        })
        .collect())
}

async fn create(
    ctx: &Ctx,
    namespace: &str,
    kind: Kind,
    object: &DynamicObject,
) -> Result<(), crate::kit::Error> {
    if !ctx.leadership.is_leader() {
        return Err(crate::kit::Error::NotLeader);
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &kind.resource());
    api.create(&PostParams::default(), object)
        .await
        .map_err(crate::kit::Error::kube(
            crate::kit::Verb::Create,
            kind.name(),
            object.name_any(),
        ))?;
    crate::apply::wrote(
        ctx,
        crate::kit::Verb::Create,
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
) -> Result<Option<(String, String)>, crate::kit::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &Kind::StatusCheck.resource());
    let params = ListParams::default().labels(&format!("{}={workflow}", chaos::WORKFLOW_LABEL));
    let until = tokio::time::Instant::now() + STATUS_CHECK_BOUND;
    loop {
        let list = api.list(&params).await.map_err(crate::kit::Error::kube(
            crate::kit::Verb::List,
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

/// Guards the injected run until its experiments' time is up (`None`) or
/// the verdict aborts it (the ending).
async fn watch(
    ctx: &Ctx,
    plan: &Plan,
    guard: &Guard,
    sampler: &mut Sampler<'_>,
    injected: Injected,
) -> Option<Ending> {
    let drill = &plan.drill;
    let mut ticks = ticker(drill.spec.slo_guard.interval.0);
    loop {
        ticks.tick().await;
        let verdict = sampler.evaluate().await;
        guard.verdict(verdict.reason(), verdict == Verdict::Healthy);
        guard.update(|progress| sampler.record_extremes(&mut progress.record.slo_extremes));
        if verdict.aborts() {
            return Some(abort(ctx, plan, guard, &verdict).await);
        }
        if ctx.clock.now() >= injected.until {
            return None;
        }
    }
}

/// The abort: silence the endpoint, stop everything of the run at once,
/// and record when each step happened.
async fn abort(ctx: &Ctx, plan: &Plan, guard: &Guard, verdict: &Verdict) -> Ending {
    let decided = ctx.clock.now();
    guard.silence(verdict.reason());
    let detected = match verdict {
        Verdict::Breach { sampled_at, .. } => *sampled_at,
        _ => decided,
    };
    guard.update(|progress| {
        progress.phase = DrillPhase::Aborting;
        progress.record.detected_at = Some(MicroTime(detected));
        progress.record.decided_at = Some(MicroTime(decided));
        progress.record.detection_latency =
            Some(api::Duration(unsigned(decided.duration_since(detected))));
    });
    ctx.settings.wake(&plan.drill);
    let stopped = stop_run(ctx, plan, guard).await;
    let namespace = plan.drill.namespace().unwrap_or_default();
    match stopped {
        Ok(stopped) => {
            let latency = stopped
                .gone_at
                .map(|gone| unsigned(gone.duration_since(decided)));
            if let Some(latency) = latency {
                ctx.metrics
                    .drill_aborted(&namespace, &plan.drill.name_any(), latency);
            }
            guard.update(|progress| {
                progress.record.recovered_at = stopped.recovered_at.map(MicroTime);
                progress.record.gone_at = stopped.gone_at.map(MicroTime);
                progress.record.abort_latency = latency.map(api::Duration);
            });
            let mut message = describe(verdict);
            if !stopped.remaining.is_empty() {
                message.push_str(&format!(
                    "; still present after {}: {}",
                    api::Duration(STOP_BOUND),
                    stopped.remaining.join(", ")
                ));
            }
            Ending::new(RunOutcome::Aborted, verdict.reason(), message)
        }
        Err(err) => Ending::new(
            RunOutcome::Aborted,
            verdict.reason(),
            format!("{}; stopping failed: {err}", describe(verdict)),
        ),
    }
}

/// Stops the run's objects; those the guard recorded are deleted without
/// waiting for the list.
async fn stop_run(ctx: &Ctx, plan: &Plan, guard: &Guard) -> Result<Stopped, crate::kit::Error> {
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
                api::chaosdrill::BreachWhen::Above => "above",
                api::chaosdrill::BreachWhen::Below => "below",
            };
            format!("{objective} = {value} is {side} its threshold {threshold}")
        }
        Verdict::Blind {
            objective,
            cause,
            detail,
        } => format!("{objective} is blind ({}): {detail}", cause.reason()),
    }
}

/// Asks Prometheus for every objective at once, remembering when each last
/// gave a usable value.
struct Sampler<'a> {
    ctx: &'a Ctx,
    plan: &'a Plan,
    started: Timestamp,
    latest: Vec<Option<Reading>>,
    last_usable: Vec<Option<Timestamp>>,
}

impl<'a> Sampler<'a> {
    fn new(ctx: &'a Ctx, plan: &'a Plan) -> Self {
        let n = plan.drill.spec.slo_guard.objectives.len();
        Self {
            ctx,
            plan,
            started: ctx.clock.now(),
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
        let reads = spec.objectives.iter().map(|objective| {
            self.ctx.settings.signal.read(
                &self.plan.prometheus_url,
                &objective.query,
                timeout,
                stale_after,
                now,
            )
        });
        let readings = join_all(reads).await;
        let answered = self.ctx.clock.now();
        for (i, reading) in readings.into_iter().enumerate() {
            if matches!(reading, Reading::Value(_)) {
                self.last_usable[i] = Some(answered);
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
                api::chaosdrill::BreachWhen::Above => sample.value > old,
                api::chaosdrill::BreachWhen::Below => sample.value < old,
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
