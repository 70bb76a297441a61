//! Rate-limit decisions, three ways in the same run at the same offered
//! rate (half of what Redis sustains for the script, measured first in the
//! same run):
//!
//! - `raw-evalsha`: the GCRA script called directly on Redis, the answer
//!   waiting for it (a limiter that decides in Redis);
//! - `gateway`: `RateLimiter::check`, which decides in process and charges
//!   the shared quota in Redis after the answer (the same script, every
//!   decision charged: the run fails if a charge failed);
//! - `governor`: the `governor` crate's keyed GCRA in process (no network; not
//!   shared between replicas).
//!
//! Needs Redis (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p flashsale-bench --example bench_gcra -- --concurrency 16 --seconds 3 --runs 5`

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use clap::Parser;
use flashsale_bench::{
    load::{Measured, closed_loop, open_loop},
    median,
};
use gateway::ratelimit::{Charges, GCRA_LUA, Policy, RateLimiter, Settings, Source};
use governor::Quota;

/// Rate-limit decisions: the gateway's shared GCRA vs raw EVALSHA vs governor.
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
    let charges = Charges::default();
    let limiter = RateLimiter::new(
        Some(flashsale_e2e::redis_connection::connect(&url).await?),
        settings,
        charges.clone(),
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
    // Warm up connections and the script cache; not measured. Paced, so
    // the charges keep up as they do for requests that wait for answers.
    for _ in 0..1_000 {
        limiter.check(&format!("{sale}-warm"), "u");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    for run in 0..opts.runs {
        let saturated =
            raw_evalsha(&opts, None, &conn, &script, policy, format!("{sale}-sat")).await?;
        let rate = saturated.per_second() / 2.0;
        let at = Some(rate);
        let raw = raw_evalsha(&opts, at, &conn, &script, policy, format!("{sale}-raw")).await?;
        let failed = charges.failed.get();
        let gateway = through_gateway(&opts, rate, &limiter, sale.clone()).await?;
        anyhow::ensure!(
            charges.failed.get() == failed,
            "{} charges failed: the gateway's decisions were not all shared",
            charges.failed.get() - failed
        );
        let local = in_process(&opts, rate, governor.clone()).await?;
        eprintln!(
            "run {run}: Redis saturated {:.0}/s; at {rate:.0}/s p99: raw {:.0} µs, gateway {:.1} µs, governor {:.1} µs",
            saturated.per_second(),
            raw.p99_us(),
            gateway.p99_us(),
            local.p99_us()
        );
        rows[0].1.push(raw);
        rows[1].1.push(gateway);
        rows[2].1.push(local);
    }
    println!(
        "charges to the shared quota: {} within, {} over, {} failed",
        charges.within.get(),
        charges.over.get(),
        charges.failed.get()
    );
    report(&rows);

    // Leave Redis as found.
    flashsale_e2e::redis_keys::unlink_matching(&url, &format!("fs:{{{sale}*")).await?;
    Ok(())
}

/// The GCRA script called straight on Redis for `sale`'s users: back to
/// back (`rate` `None`), or at `rate` a second.
async fn raw_evalsha(
    opts: &Options,
    rate: Option<f64>,
    conn: &redis::aio::ConnectionManager,
    script: &Arc<redis::Script>,
    policy: Policy,
    sale: String,
) -> anyhow::Result<Measured> {
    let (conn, script, users) = (conn.clone(), script.clone(), opts.users as u64);
    let op = move |n| {
        let (mut conn, script, key) = (
            conn.clone(),
            script.clone(),
            RateLimiter::key(&sale, &format!("u{}", n % users)),
        );
        async move {
            let _: (i64, i64, i64) = script
                .key(key)
                .arg(policy.interval_micros())
                .arg(policy.burst.get())
                .invoke_async(&mut conn)
                .await?;
            Ok(())
        }
    };
    let duration = Duration::from_secs(opts.seconds);
    match rate {
        None => closed_loop(opts.concurrency, duration, op).await?.check(),
        Some(rate) => open_loop(opts.concurrency, rate, duration, op)
            .await?
            .check(),
    }
}

/// The gateway's limiter deciding for `sale`'s users at `rate` a second,
/// each decision under the shared quota.
async fn through_gateway(
    opts: &Options,
    rate: f64,
    limiter: &RateLimiter,
    sale: String,
) -> anyhow::Result<Measured> {
    let (limiter, users) = (limiter.clone(), opts.users as u64);
    open_loop(
        opts.concurrency,
        rate,
        Duration::from_secs(opts.seconds),
        move |n| {
            let decision = limiter.check(&sale, &format!("u{}", n % users));
            async move {
                anyhow::ensure!(decision.source == Source::Redis, "fell back to local");
                Ok(())
            }
        },
    )
    .await?
    .check()
}

/// The `governor` crate's keyed GCRA in this process, at `rate` a second.
async fn in_process(
    opts: &Options,
    rate: f64,
    governor: Arc<governor::DefaultKeyedRateLimiter<String>>,
) -> anyhow::Result<Measured> {
    let users = opts.users as u64;
    open_loop(
        opts.concurrency,
        rate,
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
/// script at the same rate.
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
        "gateway / raw-evalsha at the same rate: p50 {:.3}×, p99 {:.3}× (same-run ratios, median)",
        ratio(1, 0, Measured::p50_us),
        ratio(1, 0, Measured::p99_us)
    );
}
