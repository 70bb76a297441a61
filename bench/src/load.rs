//! The two ways the benchmarks load what they measure: a closed loop (a
//! fixed number of workers, each calling again as soon as it is answered,
//! for a fixed time) and an open loop (calls on a fixed schedule, whatever
//! the answers, a fixed number of times).
//!
//! Both give every call its number (0, 1, 2, …, unique within the run),
//! time the calls that succeed, and count the ones that fail without
//! stopping: the caller decides whether a failure spoils the run
//! ([`Measured::check`]).

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::Recorder;

/// What one run of a driver measured.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// How long the run took, from the first call's start to the last answer.
    pub elapsed: Duration,
    /// Latencies of the calls that succeeded: from the call's start (closed
    /// loop) or from its scheduled time (open loop).
    pub latency: Recorder,
    /// Open loop: how late each call started after its scheduled time
    /// (every worker busy, or the client itself slow); empty for a closed
    /// loop.
    pub late: Recorder,
    /// Calls that failed (not in `latency`).
    pub errors: u64,
    /// The first failure, as text.
    pub first_error: Option<String>,
}

impl Measured {
    /// Successful calls per second.
    pub fn per_second(&self) -> f64 {
        self.latency.len() as f64 / self.elapsed.as_secs_f64()
    }

    /// The `q` latency quantile in µs; NaN without a successful call.
    pub fn latency_us(&self, q: f64) -> f64 {
        self.latency.quantile_us(q)
    }

    /// The median latency in µs.
    pub fn p50_us(&self) -> f64 {
        self.latency_us(0.5)
    }

    /// The 99th percentile latency in µs.
    pub fn p99_us(&self) -> f64 {
        self.latency_us(0.99)
    }

    /// The 99th percentile of late starts in µs; NaN for a closed loop.
    pub fn late_p99_us(&self) -> f64 {
        self.late.quantile_us(0.99)
    }

    /// The run, or the first failure when any call failed.
    pub fn check(self) -> anyhow::Result<Self> {
        match self.first_error {
            Some(error) => anyhow::bail!("{} calls failed, the first: {error}", self.errors),
            None => Ok(self),
        }
    }

    /// Adds one worker's share.
    fn add(&mut self, share: Share) {
        self.latency.add(&share.latency);
        self.late.add(&share.late);
        self.errors += share.errors;
        if self.first_error.is_none() {
            self.first_error = share.first_error;
        }
    }
}

/// What one worker measured.
#[derive(Default)]
struct Share {
    latency: Recorder,
    late: Recorder,
    errors: u64,
    first_error: Option<String>,
}

impl Share {
    /// Notes one call's outcome, its latency measured from `since`.
    fn note(&mut self, outcome: anyhow::Result<()>, since: Instant) {
        match outcome {
            Ok(()) => self.latency.record(since.elapsed()),
            Err(error) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| format!("{error:#}"));
            }
        }
    }
}

/// `workers` workers call `op` back to back until `duration` has passed
/// (each call starts before then), each call with its number.
pub async fn closed_loop<F, Fut>(
    workers: usize,
    duration: Duration,
    op: F,
) -> anyhow::Result<Measured>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    anyhow::ensure!(workers > 0, "a closed loop needs a worker");
    let (op, next) = (Arc::new(op), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                let mut share = Share::default();
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let start = Instant::now();
                    share.note(op(n).await, start);
                }
                share
            })
        })
        .collect();
    collect(tasks, started).await
}

/// An HTTP client for a load: connections pooled for up to 1024 callers,
/// each request bounded by 10 s.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

/// `workers` callers send the request `build` makes for each call number,
/// back to back for `duration` (a [`closed_loop`]); a call whose status is
/// not in `answers` is an error, and any error fails the measurement
/// ([`Measured::check`]).
pub async fn http_closed_loop<B>(
    workers: usize,
    duration: Duration,
    answers: &'static [u16],
    build: B,
) -> anyhow::Result<Measured>
where
    B: Fn(u64) -> reqwest::RequestBuilder + Send + Sync + 'static,
{
    let build = Arc::new(build);
    closed_loop(workers, duration, move |n| {
        let request = build(n);
        async move {
            let response = request.send().await?;
            let status = response.status().as_u16();
            response.bytes().await?;
            anyhow::ensure!(answers.contains(&status), "unexpected HTTP {status}");
            Ok(())
        }
    })
    .await?
    .check()
}

/// Calls `op` `rate` times a second for `duration` on a fixed schedule
/// (`rate × duration` calls, rounded), whatever the answers. `workers`
/// tasks take the scheduled slots in order, each waiting for its slot's
/// time; a call's latency runs from that time, not from when it was sent,
/// so a call that starts late counts its wait. The workers bound the calls
/// in flight, and so the connections. Each call gets its slot's number.
pub async fn open_loop<F, Fut>(
    workers: usize,
    rate: f64,
    duration: Duration,
    op: F,
) -> anyhow::Result<Measured>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    anyhow::ensure!(workers > 0, "an open loop needs a worker");
    anyhow::ensure!(
        rate.is_finite() && rate > 0.0,
        "an open loop needs a positive rate, not {rate}"
    );
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let (op, next) = (Arc::new(op), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                let mut share = Share::default();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= total {
                        break;
                    }
                    let due = started + Duration::from_secs_f64(n as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                    share.late.record(due.elapsed());
                    share.note(op(n).await, due);
                }
                share
            })
        })
        .collect();
    collect(tasks, started).await
}

/// Every worker's share, once all are done.
async fn collect(
    tasks: Vec<tokio::task::JoinHandle<Share>>,
    started: Instant,
) -> anyhow::Result<Measured> {
    let mut measured = Measured::default();
    for task in tasks {
        measured.add(task.await?);
    }
    measured.elapsed = started.elapsed();
    Ok(measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_closed_loop_calls_until_the_time_is_up() -> anyhow::Result<()> {
        let measured = closed_loop(4, Duration::from_millis(100), |_| async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(())
        })
        .await?
        .check()?;
        // 4 workers, 5 ms a call, 100 ms: about 80 calls.
        assert!((40..=84).contains(&measured.latency.len()), "{measured:?}");
        assert!(measured.elapsed >= Duration::from_millis(100));
        assert!(measured.p50_us() >= 5_000.0, "{measured:?}");
        assert!(measured.late.is_empty());
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_open_loop_makes_every_scheduled_call_once() -> anyhow::Result<()> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let calls = seen.clone();
        let measured = open_loop(2, 200.0, Duration::from_millis(250), move |n| {
            let calls = calls.clone();
            async move {
                calls.lock().map_err(|e| anyhow::anyhow!("{e}"))?.push(n);
                Ok(())
            }
        })
        .await?
        .check()?;
        let mut numbers = seen.lock().map_err(|e| anyhow::anyhow!("{e}"))?.clone();
        numbers.sort_unstable();
        assert_eq!(numbers, (0..50).collect::<Vec<u64>>());
        assert_eq!(measured.latency.len(), 50);
        assert_eq!(measured.late.len(), 50);
        // The last slot is at 245 ms.
        assert!(measured.elapsed >= Duration::from_millis(245));
        Ok(())
    }

    #[tokio::test]
    async fn failures_are_counted_and_checked() -> anyhow::Result<()> {
        let measured = open_loop(1, 1_000.0, Duration::from_millis(10), |n| async move {
            anyhow::ensure!(n % 2 == 0, "odd call {n}");
            Ok(())
        })
        .await?;
        assert_eq!((measured.latency.len(), measured.errors), (5, 5));
        assert_eq!(measured.first_error.as_deref(), Some("odd call 1"));
        let refused = measured.check().err().map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some("5 calls failed, the first: odd call 1")
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_loop_without_workers_or_rate_is_refused() {
        let op = |_| async { Ok(()) };
        assert!(closed_loop(0, Duration::from_millis(1), op).await.is_err());
        assert!(
            open_loop(1, 0.0, Duration::from_millis(1), op)
                .await
                .is_err()
        );
        assert!(
            open_loop(1, f64::NAN, Duration::from_millis(1), op)
                .await
                .is_err()
        );
    }
}
