//! The FlashSale controller.

pub mod build;
