//! Benchmark: how fast a ChaosDrill's chaos ends, on the local control
//! plane with the stack's real Chaos Mesh controller and Prometheus.
//!
//! 1. **Stop path** (`--aborts`): `drill::stop::stop`, the operator's one
//!    stop path, called in this process on a PodChaos `pod-failure` that
//!    Chaos Mesh reports injected, timed from just before the call (the
//!    decision) until Chaos Mesh reported the target recovered and until
//!    the object was gone; alternating with a plain delete of the same kind
//!    of object (as `kubectl delete` sends it) watched until gone, the
//!    floor of any removal.
//! 2. **Breach → gone** (`--detections`): a drill run by a release
//!    `flashsale-operator run` process, its guard reading a gauge through
//!    Prometheus every 250 ms; the gauge set above the threshold, timed
//!    until the run's PodChaos is gone, and split by the run's status.
//! 3. **Dead man** (`--outages`): the stack's Prometheus stopped mid-run
//!    (`stack down prometheus`), timed until the PodChaos is gone, against
//!    staleAfter (2 s) + 500 ms; Prometheus is started again after each.
//! 4. **Backstop** (`--backstops`): the operator SIGKILLed mid-run, timed
//!    until Chaos Mesh's StatusCheck alone has removed the PodChaos; a fresh
//!    operator takes over before the next run.
//!
//! Needs the stack (variables from `e2e/local/stack env`) and the release
//! operator next to this example (or `--operator-bin`):
//!
//! ```text
//! cargo build --release -p flashsale-operator --bin flashsale-operator --example bench_drill
//! cargo run --release -p flashsale-operator --example bench_drill -- --aborts 50 --detections 5 --outages 2 --backstops 3
//! ```
//!
//! Everything lives in a fresh namespace, deleted at the end; the operator
//! processes it starts are killed, and a stopped Prometheus is started
//! again, on every way out. Percentiles and medians are `flashsale-bench`'s.

mod chaos;
mod runs;
mod stop_path;

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use flashsale_bench::{Recorder, median, ms, release_binary};
use flashsale_e2e::{
    drill::DrillScene,
    operator::{FAST_LEASE, Launcher},
};

#[derive(Debug, Parser)]
#[command(about = "Time how fast a ChaosDrill's chaos ends: stop path, breach, dead man, backstop")]
struct Args {
    /// In-process stops, each paired with a plain delete (0 skips part 1).
    #[arg(long, default_value_t = 50)]
    aborts: usize,
    /// Runs aborted by a breach of the gauge (0 skips part 2).
    #[arg(long, default_value_t = 5)]
    detections: usize,
    /// Runs aborted by stopping the stack's Prometheus (0 skips part 3 and
    /// leaves Prometheus alone).
    #[arg(long, default_value_t = 2)]
    outages: usize,
    /// Runs ended by Chaos Mesh after a SIGKILL of the operator (0 skips
    /// part 4).
    #[arg(long, default_value_t = 3)]
    backstops: usize,
    /// Longest wait for any one step.
    #[arg(long, default_value_t = 60)]
    deadline_seconds: u64,
    /// The operator binary; by default `flashsale-operator` next to this example.
    #[arg(long)]
    operator_bin: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.aborts + args.detections + args.outages + args.backstops > 0,
        "every count is 0: nothing to measure"
    );
    // The tests' short lease timings and status refresh, quieter logs.
    let launcher = Launcher::new(release_binary(
        "flashsale-operator",
        args.operator_bin.as_deref(),
    )?)
    .with(&FAST_LEASE)
    .with(&["--status-refresh", "2s", "--log-filter", "info"]);
    // The scene (namespace, operator, Prometheus outage) lives inside the
    // future, so an interrupt drops it and its cleanup runs.
    let report = tokio::select! {
        report = run(&args, &launcher) => report,
        signal = tokio::signal::ctrl_c() => {
            signal?;
            Err(anyhow::anyhow!("interrupted"))
        }
    }?;
    report.print(&args);
    Ok(())
}

/// Every measurement of the benchmark.
#[derive(Debug, Default)]
struct Report {
    /// Part 1, pair by pair.
    stops: stop_path::Measured,
    /// Part 2, one per run.
    breaches: Vec<runs::Breach>,
    /// Part 3, one per run.
    outages: Vec<runs::Blind>,
    /// Part 4, one per run.
    backstops: Vec<runs::Backstop>,
}

async fn run(args: &Args, launcher: &Launcher) -> anyhow::Result<Report> {
    let bound = Duration::from_secs(args.deadline_seconds);
    let mut scene = DrillScene::start(launcher, "bench-drill", 0.0, &[]).await?;
    eprintln!(
        "operator {}: pid {} (log {})",
        scene.operator.identity,
        scene.operator.pid(),
        scene.operator.log.display()
    );
    eprintln!(
        "namespace {}: {} aborts, {} breaches, {} outages, {} backstops",
        scene.ns.name, args.aborts, args.detections, args.outages, args.backstops
    );
    // The drill's pods first: its scene counts every Ready pod of the
    // namespace while it waits for them.
    runs::prepare(&mut scene).await?;
    let mut report = Report::default();
    if args.aborts > 0 {
        eprintln!("part 1: the stop path, {} aborts", args.aborts);
        report.stops =
            stop_path::measure(&scene.client, &scene.ns.name, args.aborts, bound).await?;
    }
    if args.detections > 0 {
        eprintln!("part 2: breach → gone, {} runs", args.detections);
        report.breaches = runs::breaches(&scene, args.detections, bound).await?;
    }
    if args.outages > 0 {
        eprintln!("part 3: Prometheus stopped mid-run, {} runs", args.outages);
        report.outages = runs::outages(&scene, args.outages, bound).await?;
    }
    if args.backstops > 0 {
        eprintln!(
            "part 4: the operator SIGKILLed mid-run, {} runs",
            args.backstops
        );
        report.backstops = runs::backstops(&mut scene, args.backstops, bound).await?;
    }
    eprintln!("deleting namespace {}", scene.ns.name);
    Ok(report)
}

/// A row of the summary: n, p50, p99, max of `values` (ms).
fn row(part: &str, what: &str, values: &[f64]) {
    let recorded = Recorder::of_ms(values.iter().copied());
    if recorded.is_empty() {
        return;
    }
    println!(
        "| {part} | {what} | {} | {:.1} | {:.1} | {:.1} |",
        recorded.len(),
        recorded.quantile_ms(0.5),
        recorded.quantile_ms(0.99),
        recorded.quantile_ms(1.0)
    );
}

/// The median of `values` (ms), as the summary's p50.
fn p50(values: &[f64]) -> f64 {
    Recorder::of_ms(values.iter().copied()).quantile_ms(0.5)
}

impl Report {
    /// Prints the summary, then each part's details where it was measured.
    fn print(&self, args: &Args) {
        self.print_summary();
        if !self.stops.gone.is_empty() {
            self.print_ratios();
        }
        if !self.outages.is_empty() {
            self.print_outages();
        }
        if !self.backstops.is_empty() {
            self.print_backstops();
        }
        println!(
            "\n(counts: --aborts {} --detections {} --outages {} --backstops {})",
            args.aborts, args.detections, args.outages, args.backstops
        );
    }

    /// One figure of every breach (ms).
    fn breach_ms(&self, f: fn(&runs::Breach) -> f64) -> Vec<f64> {
        self.breaches.iter().map(f).collect()
    }

    /// The summary: a row per measurement of every part.
    fn print_summary(&self) {
        let stops = &self.stops;
        let pick = |f| self.breach_ms(f);
        let outages_begin: Vec<f64> = self.outages.iter().map(|o| o.from_begin).collect();
        let outages_down: Vec<f64> = self.outages.iter().map(|o| o.from_down).collect();
        let backstops: Vec<f64> = self.backstops.iter().map(|b| b.gone).collect();
        let leads: Vec<f64> = self.backstops.iter().map(|b| b.leads).collect();
        println!("\n== how fast a drill's chaos ends (ms)");
        println!("| part | measurement | n | p50 | p99 | max |");
        println!("|---|---|---|---|---|---|");
        row("1 stop path", "decision → recovered", &stops.recovered);
        row("1 stop path", "decision → gone", &stops.gone);
        row("1 baseline", "plain delete → gone", &stops.deleted);
        row("2 breach", "gauge set → PodChaos gone", &pick(|b| b.gone));
        row(
            "2 breach",
            "gauge set → detected (next scrape, next guard tick)",
            &pick(|b| b.detected),
        );
        row("2 breach", "detection → decision", &pick(|b| b.detection));
        row(
            "2 breach",
            "decision → gone (abortLatency)",
            &pick(|b| b.abort),
        );
        row(
            "3 dead man",
            "`stack down prometheus` began → gone",
            &outages_begin,
        );
        row(
            "3 dead man",
            "`stack down prometheus` returned → gone",
            &outages_down,
        );
        row(
            "4 backstop",
            "SIGKILL → gone (Chaos Mesh alone)",
            &backstops,
        );
        row("4 backstop", "next operator started → leads", &leads);
    }

    /// The stop path against a plain delete in the same runs, and the
    /// operator's abort latency against the stop path.
    fn print_ratios(&self) {
        let stops = &self.stops;
        let pairs = |of: &[f64]| -> Vec<f64> {
            of.iter().zip(&stops.deleted).map(|(s, d)| s / d).collect()
        };
        println!(
            "\n== same-run ratios ({} alternating pairs; operator rows from part 2 against part 1)",
            stops.gone.len()
        );
        println!("| ratio | of medians | median of pair ratios |");
        println!("|---|---|---|");
        let median_of = |values: Vec<f64>| median(values).unwrap_or(f64::NAN);
        println!(
            "| stop decision → gone / plain delete → gone | {:.2} | {:.2} |",
            p50(&stops.gone) / p50(&stops.deleted),
            median_of(pairs(&stops.gone))
        );
        println!(
            "| stop decision → recovered / plain delete → gone | {:.2} | {:.2} |",
            p50(&stops.recovered) / p50(&stops.deleted),
            median_of(pairs(&stops.recovered))
        );
        if !self.breaches.is_empty() {
            println!(
                "| operator abortLatency / in-process decision → gone | {:.2} | – |",
                p50(&self.breach_ms(|b| b.abort)) / p50(&stops.gone)
            );
        }
    }

    /// Part 3 per run, against the target of staleAfter plus half a second.
    fn print_outages(&self) {
        let target = ms(runs::STALE_AFTER) + 500.0;
        println!(
            "\n== dead man, per run (staleAfter {} ms; target: gone < {target:.0} ms after the stop completed)",
            ms(runs::STALE_AFTER)
        );
        println!(
            "| run | `stack down` took | began → gone | returned → gone | within target | reason | abortLatency |"
        );
        println!("|---|---|---|---|---|---|---|");
        for (i, o) in self.outages.iter().enumerate() {
            println!(
                "| {} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
                i + 1,
                o.down,
                o.from_begin,
                o.from_down,
                if o.from_down < target { "yes" } else { "no" },
                o.reason,
                o.abort.map_or("–".to_owned(), |a| format!("{a:.1}")),
            );
        }
    }

    /// Part 4 per run.
    fn print_backstops(&self) {
        println!("\n== backstop, per run");
        println!("| run | SIGKILL → gone | next operator leads after | recorded by it |");
        println!("|---|---|---|---|");
        for (i, b) in self.backstops.iter().enumerate() {
            println!(
                "| {} | {:.1} | {:.1} | {} |",
                i + 1,
                b.gone,
                b.leads,
                b.reason
            );
        }
    }
}
