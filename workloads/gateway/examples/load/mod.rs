//! The load drivers the gateway benchmarks share: a closed loop (as fast as
//! a fixed number of clients can) and an open loop (a fixed schedule).

#![allow(dead_code)] // each benchmark uses its own subset

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Throughput and latency of one measured run.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Calls per second.
    pub per_second: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Open loop: the 99th percentile of how late calls started after their
    /// scheduled time (every worker busy, or the client itself slow), µs; 0
    /// for a closed loop.
    pub late_p99_us: f64,
}

/// The median of `values` (0 when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Runs `decide` from `concurrency` tasks for `seconds`, each call for one
/// of `users` user names, timing every call (a closed loop).
pub async fn drive<F, Fut>(
    concurrency: usize,
    seconds: u64,
    users: usize,
    decide: F,
) -> anyhow::Result<Sample>
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let decide = Arc::new(decide);
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let decide = decide.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = worker;
            while Instant::now() < until {
                let user = format!("u{}", n % users);
                n += 7;
                let t = Instant::now();
                decide(user).await?;
                latencies.push(t.elapsed().as_nanos() as f64 / 1_000.0);
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(summarize(all, Vec::new(), started.elapsed()))
}

/// Calls `op` `rate` times a second for `seconds` on a fixed schedule,
/// whatever the answers (an open loop). `workers` tasks take the scheduled
/// slots in order, each waiting for its slot's time; a call's latency runs
/// from that time, not from when it was sent, so a call that starts late
/// (every worker busy, or the client itself slow) counts its wait. The
/// workers bound the calls in flight, and so the connections. Each call gets
/// its slot's number.
pub async fn drive_open<F, Fut>(
    workers: usize,
    rate: f64,
    seconds: u64,
    op: F,
) -> anyhow::Result<Sample>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    anyhow::ensure!(rate > 0.0, "an open loop needs a positive rate, not {rate}");
    let op = Arc::new(op);
    let total = (rate * seconds as f64).round() as u64;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (op, next) = (op.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut late) = (Vec::new(), Vec::new());
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break;
                }
                let due = started + Duration::from_secs_f64(n as f64 / rate);
                tokio::time::sleep_until(due.into()).await;
                late.push(due.elapsed().as_nanos() as f64 / 1_000.0);
                op(n).await?;
                latencies.push(due.elapsed().as_nanos() as f64 / 1_000.0);
            }
            anyhow::Ok((latencies, late))
        }));
    }
    let (mut all, mut late) = (Vec::new(), Vec::new());
    for task in tasks {
        let (latencies, lates) = task.await??;
        all.extend(latencies);
        late.extend(lates);
    }
    Ok(summarize(all, late, started.elapsed()))
}

/// Throughput and percentiles of the latencies (µs) of calls made in
/// `elapsed`, and of how late they started (µs; empty for a closed loop).
fn summarize(mut all: Vec<f64>, mut late: Vec<f64>, elapsed: Duration) -> Sample {
    all.sort_by(f64::total_cmp);
    late.sort_by(f64::total_cmp);
    Sample {
        per_second: all.len() as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
        late_p99_us: percentile(&late, 0.99),
    }
}

/// The `q` quantile of sorted `values` (0 when empty).
fn percentile(values: &[f64], q: f64) -> f64 {
    values
        .get(((values.len() as f64 * q) as usize).min(values.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}
