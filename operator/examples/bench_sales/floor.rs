//! The control plane's floor: the same sales brought up without the
//! operator. The benchmark creates the FlashSales, then writes for each one
//! what one reconcile of the operator writes (its internal Secret, then the
//! children of the operator's pure build, server-side applied in the
//! operator's two waves), a bounded number of sales at a time, and times
//! until every Deployment has its replicas ready. What is left between this
//! and an operator run is the operator's own cost.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use flashsale_api::{FlashSale, timeline::Timeline};
use flashsale_controller_sale::{build, build::Images, build::Input, lifecycle, tokens};
use flashsale_kit::apply::Namespaced;
use futures::{StreamExt, TryStreamExt, future::try_join_all, stream};
use jiff::Timestamp;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use tokio::task::JoinHandle;

use crate::{CpuSnapshot, POLL, create_sales, observe::ApiserverCounters};

/// Field manager of the floor's applies.
pub const MANAGER: &str = "bench-floor";

/// What the floor writes like the operator does.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The images the operator would default to.
    pub images: Images,
    /// The operator namespace the operator would let through.
    pub operator_namespace: String,
    /// Sales written at once (the operator's `--max-concurrent-reconciles`).
    pub concurrency: usize,
    /// Creates of FlashSales in flight at once.
    pub create_concurrency: usize,
    /// Give up when not every Deployment is ready after this long.
    pub timeout: Duration,
}

/// One floor run.
#[derive(Debug, Clone, Default)]
pub struct FloorResult {
    pub namespace: String,
    pub created_s: f64,
    /// Every child of every sale written.
    pub applied_s: Option<f64>,
    /// Every Deployment with its replicas ready.
    pub ready_s: Option<f64>,
    pub deployments_ready_at_end: usize,
    pub deployments_expected: usize,
    /// Requests that wrote (creates and applies), sales excluded.
    pub writes: usize,
    pub apiserver: Option<ApiserverCounters>,
    pub cpu: Vec<(&'static str, f64)>,
    pub machine_busy: f64,
}

/// Runs the floor in the fresh namespace `ns` (Secrets and admission
/// policy in place) for `objects`, the same sales an operator run creates.
pub async fn run(
    client: &Client,
    settings: &Settings,
    ns: &str,
    objects: Vec<FlashSale>,
) -> anyhow::Result<FloorResult> {
    let count = objects.len();
    let processes = flashsale_bench::system::stack_pids();
    let apiserver_before = ApiserverCounters::scrape();
    let cpu_before = CpuSnapshot::take(&processes);
    let sales: Api<FlashSale> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let created = create_sales(&sales, objects, settings.create_concurrency).await?;
    let mut result = FloorResult {
        namespace: ns.to_owned(),
        created_s: started.elapsed().as_secs_f64(),
        deployments_expected: 3 * count,
        ..FloorResult::default()
    };
    println!(
        "  created {count} FlashSales in {:.1} s; writing their children, {} sales at a time",
        result.created_s, settings.concurrency
    );

    let writer = spawn_writer(client, settings, created, started);
    // Stops the writer when the polling fails or gives up.
    let _abort = AbortOnDrop(writer.abort_handle());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    await_ready(&deployments, settings, started, writer, &mut result).await?;
    let cpu_after = CpuSnapshot::take(&processes);
    (result.cpu, result.machine_busy) = cpu_after.since(&cpu_before);
    result.apiserver = ApiserverCounters::scrape()
        .zip(apiserver_before)
        .map(|(after, before)| after.since(before));
    Ok(result)
}

/// The writes a finished writer made, and how long after `started` it
/// finished.
type Written = anyhow::Result<(usize, Duration)>;

/// Writes every sale's children in a task of its own,
/// `settings.concurrency` sales at a time.
fn spawn_writer(
    client: &Client,
    settings: &Settings,
    created: Vec<FlashSale>,
    started: Instant,
) -> JoinHandle<Written> {
    let client = client.clone();
    let settings = settings.clone();
    tokio::spawn(async move {
        let writes: Vec<usize> = stream::iter(created)
            .map(|sale| write_sale(&client, &settings, sale))
            .buffer_unordered(settings.concurrency.max(1))
            .try_collect()
            .await?;
        Ok::<_, anyhow::Error>((writes.iter().sum::<usize>(), started.elapsed()))
    })
}

/// Polls the Deployments until every expected one is ready and the writer
/// has finished, or until the timeout, recording both moments in `result`.
async fn await_ready(
    deployments: &Api<Deployment>,
    settings: &Settings,
    started: Instant,
    writer: JoinHandle<Written>,
    result: &mut FloorResult,
) -> anyhow::Result<()> {
    let mut writer = Some(writer);
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_print = Instant::now();
    loop {
        tick.tick().await;
        if let Some(task) = writer.take_if(|task| task.is_finished()) {
            let (writes, took) = task.await.context("the floor's writer panicked")??;
            result.writes = writes;
            result.applied_s = Some(took.as_secs_f64());
            println!(
                "  all {writes} children written after {:.1} s",
                took.as_secs_f64()
            );
        }
        let list = deployments.list(&ListParams::default()).await?;
        let elapsed = started.elapsed().as_secs_f64();
        let ready = ready_count(&list.items);
        result.deployments_ready_at_end = ready;
        let done = ready >= result.deployments_expected && writer.is_none();
        if done || last_print.elapsed() >= Duration::from_secs(5) {
            println!(
                "  Deployments ready {ready}/{} after {elapsed:.1} s ({} listed)",
                result.deployments_expected,
                list.items.len()
            );
            last_print = Instant::now();
        }
        if done {
            result.ready_s = Some(elapsed);
            return Ok(());
        }
        if elapsed >= settings.timeout.as_secs_f64() {
            println!(
                "  gave up: {ready}/{} Deployments ready after {elapsed:.0} s",
                result.deployments_expected
            );
            return Ok(());
        }
    }
}

/// The Deployments with their replicas ready, as the operator's Ready
/// condition counts a workload.
fn ready_count(deployments: &[Deployment]) -> usize {
    deployments
        .iter()
        .filter(|d| {
            let desired = d.spec.replicas.unwrap_or(1);
            let ready = d.status.as_ref().and_then(|s| s.ready_replicas);
            ready.unwrap_or(0) >= desired
        })
        .count()
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What one reconcile of a new Pending sale writes: its internal Secret,
/// then the operator's two waves of applies. Returns the requests made.
async fn write_sale(
    client: &Client,
    settings: &Settings,
    sale: FlashSale,
) -> anyhow::Result<usize> {
    // The stage as the operator decides it; a new sale is not drained.
    let now = Timestamp::now();
    let timeline = Timeline::of(&sale.spec);
    let (phase, _) = timeline.phase_at(now);
    let stage = lifecycle::stage(phase, timeline.settled(now), false);
    let desired = build::build(&Input {
        sale: &sale,
        images: &settings.images,
        stage,
        operator_namespace: &settings.operator_namespace,
    })
    .with_context(|| format!("building the children of {}", sale.name_any()))?;

    let secret = build::internal_secret(&sale, &tokens::generate())?;
    let ns = secret
        .namespace()
        .context("the internal Secret has no namespace")?;
    match Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => return Err(err).context("creating the internal Secret"),
    }

    // The operator's order: what pods refer to and what guards them, then
    // the workloads.
    let d = &desired;
    let first = tokio::try_join!(
        apply_each(client, &d.service_accounts),
        apply_each(client, &d.roles),
        apply_each(client, &d.role_bindings),
        apply_each(client, &d.config_maps),
        apply_each(client, &d.services),
        apply_each(client, &d.pod_disruption_budgets),
        apply_each(client, &d.network_policies),
    )?;
    let second = tokio::try_join!(
        apply_each(client, &d.deployments),
        apply_each(client, &d.horizontal_pod_autoscalers),
    )?;
    Ok(1 + first.0
        + first.1
        + first.2
        + first.3
        + first.4
        + first.5
        + first.6
        + second.0
        + second.1)
}

/// Server-side applies `objects` together; returns how many.
async fn apply_each<K: Namespaced>(client: &Client, objects: &[K]) -> anyhow::Result<usize> {
    let params = PatchParams::apply(MANAGER).force();
    try_join_all(objects.iter().map(|object| {
        let params = &params;
        async move {
            let name = object.name_any();
            let ns = object
                .namespace()
                .with_context(|| format!("{name} has no namespace"))?;
            Api::<K>::namespaced(client.clone(), &ns)
                .patch(&name, params, &Patch::Apply(object))
                .await
                .with_context(|| format!("applying {} {ns}/{name}", K::kind(&())))?;
            Ok::<_, anyhow::Error>(())
        }
    }))
    .await?;
    Ok(objects.len())
}

/// Prints a floor run.
pub fn report(r: &FloorResult) {
    println!("  --- {} (floor, no operator)", r.namespace);
    println!(
        "  created {:.1} s, all written {} s, all Deployments ready {} s ({}/{} ready at the end); \
         {} writes besides the sales",
        r.created_s,
        crate::secs(r.applied_s),
        crate::secs(r.ready_s),
        r.deployments_ready_at_end,
        r.deployments_expected,
        r.writes
    );
    if let Some(a) = r.apiserver {
        println!(
            "  apiserver: {:.0} requests, {:.0} Service and {:.0} other requests timed out (504)",
            a.requests, a.timeouts_services, a.timeouts_other
        );
    }
    println!(
        "  CPU seconds from the creates to all ready: {} (machine busy {:.0}%)",
        crate::cpu_seconds(&r.cpu),
        r.machine_busy * 100.0
    );
}
