//! Rate-limit decisions per second and latency, three ways in the same run at
//! the same concurrency:
//!
//! - `raw-evalsha`: the GCRA script called directly on Redis (the ceiling for
//!   a shared limiter);
//! - `gateway`: `RateLimiter::check` (the same script, plus the timeout and
//!   the fallback bookkeeping);
//! - `governor`: the `governor` crate's keyed GCRA in process (no network; the
//!   gateway's fallback).
//!
//! Needs Redis (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p flashsale-bench --example bench_gcra -- --concurrency 16 --seconds 3 --runs 5`

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use clap::Parser;
use flashsale_bench::{
    load::{Measured, closed_loop},
    median,
};
use gateway::ratelimit::{GCRA_LUA, Policy, RateLimiter, Settings, Source};
use governor::Quota;

/// Rate-limit decisions: the gateway's Redis GCRA vs raw EVALSHA vs governor.
#[derive(Debug, Parser)]
struct Options {
    /// Concurrent callers.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seconds per mode per run.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Runs; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Distinct users the callers pick from.
    #[arg(long, default_value_t = 10_000)]
    users: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Arc::new(Options::parse());
    let url = std::env::var("REDIS_URL")
        .map_err(|_| anyhow::anyhow!("REDIS_URL unset: eval \"$(e2e/local/stack env)\""))?;
    let client = redis::Client::open(url.as_str())?;
    let conn = redis::aio::ConnectionManager::new(client).await?;
    let policy = Policy {
        rate: NonZeroU32::new(1_000).ok_or_else(|| anyhow::anyhow!("rate"))?,
        burst: NonZeroU32::new(1_000).ok_or_else(|| anyhow::anyhow!("burst"))?,
    };
    let sale = format!("bench-gcra-{}", std::process::id());
    let mut settings = Settings::new(policy);
    // Measure the Redis path itself: never fall back during the benchmark.
    settings.redis_timeout = Duration::from_secs(1);
    // A connection of its own, as the baseline has: one multiplexed socket each.
    let limiter = RateLimiter::new(
        Some(flashsale_e2e::redis_connection::connect(&url).await?),
        settings,
    );
    let script = Arc::new(redis::Script::new(GCRA_LUA));
    let governor = Arc::new(governor::RateLimiter::keyed(
        Quota::per_second(policy.rate).allow_burst(policy.burst),
    ));

    let mut rows: Vec<(&str, Vec<Measured>)> = vec![
        ("raw-evalsha", vec![]),
        ("gateway", vec![]),
        ("governor", vec![]),
    ];
    // Warm up connections and the script cache; not measured.
    for _ in 0..1_000 {
        limiter.check(&format!("{sale}-warm"), "u").await;
    }
    for run in 0..opts.runs {
        let raw = raw_evalsha(&opts, &conn, &script, policy, format!("{sale}-raw")).await?;
        let gateway = through_gateway(&opts, &limiter, sale.clone()).await?;
        let local = in_process(&opts, governor.clone()).await?;
        eprintln!(
            "run {run}: raw {:.0}/s p99 {:.0} µs, gateway {:.0}/s p99 {:.0} µs, governor {:.0}/s p99 {:.1} µs",
            raw.per_second(),
            raw.p99_us(),
            gateway.per_second(),
            gateway.p99_us(),
            local.per_second(),
            local.p99_us()
        );
        rows[0].1.push(raw);
        rows[1].1.push(gateway);
        rows[2].1.push(local);
    }
    report(&rows);

    // Leave Redis as found.
    flashsale_e2e::redis_keys::unlink_matching(&url, &format!("fs:{{{sale}*")).await?;
    Ok(())
}

/// The GCRA script called straight on Redis for `sale`'s users.
async fn raw_evalsha(
    opts: &Options,
    conn: &redis::aio::ConnectionManager,
    script: &Arc<redis::Script>,
    policy: Policy,
    sale: String,
) -> anyhow::Result<Measured> {
    let (conn, script, users) = (conn.clone(), script.clone(), opts.users as u64);
    closed_loop(
        opts.concurrency,
        Duration::from_secs(opts.seconds),
        move |n| {
            let (mut conn, script, key) = (
                conn.clone(),
                script.clone(),
                RateLimiter::key(&sale, &format!("u{}", n % users)),
            );
            async move {
                let _: (i64, i64, i64, i64) = script
                    .key(key)
                    .arg(policy.interval_micros())
                    .arg(policy.burst.get())
                    .invoke_async(&mut conn)
                    .await?;
                Ok(())
            }
        },
    )
    .await?
    .check()
}

/// The gateway's limiter deciding for `sale`'s users, on Redis every time.
async fn through_gateway(
    opts: &Options,
    limiter: &RateLimiter,
    sale: String,
) -> anyhow::Result<Measured> {
    let (limiter, users) = (limiter.clone(), opts.users as u64);
    closed_loop(
        opts.concurrency,
        Duration::from_secs(opts.seconds),
        move |n| {
            let (limiter, sale) = (limiter.clone(), sale.clone());
            async move {
                let decision = limiter.check(&sale, &format!("u{}", n % users)).await;
                anyhow::ensure!(decision.source == Source::Redis, "fell back to local");
                Ok(())
            }
        },
    )
    .await?
    .check()
}

/// The `governor` crate's keyed GCRA in this process.
async fn in_process(
    opts: &Options,
    governor: Arc<governor::DefaultKeyedRateLimiter<String>>,
) -> anyhow::Result<Measured> {
    let users = opts.users as u64;
    closed_loop(
        opts.concurrency,
        Duration::from_secs(opts.seconds),
        move |n| {
            let _ = governor.check_key(&format!("u{}", n % users));
            async { Ok(()) }
        },
    )
    .await?
    .check()
}

/// Prints each mode's medians and the gateway's same-run ratios to the raw
/// script.
fn report(rows: &[(&str, Vec<Measured>)]) {
    println!("| mode | decisions/s | p50 µs | p99 µs |");
    println!("|---|---|---|---|");
    let of = |values: Vec<f64>| median(values).unwrap_or(f64::NAN);
    for (name, samples) in rows {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} |",
            of(samples.iter().map(Measured::per_second).collect()),
            of(samples.iter().map(Measured::p50_us).collect()),
            of(samples.iter().map(Measured::p99_us).collect()),
        );
    }
    let ratio = |a: usize, b: usize, f: fn(&Measured) -> f64| {
        of(rows[a]
            .1
            .iter()
            .zip(&rows[b].1)
            .map(|(x, y)| f(x) / f(y))
            .collect())
    };
    println!(
        "gateway / raw-evalsha: p99 {:.2}×, throughput {:.2}× (same-run ratios, median)",
        ratio(1, 0, Measured::p99_us),
        ratio(1, 0, Measured::per_second)
    );
}
