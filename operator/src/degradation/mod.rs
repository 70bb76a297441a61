//! The DegradationPolicy controller: reads a sale's load signal from
//! Prometheus, decides the degradation tier with hysteresis, a hold-down, a
//! signal-loss rule and on-call's override, writes the sale's switches
//! ConfigMap and measures how fast every gateway applies it.

pub mod decide;
pub mod propagation;
pub mod signal;
