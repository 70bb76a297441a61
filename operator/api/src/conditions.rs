//! Condition types and reasons, in one place so every controller and every
//! test speaks the same words.

/// The object is doing what its spec asks.
pub const READY: &str = "Ready";
/// The operator is moving the object towards its spec.
pub const PROGRESSING: &str = "Progressing";
/// The operator cannot proceed until something changes; the reason says why.
pub const STALLED: &str = "Stalled";
/// A FlashSale's inventory answered the operator's stock reading.
pub const INVENTORY_REACHABLE: &str = "InventoryReachable";
/// An ended FlashSale has nothing left to write: every reservation is paid
/// or expired and the order-writer's lag is zero.
pub const DRAINED: &str = "Drained";
/// A DegradationPolicy's load signal was read and is fresh; while it is
/// `False`, the reason says what is wrong with it and `onSignalLoss` applies.
pub const SIGNAL_AVAILABLE: &str = "SignalAvailable";
/// A DegradationPolicy's switches have reached every ready gateway.
pub const PROPAGATED: &str = "Propagated";

/// Reasons, as `reason` of a condition (CamelCase, stable for alerting).
pub mod reasons {
    /// The spec passed the operator's own checks (those CEL cannot express).
    pub const SPEC_VALID: &str = "SpecValid";
    /// The spec failed the operator's own checks; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Nothing stands in the way.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// A Secret the spec names does not exist; the message names it.
    pub const SECRET_MISSING: &str = "SecretMissing";
    /// A Secret exists but lacks the key the spec names.
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    /// A Secret the operator makes for the sale (`<sale>-internal`) exists
    /// but belongs to something else; the message says how to clear it.
    pub const SECRET_NOT_OWNED: &str = "SecretNotOwned";
    /// An object the operator would make for the sale (a Deployment, a
    /// ConfigMap …) exists already and is not the sale's: the operator does
    /// not take it over; the message names it.
    pub const OBJECT_NOT_OWNED: &str = "ObjectNotOwned";
    /// A workload image of the spec is outside the operator's allowlist
    /// (`--allowed-image`); the message names each field.
    pub const IMAGE_NOT_ALLOWED: &str = "ImageNotAllowed";
    /// Every workload has all its desired replicas ready.
    pub const WORKLOADS_READY: &str = "WorkloadsReady";
    /// Some workload has fewer ready replicas than desired.
    pub const WORKLOADS_NOT_READY: &str = "WorkloadsNotReady";
    /// Some workload is still rolling out its current spec.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// Every workload runs its current spec.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// The inventory answered.
    pub const STOCK_READ: &str = "StockRead";
    /// The inventory did not answer in time; the message says what failed.
    pub const INVENTORY_UNREACHABLE: &str = "InventoryUnreachable";
    /// The workloads are scaled to zero, so there is nobody to ask.
    pub const SCALED_DOWN: &str = "ScaledDown";
    /// Reservations may still be paid, or the order-writer still has lag.
    pub const DRAINING: &str = "Draining";
    /// Nothing is left to persist.
    pub const ORDERS_DRAINED: &str = "OrdersDrained";
    /// Prefix of the Event reason of a phase change, followed by the new
    /// phase: `PhaseWarmingUp`, `PhaseLive`, `PhaseEnded`.
    pub const PHASE_EVENT_PREFIX: &str = "Phase";

    /// The FlashSale a DegradationPolicy or ChaosDrill names does not exist.
    pub const SALE_NOT_FOUND: &str = "SaleNotFound";
    /// Another DegradationPolicy already drives the same sale; the message
    /// names it.
    pub const CONFLICTING_POLICY: &str = "ConflictingPolicy";
    /// Event: the degradation tier in force changed; the note says from
    /// which, to which and why.
    pub const TIER_CHANGED: &str = "TierChanged";
    /// Event: an override took effect (or changed); the note names who set
    /// it, the tier, until when and why.
    pub const OVERRIDE_STARTED: &str = "OverrideStarted";
    /// Event: an override expired or was removed; the signal decides again.
    pub const OVERRIDE_ENDED: &str = "OverrideEnded";
    /// `spec.override` expires too far ahead and is not applied.
    pub const OVERRIDE_REFUSED: &str = "OverrideRefused";
    /// An override lapsed and no policy took the switches back: the
    /// operator lifted them.
    pub const OVERRIDE_EXPIRED: &str = "OverrideExpired";
    /// The load signal was read and is fresh.
    pub const SIGNAL_OK: &str = "SignalOk";
    /// Prometheus did not answer, or answered with an error status.
    pub const PROMETHEUS_UNREACHABLE: &str = "PrometheusUnreachable";
    /// Prometheus refused the query.
    pub const INVALID_QUERY: &str = "InvalidQuery";
    /// The query returned no sample.
    pub const EMPTY_RESULT: &str = "EmptyResult";
    /// The query returned NaN or an infinity.
    pub const NOT_A_NUMBER: &str = "NotANumber";
    /// The newest sample is older than `signal.staleAfter`.
    pub const STALE_SAMPLE: &str = "StaleSample";
    /// The query returned more than one sample, so none is the load.
    pub const AMBIGUOUS_RESULT: &str = "AmbiguousResult";
    /// Every ready gateway applies the current switches.
    pub const APPLIED: &str = "Applied";
    /// Some ready gateway does not apply the current switches yet.
    pub const NOT_APPLIED: &str = "NotApplied";
    /// The sale has no ready gateway to apply the switches.
    pub const NO_GATEWAYS: &str = "NoGateways";
}
