//! The flash-sale operator: API types, CRD generation and the controllers of
//! FlashSale (and, in later stages, DegradationPolicy and ChaosDrill).

pub mod api;
pub mod crdgen;
pub mod flashsale;
pub mod leader;
pub mod validate;
