//! The steady state after a run: every sale Ready, nothing changing, the
//! operator left running for a while. Whatever it writes then is work an
//! unchanged cluster does not need.

use std::time::{Duration, Instant};

use flashsale_api::FlashSale;
use kube::{Api, api::ListParams};

use crate::{Operator, log_len, observe, observe::OperatorCounters, writes::Writes};

/// Progress lines at most this far apart.
const PROGRESS: Duration = Duration::from_secs(15);

/// What the operator did in the steady window.
#[derive(Debug, Clone, Default)]
pub struct Steady {
    pub secs: f64,
    /// Deltas of the operator's counters over the window.
    pub counters: OperatorCounters,
    /// The write lines of the window, once the log is read.
    pub writes: Option<Writes>,
    /// `VmRSS` at the end of the window.
    pub rss_mb: f64,
    /// `VmHWM` at the end of the window: the run's peak, steady state included.
    pub hwm_mb: f64,
    /// Sales Ready at the end of the window.
    pub ready_at_end: usize,
    /// Byte offsets of the operator's log at the start and end of the window.
    pub log_window: (u64, u64),
}

/// Leaves the operator alone for `secs` seconds, printing progress, and
/// returns what it did meanwhile.
pub async fn hold(
    operator: &Operator,
    sales: &Api<FlashSale>,
    secs: u64,
) -> anyhow::Result<Steady> {
    let pid = operator.pid();
    let before = OperatorCounters::parse(&operator.metrics().await?);
    let from = log_len(operator);
    let started = Instant::now();
    let window = Duration::from_secs(secs);
    println!("  steady state: leaving everything as is for {secs} s");
    while started.elapsed() < window {
        let left = window.saturating_sub(started.elapsed());
        tokio::time::sleep(left.min(PROGRESS)).await;
        let now = OperatorCounters::parse(&operator.metrics().await?);
        println!(
            "  steady {:.0}/{secs} s: {:.0} writes, {:.0} reconciles, operator RSS {:.0} MB",
            started.elapsed().as_secs_f64(),
            now.writes - before.writes,
            now.reconciles - before.reconciles,
            observe::memory_mb(pid, "VmRSS:").unwrap_or(f64::NAN)
        );
    }
    let after = OperatorCounters::parse(&operator.metrics().await?);
    let to = log_len(operator);
    let list = sales.list(&ListParams::default()).await?;
    let ready_at_end = list
        .items
        .iter()
        .filter_map(|s| s.status.as_ref())
        .filter(|s| s.observed.is_true("Ready"))
        .count();
    Ok(Steady {
        secs: started.elapsed().as_secs_f64(),
        counters: OperatorCounters {
            reconciles: after.reconciles - before.reconciles,
            reconcile_errors: after.reconcile_errors - before.reconcile_errors,
            reconcile_seconds: after.reconcile_seconds - before.reconcile_seconds,
            writes: after.writes - before.writes,
        },
        writes: None,
        rss_mb: observe::memory_mb(pid, "VmRSS:").unwrap_or(f64::NAN),
        hwm_mb: observe::memory_mb(pid, "VmHWM:").unwrap_or(f64::NAN),
        ready_at_end,
        log_window: (from, to),
    })
}

/// Prints the steady window.
pub fn report(s: &Steady, sales: usize) {
    let c = &s.counters;
    println!(
        "  steady state ({:.0} s after all Ready, {}/{sales} Ready at its end): {:.0} writes \
         (/metrics), {:.0} reconciles ({:.0} errors, mean {:.1} ms); operator VmRSS {:.1} MB at \
         the end, VmHWM {:.1} MB",
        s.secs,
        s.ready_at_end,
        c.writes,
        c.reconciles,
        c.reconcile_errors,
        c.mean_reconcile_ms(),
        s.rss_mb,
        s.hwm_mb
    );
    if let Some(writes) = &s.writes {
        writes.print("steady-state writes (operator log)");
    }
}
