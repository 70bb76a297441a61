//! The order event (`flashsale.orders`, keyed by user id) and the producer
//! that publishes it: the contract between the gateway, which acknowledges an
//! order once its event is durably in Kafka, and the order-writer, which
//! stores it. See docs/architecture.md.

pub mod event;
pub mod producer;
pub mod user;

pub use event::{
    EventKind, ORDER_ID_PREFIX, OrderEvent, Poison, ReservedFacts, SCHEMA_VERSION, order_id,
    reservation_id,
};
pub use producer::{OrderProducer, ProduceError, ProducerSettings};
pub use user::{InvalidUserId, MAX_USER_ID_BYTES, check_user_id};
