//! The process runtime every flash-sale binary shares: command-line
//! conventions, structured logging, the ops HTTP endpoints (`/healthz`,
//! `/readyz`, `/metrics`) and graceful shutdown.
//!
//! Business logic lives in the binaries; this crate only gives them one way
//! to be observed and stopped, so that an SRE sees the same surface on the
//! gateway, the inventory, the order-writer and the operator.

mod allocator;
pub mod api_error;
pub mod cli;
pub mod metrics;
pub mod ops;
pub mod process;
pub mod readiness;
pub mod reaper;
pub mod redis;
pub mod shutdown;
pub mod telemetry;

pub use api_error::ApiError;

/// The answer header naming the region whose process served the request:
/// the gateway stamps it on every answer, and the operator's failover
/// checks read it behind the global endpoint.
pub const REGION_HEADER: &str = "flashsale-region";

pub use cli::{LogArgs, LogFormat, OpsArgs, RuntimeArgs};
pub use ops::{OpsServer, OpsServerError, register_process_info};
pub use process::{Process, ProcessError};
pub use readiness::{Readiness, ReadinessCheck, ReadinessReport};
pub use redis::{RedisConnection, RedisTarget, RedisTimeouts};
pub use shutdown::Shutdown;
