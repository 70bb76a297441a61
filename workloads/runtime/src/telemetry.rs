//! Structured logging through `tracing`.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::cli::{LogArgs, LogFormat};

/// Errors setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter string does not parse.
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        /// The filter as given.
        filter: String,
        /// Why it does not parse.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("logging was already initialised: {0}")]
    AlreadyInitialised(#[from] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber described by `args`.
pub fn init(args: &LogArgs) -> Result<(), TelemetryError> {
    let filter = EnvFilter::try_new(&args.log_filter).map_err(|source| TelemetryError::Filter {
        filter: args.log_filter.clone(),
        source,
    })?;
    let registry = tracing_subscriber::registry().with(filter);
    match args.log_format {
        LogFormat::Text => registry.with(fmt::layer().with_target(true)).try_init()?,
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .try_init()?,
    }
    Ok(())
}
