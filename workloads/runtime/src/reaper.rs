//! Reaping of orphaned processes when a workload is its container's PID 1.
//!
//! The images have no init, and the workloads start no children of their
//! own. But processes started in the container's PID namespace from outside
//! (chaos-daemon's stressors, `kubectl exec`) are handed to PID 1 when
//! their parent dies, and stay zombies until PID 1 reaps them: a stress
//! drill would leave one behind in every pod it touched.

use rustix::process::{WaitOptions, getpid, wait};
use tokio::signal::unix::{SignalKind, signal};

/// Reaps exited children for as long as the process runs, when it is PID 1
/// of its namespace; does nothing otherwise (a parent reaps, or an init
/// does).
pub fn start_if_init() -> std::io::Result<()> {
    if !getpid().is_init() {
        return Ok(());
    }
    let mut exited = signal(SignalKind::child())?;
    tokio::spawn(async move {
        loop {
            let reaped = reap();
            if reaped > 0 {
                tracing::debug!(reaped, "reaped exited processes handed to PID 1");
            }
            if exited.recv().await.is_none() {
                break;
            }
        }
    });
    Ok(())
}

/// Reaps every child that has exited, without waiting; how many.
pub fn reap() -> usize {
    let mut reaped = 0;
    while let Ok(Some(_)) = wait(WaitOptions::NOHANG) {
        reaped += 1;
    }
    reaped
}
