//! The gateway's HTTP paths against peers measured in the same run, at the
//! same concurrency, over loopback:
//!
//! - `get`: a tier-1 `GET /api/v1/items/A` through the gateway (token check,
//!   Redis GCRA decision, concurrency slot, cached stock) vs a bare axum
//!   handler answering the same JSON;
//! - `limited`: a rate-limited GET (rate 50/s, burst 10 per user, most
//!   requests refused) through the gateway vs Debian's nginx `limit_req` at
//!   the same settings, keyed by the same user header;
//! - `order`: the full order path (token, rate limit, reserve in the real
//!   inventory, publish to Kafka with acks=all, answer), first at saturation,
//!   then open-loop at half that rate for its p99.
//!
//! Needs the local stack (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p gateway --example bench_gateway -- --runs 3`

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "load/mod.rs"]
mod load;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{Json, Router, routing::get};
use clap::Parser;
use common::{Funnel, Options as FunnelOptions, token};
use load::{Sample, drive, median};
use serde_json::json;

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
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// GETs `url` as each user (token and `X-User` header), counting 200 and 429
/// alike as answers.
async fn get_as_users(opts: &Options, url: String, users: usize) -> anyhow::Result<Sample> {
    let http = client();
    let tokens: Arc<Vec<String>> = Arc::new((0..users).map(|u| token(&format!("u{u}"))).collect());
    drive(opts.concurrency, opts.seconds, users, move |user| {
        let (http, url, tokens) = (http.clone(), url.clone(), tokens.clone());
        async move {
            let index: usize = user.trim_start_matches('u').parse().unwrap_or(0);
            let response = http
                .get(&url)
                .bearer_auth(&tokens[index % tokens.len()])
                .header("x-user", &user)
                .send()
                .await?;
            let status = response.status().as_u16();
            response.bytes().await?;
            anyhow::ensure!(status == 200 || status == 429, "unexpected HTTP {status}");
            Ok(())
        }
    })
    .await
}

async fn bare_axum() -> anyhow::Result<String> {
    let router = Router::new().route(
        "/api/v1/items/{sku}",
        get(|| async {
            Json(json!({"sku": "A", "status": "available", "available": 100, "stock": 100}))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/api/v1/items/A", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(url)
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

/// Orders as fast as `concurrency` clients can, each a new user and key.
async fn order_saturated(opts: &Options, gateway: &str) -> anyhow::Result<Sample> {
    let (http, url) = (client(), format!("{gateway}/api/v1/orders"));
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    drive(opts.concurrency, opts.seconds, 1, move |_| {
        let (http, url, counter) = (http.clone(), url.clone(), counter.clone());
        async move {
            place(
                &http,
                &url,
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            )
            .await
        }
    })
    .await
}

/// Orders answered 503 (shed, or a dependency too slow) over the whole run.
static UNAVAILABLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

async fn place(http: &reqwest::Client, url: &str, n: u64) -> anyhow::Result<()> {
    let user = format!("buyer{n}-{}", std::process::id());
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
        UNAVAILABLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(());
    }
    anyhow::ensure!(status == 201, "order answered HTTP {status}");
    Ok(())
}

/// Orders arriving at `rate` per second regardless of answers (open loop),
/// so queueing shows in the latency; returns the p99 in µs.
async fn order_open_loop(opts: &Options, gateway: &str, rate: f64) -> anyhow::Result<f64> {
    let (http, url) = (client(), format!("{gateway}/api/v1/orders"));
    let total = (rate * opts.seconds as f64) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..total {
        let due = started + interval * n as u32;
        tokio::time::sleep_until(due.into()).await;
        let (http, url) = (http.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            place(&http, &url, 1_000_000_000 + n).await?;
            anyhow::Ok(t.elapsed().as_secs_f64() * 1e6)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.push(task.await??);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies[(latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1))])
}

/// Prints the medians of one measurement and returns its throughput.
fn row(name: &str, samples: &[Sample]) -> f64 {
    let rps = median(samples.iter().map(|s| s.per_second).collect());
    let p99 = median(samples.iter().map(|s| s.p99_us).collect());
    println!(
        "{name:<22} {rps:>10.0} req/s   p50 {:>8.0} µs   p99 {p99:>8.0} µs",
        median(samples.iter().map(|s| s.p50_us).collect())
    );
    rps
}

/// Per-run ratios (each run's pair measured back to back), their median and spread.
fn ratios(name: &str, ours: &[Sample], peer: &[Sample]) {
    let throughput: Vec<f64> = ours
        .iter()
        .zip(peer)
        .map(|(a, b)| a.per_second / b.per_second)
        .collect();
    let p99: Vec<f64> = ours
        .iter()
        .zip(peer)
        .map(|(a, b)| a.p99_us / b.p99_us)
        .collect();
    let spread = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "{name}: throughput {:.2}× (runs: {}), p99 {:.2}× (runs: {})",
        median(throughput.clone()),
        spread(&throughput),
        median(p99.clone()),
        spread(&p99)
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    // Large stock and limits: the benchmark measures the path, not refusals.
    let funnel = Funnel::start(FunnelOptions {
        stock: 10_000_000,
        per_user_limit: 1_000,
        config: json!({
            "rateLimit": {"perUserPerSecond": 100000, "burst": 100000},
            "concurrency": {"minLimit": 1000, "maxLimit": 5000},
            "itemCacheMs": 1000,
            "requestTimeoutMs": 5000,
        }),
        ..FunnelOptions::default()
    })
    .await?;
    let limited = Funnel::start(FunnelOptions {
        config: json!({"rateLimit": {"perUserPerSecond": 50, "burst": 10}, "concurrency": {"minLimit": 1000, "maxLimit": 5000}}),
        ..FunnelOptions::default()
    })
    .await?;
    let bare = bare_axum().await?;
    let nginx = Nginx::start(&opts.nginx).await?;
    let gw_get = format!("{}/api/v1/items/A", funnel.gateway.url);
    let gw_limited = format!("{}/api/v1/items/A", limited.gateway.url);
    // Warm-up (connections, caches, Lua script): not measured.
    get_as_users(
        &Options {
            seconds: 1,
            nginx: String::new(),
            ..opts
        },
        gw_get.clone(),
        1_000,
    )
    .await?;

    let (mut gw, mut axum_only, mut gw_lim, mut nginx_lim, mut orders, mut half) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for run in 1..=opts.runs {
        eprintln!("run {run}/{}", opts.runs);
        gw.push(get_as_users(&opts, gw_get.clone(), 10_000).await?);
        axum_only.push(get_as_users(&opts, bare.clone(), 10_000).await?);
        gw_lim.push(get_as_users(&opts, gw_limited.clone(), 8).await?);
        nginx_lim.push(get_as_users(&opts, nginx.url.clone(), 8).await?);
        let saturated = order_saturated(&opts, &funnel.gateway.url).await?;
        half.push(order_open_loop(&opts, &funnel.gateway.url, saturated.per_second / 2.0).await?);
        orders.push(saturated);
    }
    println!(
        "\nconcurrency {}, {} s per measurement, medians of {} runs",
        opts.concurrency, opts.seconds, opts.runs
    );
    row("gateway GET", &gw);
    row("bare axum GET", &axum_only);
    row("gateway limited GET", &gw_lim);
    row("nginx limit_req GET", &nginx_lim);
    let order_rps = row("order (saturated)", &orders);
    let half_p99 = median(half.clone());
    let runs: Vec<f64> = half.iter().map(|p| (p / 1000.0).round()).collect();
    println!(
        "order at half load     {:>10.0} req/s   p99 {half_p99:>8.0} µs (runs, ms: {runs:?})\n",
        order_rps / 2.0
    );
    println!(
        "orders answered 503 over all runs: {}",
        UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed)
    );
    ratios("GET gateway / bare axum", &gw, &axum_only);
    ratios("limited GET gateway / nginx", &gw_lim, &nginx_lim);
    drop(nginx);
    limited.cleanup().await?;
    funnel.cleanup().await?;
    Ok(())
}
