//! The ops HTTP server: `/healthz`, `/readyz` and `/metrics`.

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::AtomicU64},
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{
    encoding::text::encode,
    metrics::{gauge::Gauge, info::Info},
    registry::{Registry, Unit},
};
use tokio::net::TcpListener;

use crate::{readiness::Readiness, shutdown::Shutdown};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Errors of the ops server.
#[derive(Debug, thiserror::Error)]
pub enum OpsServerError {
    /// The address could not be bound (in use, or not ours).
    #[error("cannot listen on {addr} for the ops endpoints: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Serving failed after the bind.
    #[error("ops server failed: {0}")]
    Serve(#[source] std::io::Error),
}

#[derive(Clone)]
struct OpsState {
    registry: Arc<Registry>,
    readiness: Readiness,
}

/// A bound ops server, ready to serve until shutdown.
pub struct OpsServer {
    listener: TcpListener,
    router: Router,
}

/// Registers `flashsale_build_info{component,version} 1`, so dashboards can
/// tell which build of which component a series comes from, and
/// `process_start_time_seconds` (now, Unix time), the series every
/// Prometheus client exports so that `changes()` over it counts restarts,
/// a killed container's included.
pub fn register_process_info(registry: &mut Registry, component: &str, version: &str) {
    let info = Info::new(vec![
        ("component".to_owned(), component.to_owned()),
        ("version".to_owned(), version.to_owned()),
    ]);
    registry.register("flashsale_build", "Build of this process", info);
    let started = Gauge::<f64, AtomicU64>::default();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    started.set(now.as_secs_f64());
    registry.register_with_unit(
        "process_start_time",
        "Start time of the process since the Unix epoch",
        Unit::Seconds,
        started,
    );
}

impl OpsServer {
    /// Binds `addr` and prepares the endpoints over `registry` and `readiness`.
    pub async fn bind(
        addr: SocketAddr,
        registry: Registry,
        readiness: Readiness,
    ) -> Result<Self, OpsServerError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| OpsServerError::Bind { addr, source })?;
        let state = OpsState {
            registry: Arc::new(registry),
            readiness,
        };
        let router = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(state);
        Ok(Self { listener, router })
    }

    /// Serves `routes` beside the ops endpoints (the operator's `/guard`).
    pub fn with_routes(mut self, routes: Router) -> Self {
        self.router = self.router.merge(routes);
        self
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, OpsServerError> {
        self.listener.local_addr().map_err(OpsServerError::Serve)
    }

    /// Serves until `shutdown` triggers.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), OpsServerError> {
        if let Ok(addr) = self.listener.local_addr() {
            tracing::info!(%addr, "ops endpoints listening (/healthz, /readyz, /metrics)");
        }
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await
            .map_err(OpsServerError::Serve)
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<OpsState>) -> Response {
    let report = state.readiness.report().await;
    let code = if report.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    if !report.ready {
        tracing::debug!(checks = ?report.checks, "not ready");
    }
    (code, Json(report)).into_response()
}

async fn metrics(State(state): State<OpsState>) -> Response {
    let mut body = String::new();
    match encode(&mut body, &state.registry) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(err) => {
            tracing::error!(%err, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics encoding failed\n",
            )
                .into_response()
        }
    }
}
