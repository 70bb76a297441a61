//! The flash-sale operator binary's library: the process that runs the three
//! controllers (`run`) and the CRD generator (`crdgen`). The API types, the
//! kit and the controllers are crates of their own (see
//! `docs/architecture.md`, "The operator's crates").

pub mod crdgen;
pub mod run;
