//! The FlashSale controller's error: the shared path's failures, and the
//! children that could not be built.

use super::build::BuildError;
use crate::kit::{self, ReconcileError};

/// A FlashSale reconcile that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing through the shared path failed.
    #[error(transparent)]
    Kit(#[from] kit::Error),
    /// The children could not be built.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_typed_not_parsed() {
        let not_leader = Error::from(kit::Error::NotLeader);
        assert!(not_leader.not_leader());
        assert_eq!(not_leader.reason(), "NotLeader");
        let missing = Error::from(kit::Error::MissingMetadata("metadata.uid"));
        assert!(!missing.not_leader());
        assert_eq!(missing.reason(), "InvalidObject");
        let encode = serde_json::from_str::<u8>("x").map_err(kit::Error::from);
        assert!(matches!(encode, Err(ref e) if e.reason() == "EncodeFailed"));
    }
}
