//! A FlashSale's children as every controller sees them: their names, their
//! labels and the owner metadata they carry (the contract of
//! `docs/architecture.md`, "API"). The FlashSale controller builds them; the
//! DegradationPolicy controller writes the switches ConfigMap among them and
//! the ChaosDrill controller selects their pods.

mod error;
pub mod labels;
pub mod names;
mod owner;
mod switches;

pub use error::BuildError;
pub use labels::{
    COMPONENT_KEY, MANAGED_BY, MANAGED_BY_KEY, NAME_KEY, PART_OF_KEY, labels, selector,
};
pub use names::Component;
pub use owner::Owner;
pub use switches::degradation_config_map;

/// The ops port (`/healthz`, `/readyz`, `/metrics`) of every workload, where
/// the operator scrapes and probes them.
pub const OPS_PORT_NUMBER: u16 = 9090;
