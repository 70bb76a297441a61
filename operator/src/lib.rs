//! The flash-sale operator: API types, CRD generation and the controllers of
//! FlashSale (and, in later stages, DegradationPolicy and ChaosDrill).

pub mod api;
pub mod apply;
pub mod clock;
pub mod crdgen;
pub mod degradation;
pub mod drill;
pub mod flashsale;
pub mod kit;
pub mod leader;
pub mod metrics;
pub mod run;
pub mod validate;
