//! What the machine and the local stack's processes are doing, from /proc:
//! the benchmarks report where the CPU went while they measured.

use std::path::PathBuf;

/// Busy and total jiffies of all CPUs, from the first line of /proc/stat.
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().sum();
    // idle and iowait
    let idle = values.get(3)? + values.get(4)?;
    Some((total - idle, total))
}

/// The stack's control-plane processes, by the PID files `e2e/local/stack`
/// keeps in its state folder (`FLASHSALE_STATE_DIR`).
pub fn stack_pids() -> Vec<(&'static str, u32)> {
    let Some(state) = std::env::var_os("FLASHSALE_STATE_DIR") else {
        return Vec::new();
    };
    let run = PathBuf::from(state).join("run");
    [
        "etcd",
        "apiserver",
        "controller-manager",
        "scheduler",
        "kwok",
    ]
    .into_iter()
    .filter_map(|name| {
        let text = std::fs::read_to_string(run.join(format!("{name}.pid"))).ok()?;
        let pid = text.split_whitespace().next()?.parse().ok()?;
        Some((name, pid))
    })
    .collect()
}
