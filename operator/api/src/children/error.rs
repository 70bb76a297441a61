//! Why a build failed.

/// Why the objects of a sale could not be built. Every variant is a problem
/// of the FlashSale object itself, so retrying without a change is useless.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The sale lacks a metadata field every child needs (name and namespace
    /// for names, uid for the owner reference).
    #[error("the FlashSale has no metadata.{0}")]
    MissingMetadata(&'static str),
    /// A spec value does not fit the type the workload reads it as (the
    /// CRD's schema normally keeps it in range).
    #[error("{field} = {value} is out of range for the workload")]
    OutOfRange {
        /// Path of the spec field.
        field: &'static str,
        /// The value as written.
        value: String,
    },
    /// The spec breaks a rule the CRD's CEL validation normally enforces
    /// (e.g. exactly one of two fields), so there is no right object to build.
    #[error("{field}: {reason}")]
    InvalidSpec {
        /// Path of the spec field.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A workload configuration could not be rendered as JSON.
    #[error("cannot render a workload configuration: {0}")]
    Render(#[from] serde_json::Error),
}
