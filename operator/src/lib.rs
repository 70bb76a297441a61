//! The flash-sale operator: API types, CRD generation and (in later stages)
//! the controllers of FlashSale, DegradationPolicy and ChaosDrill.

pub mod api;
pub mod crdgen;
pub mod validate;
