//! The closed-loop load driver the gateway benchmarks share.

#![allow(dead_code)] // each benchmark uses its own subset

use std::{
    sync::Arc,
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
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Sample {
        per_second: all.len() as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    })
}
