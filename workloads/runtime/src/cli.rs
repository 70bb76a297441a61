//! Flags every binary accepts, flattened into its own clap parser.

use std::net::SocketAddr;

use clap::{Args, ValueEnum};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, for a terminal.
    Text,
    /// One JSON object per line, for log collectors in a cluster.
    Json,
}

/// Logging flags.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter in `tracing` EnvFilter syntax, e.g. `info,flashsale=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
}

/// Flags of the ops HTTP server (`/healthz`, `/readyz`, `/metrics`).
#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    /// Address of the ops endpoints. Keep it off the public listener: metrics
    /// and readiness are for the cluster, not for shoppers.
    #[arg(long, env = "OPS_ADDR", default_value = "0.0.0.0:9090")]
    pub ops_addr: SocketAddr,
}

/// Every flag the runtime owns, for binaries to flatten into their parser.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// Logging flags.
    #[command(flatten)]
    pub log: LogArgs,
    /// Ops server flags.
    #[command(flatten)]
    pub ops: OpsArgs,
}
