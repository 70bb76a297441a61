//! The flash-sale gateway library: the shedding layers and the order intake
//! behind the public API.

pub mod app;
pub mod auth;
pub mod bot_shield;
pub mod clock;
pub mod concurrency;
pub mod config;
pub mod degradation;
pub mod features;
pub mod inventory_client;
pub mod items;
pub mod metrics;
pub mod orders;
pub mod payments;
pub mod queue;
pub mod ratelimit;
pub mod server;
pub mod sold_out;
pub mod waiting_room;
pub mod window;
