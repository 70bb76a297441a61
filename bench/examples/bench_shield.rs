//! The bot shield's costs, measured in the same run:
//!
//! - **verification**: joins answered per second by an axum server whose
//!   handler checks the request's proof (`Shield::check`: one HMAC, one
//!   SHA-256 block, no Redis), and by the same server whose handler answers
//!   at once (bare axum), over HTTP on loopback, the two alternated run by
//!   run. Their ratio is what checking a proof costs a join; in process,
//!   the check's own time against one SHA-256 block;
//! - **work**: hashes per second of `work::solve` on one core (what a
//!   script runs), and so the time one join costs at each difficulty,
//!   `2^bits` hashes on average. A browser's figures come from the page's
//!   test (`workloads/gateway/tests/bot_shield.rs`).
//!
//! Needs only loopback. Run:
//! `cargo run --release -p flashsale-bench --example bench_shield -- --concurrency 32 --seconds 3 --runs 5`

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use clap::Parser;
use flashsale_bench::{
    load::{Measured, http_client, http_closed_loop},
    median,
};
use gateway::{
    bot_shield::{PROOF_HEADER, Settings, Shield, work},
    waiting_room::Signer,
};
use serde_json::json;

/// The bot shield: proof verification against bare axum, and the work per join.
#[derive(Debug, Parser)]
struct Options {
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per server per run.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Runs; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Difficulties whose work is measured.
    #[arg(long, value_delimiter = ',', default_value = "8,12,16,20")]
    bits: Vec<u8>,
}

const USER: &str = "bench-user";
const KEY: &[u8] = b"bench key of the waiting room, 32+ bytes";

/// A server of `router` on loopback; its base URL.
async fn serve(router: Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(url)
}

/// What both servers answer a good join.
fn queued() -> (StatusCode, Json<serde_json::Value>) {
    (StatusCode::ACCEPTED, Json(json!({"status": "queued"})))
}

/// POSTs joins with `proof` to `url`, closed-loop, counting only 202.
async fn joins(opts: &Options, url: &str, proof: &str) -> anyhow::Result<Measured> {
    let http = http_client();
    let (url, proof) = (format!("{url}/join"), proof.to_owned());
    let seconds = Duration::from_secs(opts.seconds);
    http_closed_loop(opts.concurrency, seconds, &[202], move |_| {
        http.post(&url).header(PROOF_HEADER, &proof)
    })
    .await
}

/// The median of per-run figures.
fn of(values: impl IntoIterator<Item = f64>) -> f64 {
    median(values).unwrap_or(f64::NAN)
}

/// Nanoseconds per call of `f`, over `calls` calls.
fn ns_per_call(calls: u32, mut f: impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..calls {
        f();
    }
    started.elapsed().as_secs_f64() * 1e9 / f64::from(calls)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    let shield = Shield::signing(
        Arc::new(Signer::new(KEY)?),
        "bench-sale".to_owned(),
        Settings {
            difficulty_bits: vec![12],
            challenge_ttl: Duration::from_secs(3_600),
        },
    );
    let issued = shield.issue(USER, 0, 1_700_000_000_000);
    let mac = work::mac_of(&issued.token).ok_or_else(|| anyhow::anyhow!("no MAC"))?;
    let (solution, _) = work::solve(&mac, issued.difficulty);
    let proof = format!("{}:{solution}", issued.token);
    anyhow::ensure!(shield.check(&proof, USER).is_ok(), "the proof checks");
    in_process(&opts, &shield, &proof, (&mac, solution));
    over_http(&opts, &shield, &proof).await?;
    work_per_join(&opts, &shield)
}

/// The check against one SHA-256 block, in process.
fn in_process(opts: &Options, shield: &Shield, proof: &str, (mac, solution): (&[u8; 32], u64)) {
    let mut checks = Vec::new();
    let mut hashes = Vec::new();
    for _ in 0..opts.runs {
        checks.push(ns_per_call(200_000, || {
            black_box(shield.check(black_box(proof), USER)).ok();
        }));
        hashes.push(ns_per_call(200_000, || {
            black_box(work::hash(black_box(mac), black_box(solution)));
        }));
    }
    println!(
        "in process: Shield::check {:.0} ns, one SHA-256 block {:.0} ns (medians of {} runs)",
        of(checks.iter().copied()),
        of(hashes.iter().copied()),
        opts.runs
    );
}

/// Joins over HTTP with the proof checked against bare axum, alternated.
async fn over_http(opts: &Options, shield: &Shield, proof: &str) -> anyhow::Result<()> {
    let bare = serve(Router::new().route("/join", post(|| async { queued() }))).await?;
    let checking = {
        let shield = shield.clone();
        Router::new().route(
            "/join",
            post(move |headers: HeaderMap| {
                let shield = shield.clone();
                async move {
                    let proof = headers.get(PROOF_HEADER).and_then(|v| v.to_str().ok());
                    match proof.map(|proof| shield.check(proof, USER)) {
                        Some(Ok(_)) => queued(),
                        _ => (StatusCode::FORBIDDEN, Json(json!({"error": "forged"}))),
                    }
                }
            }),
        )
    };
    let checking = serve(checking).await?;
    let (mut bare_runs, mut checking_runs) = (Vec::new(), Vec::new());
    for run in 0..opts.runs {
        if run % 2 == 0 {
            bare_runs.push(joins(opts, &bare, proof).await?);
            checking_runs.push(joins(opts, &checking, proof).await?);
        } else {
            checking_runs.push(joins(opts, &checking, proof).await?);
            bare_runs.push(joins(opts, &bare, proof).await?);
        }
    }
    for (name, runs) in [
        ("bare axum", &bare_runs),
        ("checking the proof", &checking_runs),
    ] {
        println!(
            "{name:<20} {:>9.0} joins/s   p50 {:>6.0} µs   p99 {:>6.0} µs",
            of(runs.iter().map(Measured::per_second)),
            of(runs.iter().map(Measured::p50_us)),
            of(runs.iter().map(Measured::p99_us)),
        );
    }
    let cost: Vec<f64> = bare_runs
        .iter()
        .zip(&checking_runs)
        .map(|(bare, checking)| bare.per_second() / checking.per_second())
        .collect();
    println!(
        "time per join, checking ÷ bare: {:.3} (runs: {})",
        of(cost.iter().copied()),
        cost.iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// The work: hashes per join and time per join on one core.
fn work_per_join(opts: &Options, shield: &Shield) -> anyhow::Result<()> {
    println!("bits  hashes/join (mean)  expected  ms/join (native, one core)");
    for &bits in &opts.bits {
        let joins_measured: u32 = if bits <= 16 { 64 } else { 8 };
        let started = Instant::now();
        let mut total = 0u64;
        for n in 0..joins_measured {
            let challenge = shield.issue(&format!("u{n}"), 0, 1_700_000_000_000);
            let mac = work::mac_of(&challenge.token).ok_or_else(|| anyhow::anyhow!("no MAC"))?;
            total += work::solve(&mac, bits).1;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let mean = total as f64 / f64::from(joins_measured);
        println!(
            "{bits:>4}  {mean:>18.0}  {:>8.0}  {:>10.2}",
            2f64.powi(i32::from(bits)),
            elapsed * 1e3 / f64::from(joins_measured)
        );
    }
    Ok(())
}
