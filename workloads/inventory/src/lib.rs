//! The flash-sale inventory: stock reservations in Redis that never oversell.
//! `keys` documents the Redis key schema; `store` holds the scripts and the
//! reservation protocol.

pub mod keys;
pub mod store;
