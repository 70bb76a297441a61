//! Benchmark: the stop path per fault kind on the real node, from the
//! decision to the Chaos Mesh objects gone and to the effect gone as the
//! pod shows it, beside a plain delete of the same object in the same run.
//!
//! A sale runs on the stack's real node (kubelet, containerd, chaos-daemon);
//! once it is Ready its operator is stopped, so nothing else writes while
//! the stops are timed. For each kind, `--aborts` times: the fault is
//! injected on one gateway as a run's experiment (built by the operator's
//! own code), and once Chaos Mesh reports it injected and the pod shows it,
//! it is ended by `drill::stop::stop` (the guard's abort, the kill switch,
//! the end of a run), then injected again and ended by a plain delete, as
//! `kubectl delete` sends it. The effect is looked at every 5 ms from the
//! host: the gateway's liveness answer (pod-failure), a connect from its
//! network namespace to the inventory (partition), its cgroup's processes
//! (stress), its qdiscs (delay); a clock's injection is seen in a stale
//! `Date` header, its end is not timed (see `Fault::end_is_seen`).
//!
//! ```text
//! eval "$(e2e/local/stack env)"
//! cargo build --release -p flashsale-operator --bin flashsale-operator --example bench_fault_stop
//! cargo run --release -p flashsale-operator --example bench_fault_stop -- --aborts 20
//! ```
//!
//! Runs as root on the node's host (it enters the pod's namespaces). The
//! namespace is deleted at the end, and the operator process is killed on
//! every way out.

mod faults;
mod measure;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;
use flashsale_bench::{Recorder, release_binary};
use flashsale_e2e::{
    inside,
    kube::TestNamespace,
    operator::{FAST_LEASE, Launcher, setup},
    real_node::{await_ready, create_sale, operator_flags, pod_ip, ready_pods},
};
use jiff::SignedDuration;
use kube::ResourceExt;

use faults::Fault;

#[derive(Debug, Parser)]
#[command(
    about = "Time the stop path per fault kind on the real node: decision → objects gone → effect gone in the pod, against a plain delete"
)]
struct Args {
    /// Stops per kind, each paired with a plain delete.
    #[arg(long, default_value_t = 20)]
    aborts: usize,
    /// The kinds, in order (delay is skipped on a kernel without netem).
    /// pod-failure and container-kill are left out by default: each
    /// restart of the same container after the first waits out the
    /// kubelet's back-off (10 s, doubling up to 5 min), which then is the
    /// whole of the effect's end; container-kill's stop has nothing to undo.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "delay,partition,stress,time"
    )]
    kinds: Vec<Fault>,
    /// Longest wait for any one step.
    #[arg(long, default_value_t = 120)]
    deadline_seconds: u64,
    /// The operator binary; by default `flashsale-operator` next to this example.
    #[arg(long)]
    operator_bin: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.aborts > 0, "--aborts 0: nothing to measure");
    let launcher = Launcher::new(release_binary(
        "flashsale-operator",
        args.operator_bin.as_deref(),
    )?)
    .with(&FAST_LEASE)
    .with(&["--log-filter", "info"]);
    // Everything the run holds lives inside the future, so an interrupt
    // drops it and its cleanup runs.
    let measured = tokio::select! {
        measured = run(&args, &launcher) => measured,
        signal = tokio::signal::ctrl_c() => {
            signal?;
            Err(anyhow::anyhow!("interrupted"))
        }
    }?;
    print(&measured, args.aborts);
    Ok(())
}

async fn run(args: &Args, launcher: &Launcher) -> anyhow::Result<Vec<(Fault, measure::Measured)>> {
    let bound = Duration::from_secs(args.deadline_seconds);
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "bench-faults").await?;
    let flags = operator_flags()?;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut operator = launcher.start(&ns.name, "bench-faults", &flags, &[])?;
    eprintln!("namespace {}: a sale on the real node", ns.name);
    let sale = create_sale(&client, &ns.name, SignedDuration::from_hours(1)).await?;
    await_ready(&client, &ns.name, &sale.name).await?;
    operator.kill();
    let gateways = ready_pods(&client, &ns.name, &sale.name, "gateway").await?;
    let inventory = ready_pods(&client, &ns.name, &sale.name, "inventory").await?;
    let (Some(gateway), Some(inventory)) = (gateways.first(), inventory.first()) else {
        anyhow::bail!("the sale has no ready gateway or inventory");
    };
    let inventory: SocketAddr = format!("{}:8080", pod_ip(inventory)?).parse()?;
    let pod = gateway.name_any();
    let bench = measure::Bench {
        client: &client,
        namespace: &ns.name,
        sale: &sale.name,
        pod: &pod,
        inventory,
        bound,
        // A fresh connection per look: a kept one would hide a process
        // that was replaced.
        http: reqwest::Client::builder()
            .timeout(Duration::from_millis(200))
            .pool_max_idle_per_host(0)
            .build()?,
    };
    let netem = inside::kernel_has_netem()?;
    let mut measured = Vec::new();
    for &fault in &args.kinds {
        if fault == Fault::Delay && !netem {
            eprintln!("delay: skipped, this kernel has no netem (Chaos Mesh cannot inject it)");
            continue;
        }
        eprintln!("{}: {} aborts on {pod}", fault.label(), args.aborts);
        measured.push((fault, bench.measure(fault, args.aborts).await?));
    }
    eprintln!("deleting namespace {}", ns.name);
    Ok(measured)
}

/// p50 / p99 of `values` (ms), or a dash when there are none.
fn p50_p99(values: &[f64]) -> String {
    let recorded = Recorder::of_ms(values.iter().copied());
    if recorded.is_empty() {
        return "–".to_owned();
    }
    format!(
        "{:.1} / {:.1}",
        recorded.quantile_ms(0.5),
        recorded.quantile_ms(0.99)
    )
}

/// The ratio of the medians of `a` and `b`.
fn ratio(a: &[f64], b: &[f64]) -> String {
    let p50 = |v: &[f64]| Recorder::of_ms(v.iter().copied()).quantile_ms(0.5);
    if a.is_empty() || b.is_empty() {
        return "–".to_owned();
    }
    format!("{:.2}", p50(a) / p50(b))
}

fn print(measured: &[(Fault, measure::Measured)], aborts: usize) {
    println!("\n== stop path per kind on the real node (ms, p50 / p99; {aborts} of each per kind)");
    println!(
        "| kind | stop: decision → recovered | stop: decision → gone | stop: decision → effect gone | effect gone ≤ 500 ms | plain delete → gone | plain delete → effect gone | stop / delete, gone | stop / delete, effect gone |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (fault, m) in measured {
        let pick = |endings: &[measure::Ending], f: fn(&measure::Ending) -> Option<f64>| {
            endings.iter().filter_map(f).collect::<Vec<f64>>()
        };
        let recovered = pick(&m.stopped, |e| e.recovered);
        let (gone, deleted) = (
            pick(&m.stopped, |e| Some(e.gone)),
            pick(&m.deleted, |e| Some(e.gone)),
        );
        let (effect, deleted_effect) = (
            pick(&m.stopped, |e| e.effect),
            pick(&m.deleted, |e| e.effect),
        );
        let within = if effect.is_empty() {
            "n/a".to_owned()
        } else {
            let fast = effect.iter().filter(|&&e| e <= 500.0).count();
            format!("{fast} of {}", effect.len())
        };
        println!(
            "| {} | {} | {} | {} | {within} | {} | {} | {} | {} |",
            fault.label(),
            p50_p99(&recovered),
            p50_p99(&gone),
            p50_p99(&effect),
            p50_p99(&deleted),
            p50_p99(&deleted_effect),
            ratio(&gone, &deleted),
            ratio(&effect, &deleted_effect),
        );
    }
}
