//! The flash-sale inventory: stock reservations in Redis that never oversell.
//! `keys` documents the Redis key schema; `store` holds the scripts and the
//! reservation protocol; `coalesce` gathers concurrent reservations of a SKU
//! into one script call, and `fence` confirms them under the replicated
//! policy without holding up the next call; `api` is the HTTP face; `sweeper` returns unpaid
//! stock; `outbox` announces lapsed and cancelled orders to the order
//! stream; `standby` holds sales while Redis is a standby region's
//! read-only replica; `auth` guards the API.

pub mod api;
pub mod auth;
pub mod coalesce;
pub mod fence;
pub mod metrics;
pub mod outbox;
pub mod periodic;
mod queues;
pub mod standby;
pub mod store;
pub mod sweeper;

/// The Redis key schema, shared with the gateway and the operator.
pub use flashsale_inventory_api::keys;
