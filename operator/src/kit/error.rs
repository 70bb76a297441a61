//! The controllers' errors. Each has a reason, which becomes the Warning
//! Event's reason and the failure metric's label.

use crate::flashsale::build::BuildError;

/// A reconcile that could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This replica lost the lease: it must not write.
    #[error("this replica is not the leader, so it does not write")]
    NotLeader,
    /// An apiserver call failed.
    #[error("{action} {kind} {name}: {source}")]
    Kube {
        /// What was being done (apply, create, delete, read, status).
        action: &'static str,
        /// Kind of the object.
        kind: &'static str,
        /// Its name.
        name: String,
        /// What the apiserver or the connection said.
        #[source]
        source: kube::Error,
    },
    /// The object lacks metadata the apiserver always sets.
    #[error("the object has no {0}")]
    MissingMetadata(&'static str),
    /// The children could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A status could not be encoded.
    #[error("encoding the status: {0}")]
    Encode(#[from] serde_json::Error),
}

impl Error {
    /// A stable CamelCase category, for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotLeader => "NotLeader",
            Self::Kube { action, .. } => match *action {
                "apply" => "ApplyFailed",
                "create" => "CreateFailed",
                "delete" => "DeleteFailed",
                "status" => "StatusUpdateFailed",
                _ => "ReadFailed",
            },
            Self::MissingMetadata(_) => "InvalidObject",
            Self::Build(_) => "BuildFailed",
            Self::Encode(_) => "EncodeFailed",
        }
    }
}
