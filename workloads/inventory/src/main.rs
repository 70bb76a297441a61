//! The flash-sale inventory service: atomic stock reservations in Redis that never oversell.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::{Process, Readiness, RuntimeArgs, Shutdown};
use inventory::{
    api::{self, AppState},
    auth::Tokens,
    coalesce::CoalesceSettings,
    keys::{SaleKeys, Workload},
    metrics::Metrics,
    outbox, standby,
    store::{Durability, SaleDefinition, Store},
    sweeper,
};
use sha2::{Digest, Sha256};

/// The flash-sale inventory service: atomic stock reservations in Redis that never oversell.
#[derive(Debug, Parser)]
#[command(name = "inventory", version, subcommand_negates_reqs = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address of the reservation API.
    #[arg(long, env = "INVENTORY_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Redis holding the stock: one server (`redis://host:port`) or a
    /// cluster (a comma-separated list of nodes, or `redis+cluster://host:port`).
    #[arg(long, env = "REDIS_URL", required = true)]
    redis_url: Option<String>,
    /// When a reservation or payment is acknowledged: `fast` once Redis's
    /// primary applied it; `replicated` once --durability-replicas replicas
    /// have it (WAIT), so a failover cannot lose it; `auto` replicated if
    /// every primary has that many replicas when the inventory starts, else
    /// fast.
    #[arg(long, env = "INVENTORY_DURABILITY", value_enum, default_value = "fast")]
    durability: DurabilityArg,
    /// Replicas that must confirm a write under `--durability replicated`.
    #[arg(long, env = "INVENTORY_DURABILITY_REPLICAS", default_value_t = 1)]
    durability_replicas: u32,
    /// How long to wait for them before answering "retry"; at most 1000,
    /// well within the 2 s a Redis answer may take.
    #[arg(long, env = "INVENTORY_DURABILITY_TIMEOUT_MS", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    durability_timeout_ms: u64,
    /// Most one-shard reservations of a SKU decided in one script call.
    #[arg(long, env = "INVENTORY_COALESCE_MAX_BATCH", default_value_t = 128,
          value_parser = clap::value_parser!(u16).range(1..))]
    coalesce_max_batch: u16,
    /// How long a reservation that finds no call in flight waits for others
    /// to share its call, in microseconds (at most 100,000). 0: it goes at
    /// once, and requests gather only while a call is in flight.
    #[arg(long, env = "INVENTORY_COALESCE_WINDOW_US", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    coalesce_window_us: u64,
    /// A sale definition (JSON) to load at start; loading never resets counts.
    #[arg(long, env = "INVENTORY_SALE_FILE")]
    sale_file: Option<PathBuf>,
    /// How often unpaid reservations are looked for.
    #[arg(long, env = "INVENTORY_SWEEP_INTERVAL_MS", default_value_t = 250)]
    sweep_interval_ms: u64,
    /// How long a replica answers "sold out" from memory before asking Redis again.
    #[arg(long, env = "INVENTORY_SOLD_OUT_STALENESS_MS", default_value_t = 200)]
    sold_out_staleness_ms: u64,
    /// File holding the token callers (gateway, operator) must send as
    /// `Authorization: Bearer`; without it and --admin-token-file the API is open.
    #[arg(long, env = "INVENTORY_API_TOKEN_FILE")]
    api_token_file: Option<PathBuf>,
    /// File holding the token that loading a sale and stock adjustments need.
    #[arg(long, env = "INVENTORY_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// Kafka bootstrap servers for the `expired` order events of lapsed or
    /// cancelled reservations; without them no such event is published.
    #[arg(long, env = "KAFKA_BROKERS")]
    kafka_brokers: Option<String>,
    /// Topic of order events.
    #[arg(long, env = "ORDERS_TOPIC", default_value = "flashsale.orders")]
    orders_topic: String,
    /// How often the outbox of order events (created, expired) is looked
    /// at when it was empty; a backlog is published back to back.
    #[arg(long, env = "INVENTORY_OUTBOX_INTERVAL_MS", default_value_t = 10)]
    outbox_interval_ms: u64,
    /// How often the inventory checks whether Redis takes writes: a
    /// read-only replica (a standby region's) makes it stand by, refusing
    /// sales with `standby` until the replica is promoted.
    #[arg(long, env = "INVENTORY_STANDBY_CHECK_MS", default_value_t = 500)]
    standby_check_ms: u64,
    /// This replica's name in the outbox's consumer group (the pod name).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// `--durability` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DurabilityArg {
    /// Acknowledged once the primary applied it.
    Fast,
    /// Acknowledged once replicas confirmed it.
    Replicated,
    /// Replicated where Redis has the replicas, else fast.
    Auto,
}

/// Tools besides serving.
#[derive(Debug, Subcommand)]
enum Command {
    /// Prints the `ACL SETUSER` commands (for redis-cli) of a Redis user per
    /// workload that can touch only its own keys of one sale: the gateway
    /// its rate-limit and waiting-room keys, the inventory the stock keys.
    /// Passwords are given as SHA-256 hashes, so the output holds no secret.
    RedisAcl {
        /// The sale id (the `sale` of the inventory's sale definition).
        #[arg(long)]
        sale: String,
        /// Redis user name of the gateway.
        #[arg(long, default_value = "flashsale-gateway")]
        gateway_user: String,
        /// File holding the gateway user's password.
        #[arg(long)]
        gateway_password_file: PathBuf,
        /// Redis user name of the inventory.
        #[arg(long, default_value = "flashsale-inventory")]
        inventory_user: String,
        /// File holding the inventory user's password.
        #[arg(long)]
        inventory_password_file: PathBuf,
    },
}

/// One `ACL SETUSER` line for `user` over `workload`'s keys of `sale`.
fn acl_command(sale: &str, workload: Workload, user: &str, password: &str) -> String {
    let hash: String = Sha256::digest(password.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let rules = SaleKeys::new(sale).acl_rules(workload).join(" ");
    format!("ACL SETUSER {user} reset on #{hash} {rules}")
}

fn read_password(path: &PathBuf) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let password = text.trim();
    anyhow::ensure!(
        password.len() >= 16,
        "{}: a password must be at least 16 characters",
        path.display()
    );
    Ok(password.to_owned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(command) = &args.command {
        return run_command(command);
    }
    let mut process = Process::start("inventory", env!("CARGO_PKG_VERSION"), &args.runtime.log)?;
    let metrics = Metrics::register(process.registry_mut());
    let tokens = Tokens::from_files(
        args.api_token_file.as_deref(),
        args.admin_token_file.as_deref(),
    )
    .context("reading the API tokens")?;
    if !tokens.enforced() {
        tracing::warn!(
            "no API token configured: any caller may reserve, confirm, cancel, load and adjust stock"
        );
    }
    let (store, pending) = open_store(&args, &metrics).await?;
    let state = AppState::new(
        store.clone(),
        metrics.clone(),
        Duration::from_millis(args.sold_out_staleness_ms),
    )
    .with_tokens(tokens);
    let shutdown = process.shutdown();
    tokio::spawn(sweeper::run(
        store.clone(),
        state.clone(),
        metrics.clone(),
        Duration::from_millis(args.sweep_interval_ms.max(10)),
        shutdown.clone(),
    ));
    start_outbox(&args, &store, &metrics, &shutdown)?;
    tokio::spawn(standby::follow(
        store.clone(),
        pending,
        metrics.clone(),
        Duration::from_millis(args.standby_check_ms.max(10)),
        shutdown.clone(),
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(addr = %args.listen, "reservation API listening");
    let api = axum::serve(listener, api::router(state))
        .with_graceful_shutdown(async move { shutdown.wait().await });
    let (api, ops) = tokio::join!(api, process.serve_ops(&args.runtime.ops, readiness(store)));
    api.context("reservation API failed")?;
    ops?;
    Ok(())
}

/// Runs a tool instead of serving.
fn run_command(command: &Command) -> anyhow::Result<()> {
    let Command::RedisAcl {
        sale,
        gateway_user,
        gateway_password_file,
        inventory_user,
        inventory_password_file,
    } = command;
    let gateway = read_password(gateway_password_file)?;
    let inventory = read_password(inventory_password_file)?;
    println!(
        "{}",
        acl_command(sale, Workload::Gateway, gateway_user, &gateway)
    );
    println!(
        "{}",
        acl_command(sale, Workload::Inventory, inventory_user, &inventory)
    );
    Ok(())
}

/// The store on the arguments' Redis, with their durability policy and
/// coalescing, after the eviction check; the sale file, if any, is loaded,
/// unless Redis is a read-only replica: then the store stands by, and the
/// sale is returned to load on the promotion.
async fn open_store(
    args: &Args,
    metrics: &Metrics,
) -> anyhow::Result<(Store, Option<SaleDefinition>)> {
    let redis_url = args.redis_url.as_deref().unwrap_or_default();
    let store = Store::connect(redis_url)
        .await
        .context("connecting to Redis")?;
    let durability = durability(args, &store).await?;
    tracing::info!(replicas = durability.replicas(), "durability policy");
    metrics.durability(durability.replicas());
    let store = store
        .with_durability(durability)
        .with_coalescing(CoalesceSettings {
            max_batch: usize::from(args.coalesce_max_batch),
            window: Duration::from_micros(args.coalesce_window_us),
        });
    if !store
        .check_no_eviction()
        .await
        .context("checking Redis's eviction policy")?
    {
        tracing::warn!(
            "cannot read Redis's maxmemory-policy with this user; it must be noeviction, or Redis may evict stock"
        );
    }
    if !store
        .writable()
        .await
        .context("checking whether Redis takes writes")?
    {
        standby::stand_by(&store, metrics);
    }
    let Some(path) = &args.sale_file else {
        return Ok((store, None));
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let def: SaleDefinition =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if store.standing_by() {
        return Ok((store, Some(def)));
    }
    let loaded = store.load(&def).await.context("loading the sale")?;
    tracing::info!(sale = def.sale, ?loaded, "sale loaded");
    Ok((store, None))
}

/// The durability policy `--durability` asks for; `auto` looks at the
/// replicas `store`'s Redis has now.
async fn durability(args: &Args, store: &Store) -> anyhow::Result<Durability> {
    let (replicas, timeout) = (
        args.durability_replicas.max(1),
        Duration::from_millis(args.durability_timeout_ms),
    );
    Ok(match args.durability {
        DurabilityArg::Fast => Durability::Fast,
        DurabilityArg::Replicated => Durability::Replicated { replicas, timeout },
        DurabilityArg::Auto => {
            let fewest = store
                .fewest_replicas()
                .await
                .context("counting Redis's replicas for --durability auto")?;
            let picked = Durability::auto(fewest, replicas, timeout);
            if picked == Durability::Fast {
                tracing::warn!(
                    fewest_replicas = fewest,
                    wanted = replicas,
                    "durability auto: a Redis primary has too few replicas, so writes are acknowledged on the primary alone and a failover may lose the last ones"
                );
            }
            picked
        }
    })
}

/// Starts publishing the outbox of order events, when Kafka brokers are
/// configured.
fn start_outbox(
    args: &Args,
    store: &Store,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> anyhow::Result<()> {
    match &args.kafka_brokers {
        Some(brokers) => {
            let producer = OrderProducer::new(&ProducerSettings {
                topic: args.orders_topic.clone(),
                replacements: metrics.producer_replacements(),
                ..ProducerSettings::new(brokers.clone())
            })
            .context("building the order-event producer")?;
            let consumer = args
                .pod_name
                .clone()
                .unwrap_or_else(|| format!("inventory-{}", uuid::Uuid::new_v4().simple()));
            tokio::spawn(outbox::run(
                store.clone(),
                producer,
                metrics.clone(),
                consumer,
                Duration::from_millis(args.outbox_interval_ms.max(1)),
                shutdown.clone(),
            ));
        }
        None => tracing::warn!(
            "no Kafka brokers configured: order events stay in the outbox until an inventory with brokers publishes them"
        ),
    }
    Ok(())
}

/// The ops server's readiness: Redis answers, and no sale lost its stock.
fn readiness(store: Store) -> Readiness {
    let stock_store = store.clone();
    Readiness::default()
        .with_check("redis", move || {
            let store = store.clone();
            async move { store.ping().await.map_err(|e| e.to_string()) }
        })
        // A sale whose stock Redis lost is not served: say so where an SRE
        // and the operator look first.
        .with_check("stock", move || {
            let store = stock_store.clone();
            async move {
                match store.lost_sales().await.as_slice() {
                    [] => Ok(()),
                    lost => Err(format!(
                        "Redis lost the stock of sale(s) {}; refusing to sell them again",
                        lost.join(", ")
                    )),
                }
            }
        })
}
