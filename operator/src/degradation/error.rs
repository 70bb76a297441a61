//! The DegradationPolicy controller's error.

use crate::{
    flashsale::build::BuildError,
    kit::{self, ReconcileError},
};

/// A DegradationPolicy reconcile that could not finish. What the policy's
/// owner must fix (a missing sale, a rival policy, a lost signal) is not an
/// error: it is a condition in the status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing through the shared path failed.
    #[error(transparent)]
    Kit(#[from] kit::Error),
    /// The switches ConfigMap could not be built from the sale.
    #[error(transparent)]
    Build(#[from] BuildError),
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        match self {
            Self::Kit(err) => err.reason(),
            Self::Build(_) => "BuildFailed",
        }
    }

    fn not_leader(&self) -> bool {
        matches!(self, Self::Kit(err) if err.not_leader())
    }
}
