//! The life of one process: logging, metrics registry, shutdown signal and
//! the ops server, set up the same way in every binary.

use prometheus_client::registry::Registry;

use crate::{
    cli::{LogArgs, OpsArgs},
    ops::{OpsServer, OpsServerError, register_process_info},
    readiness::Readiness,
    reaper,
    shutdown::Shutdown,
    telemetry::{self, TelemetryError},
};

/// Errors starting or running a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Logging could not be set up.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// The ops server could not bind or failed.
    #[error(transparent)]
    Ops(#[from] OpsServerError),
    /// As its container's PID 1, the process could not watch for exited
    /// children to reap.
    #[error("watching for exited processes to reap: {0}")]
    Reaper(std::io::Error),
}

/// A started process: logging is on, the registry holds the build info,
/// SIGTERM/SIGINT trigger [`Process::shutdown`] and, as its container's
/// PID 1, it reaps the processes handed to it.
pub struct Process {
    component: &'static str,
    registry: Registry,
    shutdown: Shutdown,
}

impl Process {
    /// Starts logging and the signal handler. Call once, inside the runtime.
    pub fn start(
        component: &'static str,
        version: &'static str,
        log: &LogArgs,
    ) -> Result<Self, ProcessError> {
        telemetry::init(log)?;
        reaper::start_if_init().map_err(ProcessError::Reaper)?;
        let mut registry = Registry::default();
        register_process_info(&mut registry, component, version);
        tracing::info!(component, version, "starting");
        Ok(Self {
            component,
            registry,
            shutdown: Shutdown::on_signals(),
        })
    }

    /// The registry the process' own metrics go into.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The process-wide shutdown handle.
    pub fn shutdown(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Serves the ops endpoints until shutdown.
    pub async fn serve_ops(self, ops: &OpsArgs, readiness: Readiness) -> Result<(), ProcessError> {
        self.serve_ops_with(ops, readiness, axum::Router::new())
            .await
    }

    /// Serves the ops endpoints and `routes` beside them until shutdown.
    pub async fn serve_ops_with(
        self,
        ops: &OpsArgs,
        readiness: Readiness,
        routes: axum::Router,
    ) -> Result<(), ProcessError> {
        let server = OpsServer::bind(ops.ops_addr, self.registry, readiness)
            .await?
            .with_routes(routes);
        server.serve(self.shutdown).await?;
        tracing::info!(component = self.component, "stopped");
        Ok(())
    }
}
