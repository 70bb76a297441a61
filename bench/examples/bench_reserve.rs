//! Load generator: reservations per second and latency on one hot SKU, in
//! three ways measured in the same run at the same concurrency:
//!
//! - `raw-lua`: the reserve script called directly on Redis, one call (a
//!   batch of one) per request (the ceiling without coalescing);
//! - `service`: the inventory's HTTP API (in-process server, keep-alive
//!   client), which coalesces concurrent reservations of the SKU into one
//!   call of the same script (with `--shards N` > 1: the sharded path, claim,
//!   take from a shard, settle, without coalescing);
//! - `gateway-client`: the gateway's own inventory client against the same
//!   service, as an order takes it: concurrent reservations travel many in
//!   one request (reservation batches), which the service decides in one
//!   script call;
//! - `naive-sql`: `UPDATE stock SET available = available - 1 WHERE sku = $1
//!   AND available > 0` on PostgreSQL, committed durably (`synchronous_commit = on`).
//!
//! `--target cluster` puts the service's and the raw baseline's sales on the
//! stack's Redis Cluster (`FLASHSALE_REDIS_CLUSTER_URL`) instead of its single
//! Redis (`REDIS_URL`). `--durability-cost` (on the cluster) measures the
//! service under the fast and the replicated durability policy instead:
//! saturated throughput (closed loop) and the p99 at half load (open loop at
//! half of the fast policy's saturated rate of the same run).
//!
//! Needs the local stack (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p flashsale-bench --example bench_reserve -- --concurrency 64 --seconds 4 --runs 5`

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::{Parser, ValueEnum};
use flashsale_bench::{
    load::{Measured, closed_loop, open_loop},
    median,
    reserve_script::reserve_calls,
};
use flashsale_e2e::clusters::{RedisCluster, RedisRole};
use flashsale_inventory_api::paths;
use flashsale_runtime::redis::{RedisConnection, RedisTarget, RedisTimeouts};
use gateway::inventory_client::InventoryClient;
use inventory::{
    api::{self, AppState},
    keys::SaleKeys,
    metrics::Metrics,
    store::{Durability, ItemDefinition, SaleDefinition, Store},
};
use prometheus_client::registry::Registry;

const STOCK: u64 = 1_000_000_000;
const SKU: &str = "HOT";
/// How long a cluster that is failing over (other tests kill nodes) may take
/// to be whole again before a run starts.
const HEALTHY_WITHIN: Duration = Duration::from_secs(180);
/// The replicated policy measured by `--durability-cost`.
const REPLICATED: Durability = Durability::Replicated {
    replicas: 1,
    timeout: Duration::from_millis(100),
};

/// Where the sales live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    /// The stack's single Redis (`REDIS_URL`).
    Single,
    /// The stack's Redis Cluster (`FLASHSALE_REDIS_CLUSTER_URL`).
    Cluster,
}

/// Reservations of one hot SKU: the service against its baselines.
#[derive(Debug, Parser)]
struct Options {
    /// Concurrent workers of every closed-loop measurement.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Runs; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where the service's and the raw baseline's sales live.
    #[arg(long, value_enum, default_value_t = Target::Single)]
    target: Target,
    /// Shards of the service's SKU (more than 1: the sharded path).
    #[arg(long, default_value_t = 1)]
    shards: u32,
    /// Measure the service under the fast and the replicated durability
    /// policy (on the cluster) instead of against the baselines.
    #[arg(long)]
    durability_cost: bool,
}

/// Says when calls of a measurement failed: they are not in its figures.
fn noted(measured: Measured) -> Measured {
    if let Some(error) = &measured.first_error {
        eprintln!("  {} calls failed, the first: {error}", measured.errors);
    }
    measured
}

/// The median of `f` over the runs.
fn median_of(samples: &[Measured], f: impl Fn(&Measured) -> f64) -> f64 {
    median(samples.iter().map(f)).unwrap_or(f64::NAN)
}

/// The median of the same-run ratios `f(a) / f(b)`, and each run's ratio.
fn ratio(a: &[Measured], b: &[Measured], f: impl Fn(&Measured) -> f64) -> (f64, String) {
    let runs: Vec<f64> = a.iter().zip(b).map(|(x, y)| f(x) / f(y)).collect();
    let listed = runs
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    (median(runs).unwrap_or(f64::NAN), listed)
}

/// The inventory's API in this process on loopback, over `store`; returns
/// its base URL and the service's metrics registry.
async fn serve(store: Store) -> anyhow::Result<(String, Arc<Registry>)> {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let state = AppState::new(store, metrics, Duration::from_millis(200));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, api::router(state)).await });
    Ok((url, Arc::new(registry)))
}

/// One reservation through the service, under request id `id`.
async fn reserve_http(http: reqwest::Client, url: String, id: String) -> anyhow::Result<()> {
    let body =
        serde_json::json!({"sku": SKU, "user": format!("u{id}"), "quantity": 1, "requestId": id});
    let response = http.post(&url).json(&body).send().await?;
    let status = response.status();
    if status != reqwest::StatusCode::CREATED {
        let text = response.text().await.unwrap_or_default();
        anyhow::bail!("HTTP {status}: {text}");
    }
    Ok(())
}

/// A closed-loop op reserving through the service at `base` for `sale`;
/// `tag` keeps request ids of different measurements apart.
fn via_service(
    http: &reqwest::Client,
    base: &str,
    sale: &str,
    tag: String,
) -> impl Fn(u64) -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send + Sync + 'static
{
    let (http, url) = (http.clone(), format!("{base}{}", paths::reservations(sale)));
    move |n| {
        Box::pin(reserve_http(
            http.clone(),
            url.clone(),
            format!("{tag}-{n}"),
        ))
    }
}

/// A closed-loop op reserving through the gateway's inventory client.
fn via_gateway_client(
    client: &InventoryClient,
    tag: String,
) -> impl Fn(u64) -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send + Sync + 'static
{
    let client = client.clone();
    move |n| {
        let (client, id) = (client.clone(), format!("{tag}-{n}"));
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            client
                .reserve(SKU, &format!("u{id}"), 1, 0, &id, deadline)
                .await?;
            Ok(())
        })
    }
}

fn definition(sale: &str, shards: u32) -> SaleDefinition {
    SaleDefinition {
        sale: sale.to_owned(),
        opens_at_ms: None,
        reservation_ttl_ms: 3_600_000,
        items: vec![ItemDefinition {
            sku: SKU.into(),
            stock: STOCK,
            per_user_limit: 1_000_000,
            shards,
        }],
    }
}

/// The stack's Redis Cluster, when the sales live there.
struct Cluster {
    nodes: RedisCluster,
}

impl Cluster {
    /// The ports of the primaries that serve slots.
    async fn primaries(&self) -> BTreeSet<u16> {
        self.nodes
            .nodes()
            .await
            .into_iter()
            .filter(|n| n.role == RedisRole::Primary && n.slots > 0)
            .map(|n| n.port)
            .collect()
    }

    /// A sale name (from `prefix`) whose `shards` shards of the SKU land on
    /// every primary (or on `shards` of them, when there are more primaries).
    async fn spread_sale(&self, prefix: &str, shards: u32) -> anyhow::Result<String> {
        let wanted = self.primaries().await.len().min(shards as usize);
        for attempt in 0..200 {
            let sale = format!("{prefix}{attempt}");
            let keys = SaleKeys::new(&sale);
            let mut used = BTreeSet::new();
            for index in 0..shards {
                used.insert(
                    self.nodes
                        .primary_for_key(&keys.shard(SKU, shards, index).avail())
                        .await?,
                );
            }
            if used.len() >= wanted {
                return Ok(sale);
            }
        }
        anyhow::bail!("no sale name spreads {shards} shards over {wanted} primaries")
    }

    /// Waits until the cluster is whole (another test may have killed a
    /// node); says so when that took a while. Returns the primaries.
    async fn healthy(&self, run: usize) -> anyhow::Result<BTreeSet<u16>> {
        let t = Instant::now();
        self.nodes.until_healthy(HEALTHY_WITHIN).await?;
        if t.elapsed() > Duration::from_secs(1) {
            eprintln!(
                "run {run}: waited {:.1} s for the cluster to be healthy",
                t.elapsed().as_secs_f64()
            );
        }
        Ok(self.primaries().await)
    }

    /// Deletes every key matching `pattern` on every primary, one key per
    /// UNLINK (a cluster node refuses one UNLINK over several slots). A node
    /// busy enough to time out (a fork for its AOF rewrite after this much
    /// writing) is asked again.
    async fn unlink_matching(&self, pattern: &str) -> anyhow::Result<usize> {
        self.nodes.until_healthy(HEALTHY_WITHIN).await?;
        let mut removed = 0;
        for port in self.primaries().await {
            let mut attempt = 1;
            loop {
                match self.unlink_on(port, pattern).await {
                    Ok(n) => {
                        removed += n;
                        break;
                    }
                    Err(error) if attempt < 5 => {
                        eprintln!("removing keys on {port}: {error:#}; again");
                        tokio::time::sleep(Duration::from_secs(attempt)).await;
                        attempt += 1;
                    }
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(removed)
    }

    async fn unlink_on(&self, port: u16, pattern: &str) -> anyhow::Result<usize> {
        let mut conn = self.nodes.connect(port).await?;
        let mut keys = Vec::new();
        let mut cursor = 0_u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1_000)
                .query_async(&mut conn)
                .await?;
            keys.extend(batch);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        for chunk in keys.chunks(200) {
            let mut pipe = redis::pipe();
            for key in chunk {
                pipe.cmd("UNLINK").arg(key).ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
        }
        Ok(keys.len())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    anyhow::ensure!(opts.shards >= 1, "--shards must be at least 1");
    anyhow::ensure!(
        !opts.durability_cost || opts.target == Target::Cluster,
        "--durability-cost needs --target cluster: the replicated policy waits for replicas"
    );
    let (redis_url, cluster) = match opts.target {
        Target::Single => (
            std::env::var("REDIS_URL")
                .map_err(|_| anyhow::anyhow!("REDIS_URL unset: eval \"$(e2e/local/stack env)\""))?,
            None,
        ),
        Target::Cluster => {
            let nodes = RedisCluster::from_env()?;
            (nodes.urls().to_owned(), Some(Cluster { nodes }))
        }
    };
    // Every sale of this process starts with the prefix, so one pattern
    // finds all their keys (shard keys included) for the cleanup.
    let prefix = format!("bench-{}-", std::process::id());
    let measured = measure(&opts, &redis_url, cluster.as_ref(), &prefix).await;
    // Leave Redis as found, whether or not the measurement went through.
    let pattern = format!("fs:{{{prefix}*");
    let removed = match &cluster {
        Some(cluster) => cluster.unlink_matching(&pattern).await?,
        None => flashsale_e2e::redis_keys::unlink_matching(&redis_url, &pattern).await?,
    };
    eprintln!("removed {removed} benchmark keys");
    measured
}

async fn measure(
    opts: &Options,
    redis_url: &str,
    cluster: Option<&Cluster>,
    prefix: &str,
) -> anyhow::Result<()> {
    let sale = match cluster {
        Some(cluster) if opts.shards > 1 => cluster.spread_sale(prefix, opts.shards).await?,
        _ => format!("{prefix}svc"),
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.concurrency)
        .build()?;
    let store = Store::connect(redis_url).await?;
    store.load(&definition(&sale, opts.shards)).await?;
    if let Some(cluster) = cluster {
        let keys = SaleKeys::new(&sale);
        let mut homes = BTreeSet::new();
        for index in 0..opts.shards {
            homes.insert(
                cluster
                    .nodes
                    .primary_for_key(&keys.shard(SKU, opts.shards, index).avail())
                    .await?,
            );
        }
        eprintln!(
            "sale {sale}: sale slot on primary {}, {} shard(s) on primaries {homes:?}",
            cluster.nodes.primary_for_key(&keys.sku(SKU)).await?,
            opts.shards
        );
    }
    if opts.durability_cost {
        durability_cost(opts, redis_url, store, &http, cluster, &sale).await
    } else {
        against_baselines(opts, redis_url, store, &http, cluster, &sale, prefix).await
    }
}

/// The service against the raw script and the naive SQL, in every run.
async fn against_baselines(
    opts: &Options,
    redis_url: &str,
    store: Store,
    http: &reqwest::Client,
    cluster: Option<&Cluster>,
    sale: &str,
    prefix: &str,
) -> anyhow::Result<()> {
    // The raw baseline gets a sale of its own, so the two never share keys.
    let raw_sale = format!("{prefix}raw");
    store.load(&definition(&raw_sale, 1)).await?;
    let (base, registry) = serve(store).await?;
    let client = InventoryClient::new(&base, sale, None)?;

    // The raw baseline: the same script, straight to Redis, one request per
    // call, over the connection type the service uses (one server or a
    // cluster: the script's keys are all in the sale slot).
    let target: RedisTarget = redis_url.parse()?;
    let raw_conn = RedisConnection::connect(&target, RedisTimeouts::default()).await?;

    // The naive baseline.
    let pool = naive_sql_stock(opts.concurrency).await?;

    // Warm-up, not measured: connections, the script cache, the pools.
    closed_loop(
        opts.concurrency,
        Duration::from_secs(1),
        reserve_calls(&raw_conn, &raw_sale, SKU, "rw".into()),
    )
    .await?;
    closed_loop(
        opts.concurrency,
        Duration::from_secs(1),
        via_service(http, &base, sale, "sw".into()),
    )
    .await?;
    closed_loop(
        opts.concurrency,
        Duration::from_secs(1),
        via_gateway_client(&client, "gw".into()),
    )
    .await?;

    let duration = Duration::from_secs(opts.seconds);
    let mut rows: Vec<(&str, Vec<Measured>)> = vec![
        ("raw-lua", vec![]),
        ("service", vec![]),
        ("gateway-client", vec![]),
        ("naive-sql", vec![]),
    ];
    for run in 1..=opts.runs {
        let watch = RunWatch::begin(redis_url, cluster, run).await?;
        let raw = noted(
            closed_loop(
                opts.concurrency,
                duration,
                reserve_calls(&raw_conn, &raw_sale, SKU, format!("r{run}")),
            )
            .await?,
        );
        let service = noted(
            closed_loop(
                opts.concurrency,
                duration,
                via_service(http, &base, sale, format!("s{run}")),
            )
            .await?,
        );
        let gateway_client = noted(
            closed_loop(
                opts.concurrency,
                duration,
                via_gateway_client(&client, format!("g{run}")),
            )
            .await?,
        );
        let sql = noted(naive_sql(opts.concurrency, duration, &pool).await?);
        eprintln!(
            "run {run}/{}: raw {:.0}/s, service {:.0}/s, gateway client {:.0}/s, sql {:.0}/s",
            opts.runs,
            raw.per_second(),
            service.per_second(),
            gateway_client.per_second(),
            sql.per_second()
        );
        rows[0].1.push(raw);
        rows[1].1.push(service);
        rows[2].1.push(gateway_client);
        rows[3].1.push(sql);
        watch.end(redis_url, cluster, run).await;
    }

    report_baselines(opts, &rows, &registry)?;
    sqlx::query("DROP TABLE bench_stock").execute(&pool).await?;
    Ok(())
}

/// The naive baseline's table of stock on PostgreSQL (`DATABASE_URL`),
/// filled with the SKU's stock, and a pool of `concurrency` connections
/// that commit durably, as a naive application does: each UPDATE waits for
/// its WAL flush.
async fn naive_sql_stock(concurrency: usize) -> anyhow::Result<sqlx::PgPool> {
    let pg_url =
        std::env::var("DATABASE_URL").map_err(|_| anyhow::anyhow!("DATABASE_URL unset"))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(concurrency as u32)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET synchronous_commit = on")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .connect(&pg_url)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_stock (sku TEXT PRIMARY KEY, available BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("INSERT INTO bench_stock VALUES ('HOT', 1000000000) ON CONFLICT (sku) DO UPDATE SET available = 1000000000")
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// The naive baseline for `duration`: one conditional UPDATE per reservation.
async fn naive_sql(
    concurrency: usize,
    duration: Duration,
    pool: &sqlx::PgPool,
) -> anyhow::Result<Measured> {
    let pool = pool.clone();
    closed_loop(concurrency, duration, move |_| {
        let pool = pool.clone();
        async move {
            let done = sqlx::query(
                "UPDATE bench_stock SET available = available - 1 WHERE sku = $1 AND available > 0",
            )
            .bind("HOT")
            .execute(&pool)
            .await?;
            anyhow::ensure!(done.rows_affected() == 1, "sold out");
            Ok(())
        }
    })
    .await
}

/// Prints the service against its baselines: the medians, the same-run
/// ratios, failed calls and, unsharded, how many reservations a script
/// call decided on average.
fn report_baselines(
    opts: &Options,
    rows: &[(&str, Vec<Measured>)],
    registry: &Registry,
) -> anyhow::Result<()> {
    println!(
        "concurrency {} · {} s per mode · {} runs (medians){}",
        opts.concurrency,
        opts.seconds,
        opts.runs,
        describe(opts)
    );
    println!("| mode | reservations/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    for (name, samples) in rows {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} |",
            median_of(samples, Measured::per_second),
            median_of(samples, Measured::p50_us) / 1000.0,
            median_of(samples, Measured::p99_us) / 1000.0
        );
    }
    let (to_raw, raw_runs) = ratio(&rows[1].1, &rows[0].1, Measured::per_second);
    let (client_to_raw, client_runs) = ratio(&rows[2].1, &rows[0].1, Measured::per_second);
    let (to_sql, sql_runs) = ratio(&rows[1].1, &rows[3].1, Measured::per_second);
    println!(
        "service / raw-lua = {to_raw:.2}, gateway-client / raw-lua = {client_to_raw:.2} (same-run ratios, median); service / naive-sql = {to_sql:.1}"
    );
    println!(
        "  per run: service / raw-lua {raw_runs}; gateway-client / raw-lua {client_runs}; service / naive-sql {sql_runs}"
    );
    report_errors(rows);
    if opts.shards == 1 {
        let text = flashsale_runtime::metrics::render(registry)?;
        let series = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let (calls, requests) = (
            series("flashsale_inventory_reserve_batch_size_count"),
            series("flashsale_inventory_reserve_batch_size_sum"),
        );
        println!(
            "service: {calls:.0} script calls for {requests:.0} reservations, {:.1} per call on average",
            requests / calls.max(1.0)
        );
    }
    Ok(())
}

/// The service under the fast and the replicated policy, on one sale: the
/// saturated rate of each (closed loop), then the p99 of each at half of
/// the fast policy's saturated rate of the same run (open loop).
async fn durability_cost(
    opts: &Options,
    redis_url: &str,
    fast_store: Store,
    http: &reqwest::Client,
    cluster: Option<&Cluster>,
    sale: &str,
) -> anyhow::Result<()> {
    // A second store on its own connections; loading finds the sale as the
    // first store left it.
    let replicated_store = Store::connect(redis_url).await?.with_durability(REPLICATED);
    replicated_store
        .load(&definition(sale, opts.shards))
        .await?;
    let (fast_url, _) = serve(fast_store).await?;
    let (replicated_url, _) = serve(replicated_store).await?;
    let names = ["fast", "replicated (1 replica, 100 ms)"];
    let urls = [fast_url, replicated_url];
    let duration = Duration::from_secs(opts.seconds);
    let (mut saturated, mut half): ([Vec<Measured>; 2], [Vec<Measured>; 2]) = Default::default();
    for (i, url) in urls.iter().enumerate() {
        // Warm-up, not measured.
        closed_loop(
            opts.concurrency,
            Duration::from_secs(1),
            via_service(http, url, sale, format!("w{i}")),
        )
        .await?;
    }
    let mut rates = Vec::new();
    for run in 1..=opts.runs {
        let watch = RunWatch::begin(redis_url, cluster, run).await?;
        // Which policy goes first alternates, so neither always follows
        // the other's load (replication backlog, a busier machine).
        let order = if run % 2 == 1 { [0, 1] } else { [1, 0] };
        for i in order {
            let op = via_service(http, &urls[i], sale, format!("c{run}p{i}"));
            saturated[i].push(noted(closed_loop(opts.concurrency, duration, op).await?));
        }
        let rate = saturated[0][run - 1].per_second() / 2.0;
        rates.push(rate);
        for i in order {
            let op = via_service(http, &urls[i], sale, format!("o{run}p{i}"));
            half[i].push(noted(
                open_loop(opts.concurrency, rate, duration, op).await?,
            ));
        }
        eprintln!(
            "run {run}/{}: saturated fast {:.0}/s, replicated {:.0}/s; at {rate:.0}/s p99 fast {:.2} ms, replicated {:.2} ms",
            opts.runs,
            saturated[0][run - 1].per_second(),
            saturated[1][run - 1].per_second(),
            half[0][run - 1].p99_us() / 1000.0,
            half[1][run - 1].p99_us() / 1000.0
        );
        watch.end(redis_url, cluster, run).await;
    }
    report_durability(opts, names, &saturated, &half, rates);
    Ok(())
}

/// Prints the two policies' medians, saturated and at half load, their
/// same-run ratios and failed calls.
fn report_durability(
    opts: &Options,
    names: [&str; 2],
    saturated: &[Vec<Measured>; 2],
    half: &[Vec<Measured>; 2],
    rates: Vec<f64>,
) {
    println!(
        "durability cost · concurrency {} saturated, open loop at half of fast · {} s per measurement · {} runs (medians){}",
        opts.concurrency,
        opts.seconds,
        opts.runs,
        describe(opts)
    );
    println!(
        "| policy | saturated reservations/s | p50 ms | p99 ms | half load /s | p50 ms | p99 ms | late start p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let half_rate = median(rates).unwrap_or(f64::NAN);
    for (i, name) in names.iter().enumerate() {
        let (s, h) = (&saturated[i], &half[i]);
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {half_rate:.0} | {:.2} | {:.2} | {:.2} |",
            median_of(s, Measured::per_second),
            median_of(s, Measured::p50_us) / 1000.0,
            median_of(s, Measured::p99_us) / 1000.0,
            median_of(h, Measured::p50_us) / 1000.0,
            median_of(h, Measured::p99_us) / 1000.0,
            median_of(h, Measured::late_p99_us) / 1000.0,
        );
    }
    let (throughput, throughput_runs) = ratio(&saturated[1], &saturated[0], Measured::per_second);
    let (p99, p99_runs) = ratio(&half[1], &half[0], Measured::p99_us);
    println!(
        "replicated / fast (same-run ratios, median): throughput {throughput:.2} (runs: {throughput_runs}), p99 at half load {p99:.2} (runs: {p99_runs})"
    );
    report_errors(&[
        ("fast saturated", saturated[0].clone()),
        ("replicated saturated", saturated[1].clone()),
        ("fast half load", half[0].clone()),
        ("replicated half load", half[1].clone()),
    ]);
}

/// What the run was on, for the report's first line.
fn describe(opts: &Options) -> String {
    let target = match opts.target {
        Target::Single => "",
        Target::Cluster => " · Redis Cluster",
    };
    let shards = if opts.shards > 1 {
        format!(" · service SKU in {} shards", opts.shards)
    } else {
        String::new()
    };
    format!("{target}{shards}")
}

/// What else happened to Redis during a run and makes its figures
/// suspect: a failover (another test killing a node) or a fork for an AOF
/// rewrite or an RDB save (the fork pauses the node; the child competes for
/// the cores while it writes).
struct RunWatch {
    primaries: BTreeSet<u16>,
    forks: u64,
}

impl RunWatch {
    /// Waits for a whole cluster, then notes the primaries and forks so far.
    async fn begin(redis_url: &str, cluster: Option<&Cluster>, run: usize) -> anyhow::Result<Self> {
        let primaries = match cluster {
            Some(cluster) => cluster.healthy(run).await?,
            None => BTreeSet::new(),
        };
        Ok(Self {
            primaries,
            forks: forks(redis_url).await,
        })
    }

    /// Says what changed since [`RunWatch::begin`].
    async fn end(self, redis_url: &str, cluster: Option<&Cluster>, run: usize) {
        if let Some(cluster) = cluster {
            let after = cluster.primaries().await;
            if after != self.primaries {
                eprintln!(
                    "run {run}: the cluster's primaries changed during the run: {:?} → {after:?}",
                    self.primaries
                );
            }
        }
        let forks = forks(redis_url).await.saturating_sub(self.forks);
        if forks > 0 {
            eprintln!(
                "run {run}: {forks} background AOF rewrite(s) or RDB save(s) on the Redis nodes"
            );
        }
    }
}

/// AOF rewrites and RDB saves so far, summed over the nodes of `redis_url`
/// (one URL, or a cluster's comma-separated nodes) that answer.
async fn forks(redis_url: &str) -> u64 {
    let mut total = 0;
    for url in redis_url.split(',').map(str::trim) {
        let Ok(client) = redis::Client::open(url) else {
            continue;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let info: String = match redis::cmd("INFO")
            .arg("persistence")
            .query_async(&mut conn)
            .await
        {
            Ok(info) => info,
            Err(_) => continue,
        };
        total += info
            .lines()
            .filter_map(|line| {
                let (name, value) = line.trim().split_once(':')?;
                matches!(name, "aof_rewrites" | "rdb_saves").then(|| value.parse::<u64>().ok())?
            })
            .sum::<u64>();
    }
    total
}

/// Prints failed calls per mode, if any.
fn report_errors(rows: &[(&str, Vec<Measured>)]) {
    for (name, samples) in rows {
        let errors: u64 = samples.iter().map(|s| s.errors).sum();
        if errors > 0 {
            println!("{name}: {errors} calls failed over all runs (not counted above)");
        }
    }
}
