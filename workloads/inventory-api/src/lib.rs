//! The inventory's HTTP contract in one place: the routes ([`paths`]), the
//! JSON bodies and answers, and the error answer with its codes
//! ([`ErrorBody`], [`codes`]). The inventory serves it; the gateway (and
//! any other caller) uses the same types, so the two cannot drift apart.
//! The JSON of each type is the wire format, pinned by the tests beside it.
//! Beside it, the inventory's Redis key schema ([`keys`]), which the
//! gateway's own keys share a prefix with and a failover drill reads stock
//! through.

pub mod codes;
mod error;
pub mod keys;
pub mod paths;
mod reservations;
mod sales;
mod stock;

pub use error::ErrorBody;
pub use reservations::{
    MAX_BATCH, MemberAnswer, ORDER_ID_PREFIX, Reservation, ReservationState, ReserveBatchAnswer,
    ReserveBatchBody, ReserveBody, StateChange, order_id, reservation_id,
};
pub use sales::{ItemDefinition, LoadedItem, LoadedSale, SaleDefinition};
pub use stock::{AdjustBody, Adjustment, StockLevel};
