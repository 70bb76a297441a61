//! Condition types, in one place so every controller and every test speaks
//! the same words; their reasons are in [`crate::reasons`].

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
/// A ChaosDrill's standby region can take the sale over: it exists and is
/// Ready, has the capacity, its replication is within bounds and the global
/// endpoint sees it healthy. The reason names the first check that failed.
pub const STANDBY_READY: &str = "StandbyReady";
