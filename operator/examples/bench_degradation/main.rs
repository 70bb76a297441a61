//! Benchmark: how fast a sale's degradation switches reach every gateway
//! process, on the local control plane.
//!
//! Real `gateway` processes (3 and 30 in the same run, each with its own ops
//! port on loopback) follow the sale's `<sale>-degradation` ConfigMap with
//! their own watch, and export what they have in force on `/metrics`
//! (`gateway_degradation_generation`, `gateway_degradation_tier`). The
//! benchmark asks every one of them every `--poll-ms`, as the operator does
//! after a write (`degradation::propagation::await_generation`, the
//! operator's own code).
//!
//! 1. **Write → every gateway**: the benchmark writes the ConfigMap as the
//!    DegradationPolicy controller does (server-side apply, a generation
//!    from `next_generation`), timed from just before the write until every
//!    gateway reports the generation; a bare `kube::runtime::watcher` on the
//!    same object in this process is the floor any API-server watch reaches.
//!    The polls are load on the machine too, so every timed change is
//!    followed by one no gateway is asked about while it travels, timed by
//!    the bare watch alone: the floor without the polls.
//! 2. **Override → every gateway** (unless `--skip-override`): a
//!    `flashsale-operator run` process, a FlashSale and a DegradationPolicy
//!    with a constant signal; each step merge-patches `spec.override` (tier
//!    2, then tier 0, alternating) and is timed from the patch's answer
//!    until every gateway reports the tier, split at the moment the bare
//!    watch sees the operator's write.
//!
//! Needs the stack (variables from `e2e/local/stack env`) and the release
//! binaries next to this example (or `--gateway-bin`, `--operator-bin`):
//!
//! ```text
//! cargo build --release -p gateway --bin gateway -p flashsale-operator --bin flashsale-operator
//! cargo run --release -p flashsale-operator --example bench_degradation -- --gateways 3,30 --changes 20 --runs 3
//! ```
//!
//! Everything lives in a fresh namespace, deleted at the end; the processes
//! it starts are killed on every way out. Percentiles and medians are
//! `flashsale-bench`'s.

mod fleet;
mod follow;
mod overrides;
mod switches;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Parser;
use flashsale_bench::{Recorder, median, release_binary, system};
use flashsale_e2e::{kube::TestNamespace, stack};
use flashsale_observe::probe::Probe;
use fleet::{Fleet, Setup};
use kube::Client;
use overrides::Scene;
use switches::Switcher;

#[derive(Debug, Parser)]
#[command(about = "Time degradation switches until every gateway process has them")]
struct Args {
    /// Gateway processes per measurement, each count in every run.
    #[arg(long, value_delimiter = ',', default_value = "3,30")]
    gateways: Vec<usize>,
    /// Changes (and override steps) per run and gateway count.
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// Runs; each starts its gateways afresh.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Longest wait for one change to reach every gateway.
    #[arg(long, default_value_t = 10)]
    deadline_seconds: u64,
    /// Pause between asks of one gateway's `/metrics` while a change travels.
    #[arg(long, default_value_t = 1)]
    poll_ms: u64,
    /// Measure only the writes, without the operator.
    #[arg(long)]
    skip_override: bool,
    /// The gateway binary; by default `gateway` next to this example.
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
    /// The operator binary; by default `flashsale-operator` next to this example.
    #[arg(long)]
    operator_bin: Option<PathBuf>,
}

/// The sale whose switches the gateways follow.
const SALE: &str = "bench-sale";
/// Field manager of the benchmark's own writes.
const MANAGER: &str = "flashsale-bench";
/// How long gateways and the operator may take to come up.
const START_BOUND: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.runs > 0 && args.changes > 0 && !args.gateways.is_empty(),
        "--runs, --changes and --gateways must not be empty"
    );
    anyhow::ensure!(
        args.gateways.iter().all(|&n| n > 0),
        "every --gateways count must be positive"
    );
    let gateway_bin = release_binary("gateway", args.gateway_bin.as_deref())?;
    let operator_bin = if args.skip_override {
        None
    } else {
        Some(release_binary(
            "flashsale-operator",
            args.operator_bin.as_deref(),
        )?)
    };
    let client = flashsale_e2e::kube::client().await?;
    let ns = TestNamespace::create(&client, "bench-degradation").await?;
    eprintln!(
        "namespace {}: {} runs × gateways {:?} × {} changes, polling every {} ms",
        ns.name, args.runs, args.gateways, args.changes, args.poll_ms
    );
    let setup = Setup::write(&gateway_bin, &ns.name, SALE, &stack::kafka_brokers()?)?;
    let outcome = tokio::select! {
        outcome = run(&client, &args, &setup, operator_bin.as_deref()) => outcome,
        signal = tokio::signal::ctrl_c() => {
            signal?;
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    eprintln!("deleting namespace {}", ns.name);
    drop(ns);
    let report = outcome?;
    report.print(&args);
    Ok(())
}

/// Every measurement of the benchmark.
#[derive(Debug, Default)]
struct Report {
    /// Part 1, one per run and gateway count.
    writes: Vec<switches::Measured>,
    /// Part 2, one per run and gateway count.
    overrides: Vec<overrides::Measured>,
}

async fn run(
    client: &Client,
    args: &Args,
    setup: &Setup,
    operator_bin: Option<&Path>,
) -> anyhow::Result<Report> {
    let probe = Probe::new("http://127.0.0.1:9", Duration::from_secs(1))?;
    let poll = Duration::from_millis(args.poll_ms);
    let bound = Duration::from_secs(args.deadline_seconds);
    let mut report = Report::default();
    let mut switcher = Switcher::create(client, &setup.namespace, &setup.config_map, bound).await?;
    for run in 1..=args.runs {
        for &count in &args.gateways {
            eprintln!("run {run}/{}: {count} gateways, writes", args.runs);
            let mut fleet = Fleet::start(setup, count)?;
            fleet.await_up(&probe, START_BOUND).await?;
            let measured = switcher
                .measure(&fleet, &probe, args.changes, poll, bound)
                .await?;
            eprintln!("  {}", measured.line());
            report.writes.push(measured);
        }
    }
    drop(switcher);
    let Some(operator_bin) = operator_bin else {
        return Ok(report);
    };
    let scene = Scene::start(client, &setup.namespace, operator_bin, START_BOUND).await?;
    for run in 1..=args.runs {
        for &count in &args.gateways {
            eprintln!("run {run}/{}: {count} gateways, overrides", args.runs);
            let mut fleet = Fleet::start(setup, count)?;
            fleet.await_up(&probe, START_BOUND).await?;
            let measured = scene
                .measure(&fleet, &probe, args.changes, poll, bound)
                .await?;
            eprintln!("  {}", measured.line());
            report.overrides.push(measured);
        }
    }
    scene.finish().await?;
    Ok(report)
}

impl Report {
    /// Prints both parts' tables: the writes, then the overrides when they
    /// were measured.
    fn print(&self, args: &Args) {
        self.print_writes(args);
        if self.overrides.is_empty() {
            return;
        }
        self.print_overrides(args);
    }

    /// Part 1: a row per gateway count, then the CPU per run.
    fn print_writes(&self, args: &Args) {
        println!(
            "\n== write → every gateway ({} runs × {} changes per gateway count; ms from sending the write)",
            args.runs, args.changes
        );
        println!(
            "| gateways | p50 | p99 | max | median of run p50s | raw-watch p50 | raw-watch p99 | gateways / raw-watch p50 | median of run ratios | raw-watch p50 without polls | write answered p50 | one poll of all (idle) p50 |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        for &count in &args.gateways {
            let runs: Vec<&switches::Measured> =
                self.writes.iter().filter(|m| m.gateways == count).collect();
            if runs.is_empty() {
                continue;
            }
            let all = |pick: fn(&switches::Change) -> f64| -> Vec<f64> {
                runs.iter()
                    .flat_map(|m| m.changes.iter().map(pick))
                    .collect()
            };
            let (gateways, raw) = (
                Recorder::of_ms(all(|c| c.gateways)),
                Recorder::of_ms(all(|c| c.raw)),
            );
            let run_p50s = median(runs.iter().map(|m| m.p50()));
            let run_ratios = median(runs.iter().map(|m| m.ratio()));
            let polls = Recorder::of_ms(runs.iter().flat_map(|m| m.idle_polls.clone()));
            let quiet = Recorder::of_ms(runs.iter().flat_map(|m| m.quiet.clone()));
            println!(
                "| {count} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} |",
                gateways.quantile_ms(0.5),
                gateways.quantile_ms(0.99),
                gateways.quantile_ms(1.0),
                run_p50s.unwrap_or(f64::NAN),
                raw.quantile_ms(0.5),
                raw.quantile_ms(0.99),
                gateways.quantile_ms(0.5) / raw.quantile_ms(0.5),
                run_ratios.unwrap_or(f64::NAN),
                quiet.quantile_ms(0.5),
                Recorder::of_ms(all(|c| c.write)).quantile_ms(0.5),
                polls.quantile_ms(0.5),
            );
        }
        println!("\nCPU while the changes ran (ms per change; machine busy share):");
        for m in &self.writes {
            println!(
                "  {} gateways: {}",
                m.gateways,
                m.cpu.per_step(m.changes.len())
            );
        }
    }

    /// Part 2: a row per gateway count, then the CPU and counters per run.
    fn print_overrides(&self, args: &Args) {
        println!(
            "\n== override → every gateway ({} runs × {} steps per gateway count; ms from the patch's answer)",
            args.runs, args.changes
        );
        println!(
            "| gateways | p50 | p99 | max | median of run p50s | ConfigMap changed p50 | ConfigMap changed p99 | fan-out p50 | fan-out p99 |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for &count in &args.gateways {
            let runs: Vec<&overrides::Measured> = self
                .overrides
                .iter()
                .filter(|m| m.gateways == count)
                .collect();
            if runs.is_empty() {
                continue;
            }
            let all: Vec<f64> = runs.iter().flat_map(|m| m.steps.clone()).collect();
            let written: Vec<f64> = runs.iter().flat_map(|m| m.written.clone()).collect();
            let fan_out = Recorder::of_ms(all.iter().zip(&written).map(|(t, w)| t - w));
            let run_p50s = median(
                runs.iter()
                    .map(|m| Recorder::of_ms(m.steps.clone()).quantile_ms(0.5)),
            );
            let (all, written) = (Recorder::of_ms(all), Recorder::of_ms(written));
            println!(
                "| {count} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                all.quantile_ms(0.5),
                all.quantile_ms(0.99),
                all.quantile_ms(1.0),
                run_p50s.unwrap_or(f64::NAN),
                written.quantile_ms(0.5),
                written.quantile_ms(0.99),
                fan_out.quantile_ms(0.5),
                fan_out.quantile_ms(0.99),
            );
        }
        println!("\nCPU while the steps ran (ms per step; machine busy share):");
        for m in &self.overrides {
            println!(
                "  {} gateways: {}; {}",
                m.gateways,
                m.cpu.per_step(m.steps.len()),
                m.counters.per_step(m.steps.len())
            );
        }
    }
}

/// CPU the processes that take part used during the timed steps, summed
/// over the steps, for "what does the time go to".
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    /// ns of the apiserver, etcd, the operator, the gateways together and
    /// this process (the polls and the bare watch).
    ns: [u64; 5],
    /// Busy and total ticks of the machine.
    machine: (u64, u64),
}

impl Cpu {
    /// Adds what was used between two readings.
    fn add(&mut self, before: &CpuMark, after: &CpuMark) {
        for (sum, (then, now)) in self.ns.iter_mut().zip(before.ns.iter().zip(after.ns)) {
            *sum += now.saturating_sub(*then);
        }
        let ((busy0, total0), (busy, total)) = (before.machine, after.machine);
        self.machine.0 += busy.saturating_sub(busy0);
        self.machine.1 += total.saturating_sub(total0);
    }

    /// Per step, in ms, and the machine's busy share.
    fn per_step(&self, steps: usize) -> String {
        let [apiserver, etcd, operator, gateways, benchmark] =
            self.ns.map(|ns| ns as f64 / 1e6 / steps as f64);
        format!(
            "apiserver {apiserver:.1}, etcd {etcd:.1}, operator {operator:.1}, gateways {gateways:.1}, \
             benchmark {benchmark:.1}; machine busy {:.0}%",
            self.machine.0 as f64 * 100.0 / self.machine.1.max(1) as f64
        )
    }
}

/// CPU time every thread of `pid` has used so far, in ns (the scheduler's
/// own count: /proc's tick counters are too coarse for steps of a few ms).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A reading of the counters behind [`Cpu`].
struct CpuMark {
    ns: [u64; 5],
    machine: (u64, u64),
}

impl CpuMark {
    fn take(gateway_pids: &[u32], operator_pid: Option<u32>) -> Self {
        let stack = system::stack_pids();
        let of = |name: &str| {
            stack
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, pid)| cpu_ns(*pid))
        };
        Self {
            ns: [
                of("apiserver"),
                of("etcd"),
                operator_pid.map_or(0, cpu_ns),
                gateway_pids.iter().map(|pid| cpu_ns(*pid)).sum(),
                cpu_ns(std::process::id()),
            ],
            machine: system::machine_ticks().unwrap_or_default(),
        }
    }
}
