//! Load generator: reservations per second and latency on one hot SKU, in
//! three ways measured in the same run at the same concurrency:
//!
//! - `raw-lua`: the reserve script called directly on Redis, one call (a
//!   batch of one) per request (the ceiling without coalescing);
//! - `service`: the inventory's HTTP API (in-process server, keep-alive
//!   client), which coalesces concurrent reservations of the SKU into one
//!   call of the same script;
//! - `naive-sql`: `UPDATE stock SET available = available - 1 WHERE sku = $1
//!   AND available > 0` on PostgreSQL, committed durably (`synchronous_commit = on`).
//!
//! Needs the local stack (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p inventory --example bench_reserve -- --concurrency 64 --seconds 4 --runs 5`

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use inventory::{
    api::{self, AppState},
    coalesce::{BatchItem, batch_invocation},
    keys::SaleKeys,
    metrics::Metrics,
    store::{ItemDefinition, SaleDefinition, Store},
};

const STOCK: u64 = 1_000_000_000;

struct Options {
    concurrency: usize,
    seconds: u64,
    runs: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut opts = Options {
        concurrency: 64,
        seconds: 5,
        runs: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--concurrency" => opts.concurrency = value.parse()?,
            "--seconds" => opts.seconds = value.parse()?,
            "--runs" => opts.runs = value.parse()?,
            other => {
                anyhow::bail!("unknown flag {other} (known: --concurrency, --seconds, --runs)")
            }
        }
    }
    Ok(opts)
}

/// Throughput and latency of one mode in one run.
#[derive(Debug, Clone, Copy)]
struct Sample {
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Runs `op` from `concurrency` workers for `seconds`; each call gets a
/// unique sequence number.
async fn drive<F, Fut>(concurrency: usize, seconds: u64, op: F) -> anyhow::Result<Sample>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (op, counter) = (op.clone(), counter.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(16_384);
                while Instant::now() < deadline {
                    let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let t = Instant::now();
                    op(n).await?;
                    latencies.push(t.elapsed().as_micros() as u32);
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
    };
    Ok(Sample {
        per_second: all.len() as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = options()?;
    let redis_url = std::env::var("REDIS_URL")
        .map_err(|_| anyhow::anyhow!("REDIS_URL unset: eval \"$(e2e/local/stack env)\""))?;
    let pg_url =
        std::env::var("DATABASE_URL").map_err(|_| anyhow::anyhow!("DATABASE_URL unset"))?;
    let sale = format!("bench-{}", std::process::id());

    // Two sales with one hot SKU each: one behind the service, one for the
    // raw baseline, so the two never share keys.
    let raw_sale = format!("{sale}-raw");
    let store = Store::connect(&redis_url).await?;
    for name in [&sale, &raw_sale] {
        store
            .load(&SaleDefinition {
                sale: name.clone(),
                opens_at_ms: None,
                reservation_ttl_ms: 3_600_000,
                items: vec![ItemDefinition {
                    sku: "HOT".into(),
                    stock: STOCK,
                    per_user_limit: 1_000_000,
                    shards: 1,
                }],
            })
            .await?;
    }

    // The service, in-process on loopback; its batch sizes are reported.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let state = AppState::new(store, metrics.clone(), Duration::from_millis(200));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!(
        "http://{}/v1/sales/{sale}/reservations",
        listener.local_addr()?
    );
    tokio::spawn(async move { axum::serve(listener, api::router(state)).await });

    // The raw baseline: the same script, straight to Redis, one request per call.
    let raw_conn =
        redis::aio::ConnectionManager::new(redis::Client::open(redis_url.as_str())?).await?;
    let script = Arc::new(redis::Script::new(inventory::store::RESERVE_LOCAL_LUA));

    // The naive baseline.
    // A naive application commits durably: each UPDATE waits for its WAL flush.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(opts.concurrency as u32)
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

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(opts.concurrency)
        .build()?;
    let mut rows: Vec<(&str, Vec<Sample>)> = vec![
        ("raw-lua", vec![]),
        ("service", vec![]),
        ("naive-sql", vec![]),
    ];
    for run in 1..=opts.runs {
        let keys = SaleKeys::new(&raw_sale);
        let (conn, script) = (raw_conn.clone(), script.clone());
        let raw = drive(opts.concurrency, opts.seconds, move |n| {
            let (mut conn, script, keys) = (conn.clone(), script.clone(), keys.clone());
            async move {
                let id = format!("r{run}-{n}");
                let item = BatchItem {
                    user: format!("u{n}"),
                    quantity: 1,
                    reservation_id: id.clone(),
                    request_id: id,
                    amount_minor: 3600,
                    ttl_ms: 3_600_000,
                };
                let replies: Vec<Vec<String>> = batch_invocation(&script, &keys, "HOT", &[item])
                    .invoke_async(&mut conn)
                    .await?;
                let reply = replies.first().and_then(|r| r.first());
                anyhow::ensure!(reply.map(String::as_str) == Some("reserved"), "{replies:?}");
                Ok(())
            }
        })
        .await?;
        rows[0].1.push(raw);

        let (http2, url2) = (http.clone(), url.clone());
        let service = drive(opts.concurrency, opts.seconds, move |n| {
            let (http, url) = (http2.clone(), url2.clone());
            async move {
                let body = serde_json::json!({"sku": "HOT", "user": format!("u{n}"), "quantity": 1, "requestId": format!("s{run}-{n}")});
                let status = http.post(&url).json(&body).send().await?.status();
                anyhow::ensure!(status == reqwest::StatusCode::CREATED, "{status}");
                Ok(())
            }
        })
        .await?;
        rows[1].1.push(service);

        let pool2 = pool.clone();
        let sql = drive(opts.concurrency, opts.seconds, move |_| {
            let pool = pool2.clone();
            async move {
                let done = sqlx::query("UPDATE bench_stock SET available = available - 1 WHERE sku = $1 AND available > 0")
                    .bind("HOT")
                    .execute(&pool)
                    .await?;
                anyhow::ensure!(done.rows_affected() == 1, "sold out");
                Ok(())
            }
        })
        .await?;
        rows[2].1.push(sql);
        eprintln!(
            "run {run}/{}: raw {:.0}/s, service {:.0}/s, sql {:.0}/s",
            opts.runs, raw.per_second, service.per_second, sql.per_second
        );
    }

    println!(
        "concurrency {} · {} s per mode · {} runs (medians)",
        opts.concurrency, opts.seconds, opts.runs
    );
    println!("| mode | reservations/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    let mut medians = Vec::new();
    for (name, samples) in &mut rows {
        let per_second = median(&mut samples.iter().map(|s| s.per_second).collect::<Vec<_>>());
        let p50 = median(&mut samples.iter().map(|s| s.p50_us).collect::<Vec<_>>()) / 1000.0;
        let p99 = median(&mut samples.iter().map(|s| s.p99_us).collect::<Vec<_>>()) / 1000.0;
        println!("| {name} | {per_second:.0} | {p50:.2} | {p99:.2} |");
        medians.push(per_second);
    }
    let ratio = |a: &[Sample], b: &[Sample]| {
        let mut r: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(x, y)| x.per_second / y.per_second)
            .collect();
        median(&mut r)
    };
    println!(
        "service / raw-lua = {:.2} (same-run ratios, median); service / naive-sql = {:.1}",
        ratio(&rows[1].1, &rows[0].1),
        ratio(&rows[1].1, &rows[2].1)
    );
    let text = flashsale_runtime::metrics::render(&registry)?;
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
    sqlx::query("DROP TABLE bench_stock").execute(&pool).await?;
    // Leave Redis as found: both sales' keys start with the bench's prefix.
    let removed =
        flashsale_e2e::redis_keys::unlink_matching(&redis_url, &format!("fs:{{{sale}*")).await?;
    eprintln!("removed {removed} benchmark keys");
    Ok(())
}
