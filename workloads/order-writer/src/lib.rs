//! The order-writer: drains order events from Kafka into SQL in idempotent
//! batches. `sink` writes a batch to PostgreSQL or a MySQL-protocol database
//! in one transaction.

pub mod sink;
