//! One shutdown signal for every task of a process.

use tokio::sync::watch;

/// A cloneable handle that resolves once shutdown was requested, whether by
/// SIGTERM/SIGINT or by code calling [`Shutdown::trigger`].
#[derive(Debug, Clone)]
pub struct Shutdown {
    tx: std::sync::Arc<watch::Sender<bool>>,
    rx: watch::Receiver<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A handle not yet triggered.
    pub fn new() -> Self {
        let (tx, rx) = watch::channel(false);
        Self {
            tx: std::sync::Arc::new(tx),
            rx,
        }
    }

    /// A handle that also triggers on SIGTERM (how Kubernetes stops a pod)
    /// or SIGINT (Ctrl-C in a terminal).
    pub fn on_signals() -> Self {
        let shutdown = Self::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            let signal = wait_for_signal().await;
            tracing::info!(signal, "shutdown requested");
            trigger.trigger();
        });
        shutdown
    }

    /// Requests shutdown; every waiter wakes.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Whether shutdown was requested.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once shutdown was requested.
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        // An error means every sender is gone, which only happens at exit.
        let _ = rx.wait_for(|triggered| *triggered).await;
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => {
            // Without signal handlers Ctrl-C is the best we can still catch.
            let _ = tokio::signal::ctrl_c().await;
            "ctrl-c"
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> &'static str {
    let _ = tokio::signal::ctrl_c().await;
    "ctrl-c"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trigger_wakes_every_clone() {
        let shutdown = Shutdown::new();
        let a = shutdown.clone();
        let b = shutdown.clone();
        assert!(!a.is_triggered());
        let waiter = tokio::spawn(async move { b.wait().await });
        shutdown.trigger();
        a.wait().await;
        assert!(a.is_triggered());
        assert!(waiter.await.is_ok());
    }
}
