//! The flash-sale operator: API types, CRD generation and the controllers of
//! FlashSale (and, in later stages, DegradationPolicy and ChaosDrill).

pub mod api;
pub mod apply;
pub mod clock;
pub mod context;
pub mod crdgen;
pub mod degradation;
pub mod error;
pub mod flashsale;
pub mod leader;
pub mod metrics;
pub mod run;
pub mod validate;
