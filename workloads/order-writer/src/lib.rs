//! The order-writer: drains order events from Kafka into SQL in idempotent
//! batches. `sink` writes a batch to PostgreSQL or a MySQL-protocol database
//! in one transaction; `writer` is the consume → store → commit loop.

pub mod metrics;
pub mod sink;
pub mod writer;
