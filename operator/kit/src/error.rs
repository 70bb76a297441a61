//! Errors of the shared read and write path, what a controller's error type
//! must say about itself, and the one the controllers that build objects share.

use flashsale_api::reasons::ErrorReason;

/// What a failed apiserver call was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Server-side apply.
    Apply,
    /// Create.
    Create,
    /// Delete.
    Delete,
    /// Get.
    Read,
    /// List.
    List,
    /// Status subresource write.
    Status,
}

impl Verb {
    /// The verb as log and error text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "apply",
            Self::Create => "create",
            Self::Delete => "delete",
            Self::Read => "read",
            Self::List => "list",
            Self::Status => "status",
        }
    }

    /// The stable reason of a failure of this verb.
    pub fn reason(self) -> ErrorReason {
        match self {
            Self::Apply => ErrorReason::ApplyFailed,
            Self::Create => ErrorReason::CreateFailed,
            Self::Delete => ErrorReason::DeleteFailed,
            Self::Status => ErrorReason::StatusUpdateFailed,
            Self::Read | Self::List => ErrorReason::ReadFailed,
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure any controller can meet on the shared path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This replica lost the lease: it must not write.
    #[error("this replica is not the leader, so it does not write")]
    NotLeader,
    /// An apiserver call failed.
    #[error("{verb} {kind} {name}: {source}")]
    Kube {
        /// What was being done.
        verb: Verb,
        /// Kind of the object.
        kind: &'static str,
        /// Its name (or the selector of a list).
        name: String,
        /// What the apiserver or the connection said.
        #[source]
        source: kube::Error,
    },
    /// An object the controller would write exists but is not its own (no
    /// controller reference to the object reconciled): taking it over
    /// would overwrite what someone else made.
    #[error(
        "{kind} {namespace}/{name} exists but was not made for this object (it has no controller \
         reference to it); rename or delete it, and the operator creates its own"
    )]
    NotOwned {
        /// Kind of the object.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The object lacks metadata the apiserver always sets.
    #[error("the object has no {0}")]
    MissingMetadata(&'static str),
    /// A status could not be encoded.
    #[error("encoding the status: {0}")]
    Encode(#[from] serde_json::Error),
    /// A kill switch refused the write.
    #[error("{0}")]
    KillSwitch(String),
    /// The run the write belonged to is being stopped.
    #[error("the run is being stopped: no more of its objects are created")]
    RunStopped,
}

impl Error {
    /// The mapper of a failed call: `api.get(n).await.map_err(Error::kube(Verb::Read, "Secret", n))`.
    pub fn kube(
        verb: Verb,
        kind: &'static str,
        name: impl Into<String>,
    ) -> impl FnOnce(kube::Error) -> Self {
        let name = name.into();
        move |source| Self::Kube {
            verb,
            kind,
            name,
            source,
        }
    }
}

/// What the reconcile wrapper needs of a controller's own error type.
pub trait ReconcileError: std::error::Error + Send + Sync + 'static {
    /// A stable CamelCase category: the Warning Event's reason and the
    /// failure metric's label.
    fn reason(&self) -> ErrorReason;

    /// Whether it only says this replica stopped leading, which is neither
    /// logged as a failure nor published as an Event.
    fn not_leader(&self) -> bool;
}

impl ReconcileError for Error {
    fn reason(&self) -> ErrorReason {
        match self {
            Self::NotLeader => ErrorReason::NotLeader,
            Self::Kube { verb, .. } => verb.reason(),
            Self::NotOwned { .. } => ErrorReason::ObjectNotOwned,
            Self::MissingMetadata(_) => ErrorReason::InvalidObject,
            Self::Encode(_) => ErrorReason::EncodeFailed,
            Self::KillSwitch(_) => ErrorReason::KillSwitch,
            Self::RunStopped => ErrorReason::RunStopped,
        }
    }

    fn not_leader(&self) -> bool {
        matches!(self, Self::NotLeader)
    }
}

/// A reconcile that could not finish, for a controller that builds the
/// objects it writes (FlashSale, DegradationPolicy): the shared path's
/// failures, and objects that could not be built. A controller with other
/// failures of its own has its own type.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Reading or writing through the shared path failed.
    #[error(transparent)]
    Kit(#[from] Error),
    /// An object could not be built from the one reconciled.
    #[error(transparent)]
    Build(#[from] flashsale_api::children::BuildError),
}

impl ReconcileError for Failure {
    fn reason(&self) -> ErrorReason {
        match self {
            Self::Kit(err) => err.reason(),
            Self::Build(_) => ErrorReason::BuildFailed,
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
        let not_leader = Failure::from(Error::NotLeader);
        assert!(not_leader.not_leader());
        assert_eq!(not_leader.reason().as_str(), "NotLeader");
        let missing = Failure::from(Error::MissingMetadata("metadata.uid"));
        assert!(!missing.not_leader());
        assert_eq!(missing.reason().as_str(), "InvalidObject");
        let encode = serde_json::from_str::<u8>("x").map_err(Error::from);
        assert!(matches!(encode, Err(ref e) if e.reason().as_str() == "EncodeFailed"));
    }
}
