//! Condition types and reasons, in one place so every controller and every
//! test speaks the same words.

/// The object is doing what its spec asks.
pub const READY: &str = "Ready";
/// The operator is moving the object towards its spec.
pub const PROGRESSING: &str = "Progressing";
/// The operator cannot proceed until something changes; the reason says why.
pub const STALLED: &str = "Stalled";

/// Reasons, as `reason` of a condition (CamelCase, stable for alerting).
pub mod reasons {
    /// The spec passed the operator's own checks (those CEL cannot express).
    pub const SPEC_VALID: &str = "SpecValid";
    /// The spec failed the operator's own checks; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
}
