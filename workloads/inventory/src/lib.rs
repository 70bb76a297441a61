//! The flash-sale inventory: stock reservations in Redis that never oversell.
//! `keys` documents the Redis key schema; `store` holds the scripts and the
//! reservation protocol; `api` is the HTTP face; `sweeper` returns unpaid stock.

pub mod api;
pub mod keys;
pub mod metrics;
pub mod store;
pub mod sweeper;
