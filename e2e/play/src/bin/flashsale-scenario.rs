//! `flashsale-scenario`: plays a whole flash sale on a cluster (load,
//! degradation, a chaos drill aborted by its SLO guard), checks it against
//! the systems of record and writes a report.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::Parser;

use flashsale_play::{
    buyers::Progress,
    scenario::{self, Options, Reach, plan::Plan},
};

/// Plays a whole flash sale on a cluster and proves it survived; with
/// `--library`, runs the drill library too.
///
/// Needs a kubeconfig (`KUBECONFIG` or `~/.kube/config`) for a cluster with
/// the operator watching the namespace, Chaos Mesh, and the Secret
/// `flashsale-stack/stores` naming its Redis, PostgreSQL, Kafka and
/// Prometheus; the local stack (`e2e/local/stack up`) has all of them.
/// Exits 0 when every check passed, 1 when one failed, 2 when the scenario
/// could not run.
#[derive(Debug, Parser)]
#[command(name = "flashsale-scenario", version)]
struct Cli {
    /// The namespace the operator watches; created when missing.
    #[arg(
        long,
        env = "FLASHSALE_PLAY_NAMESPACE",
        default_value = "flashsale-demo"
    )]
    namespace: String,
    /// The sale's name (a previous sale of that name is deleted first).
    #[arg(long, default_value = "play")]
    sale: String,
    /// The short scenario CI runs (60 buyers, 100 s of load) instead of the
    /// full one (300 buyers, 4 minutes).
    #[arg(long)]
    short: bool,
    /// Buyers at the peak (overrides the scenario's).
    #[arg(long)]
    users: Option<usize>,
    /// Length of the load from the first buyer to the end of the ramp down,
    /// e.g. `4m` (overrides the scenario's; the drill's tail comes on top).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Folder for the report, the result (JSON) and the buyers' ledger.
    #[arg(long, default_value = "flashsale-report")]
    out: PathBuf,
    /// Seeds the buyers' choices, for a reproducible run.
    #[arg(long, default_value_t = 1111)]
    seed: u64,
    /// How the scenario reaches the gateways, the stores and Prometheus: by
    /// their Services' cluster IPs (the host routes to them) or through the
    /// apiserver, as `kubectl port-forward` does, when only a kubeconfig
    /// reaches the cluster.
    #[arg(long, value_enum, default_value_t = Reach::ServiceIp)]
    reach: Reach,
    /// Also run every other drill of the library in `chaos/`, one after
    /// the other, on a sale of their own while buyers order (about a
    /// minute each): each must end as its comment says, and every order
    /// acknowledged meanwhile must be stored once.
    #[arg(long)]
    library: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    text.parse::<flashsale_api::Duration>()
        .map(|d| d.0)
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let base = if cli.short {
        Plan::short(&cli.sale)
    } else {
        Plan::full(&cli.sale)
    };
    let plan = Plan::scaled(
        &cli.sale,
        cli.users.unwrap_or(base.users),
        cli.duration.unwrap_or(base.load),
    );
    // The bar runs over the sale's opening, the load and about two minutes
    // for the drill, the end and the checks.
    let library = if cli.library {
        Duration::from_secs(600)
    } else {
        Duration::ZERO
    };
    let progress = Progress::new(plan.opens_in + plan.load + Duration::from_secs(120) + library);
    let options = Options {
        namespace: cli.namespace,
        plan,
        out_dir: cli.out,
        seed: cli.seed,
        reach: cli.reach,
        library: cli.library,
    };
    match scenario::play(options, progress).await {
        Ok(outcome) if outcome.passed() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(err) => {
            eprintln!("flashsale-scenario: the scenario could not run: {err:#}");
            ExitCode::from(2)
        }
    }
}
