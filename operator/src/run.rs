//! `flashsale-operator run`: the operator process. It checks the CRDs are
//! installed, takes part in leader election, runs the controllers while it
//! leads, and serves `/metrics`, `/healthz` and `/readyz` throughout.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Args;
use flashsale_runtime::{Process, Readiness, RuntimeArgs, Shutdown};
use kube::{Api, Client, CustomResourceExt};
use tokio::task::JoinHandle;

use flashsale_api::{ChaosDrill, DegradationPolicy, FlashSale};
use flashsale_controller_sale::{allowlist::ImageAllowlist, build::Images};
use flashsale_kit::{
    Context, Shared, apply::Namespaced, clock::SystemClock, health::WatchHealth, leader,
    leader::Leadership, leader::LeaseSettings, metrics::OperatorMetrics,
};
use flashsale_observe::probe::Probe;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Flags of `flashsale-operator run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Watch FlashSales (and manage their children) in this namespace only;
    /// all namespaces when not given.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Default image of the gateway (a sale's `gateway.image` overrides it).
    #[arg(long, env = "GATEWAY_IMAGE", default_value = concat!("ghcr.io/flashsale-dev/gateway:", env!("CARGO_PKG_VERSION")))]
    pub gateway_image: String,
    /// Default image of the inventory.
    #[arg(long, env = "INVENTORY_IMAGE", default_value = concat!("ghcr.io/flashsale-dev/inventory:", env!("CARGO_PKG_VERSION")))]
    pub inventory_image: String,
    /// Default image of the order-writer.
    #[arg(long, env = "ORDER_WRITER_IMAGE", default_value = concat!("ghcr.io/flashsale-dev/order-writer:", env!("CARGO_PKG_VERSION")))]
    pub order_writer_image: String,
    /// An image a FlashSale may run besides the defaults above: a prefix
    /// ending in `/` (`registry.example.com/team/`) or a full reference
    /// (`repo:tag`, `repo@sha256:…`). Repeatable. A sale naming any other
    /// image is refused (condition and Warning Event `ImageNotAllowed`) and
    /// nothing of it is applied; without this flag only the defaults run.
    #[arg(
        long = "allowed-image",
        env = "FLASHSALE_ALLOWED_IMAGES",
        value_delimiter = ','
    )]
    pub allowed_images: Vec<String>,
    /// Base URL of a sale's inventory API, with `{sale}` and `{namespace}`
    /// filled in; the operator reads stock per SKU from it.
    #[arg(
        long,
        env = "INVENTORY_URL_TEMPLATE",
        default_value = "http://{sale}-inventory.{namespace}.svc:8080"
    )]
    pub inventory_url_template: String,
    /// Bound of each call to a workload (stock, consumer lag).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub probe_timeout: Duration,
    /// How often a running sale's replicas and stock are refreshed in its
    /// status when nothing else changes.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub status_refresh: Duration,
    /// Prometheus base URL for DegradationPolicies that name none in
    /// `spec.signal.prometheusURL`.
    #[arg(long, env = "PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// How long a change of a sale's degradation switches may take to reach
    /// every ready gateway before the policy's `Propagated` condition names
    /// the gateways that lag.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub propagation_timeout: Duration,
    /// Base URL at which chaos-controller-manager reaches this replica's ops
    /// server: each ChaosDrill run's StatusCheck probes
    /// `<url>/guard/<namespace>/<drill>/<run>` and ends the run's chaos when it
    /// stops answering 200. Default: `http://$POD_IP:<ops port>` in a pod,
    /// else the ops address.
    #[arg(long, env = "GUARD_URL")]
    pub guard_url: Option<String>,
    /// Stop every ChaosDrill run and remove every experiment the operator
    /// created, in every watched namespace, and start none while set. One
    /// namespace: annotate it `flashsale.dev/chaos-kill-switch=true`.
    #[arg(long, env = "CHAOS_KILL_SWITCH", default_value_t = false, action = clap::ArgAction::Set)]
    pub chaos_kill_switch: bool,
    /// Reconciles run at once per controller. Each sale's reconcile sends a
    /// dozen requests, so this bounds the load on the apiserver when many
    /// sales change together.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,
    /// Elect a leader through a Lease so that only one replica writes. Turn
    /// off only when exactly one replica runs.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// The operator's own namespace: each sale's NetworkPolicies let pods
    /// of this namespace reach its inventory API (stock) and its
    /// order-writer's metrics (the drain).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub operator_namespace: String,
    /// Namespace of the Lease (the operator's own namespace in a cluster).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the Lease.
    #[arg(long, default_value = "flashsale-operator")]
    pub lease_name: String,
    /// This replica's name in the Lease and in Events (the pod name in a
    /// cluster; the host name when not given), followed by a random suffix
    /// per process.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long a lease lasts without renewal: the longest a standby waits
    /// after the leader dies.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// The leader steps down if it could not renew for this long (shorter
    /// than the lease, so two leaders never overlap).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease_renew_deadline: Duration,
    /// How often the lease is renewed or tried.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub lease_retry_period: Duration,
    /// Logging and ops-server flags.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    text.parse::<flashsale_api::Duration>()
        .map(|d| d.0)
        .map_err(|err| err.to_string())
}

/// Runs the operator until SIGTERM/SIGINT.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut process = Process::start("flashsale-operator", VERSION, &args.runtime.log)?;
    let metrics = OperatorMetrics::register(process.registry_mut());
    let client = Client::try_default().await.context(
        "cannot build a Kubernetes client from the kubeconfig or the in-cluster service account",
    )?;
    check_crds(&client, args.namespace.as_deref()).await?;
    let watches = WatchHealth::new(metrics.clone());

    let identity = replica_identity(&args);
    let shutdown = process.shutdown();
    let (leadership, election) = elect(&client, &args, &identity, &shutdown)?;

    let shared = Shared {
        client: client.clone(),
        metrics,
        clock: Arc::new(SystemClock),
        leadership: leadership.clone(),
        instance: identity.clone(),
        concurrency: args.max_concurrent_reconciles,
    };
    let guards = flashsale_controller_drill::guard::Guards::default();
    let guard_routes = guards.router();
    let controllers = Controllers::new(&args, &shared, guards)?;
    let readiness = readiness(client, &watches);
    tracing::info!(
        identity,
        namespace = args.namespace.as_deref().unwrap_or("(all)"),
        leader_election = args.leader_elect,
        "operator starting"
    );
    let controllers = lead(
        controllers,
        shared.metrics.clone(),
        watches,
        args.namespace.clone(),
        leadership,
        shutdown,
    );
    let (ops, ()) = tokio::join!(
        process.serve_ops_with(&args.runtime.ops, readiness, guard_routes),
        controllers
    );
    if let Some(election) = election {
        release_lease(election).await;
    }
    ops?;
    Ok(())
}

/// This replica's name in the Lease and in Events: the flag, else the host
/// name, followed by a random suffix. A suffix per process: a restarted pod
/// keeps its name, and must not take its predecessor's lease for its own.
fn replica_identity(args: &RunArgs) -> String {
    let name = args.identity.clone().unwrap_or_else(|| {
        std::env::var("HOSTNAME").unwrap_or_else(|_| "flashsale-operator".into())
    });
    format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// The task running the leader election, which ends once it has given the
/// lease back.
type Election = JoinHandle<Result<(), leader::LeaderError>>;

/// Starts the leader election when it is on (it stops at `shutdown`);
/// without it this replica always leads.
fn elect(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    shutdown: &Shutdown,
) -> anyhow::Result<(Leadership, Option<Election>)> {
    if !args.leader_elect {
        return Ok((Leadership::always(), None));
    }
    let mut settings = LeaseSettings::new(&args.lease_namespace, &args.lease_name, identity);
    settings.lease_duration = args.lease_duration;
    settings.renew_deadline = args.lease_renew_deadline;
    settings.retry_period = args.lease_retry_period;
    settings.check()?;
    let stop = shutdown.clone();
    let (leadership, election) =
        leader::spawn(client.clone(), settings, async move { stop.wait().await });
    Ok((leadership, Some(election)))
}

/// Waits a little for the election to give the lease back, so a standby
/// takes over now rather than when the lease runs out.
async fn release_lease(election: Election) {
    match tokio::time::timeout(Duration::from_secs(5), election).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(err))) => tracing::warn!(%err, "leader election ended with an error"),
        Ok(Err(err)) => tracing::warn!(%err, "leader election task failed"),
        Err(_) => tracing::warn!("the lease was not released within 5 s"),
    }
}

/// The `/readyz` checks: the apiserver answers, and one check per
/// controller, failing while its watches fail (see `flashsale_kit::health`
/// for when it counts as recovered).
fn readiness(client: Client, watches: &WatchHealth) -> Readiness {
    let mut readiness = Readiness::default().with_check("apiserver", move || {
        let client = client.clone();
        async move {
            client
                .apiserver_version()
                .await
                .map(|_| ())
                .map_err(|err| format!("apiserver unreachable: {err}"))
        }
    });
    for controller in CONTROLLERS {
        let watches = watches.clone();
        readiness = readiness.with_check(format!("watch/{controller}"), move || {
            std::future::ready(watches.check(controller))
        });
    }
    readiness
}

/// Where Chaos Mesh reaches this replica's `/guard`: the flag, else the
/// pod's IP, else the ops address itself (a loopback or host address when
/// the operator runs outside the cluster).
fn guard_base_url(args: &RunArgs) -> String {
    if let Some(url) = &args.guard_url {
        return url.clone();
    }
    let ops = args.runtime.ops.ops_addr;
    let host = match std::env::var("POD_IP") {
        Ok(ip) if !ip.is_empty() => ip,
        _ if ops.ip().is_unspecified() => "127.0.0.1".to_owned(),
        _ => ops.ip().to_string(),
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    format!("http://{host}:{}", ops.port())
}

/// Fails with how to install the CRDs when one is missing, instead of
/// starting controllers that would only log watch errors. Lists in
/// `namespace` only when the operator is limited to it: a namespaced Role
/// grants nothing cluster-wide. A list the operator may not make proves
/// nothing either way (the apiserver refuses before it looks for the
/// resource): that is a warning, and the controller's watch then reports
/// the refusal (log, `flashsale_operator_watch_errors_total`, `/readyz`).
async fn check_crds(client: &Client, namespace: Option<&str>) -> anyhow::Result<()> {
    check_crd::<FlashSale>(client, namespace).await?;
    check_crd::<DegradationPolicy>(client, namespace).await?;
    check_crd::<ChaosDrill>(client, namespace).await
}

async fn check_crd<K>(client: &Client, namespace: Option<&str>) -> anyhow::Result<()>
where
    K: CustomResourceExt + Namespaced,
{
    let objects: Api<K> = flashsale_kit::api(client, namespace);
    match objects
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => anyhow::bail!(
            "the CRD {} is not installed; install the CRDs with \
             `flashsale-operator crd | kubectl apply --server-side -f -` \
             (or the Helm chart), then start the operator again",
            K::crd_name()
        ),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            tracing::warn!(
                crd = K::crd_name(),
                namespace = namespace.unwrap_or("(all)"),
                reason = status.message,
                "may not list these objects, so cannot check that their CRD is installed; \
                 their controller will report the refused watch"
            );
            Ok(())
        }
        Err(err) => {
            Err(err).with_context(|| format!("cannot list {} to check the CRDs", K::crd_name()))
        }
    }
}

/// Every controller of the operator, each with its own context.
struct Controllers {
    flashsale: Arc<flashsale_controller_sale::Ctx>,
    degradation: Arc<flashsale_controller_degradation::Ctx>,
    drill: Arc<flashsale_controller_drill::Ctx>,
}

/// The controllers by name, as their metrics, logs and `/readyz` checks
/// name them.
const CONTROLLERS: [&str; 3] = [
    flashsale_controller_sale::reconcile::IDENTITY.name,
    flashsale_controller_degradation::reconcile::IDENTITY.name,
    flashsale_controller_drill::reconcile::IDENTITY.name,
];

impl Controllers {
    /// Builds each controller's context from the flags: the drill
    /// controller's with `guards`, the sale controller's with the default
    /// images and the allowlist.
    fn new(
        args: &RunArgs,
        shared: &Shared,
        guards: flashsale_controller_drill::guard::Guards,
    ) -> anyhow::Result<Self> {
        let images = Images {
            gateway: args.gateway_image.clone(),
            inventory: args.inventory_image.clone(),
            order_writer: args.order_writer_image.clone(),
        };
        let probe = Probe::new(args.inventory_url_template.clone(), args.probe_timeout)?;
        Ok(Self {
            drill: Arc::new(Context::new(
                shared,
                flashsale_controller_drill::reconcile::IDENTITY,
                flashsale_controller_drill::Settings::new(
                    args.prometheus_url.clone(),
                    flashsale_observe::signal::SignalReader::new()?,
                    guard_base_url(args),
                    args.chaos_kill_switch,
                    guards,
                ),
            )),
            degradation: Arc::new(Context::new(
                shared,
                flashsale_controller_degradation::reconcile::IDENTITY,
                flashsale_controller_degradation::Settings {
                    prometheus_url: args.prometheus_url.clone(),
                    signal: flashsale_observe::signal::SignalReader::new()?,
                    probe: probe.clone(),
                    propagation_bound: args.propagation_timeout,
                    pace: flashsale_controller_degradation::pace::Pace::default(),
                },
            )),
            flashsale: Arc::new(Context::new(
                shared,
                flashsale_controller_sale::reconcile::IDENTITY,
                flashsale_controller_sale::Settings {
                    allowed_images: ImageAllowlist::new(args.allowed_images.clone(), &images),
                    operator_namespace: args.operator_namespace.clone(),
                    images,
                    refresh: args.status_refresh,
                    probe,
                    workloads: Default::default(),
                    stock_pace: Default::default(),
                },
            )),
        })
    }

    /// Runs them all until `stop` resolves, each reporting its watches'
    /// errors into `watches`.
    async fn run(&self, namespace: Option<&str>, watches: &WatchHealth, stop: Shutdown) {
        let until = |stop: Shutdown| async move { stop.wait().await };
        tokio::join!(
            watches.scope(flashsale_controller_sale::run(
                self.flashsale.clone(),
                namespace,
                until(stop.clone())
            )),
            watches.scope(flashsale_controller_degradation::run(
                self.degradation.clone(),
                namespace,
                until(stop.clone())
            )),
            watches.scope(flashsale_controller_drill::run(
                self.drill.clone(),
                namespace,
                until(stop)
            )),
        );
    }
}

/// Runs the controllers while this replica leads. Losing the lease drops
/// them at once: in-flight reconciles are cancelled mid-request, and every
/// write checks the leadership first, so nothing is written after the loss.
async fn lead(
    controllers: Controllers,
    metrics: OperatorMetrics,
    watches: WatchHealth,
    namespace: Option<String>,
    mut leadership: Leadership,
    shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            () = leadership.acquired() => {}
            () = shutdown.wait() => return,
        }
        metrics.set_leader(true);
        tracing::info!("leading: controllers start");
        let running = controllers.run(namespace.as_deref(), &watches, shutdown.clone());
        let mut lost = leadership.clone();
        tokio::select! {
            () = running => {}
            () = lost.lost() => tracing::warn!("leadership lost: controllers stopped"),
        }
        metrics.set_leader(false);
        // Stopped controllers have no failing watch: a standby is ready.
        for controller in CONTROLLERS {
            watches.forget(controller);
        }
        if shutdown.is_triggered() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn allowed_images_repeat_and_split_on_commas() -> anyhow::Result<()> {
        let cli = Cli::try_parse_from([
            "flashsale-operator",
            "--allowed-image",
            "registry.example.com/team/",
            "--allowed-image",
            "mirror.example.com/gateway:1.4,mirror.example.com/tools/",
        ])?;
        assert_eq!(
            cli.run.allowed_images,
            [
                "registry.example.com/team/",
                "mirror.example.com/gateway:1.4",
                "mirror.example.com/tools/"
            ]
        );
        Ok(())
    }
}
