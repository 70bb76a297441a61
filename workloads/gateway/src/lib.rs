//! The flash-sale gateway: the only public entry, shedding load cheaply
//! before it reaches stock or orders. `ratelimit` is the per-user GCRA limit.

pub mod ratelimit;
