//! Benchmark: many FlashSales created at once on the local control plane.
//!
//! Each run creates `--sales` FlashSales concurrently in a fresh namespace,
//! watched by an operator process of its own, and measures the time until
//! every sale is `Ready=True`, the operator's peak memory, and where the time
//! goes (operator, controller-manager, scheduler, kwok). Needs the stack
//! (`e2e/local/stack up`, variables from `e2e/local/stack env`) and the
//! release binary:
//!
//! ```text
//! cargo build --release -p flashsale-operator --bin flashsale-operator
//! cargo run --release -p flashsale-operator --example bench_sales -- --sales 500 --runs 3
//! cargo run --release -p flashsale-operator --example bench_sales -- \
//!     --sales 100 --runs 3 --floor --steady-secs 120
//! ```
//!
//! The operator runs with `--log-format json --log-filter
//! warn,flashsale_operator::writes=debug`, so its log holds one line per
//! write; the writes up to the moment all sales are Ready are counted per
//! sale (by the `bench-NNNN` prefix of the object's name) and by verb and
//! kind.
//!
//! `--floor` follows each operator run with a run without the operator: the
//! same sales are created in a fresh namespace, and the benchmark itself
//! writes what the operator would (each sale's internal Secret, then the
//! children of the operator's own build, server-side applied in the
//! operator's two waves, `--floor-concurrency` sales at a time), and times
//! until every Deployment has its replicas ready. Operator time ÷ floor time
//! is what the operator adds over the control plane's own minimum.
//!
//! `--steady-secs N` keeps each operator run going for N s after all sales
//! are Ready, and reports what the operator wrote and reconciled meanwhile
//! and its memory at the end.
//!
//! The sales' pods go to kwok nodes the benchmark creates (tainted, and
//! selected by an admission policy limited to its namespaces), so the stack's
//! own nodes and other users' pods are left alone; all of it is removed at
//! the end unless `--keep`.

mod cluster;
mod floor;
mod observe;
mod steady;
mod writes;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Parser;
use flashsale_api::FlashSale;
use flashsale_bench::{median, release_binary};
use flashsale_controller_sale::build::Images;
use flashsale_e2e::operator::{Launcher, Operator};
use flashsale_operator::run::RunArgs;
use futures::{StreamExt, TryStreamExt, stream};
use jiff::{SignedDuration, Timestamp};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use observe::{ApiserverCounters, OperatorCounters, Stage, Throttle};
use writes::Writes;

#[derive(Debug, Parser)]
#[command(about = "Time N FlashSales created at once until all are Ready")]
struct Args {
    /// FlashSales per run.
    #[arg(long, default_value_t = 500)]
    sales: usize,
    /// Runs, each in a fresh namespace with a fresh operator process.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Prefix of the runs' namespaces.
    #[arg(long, default_value = "bench-sales")]
    namespace_prefix: String,
    /// Keep namespaces, benchmark nodes and admission policy at the end.
    #[arg(long)]
    keep: bool,
    /// Creates in flight at once; 0 issues all of them together.
    #[arg(long, default_value_t = 0)]
    create_concurrency: usize,
    /// kwok nodes created for the benchmark.
    #[arg(long, default_value_t = 4)]
    bench_nodes: usize,
    /// Pod capacity of each benchmark node.
    #[arg(long, default_value_t = 1000)]
    pods_per_node: u32,
    /// Give up on a run when not all sales are Ready after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// How long to wait for a run's namespace to be gone.
    #[arg(long, default_value_t = 900)]
    delete_timeout_secs: u64,
    /// The operator binary; by default `flashsale-operator` of the same
    /// target folder and profile as this example.
    #[arg(long)]
    operator_bin: Option<PathBuf>,
    /// Extra flag for the operator's `run`, e.g. `--operator-arg=--status-refresh=5m`;
    /// repeat for more. (A `--log-filter` here replaces the one that logs
    /// every write, and the writes per sale are then not counted.)
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,
    /// After each operator run, a run without the operator in a fresh
    /// namespace: the same sales, and their children written by the
    /// benchmark from the operator's own build, timed until every Deployment
    /// is ready; reports operator time ÷ floor time.
    #[arg(long)]
    floor: bool,
    /// Sales whose children the floor writes at once; by default the
    /// operator's `--max-concurrent-reconciles` (16 unless given with
    /// `--operator-arg`).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    floor_concurrency: Option<u16>,
    /// Keep each operator run going this many seconds after all its sales
    /// are Ready, and report its writes, reconciles and memory in that
    /// window.
    #[arg(long, default_value_t = 0)]
    steady_secs: u64,
    /// Metrics of the stack's controller-manager.
    #[arg(long, default_value = "https://127.0.0.1:20257/metrics")]
    kcm_metrics: String,
    /// Metrics of the stack's scheduler.
    #[arg(long, default_value = "https://127.0.0.1:20259/metrics")]
    scheduler_metrics: String,
}

impl Args {
    /// Creates in flight at once: `--create-concurrency`, or every sale
    /// when it is 0.
    fn creates_at_once(&self) -> usize {
        match self.create_concurrency {
            0 => self.sales,
            n => n,
        }
    }
}

/// Pods per sale while Pending: one per workload.
const PODS_PER_SALE: usize = 3;
/// CPU requested per sale while Pending (gateway 250m, inventory and
/// order-writer 100m each), to check the benchmark nodes can hold them.
const CPU_PER_SALE: f64 = 0.45;
const NODE_CPU: f64 = 256.0;
const POLL: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Default)]
struct RunResult {
    namespace: String,
    /// The operator's writes from the creates until all were Ready (or the
    /// run gave up), from its log.
    writes: Option<Writes>,
    steady: Option<steady::Steady>,
    floor: Option<floor::FloorResult>,
    created_s: f64,
    applied_s: Option<f64>,
    half_ready_s: Option<f64>,
    ready_s: Option<f64>,
    /// Sales Ready and applied when the run ended (all, unless it timed out).
    ready_at_end: usize,
    applied_at_end: usize,
    peak_rss_mb: f64,
    max_sampled_rss_mb: f64,
    at_applied: OperatorCounters,
    at_end: OperatorCounters,
    slowest_list_ms: f64,
    max_sockets: usize,
    apiserver: Option<ApiserverCounters>,
    stages: Vec<Stage>,
    cpu: Vec<(&'static str, f64)>,
    machine_busy: f64,
    kcm: Option<Throttle>,
    scheduler: Option<Throttle>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.sales > 0 && args.runs > 0,
        "--sales and --runs must be positive"
    );
    let pods = args.sales * PODS_PER_SALE;
    let capacity = args.bench_nodes * args.pods_per_node as usize;
    anyhow::ensure!(
        pods <= capacity && args.sales as f64 * CPU_PER_SALE <= args.bench_nodes as f64 * NODE_CPU,
        "{pods} pods do not fit on {} benchmark nodes of {} pods; raise --bench-nodes or --pods-per-node",
        args.bench_nodes,
        args.pods_per_node
    );
    let launcher = Launcher::new(release_binary(
        "flashsale-operator",
        args.operator_bin.as_deref(),
    )?)
    .with(&OPERATOR_FLAGS);
    let floor = args
        .floor
        .then(|| floor_settings(&args, &launcher))
        .transpose()?;
    let client = flashsale_e2e::kube::client().await?;
    let bench_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();

    println!(
        "{} runs of {} FlashSales ({} pods); operator {} {}",
        args.runs,
        args.sales,
        pods,
        launcher.binary().display(),
        args.operator_args.join(" ")
    );
    if let Some(floor) = &floor {
        println!(
            "each followed by a floor run: {} sales written at once, images {}, {}, {}",
            floor.concurrency,
            floor.images.gateway,
            floor.images.inventory,
            floor.images.order_writer
        );
    }
    cluster::install_crds(&client).await?;
    let outcome = tokio::select! {
        outcome = async {
            cluster::install_policy(&client).await?;
            cluster::create_nodes(&client, args.bench_nodes, args.pods_per_node).await?;
            run_all(&client, &args, &launcher, floor.as_ref(), &bench_id).await
        } => outcome,
        signal = tokio::signal::ctrl_c() => {
            signal?;
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    if args.keep {
        println!(
            "kept: namespaces labelled {}={bench_id}, nodes {}..{}, MutatingAdmissionPolicy flashsale-bench-nodes",
            cluster::BENCH_ID_LABEL,
            cluster::node_name(1),
            cluster::node_name(args.bench_nodes)
        );
    } else {
        // The Ctrl-C handler stays installed: a second one stops the cleanup.
        tokio::select! {
            cleaned = teardown(&client, &args, &bench_id) => {
                if let Err(err) = cleaned {
                    eprintln!("cleaning up failed: {err:#}");
                }
            }
            _ = tokio::signal::ctrl_c() => eprintln!(
                "cleanup interrupted: delete namespaces labelled {}={bench_id}, nodes {}..{} \
                 and MutatingAdmissionPolicy flashsale-bench-nodes by hand",
                cluster::BENCH_ID_LABEL,
                cluster::node_name(1),
                cluster::node_name(args.bench_nodes)
            ),
        }
    }
    let results = outcome?;
    summary(&args, &results);
    Ok(())
}

/// The operator's `run` flags of every run, besides its namespace and
/// ops address, before the extra ones: no election, and JSON logs holding
/// every write.
const OPERATOR_FLAGS: [&str; 6] = [
    "--leader-elect",
    "false",
    "--log-format",
    "json",
    "--log-filter",
    writes::LOG_FILTER,
];

/// The operator's own flag parser, to read what a run's operator uses.
#[derive(Debug, Parser)]
struct OperatorCli {
    #[command(flatten)]
    run: RunArgs,
}

/// What the floor writes with: the images, operator namespace and
/// concurrency the operator of a run gets from its flags (and environment,
/// which it inherits).
fn floor_settings(args: &Args, launcher: &Launcher) -> anyhow::Result<floor::Settings> {
    let extra: Vec<&str> = args.operator_args.iter().map(String::as_str).collect();
    let argv = std::iter::once("flashsale-operator-run".to_owned()).chain(launcher.flags(
        "bench",
        "operator",
        "127.0.0.1:0",
        &extra,
    ));
    let run = OperatorCli::try_parse_from(argv)
        .context("the operator's flags (with --operator-arg) do not parse")?
        .run;
    Ok(floor::Settings {
        images: Images {
            gateway: run.gateway_image,
            inventory: run.inventory_image,
            order_writer: run.order_writer_image,
        },
        operator_namespace: run.operator_namespace,
        concurrency: usize::from(
            args.floor_concurrency
                .unwrap_or(run.max_concurrent_reconciles),
        ),
        create_concurrency: args.creates_at_once(),
        timeout: Duration::from_secs(args.timeout_secs),
    })
}

async fn run_all(
    client: &Client,
    args: &Args,
    launcher: &Launcher,
    floor: Option<&floor::Settings>,
    bench_id: &str,
) -> anyhow::Result<Vec<RunResult>> {
    let mut results = Vec::new();
    let delete_timeout = Duration::from_secs(args.delete_timeout_secs);
    for run in 1..=args.runs {
        let ns = format!("{}-{run}-{bench_id}", args.namespace_prefix);
        println!("\n== run {run}/{}: namespace {ns}", args.runs);
        let mut result = run_once(client, args, launcher, &ns, bench_id).await?;
        report(&result, args.sales);
        if !args.keep {
            cluster::delete_namespace(client, &ns, delete_timeout).await?;
        }
        if let Some(settings) = floor {
            let ns = format!("{}-floor-{run}-{bench_id}", args.namespace_prefix);
            println!(
                "\n== run {run}/{} without the operator: namespace {ns}",
                args.runs
            );
            cluster::create_namespace(client, &ns, bench_id).await?;
            cluster::await_policy(client, &ns).await?;
            cluster::create_secrets(client, &ns).await?;
            let floor = floor::run(client, settings, &ns, sales(args.sales)?).await?;
            floor::report(&floor);
            match (result.ready_s, floor.ready_s) {
                (Some(op), Some(fl)) => {
                    println!("  operator {op:.1} s ÷ floor {fl:.1} s = {:.2}", op / fl)
                }
                _ => println!("  operator ÷ floor: - (a run did not finish)"),
            }
            result.floor = Some(floor);
            if !args.keep {
                cluster::delete_namespace(client, &ns, delete_timeout).await?;
            }
        }
        results.push(result);
    }
    Ok(results)
}

/// Bytes in the operator's log so far. Lines are written whole (one write
/// each), so this marks what was logged before now.
fn log_len(operator: &Operator) -> u64 {
    std::fs::metadata(&operator.log).map_or(0, |m| m.len())
}

/// The `count` sales of a run.
fn sales(count: usize) -> anyhow::Result<Vec<FlashSale>> {
    (0..count).map(|i| sale(&writes::sale_name(i))).collect()
}

/// A sale far in the future: Pending, so every workload runs one replica.
fn sale(name: &str) -> anyhow::Result<FlashSale> {
    let start = Timestamp::now() + SignedDuration::from_hours(24 * 30);
    let end = start + SignedDuration::from_hours(2);
    Ok(serde_json::from_value(flashsale_e2e::sales::scheduled(
        name, start, end, "2h",
    ))?)
}

/// CPU ticks of the operator and the stack's processes, and of the machine.
struct CpuSnapshot {
    processes: Vec<(&'static str, Option<u64>)>,
    machine: Option<(u64, u64)>,
}

impl CpuSnapshot {
    fn take(processes: &[(&'static str, u32)]) -> Self {
        Self {
            processes: processes
                .iter()
                .map(|&(name, pid)| (name, observe::cpu_ticks(pid)))
                .collect(),
            machine: flashsale_bench::system::machine_ticks(),
        }
    }

    /// CPU seconds per process since `before`, and the machine's busy share.
    fn since(&self, before: &Self) -> (Vec<(&'static str, f64)>, f64) {
        let tps = observe::ticks_per_second();
        let cpu = self
            .processes
            .iter()
            .zip(&before.processes)
            .filter_map(|((name, now), (_, then))| {
                Some((*name, now.as_ref()?.saturating_sub((*then)?) as f64 / tps))
            })
            .collect();
        let busy = match (self.machine, before.machine) {
            (Some((busy, total)), Some((busy0, total0))) if total > total0 => {
                (busy - busy0) as f64 / (total - total0) as f64
            }
            _ => f64::NAN,
        };
        (cpu, busy)
    }
}

/// One operator run in the fresh namespace `ns`: the sales created at
/// once, timed until all are Ready, with what the operator and the stack
/// used meanwhile.
async fn run_once(
    client: &Client,
    args: &Args,
    launcher: &Launcher,
    ns: &str,
    bench_id: &str,
) -> anyhow::Result<RunResult> {
    let operator = start_operator(client, args, launcher, ns, bench_id).await?;
    let pid = operator.pid();
    let mut processes = flashsale_bench::system::stack_pids();
    processes.push(("operator", pid));
    let objects = sales(args.sales)?;

    let before = Readings::take(args, &processes);
    let sales: Api<FlashSale> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let started_at = Timestamp::now();
    create_sales(&sales, objects, args.creates_at_once()).await?;
    let mut result = RunResult {
        namespace: ns.to_owned(),
        created_s: started.elapsed().as_secs_f64(),
        ..RunResult::default()
    };
    println!(
        "  created {} FlashSales in {:.1} s",
        args.sales, result.created_s
    );
    let log_cut = await_ready(&sales, args, &operator, started, &mut result).await?;

    let cpu_after = CpuSnapshot::take(&processes);
    result.peak_rss_mb = observe::memory_mb(pid, "VmHWM:").unwrap_or(f64::NAN);
    result.at_end = OperatorCounters::parse(&operator.metrics().await?);
    before.record_since(args, &cpu_after, &mut result);
    let log_cut = log_cut.unwrap_or_else(|| log_len(&operator));
    if args.steady_secs > 0 {
        if result.ready_s.is_some() {
            result.steady = Some(steady::hold(&operator, &sales, args.steady_secs).await?);
        } else {
            println!("  no steady state: not every sale became Ready");
        }
    }
    let log = operator.log.clone();
    drop(operator);
    result.writes = logged_writes(&log, args.sales, 0, log_cut);
    if let Some(steady) = &mut result.steady {
        let (from, to) = steady.log_window;
        steady.writes = logged_writes(&log, args.sales, from, to);
    }
    result.stages = observe::timeline(client, ns, started_at).await?;
    Ok(result)
}

/// Makes `ns` ready for a run (the admission policy applies to it, the
/// Secrets exist) and starts its operator, returning once it leads.
async fn start_operator(
    client: &Client,
    args: &Args,
    launcher: &Launcher,
    ns: &str,
    bench_id: &str,
) -> anyhow::Result<Operator> {
    cluster::create_namespace(client, ns, bench_id).await?;
    cluster::await_policy(client, ns).await?;
    cluster::create_secrets(client, ns).await?;
    let extra: Vec<&str> = args.operator_args.iter().map(String::as_str).collect();
    let operator = launcher.start(ns, "operator", &extra, &[])?;
    println!(
        "  operator pid {} (log {})",
        operator.pid(),
        operator.log.display()
    );
    operator.until_leads().await?;
    Ok(operator)
}

/// Creates the FlashSales, `concurrency` at a time.
async fn create_sales(
    sales: &Api<FlashSale>,
    objects: Vec<FlashSale>,
    concurrency: usize,
) -> anyhow::Result<Vec<FlashSale>> {
    stream::iter(objects)
        .map(|sale| {
            let sales = sales.clone();
            async move { sales.create(&PostParams::default(), &sale).await }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await
        .context("creating the FlashSales")
}

/// Polls the sales until all are Ready or the run times out, recording in
/// `result` when they were applied, half and all Ready, and the operator's
/// memory and sockets on the way. Returns where the operator's log stood
/// when all were Ready.
async fn await_ready(
    sales: &Api<FlashSale>,
    args: &Args,
    operator: &Operator,
    started: Instant,
    result: &mut RunResult,
) -> anyhow::Result<Option<u64>> {
    let pid = operator.pid();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_print = (usize::MAX, usize::MAX, Instant::now());
    loop {
        tick.tick().await;
        let listed = Instant::now();
        let list = sales.list(&ListParams::default()).await?;
        result.slowest_list_ms = result
            .slowest_list_ms
            .max(listed.elapsed().as_secs_f64() * 1000.0);
        let elapsed = started.elapsed().as_secs_f64();
        let rss = observe::memory_mb(pid, "VmRSS:").unwrap_or(0.0);
        result.max_sampled_rss_mb = result.max_sampled_rss_mb.max(rss);
        result.max_sockets = result.max_sockets.max(observe::sockets(pid));
        let statuses = list.items.iter().filter_map(|s| s.status.as_ref());
        let (mut applied, mut ready) = (0, 0);
        for status in statuses {
            applied += usize::from(status.workloads.len() == 3);
            ready += usize::from(status.observed.is_true("Ready"));
        }
        if result.applied_s.is_none() && applied == args.sales {
            result.applied_s = Some(elapsed);
            result.at_applied = OperatorCounters::parse(&operator.metrics().await?);
            println!("  all {applied} sales applied after {elapsed:.1} s");
        }
        if result.half_ready_s.is_none() && ready * 2 >= args.sales {
            result.half_ready_s = Some(elapsed);
        }
        (result.ready_at_end, result.applied_at_end) = (ready, applied);
        let done = ready == args.sales;
        let changed = (applied, ready) != (last_print.0, last_print.1);
        let waited = last_print.2.elapsed();
        if done || (changed && waited >= Duration::from_secs(1)) || waited >= Duration::from_secs(5)
        {
            println!(
                "  ready {ready}/{} after {elapsed:.1} s (applied {applied}, operator RSS {rss:.0} MB)",
                args.sales
            );
            last_print = (applied, ready, Instant::now());
        }
        if done {
            result.ready_s = Some(elapsed);
            return Ok(Some(log_len(operator)));
        }
        if elapsed >= args.timeout_secs as f64 {
            println!(
                "  gave up: {ready}/{} Ready after {elapsed:.0} s",
                args.sales
            );
            return Ok(None);
        }
    }
}

/// The counters a run reports the change of, read before the creates.
struct Readings {
    apiserver: Option<ApiserverCounters>,
    kcm: Option<Throttle>,
    scheduler: Option<Throttle>,
    cpu: CpuSnapshot,
}

impl Readings {
    /// Reads them all now.
    fn take(args: &Args, processes: &[(&'static str, u32)]) -> Self {
        Self {
            apiserver: ApiserverCounters::scrape(),
            kcm: Throttle::scrape(&args.kcm_metrics),
            scheduler: Throttle::scrape(&args.scheduler_metrics),
            cpu: CpuSnapshot::take(processes),
        }
    }

    /// Records in `result` what changed since: the counters read now, the
    /// CPU as `cpu_after` took it.
    fn record_since(self, args: &Args, cpu_after: &CpuSnapshot, result: &mut RunResult) {
        result.kcm = Throttle::scrape(&args.kcm_metrics)
            .zip(self.kcm)
            .map(|(after, before)| after.since(before));
        result.scheduler = Throttle::scrape(&args.scheduler_metrics)
            .zip(self.scheduler)
            .map(|(after, before)| after.since(before));
        result.apiserver = ApiserverCounters::scrape()
            .zip(self.apiserver)
            .map(|(after, before)| after.since(before));
        (result.cpu, result.machine_busy) = cpu_after.since(&self.cpu);
    }
}

/// The writes of a window of the operator's log; `None`, with a warning,
/// when the log cannot be read.
fn logged_writes(log: &Path, sales: usize, from: u64, to: u64) -> Option<Writes> {
    writes::read(log, sales, from, to)
        .inspect_err(|err| println!("  warning: the operator's writes are not counted: {err:#}"))
        .ok()
}

/// CPU seconds per process, as `name 1.2, other 3.4`.
fn cpu_seconds(cpu: &[(&'static str, f64)]) -> String {
    let parts: Vec<String> = cpu
        .iter()
        .map(|(name, seconds)| format!("{name} {seconds:.1}"))
        .collect();
    parts.join(", ")
}

fn secs(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn report(r: &RunResult, sales: usize) {
    let end = r.at_end;
    println!("  --- {}", r.namespace);
    println!(
        "  created {:.1} s, all applied {} s, half Ready {} s, all Ready {} s ({} Ready, {} applied at the end)",
        r.created_s,
        secs(r.applied_s),
        secs(r.half_ready_s),
        secs(r.ready_s),
        r.ready_at_end,
        r.applied_at_end
    );
    println!(
        "  operator: peak RSS (VmHWM) {:.1} MB, highest sampled VmRSS {:.1} MB",
        r.peak_rss_mb, r.max_sampled_rss_mb
    );
    println!(
        "  operator: {:.0} reconciles ({:.0} errors), {:.0} writes, mean reconcile {:.1} ms; \
         at all-applied {:.0} reconciles, {:.0} writes",
        end.reconciles,
        end.reconcile_errors,
        end.writes,
        end.mean_reconcile_ms(),
        r.at_applied.reconciles,
        r.at_applied.writes
    );
    if let Some(writes) = &r.writes {
        writes.print(if r.ready_s.is_some() {
            "writes from the creates to all Ready (operator log)"
        } else {
            "writes from the creates to the end of the run (operator log)"
        });
    }
    println!(
        "  slowest LIST of the sales: {:.0} ms; operator sockets at most {}",
        r.slowest_list_ms, r.max_sockets
    );
    if let Some(a) = r.apiserver {
        println!(
            "  apiserver: {:.0} requests, {:.0} Service and {:.0} other requests timed out (504), \
             {:.0} IPAddress creates and {:.0} deletes",
            a.requests, a.timeouts_services, a.timeouts_other, a.ip_creates, a.ip_deletes
        );
    }
    println!("  stage (s after the creates)   count    p50    p90   last");
    for s in &r.stages {
        println!(
            "    {:<26} {:>6} {:>6.1} {:>6.1} {:>6.1}",
            s.name, s.count, s.p50, s.p90, s.last
        );
    }
    println!(
        "  CPU seconds from the creates to the end of the run: {} (machine busy {:.0}%)",
        cpu_seconds(&r.cpu),
        r.machine_busy * 100.0
    );
    for (name, throttle) in [("controller-manager", r.kcm), ("scheduler", r.scheduler)] {
        match throttle {
            Some(t) => println!(
                "  {name} client-side rate limiter: {:.0} requests, {:.1} s waited in total, {:.0} waited > 1 s",
                t.requests, t.wait_seconds, t.over_1s
            ),
            None => println!("  {name}: metrics unreachable"),
        }
    }
    if let Some(s) = &r.steady {
        steady::report(s, sales);
    }
}

/// One column of the summary table: its header, decimals, and value.
struct Column {
    header: &'static str,
    decimals: usize,
    value: fn(&RunResult) -> Option<f64>,
}

fn stage_last(r: &RunResult, name: &str) -> Option<f64> {
    r.stages.iter().find(|s| s.name == name).map(|s| s.last)
}

/// A quantile (min, p50, p90, max) of the run's writes per sale.
fn per_sale(r: &RunResult, which: usize) -> Option<f64> {
    r.writes.as_ref().map(|w| w.distribution()[which])
}

/// The summary's columns: the floor's and the steady state's only when
/// measured.
fn columns(args: &Args) -> Vec<Column> {
    let column = |header, decimals, value| Column {
        header,
        decimals,
        value,
    };
    let mut columns = vec![
        column("all applied (s)", 1, |r| r.applied_s),
        column("all Ready (s)", 1, |r| r.ready_s),
        column("peak RSS (MB)", 0, |r| Some(r.peak_rss_mb)),
        column("reconciles", 0, |r| Some(r.at_end.reconciles)),
        column("writes", 0, |r| Some(r.at_end.writes)),
        column("writes/sale p50", 0, |r| per_sale(r, 1)),
        column("writes/sale max", 0, |r| per_sale(r, 3)),
        column("mean reconcile (ms)", 1, |r| {
            Some(r.at_end.mean_reconcile_ms())
        }),
        column("last pod created (s)", 1, |r| stage_last(r, "Pod created")),
        column("last pod scheduled (s)", 1, |r| {
            stage_last(r, "Pod scheduled")
        }),
        column("last pod Ready (s)", 1, |r| stage_last(r, "Pod Ready")),
    ];
    if args.floor {
        columns.extend([
            column("floor all Ready (s)", 1, |r| r.floor.as_ref()?.ready_s),
            column("operator ÷ floor", 2, |r| {
                Some(r.ready_s? / r.floor.as_ref()?.ready_s?)
            }),
        ]);
    }
    if args.steady_secs > 0 {
        columns.extend([
            column("steady writes", 0, |r| {
                Some(r.steady.as_ref()?.counters.writes)
            }),
            column("steady reconciles", 0, |r| {
                Some(r.steady.as_ref()?.counters.reconciles)
            }),
            column("steady end RSS (MB)", 1, |r| {
                Some(r.steady.as_ref()?.rss_mb)
            }),
            column("steady end VmHWM (MB)", 1, |r| {
                Some(r.steady.as_ref()?.hwm_mb)
            }),
        ]);
    }
    columns
}

fn summary(args: &Args, results: &[RunResult]) {
    println!("\n== {} runs of {} FlashSales", results.len(), args.sales);
    let columns = columns(args);
    let headers: Vec<&str> = columns.iter().map(|c| c.header).collect();
    println!("| run | Ready at end | {} |", headers.join(" | "));
    println!("|---|---|{}", "---|".repeat(columns.len()));
    let row = |label: String, ready: String, values: &[Option<f64>]| {
        let cells: Vec<String> = values
            .iter()
            .zip(&columns)
            .map(|(v, c)| match v {
                Some(v) if v.is_finite() => format!("{v:.*}", c.decimals),
                _ => "-".to_owned(),
            })
            .collect();
        println!("| {label} | {ready} | {} |", cells.join(" | "));
    };
    let all: Vec<Vec<Option<f64>>> = results
        .iter()
        .map(|r| columns.iter().map(|c| (c.value)(r)).collect())
        .collect();
    for (i, (r, values)) in results.iter().zip(&all).enumerate() {
        row(
            (i + 1).to_string(),
            format!("{}/{}", r.ready_at_end, args.sales),
            values,
        );
    }
    let medians: Vec<Option<f64>> = (0..columns.len())
        .map(|c| median(all.iter().filter_map(|r| r[c])))
        .collect();
    let ready = median(results.iter().map(|r| r.ready_at_end as f64));
    row(
        "median".to_owned(),
        format!("{:.0}/{}", ready.unwrap_or(0.0), args.sales),
        &medians,
    );
}

async fn teardown(client: &Client, args: &Args, bench_id: &str) -> anyhow::Result<()> {
    // Pods must be gone before their nodes, or they stay Terminating until
    // the pod garbage collector finds them.
    for ns in cluster::own_namespaces(client, bench_id).await? {
        cluster::delete_namespace(client, &ns, Duration::from_secs(args.delete_timeout_secs))
            .await?;
    }
    cluster::delete_policy(client).await?;
    cluster::delete_nodes(client, args.bench_nodes).await?;
    println!("removed the benchmark nodes and admission policy");
    Ok(())
}
