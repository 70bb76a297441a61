//! The gateway's HTTP paths against peers measured in the same run, at the
//! same concurrency, over loopback:
//!
//! - `get`: a tier-1 `GET /api/v1/items/A` through the gateway (token check,
//!   the replica's GCRA, concurrency slot, cached stock) vs a bare axum
//!   handler answering the same JSON;
//! - `slow-get`: the same GET through a gateway whose inventory is 50 ms
//!   away (a delay the benchmark owns, in front of the real inventory),
//!   its item cache refreshed every second, vs the same bare axum: the
//!   refresh-ahead cache and the hedged read keep every read off the
//!   inventory's latency;
//! - `limited`: a rate-limited GET (rate 50/s, burst 10 per user, most
//!   requests refused) through the gateway, inside this process and as a
//!   process of its own as nginx is (the release `gateway` binary), vs
//!   Debian's nginx `limit_req` at the same settings, keyed by the same user
//!   header;
//! - `sold-out`: an order of a SKU the gateway knows is sold out, answered
//!   `409 sold_out` from its memory, vs a bare axum handler answering the
//!   same 409, and vs a gateway that asks the inventory every time
//!   (`soldOutRecheckMs` 0);
//! - `order`: the full order path (token, rate limit, reserve in the real
//!   inventory, whose script also puts the order's event in the outbox,
//!   answer), first at saturation, then open-loop at half that rate (or the
//!   share `--load` gives) for its
//!   p99; the inventory's relay publishes the events meanwhile, to the
//!   stack's single broker and/or its three-broker cluster (`--kafka
//!   single,cluster`: a topic with three replicas and `min.insync.replicas`
//!   2), optionally at several producer lingers (`--linger-ms 5,0`);
//!   `--kafka none` runs no relay, to show what publishing costs the order;
//!   `--breakdown` also times, alone at the same rate, the inventory's
//!   reserve (HTTP) and the path's floor: one reserve-script call on Redis,
//!   and prints the order's p99 over the floor's, a same-run ratio.
//!
//! Needs the local stack (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p flashsale-bench --example bench_gateway -- --runs 3`
//! `cargo run --release -p flashsale-bench --example bench_gateway -- --paths order --kafka single,cluster --runs 5`

use std::{
    collections::BTreeSet,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    http::StatusCode,
    routing::{get, post},
};
use clap::{Parser, ValueEnum};
use flashsale_bench::{
    funnel::{Funnel, Options as FunnelOptions, Running},
    gateway_process::GatewayProcess,
    load::{Measured, closed_loop, http_client, http_closed_loop, open_loop},
    median,
    reserve_script::reserve_calls,
};
use flashsale_e2e::{
    clusters::KafkaCluster,
    delay::DelayProxy,
    funnel::{INVENTORY_TOKEN, TopicSpec, token},
};
use flashsale_runtime::redis::{RedisConnection, RedisTarget, RedisTimeouts};
use gateway::server::SwitchSource;
use serde_json::json;

/// A measured path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Path {
    /// GET through the gateway vs bare axum.
    Get,
    /// GET through a gateway whose inventory is 50 ms away vs bare axum.
    SlowGet,
    /// Rate-limited GET through the gateway vs nginx.
    Limited,
    /// An order of a sold-out SKU through the gateway vs bare axum.
    SoldOut,
    /// The order path.
    Order,
}

/// The Kafka the order path publishes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kafka {
    /// No relay: the events stay in the outbox, and the order is measured
    /// without the relay's and the brokers' work on the same cores.
    None,
    /// The stack's single broker (`KAFKA_BROKERS`), a topic with one replica.
    Single,
    /// The stack's three brokers (`FLASHSALE_KAFKA_CLUSTER_BROKERS`), a
    /// topic with three replicas and `min.insync.replicas` 2.
    Cluster,
}

/// How long a cluster that is failing over (other tests kill brokers) may
/// take to be whole again before a run starts.
const HEALTHY_WITHIN: Duration = Duration::from_secs(180);

/// Gateway HTTP paths vs bare axum, nginx limit_req and saturation.
#[derive(Debug, Parser)]
struct Options {
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Runs; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// nginx binary for the limit_req peer.
    #[arg(long, default_value = "/usr/sbin/nginx")]
    nginx: String,
    /// Paths to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["get", "limited", "order"])]
    paths: Vec<Path>,
    /// Where the order path publishes; each one listed is measured in every run.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["single"])]
    kafka: Vec<Kafka>,
    /// Producer lingers (ms) to measure the order path at, each in every
    /// run; without it, the producer's default.
    #[arg(long, value_delimiter = ',')]
    linger_ms: Vec<u64>,
    /// Also time the inventory's reserve alone and one reserve-script call
    /// alone (the path's floor), each at the order path's open-loop rate.
    #[arg(long)]
    breakdown: bool,
    /// The order path's open-loop rate, as a share of its saturated rate.
    #[arg(long, default_value_t = 0.5, value_parser = load_share)]
    load: f64,
}

/// A share of the saturated rate: above 0, at most 1.
fn load_share(given: &str) -> Result<f64, String> {
    match given.parse::<f64>() {
        Ok(share) if share > 0.0 && share <= 1.0 => Ok(share),
        _ => Err(format!("{given:?} is not a share in (0, 1]")),
    }
}

/// How a share of the saturated rate is named in the report.
fn load_name(share: f64) -> String {
    if share == 0.5 {
        "half load".to_owned()
    } else {
        format!("{:.0} % load", share * 100.0)
    }
}

/// Sends the request `build` makes for call `n` as user `u<index>` (each
/// of `users` in turn, with a token of its own), closed-loop, counting only
/// the statuses in `answers` as answers.
async fn as_users(
    opts: &Options,
    users: usize,
    answers: &'static [u16],
    build: impl Fn(&reqwest::Client, usize, u64) -> reqwest::RequestBuilder + Send + Sync + 'static,
) -> anyhow::Result<Measured> {
    let http = http_client();
    let tokens: Vec<String> = (0..users).map(|u| token(&format!("u{u}"))).collect();
    let count = u64::try_from(tokens.len())?;
    http_closed_loop(opts.concurrency, seconds(opts), answers, move |n| {
        let index = usize::try_from(n % count).unwrap_or(0);
        build(&http, index, n).bearer_auth(&tokens[index])
    })
    .await
}

/// GETs `url` as each user (token and `X-User` header), counting 200 and 429
/// alike as answers.
async fn get_as_users(opts: &Options, url: String, users: usize) -> anyhow::Result<Measured> {
    as_users(opts, users, &[200, 429], move |http, index, _| {
        http.get(&url).header("x-user", format!("u{index}"))
    })
    .await
}

/// How long each measurement lasts.
fn seconds(opts: &Options) -> Duration {
    Duration::from_secs(opts.seconds)
}

/// Bare axum answering what the gateway answers, with none of its work:
/// the item page, and an order of a sold-out SKU. Its base URL.
async fn bare_axum() -> anyhow::Result<String> {
    let router = Router::new()
        .route(
            "/api/v1/items/{sku}",
            get(|| async {
                Json(json!({"sku": "A", "status": "available", "available": 100, "stock": 100}))
            }),
        )
        .route(
            "/api/v1/orders",
            post(|| async {
                (
                    StatusCode::CONFLICT,
                    Json(json!({"error": "sold_out", "message": "SKU \"A\" is sold out"})),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(url)
}

/// Orders `A` at `url` as each of `users` in turn, each with a key of its
/// own, counting only `409` as an answer (the SKU is sold out).
async fn order_sold_out(opts: &Options, url: String, users: usize) -> anyhow::Result<Measured> {
    as_users(opts, users, &[409], move |http, _, n| {
        http.post(&url)
            .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": format!("k{n}")}))
    })
    .await
}

/// nginx with `limit_req` at rate 50/s, burst 10, keyed by `X-User`, in a
/// scratch folder; killed on drop.
struct Nginx {
    child: tokio::process::Child,
    url: String,
    dir: std::path::PathBuf,
}

impl Nginx {
    async fn start(binary: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("bench-nginx-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("logs"))?;
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
            probe.local_addr()?.port()
        };
        let conf = format!(
            "daemon off; master_process off; worker_processes 1; pid {dir}/nginx.pid; error_log {dir}/logs/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}; proxy_temp_path {dir}; fastcgi_temp_path {dir}; uwsgi_temp_path {dir}; scgi_temp_path {dir};
  limit_req_zone $http_x_user zone=users:10m rate=50r/s;
  limit_req_status 429;
  server {{
    listen 127.0.0.1:{port};
    location / {{ limit_req zone=users burst=10 nodelay; default_type application/json; return 200 '{{\"sku\":\"A\",\"status\":\"available\"}}'; }}
  }}
}}
",
            dir = dir.display()
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let child = tokio::process::Command::new(binary)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf_path)
            .kill_on_drop(true)
            .spawn()?;
        let url = format!("http://127.0.0.1:{port}/api/v1/items/A");
        flashsale_e2e::wait::poll_until(
            "nginx",
            Duration::from_secs(5),
            Duration::from_millis(20),
            || async {
                reqwest::get(&url)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
        Ok(Self { child, url, dir })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Orders answered 503 (shed, or a dependency too slow), counted as they come.
static UNAVAILABLE: AtomicU64 = AtomicU64::new(0);

/// Orders as fast as `concurrency` clients can, each a new user.
async fn order_saturated(opts: &Options, gateway: &str) -> anyhow::Result<Measured> {
    let (http, url) = (http_client(), format!("{gateway}/api/v1/orders"));
    closed_loop(opts.concurrency, seconds(opts), move |_| {
        let (http, url) = (http.clone(), url.clone());
        async move { place(&http, &url).await }
    })
    .await?
    .check()
}

/// Orders arriving at `rate` per second regardless of answers (open loop),
/// so queueing shows in the latency.
async fn order_open_loop(opts: &Options, gateway: &str, rate: f64) -> anyhow::Result<Measured> {
    let (http, url) = (http_client(), format!("{gateway}/api/v1/orders"));
    open_loop(opts.concurrency, rate, seconds(opts), move |_| {
        let (http, url) = (http.clone(), url.clone());
        async move { place(&http, &url).await }
    })
    .await?
    .check()
}

/// A number not used before in this process. Every order is a new user
/// (so a new request id): a name used again would be a replay, answered
/// from the first order's acknowledgement without the inventory's
/// reservation or Kafka.
fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

async fn place(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let user = format!("buyer{}-{}", unique(), std::process::id());
    let response = http
        .post(url)
        .bearer_auth(token(&user))
        .json(&json!({"sku": "A", "quantity": 1, "idempotencyKey": "k"}))
        .send()
        .await?;
    let status = response.status().as_u16();
    response.bytes().await?;
    // A shed or failed order is an answer too; count it, do not stop.
    if status == 503 {
        UNAVAILABLE.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    anyhow::ensure!(status == 201, "order answered HTTP {status}");
    Ok(())
}

/// The inventory's reserve alone (what the gateway asks it for an order),
/// at `rate` per second.
async fn reserve_open_loop(opts: &Options, funnel: &Funnel, rate: f64) -> anyhow::Result<Measured> {
    let http = http_client();
    let url = format!(
        "{}/v1/sales/{}/reservations",
        funnel.inventory.url, funnel.sale
    );
    open_loop(opts.concurrency, rate, seconds(opts), move |_| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let id = format!("alone-{}-{}", unique(), std::process::id());
            let body = json!({"sku": "A", "user": id, "quantity": 1, "requestId": id, "amountMinor": 1999});
            let response = http
                .post(&url)
                .bearer_auth(INVENTORY_TOKEN)
                .json(&body)
                .send()
                .await?;
            let status = response.status().as_u16();
            response.bytes().await?;
            anyhow::ensure!(status == 201, "reserve answered HTTP {status}");
            Ok(())
        }
    })
    .await?
    .check()
}

/// The path's floor: one reserve-script call straight on the funnel's
/// Redis, at `rate` per second.
async fn script_open_loop(opts: &Options, funnel: &Funnel, rate: f64) -> anyhow::Result<Measured> {
    let target: RedisTarget = flashsale_e2e::stack::redis_url()?.parse()?;
    let conn = RedisConnection::connect(&target, RedisTimeouts::default()).await?;
    let call = reserve_calls(&conn, &funnel.sale, "A", format!("floor{}", unique()));
    open_loop(opts.concurrency, rate, seconds(opts), call)
        .await?
        .check()
}

/// One order setup: where its events go and what it measured.
struct OrderSetup {
    label: String,
    kafka: Kafka,
    funnel: Funnel,
    saturated: Vec<Measured>,
    loaded: Vec<Measured>,
    reserve_alone: Vec<Measured>,
    floor: Vec<Measured>,
    unavailable: u64,
}

impl OrderSetup {
    async fn start(kafka: Kafka, linger: Option<Duration>) -> anyhow::Result<Self> {
        let topic = match kafka {
            Kafka::None | Kafka::Single => None,
            Kafka::Cluster => Some(TopicSpec {
                brokers: KafkaCluster::from_env()?.brokers().to_owned(),
                replication: 3,
                min_insync_replicas: 2,
            }),
        };
        let funnel = Funnel::start(FunnelOptions {
            topic,
            linger,
            relay: kafka != Kafka::None,
            ..high_limits()
        })
        .await?;
        let mut label = match kafka {
            Kafka::None => "no relay".to_owned(),
            Kafka::Single => "1 broker".to_owned(),
            Kafka::Cluster => "3 brokers".to_owned(),
        };
        if let Some(linger) = linger {
            label.push_str(&format!(", linger {} ms", linger.as_millis()));
        }
        Ok(Self {
            label,
            kafka,
            funnel,
            saturated: vec![],
            loaded: vec![],
            reserve_alone: vec![],
            floor: vec![],
            unavailable: 0,
        })
    }

    /// One run: saturated, then the `--load` share of that rate (and the
    /// dependencies alone).
    async fn run(&mut self, opts: &Options) -> anyhow::Result<()> {
        let before = UNAVAILABLE.load(Ordering::Relaxed);
        let gateway = self.funnel.gateway.url.clone();
        let saturated = order_saturated(opts, &gateway).await?;
        let rate = saturated.per_second() * opts.load;
        let loaded = order_open_loop(opts, &gateway, rate).await?;
        eprintln!(
            "  order, {}: saturated {:.0}/s; at {rate:.0}/s p50 {:.2} ms, p99 {:.2} ms (late start p99 {:.2} ms)",
            self.label,
            saturated.per_second(),
            loaded.p50_us() / 1000.0,
            loaded.p99_us() / 1000.0,
            loaded.late_p99_us() / 1000.0
        );
        self.saturated.push(saturated);
        self.loaded.push(loaded);
        if opts.breakdown {
            let reserve = reserve_open_loop(opts, &self.funnel, rate).await?;
            let floor = script_open_loop(opts, &self.funnel, rate).await?;
            eprintln!(
                "    alone at {rate:.0}/s: reserve p50 {:.2} / p99 {:.2} ms, reserve script p50 {:.2} / p99 {:.2} ms",
                reserve.p50_us() / 1000.0,
                reserve.p99_us() / 1000.0,
                floor.p50_us() / 1000.0,
                floor.p99_us() / 1000.0
            );
            self.reserve_alone.push(reserve);
            self.floor.push(floor);
        }
        self.unavailable += UNAVAILABLE.load(Ordering::Relaxed) - before;
        Ok(())
    }

    fn report(&self, load: &str, share: f64) {
        let rps = row(
            &format!("order (saturated, {})", self.label),
            &self.saturated,
        );
        let loaded_p99 = of(self.loaded.iter().map(Measured::p99_us));
        let loaded_p50 = of(self.loaded.iter().map(Measured::p50_us));
        let late = of(self.loaded.iter().map(Measured::late_p99_us));
        let runs: Vec<f64> = self
            .loaded
            .iter()
            .map(|s| (s.p99_us() / 100.0).round() / 10.0)
            .collect();
        println!(
            "order at {load} ({}) {:>8.0} req/s   p50 {loaded_p50:>8.0} µs   p99 {loaded_p99:>8.0} µs (runs, ms: {runs:?}; late start p99 {late:.0} µs)",
            self.label,
            rps * share
        );
        if !self.reserve_alone.is_empty() {
            row(
                &format!("  reserve alone ({})", self.label),
                &self.reserve_alone,
            );
            row(
                &format!("  reserve script alone, the floor ({})", self.label),
                &self.floor,
            );
            let over_floor = of(self
                .loaded
                .iter()
                .zip(&self.floor)
                .map(|(order, floor)| order.p99_us() / floor.p99_us()));
            println!(
                "  order p99 / floor p99 at {load} ({}): {over_floor:.2} (median of same-run ratios)",
                self.label
            );
        }
        println!("  orders answered 503: {}", self.unavailable);
    }
}

/// The funnel settings of the order path: large stock and limits, so the
/// benchmark measures the path, not refusals.
fn high_limits() -> FunnelOptions {
    FunnelOptions {
        stock: 10_000_000,
        per_user_limit: 1_000,
        config: json!({
            "rateLimit": {"perUserPerSecond": 100000, "burst": 100000},
            "concurrency": {"minLimit": 1000, "maxLimit": 5000},
            "itemCacheMs": 1000,
            "requestTimeoutMs": 5000,
        }),
        ..FunnelOptions::default()
    }
}

/// How far the `slow-get` gateway's inventory is.
const INVENTORY_DELAY: Duration = Duration::from_millis(50);

/// A funnel with a second gateway that reaches its inventory through a
/// delay of [`INVENTORY_DELAY`], its item cache refreshed every second, so
/// that a measurement spans several refreshes.
async fn slow_inventory() -> anyhow::Result<(Funnel, DelayProxy, Running)> {
    // The funnel's item cache lasts a second (`high_limits`).
    let funnel = Funnel::start(high_limits()).await?;
    let proxy = DelayProxy::start(&funnel.inventory.url).await?;
    proxy.set_delay(INVENTORY_DELAY);
    let gateway = funnel.replica_via(&proxy.url, SwitchSource::None).await?;
    Ok((funnel, proxy, gateway))
}

/// Waits until the Kafka cluster and `topic`'s partition are whole (another
/// test may have killed a broker); says so when that took a while.
async fn kafka_healthy(cluster: &KafkaCluster, topic: &str, run: usize) -> anyhow::Result<()> {
    let t = Instant::now();
    cluster.until_healthy(HEALTHY_WITHIN).await?;
    flashsale_e2e::wait::poll_until(
        "the benchmark topic's replicas to be in sync",
        HEALTHY_WITHIN,
        Duration::from_millis(200),
        || async {
            match cluster.partition(topic, 0).await {
                Ok(p) if p.leader.is_some() && p.isr.len() == 3 => Ok(()),
                Ok(p) => Err(format!("{p:?}")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await?;
    if t.elapsed() > Duration::from_secs(1) {
        eprintln!(
            "run {run}: waited {:.1} s for the Kafka cluster to be healthy",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The median of per-run figures; NaN without any.
fn of(values: impl IntoIterator<Item = f64>) -> f64 {
    median(values).unwrap_or(f64::NAN)
}

/// Prints the medians of one measurement and returns its throughput.
fn row(name: &str, samples: &[Measured]) -> f64 {
    let rps = of(samples.iter().map(Measured::per_second));
    let p99 = of(samples.iter().map(Measured::p99_us));
    println!(
        "{name:<22} {rps:>10.0} req/s   p50 {:>8.0} µs   p99 {p99:>8.0} µs",
        of(samples.iter().map(Measured::p50_us))
    );
    rps
}

/// Per-run ratios (each run's pair measured back to back), their median and spread.
fn ratios(name: &str, ours: &[Measured], peer: &[Measured]) {
    let throughput: Vec<f64> = ours
        .iter()
        .zip(peer)
        .map(|(a, b)| a.per_second() / b.per_second())
        .collect();
    let p99: Vec<f64> = ours
        .iter()
        .zip(peer)
        .map(|(a, b)| a.p99_us() / b.p99_us())
        .collect();
    let spread = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "{name}: throughput {:.2}× (runs: {}), p99 {:.2}× (runs: {})",
        of(throughput.iter().copied()),
        spread(&throughput),
        of(p99.iter().copied()),
        spread(&p99)
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    let mut orders = start_orders(&opts).await?;
    let kafka_cluster = if orders.iter().any(|o| o.kafka == Kafka::Cluster) {
        Some(KafkaCluster::from_env()?)
    } else {
        None
    };
    let peers = Peers::start(&opts, &orders).await?;
    // Warm-up (connections, caches, Lua script, producer metadata): not measured.
    let warm = Options {
        seconds: 1,
        nginx: String::new(),
        paths: vec![],
        kafka: vec![],
        linger_ms: vec![],
        ..opts
    };
    if let (Some(url), true) = (&peers.get_gateway, opts.paths.contains(&Path::Get)) {
        get_as_users(&warm, url.clone(), 1_000).await?;
    }
    if let Some((_, _, slow)) = &peers.slow {
        get_as_users(&warm, format!("{}/api/v1/items/A", slow.url), 1_000).await?;
    }
    if let Some((limited, process)) = &peers.limited {
        for base in [&limited.gateway.url, &process.url] {
            get_as_users(&warm, format!("{base}/api/v1/items/A"), 8).await?;
        }
    }
    for setup in &orders {
        order_saturated(&warm, &setup.funnel.gateway.url).await?;
    }

    let mut gets = Gets::default();
    for run in 1..=opts.runs {
        eprintln!("run {run}/{}", opts.runs);
        gets.run(&opts, &peers).await?;
        for setup in &mut orders {
            run_watched(&opts, setup, kafka_cluster.as_ref(), run).await?;
        }
    }
    report(&opts, &gets, &orders);
    if let Some((_, _, slow)) = &peers.slow {
        let count = |series: &str| slow.metric(series).unwrap_or(0.0);
        println!(
            "inventory +50 ms: {} item refreshes ran behind an answer, {} had readers waiting, {} sent their hedge",
            count("gateway_item_refreshes_total{mode=\"ahead\"}"),
            count("gateway_item_refreshes_total{mode=\"waited\"}"),
            count("gateway_item_reads_hedged_total"),
        );
    }
    peers.cleanup().await?;
    for setup in orders {
        let (brokers, topic) = (setup.funnel.brokers.clone(), setup.funnel.topic.clone());
        setup.funnel.cleanup().await?;
        delete_topic(&brokers, &topic).await?;
    }
    Ok(())
}

/// An order funnel for every Kafka and linger asked for, when the order
/// path is measured.
async fn start_orders(opts: &Options) -> anyhow::Result<Vec<OrderSetup>> {
    let lingers: Vec<Option<Duration>> = if opts.linger_ms.is_empty() {
        vec![None]
    } else {
        opts.linger_ms
            .iter()
            .map(|ms| Some(Duration::from_millis(*ms)))
            .collect()
    };
    let mut orders = Vec::new();
    if opts.paths.contains(&Path::Order) {
        for kafka in &opts.kafka {
            for linger in &lingers {
                orders.push(OrderSetup::start(*kafka, *linger).await?);
            }
        }
    }
    Ok(orders)
}

/// What the GET paths are measured on: a gateway and its peers.
struct Peers {
    /// A funnel of the GET path's own, when no order funnel serves it.
    own_funnel: Option<Funnel>,
    /// The gateway URL of the tier-1 GET.
    get_gateway: Option<String>,
    /// The rate-limited gateway, and the same as a process of its own.
    limited: Option<(Funnel, GatewayProcess)>,
    /// The bare axum server's base URL.
    bare: Option<String>,
    /// A gateway reaching its funnel's inventory through a delay, with
    /// both.
    slow: Option<(Funnel, DelayProxy, Running)>,
    /// A gateway whose SKUs are sold out, and one that asks the inventory
    /// about every order.
    sold_out: Option<(Funnel, Funnel)>,
    /// nginx with `limit_req`.
    nginx: Option<Nginx>,
}

impl Peers {
    /// Starts what the asked-for GET paths need.
    async fn start(opts: &Options, orders: &[OrderSetup]) -> anyhow::Result<Self> {
        let wants = |path| opts.paths.contains(&path);
        // The GET path goes through the first order funnel, or one of its own.
        let own_funnel = match orders.first() {
            Some(_) => None,
            None if wants(Path::Get) => Some(Funnel::start(high_limits()).await?),
            None => None,
        };
        let get_gateway = orders
            .first()
            .map(|o| &o.funnel)
            .or(own_funnel.as_ref())
            .map(|f| format!("{}/api/v1/items/A", f.gateway.url));
        let limited = match wants(Path::Limited) {
            true => {
                let funnel = Funnel::start(FunnelOptions {
                    config: json!({"rateLimit": {"perUserPerSecond": 50, "burst": 10}, "concurrency": {"minLimit": 1000, "maxLimit": 5000}}),
                    ..FunnelOptions::default()
                })
                .await?;
                let process = GatewayProcess::start(&funnel).await?;
                Some((funnel, process))
            }
            false => None,
        };
        let slow = match wants(Path::SlowGet) {
            true => Some(slow_inventory().await?),
            false => None,
        };
        let bare = match wants(Path::Get) || wants(Path::SlowGet) || wants(Path::SoldOut) {
            true => Some(bare_axum().await?),
            false => None,
        };
        let sold_out = match wants(Path::SoldOut) {
            true => {
                let mut asking = high_limits();
                asking.stock = 0;
                asking.config["soldOutRecheckMs"] = json!(0);
                Some((
                    Funnel::start(FunnelOptions {
                        stock: 0,
                        ..high_limits()
                    })
                    .await?,
                    Funnel::start(asking).await?,
                ))
            }
            false => None,
        };
        let nginx = match wants(Path::Limited) {
            true => Some(Nginx::start(&opts.nginx).await?),
            false => None,
        };
        Ok(Self {
            own_funnel,
            get_gateway,
            limited,
            bare,
            slow,
            sold_out,
            nginx,
        })
    }

    /// Stops nginx and removes the funnels' sales.
    async fn cleanup(self) -> anyhow::Result<()> {
        drop(self.nginx);
        if let Some((limited, process)) = self.limited {
            drop(process);
            limited.cleanup().await?;
        }
        if let Some(funnel) = self.own_funnel {
            funnel.cleanup().await?;
        }
        if let Some((funnel, _, gateway)) = self.slow {
            drop(gateway);
            funnel.cleanup().await?;
        }
        if let Some((memory, asking)) = self.sold_out {
            memory.cleanup().await?;
            asking.cleanup().await?;
        }
        Ok(())
    }
}

/// The GET paths' measurements, one per run.
#[derive(Default)]
struct Gets {
    gateway: Vec<Measured>,
    slow_inventory: Vec<Measured>,
    bare_axum: Vec<Measured>,
    limited: Vec<Measured>,
    limited_process: Vec<Measured>,
    nginx: Vec<Measured>,
    sold_out: Vec<Measured>,
    sold_out_asking: Vec<Measured>,
    bare_sold_out: Vec<Measured>,
}

impl Gets {
    /// One run of each GET path that has its peer.
    async fn run(&mut self, opts: &Options, peers: &Peers) -> anyhow::Result<()> {
        if let (Some(gw_get), true) = (&peers.get_gateway, opts.paths.contains(&Path::Get)) {
            self.gateway
                .push(get_as_users(opts, gw_get.clone(), 10_000).await?);
        }
        if let Some((_, _, slow)) = &peers.slow {
            let url = format!("{}/api/v1/items/A", slow.url);
            self.slow_inventory
                .push(get_as_users(opts, url, 10_000).await?);
        }
        if let (Some(bare), true) = (
            &peers.bare,
            opts.paths.contains(&Path::Get) || opts.paths.contains(&Path::SlowGet),
        ) {
            self.bare_axum
                .push(get_as_users(opts, format!("{bare}/api/v1/items/A"), 10_000).await?);
        }
        if let (Some((memory, asking)), Some(bare)) = (&peers.sold_out, &peers.bare) {
            let url = |f: &Funnel| format!("{}/api/v1/orders", f.gateway.url);
            self.sold_out
                .push(order_sold_out(opts, url(memory), 10_000).await?);
            self.sold_out_asking
                .push(order_sold_out(opts, url(asking), 10_000).await?);
            self.bare_sold_out
                .push(order_sold_out(opts, format!("{bare}/api/v1/orders"), 10_000).await?);
        }
        if let (Some((limited, process)), Some(nginx)) = (&peers.limited, &peers.nginx) {
            let url = format!("{}/api/v1/items/A", limited.gateway.url);
            self.limited.push(get_as_users(opts, url, 8).await?);
            let url = format!("{}/api/v1/items/A", process.url);
            self.limited_process.push(get_as_users(opts, url, 8).await?);
            self.nginx
                .push(get_as_users(opts, nginx.url.clone(), 8).await?);
        }
        Ok(())
    }
}

/// One run of an order setup; on the Kafka cluster, once it is whole, and
/// saying so when the topic's partition changed meanwhile.
async fn run_watched(
    opts: &Options,
    setup: &mut OrderSetup,
    kafka_cluster: Option<&KafkaCluster>,
    run: usize,
) -> anyhow::Result<()> {
    let watched = match (kafka_cluster, setup.kafka) {
        (Some(cluster), Kafka::Cluster) => {
            kafka_healthy(cluster, &setup.funnel.topic, run).await?;
            Some((cluster, cluster.partition(&setup.funnel.topic, 0).await?))
        }
        _ => None,
    };
    setup.run(opts).await?;
    // A broker killed meanwhile (by another test) makes the run suspect.
    if let Some((cluster, before)) = watched {
        let after = cluster.partition(&setup.funnel.topic, 0).await?;
        let in_sync = |isr: &[i32]| isr.iter().copied().collect::<BTreeSet<i32>>();
        if after.leader != before.leader || in_sync(&after.isr) != in_sync(&before.isr) {
            eprintln!(
                "run {run}: the topic's partition changed during the run: {before:?} → {after:?}"
            );
        }
    }
    Ok(())
}

/// Prints the medians of every path and the same-run ratios.
fn report(opts: &Options, gets: &Gets, orders: &[OrderSetup]) {
    println!(
        "\nconcurrency {}, {} s per measurement, medians of {} runs",
        opts.concurrency, opts.seconds, opts.runs
    );
    if !gets.gateway.is_empty() {
        row("gateway GET", &gets.gateway);
    }
    if !gets.slow_inventory.is_empty() {
        row("  inventory +50 ms", &gets.slow_inventory);
    }
    if !gets.bare_axum.is_empty() {
        row("bare axum GET", &gets.bare_axum);
    }
    if !gets.limited.is_empty() {
        row("gateway limited GET", &gets.limited);
        row("  as a process of its own", &gets.limited_process);
        row("nginx limit_req GET", &gets.nginx);
    }
    if !gets.sold_out.is_empty() {
        row("gateway sold-out order", &gets.sold_out);
        row("  asking the inventory", &gets.sold_out_asking);
        row("bare axum 409", &gets.bare_sold_out);
    }
    let load = load_name(opts.load);
    for setup in orders {
        setup.report(&load, opts.load);
    }
    if !gets.gateway.is_empty() {
        ratios("GET gateway / bare axum", &gets.gateway, &gets.bare_axum);
    }
    if !gets.slow_inventory.is_empty() {
        ratios(
            "GET gateway, inventory +50 ms / bare axum",
            &gets.slow_inventory,
            &gets.bare_axum,
        );
    }
    if !gets.limited.is_empty() {
        ratios("limited GET gateway / nginx", &gets.limited, &gets.nginx);
        ratios(
            "limited GET gateway process / nginx",
            &gets.limited_process,
            &gets.nginx,
        );
    }
    if !gets.sold_out.is_empty() {
        ratios(
            "sold-out order gateway / bare axum",
            &gets.sold_out,
            &gets.bare_sold_out,
        );
        ratios(
            "sold-out order from memory / asking the inventory",
            &gets.sold_out,
            &gets.sold_out_asking,
        );
    }
    if let Some((first, rest)) = orders.split_first() {
        for other in rest {
            ratios(
                &format!("order saturated, {} / {}", other.label, first.label),
                &other.saturated,
                &first.saturated,
            );
            ratios(
                &format!("order at {load}, {} / {}", other.label, first.label),
                &other.loaded,
                &first.loaded,
            );
        }
    }
}

/// Removes a topic the benchmark created, so the shared brokers keep none.
async fn delete_topic(brokers: &str, topic: &str) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.delete_topics(&[topic], &options).await? {
        result.map_err(|(name, code)| anyhow::anyhow!("deleting topic {name}: {code}"))?;
    }
    Ok(())
}
