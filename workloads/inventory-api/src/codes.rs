//! The `error` codes of the inventory's own refusals and failures. Bodies
//! that do not parse, a missing token and unknown routes answer with the
//! codes every flash-sale API shares (`flashsale_runtime::ApiError`).

/// 404: the sale was never loaded into this inventory.
pub const UNKNOWN_SALE: &str = "unknown_sale";
/// 404: the sale has no such SKU.
pub const UNKNOWN_SKU: &str = "unknown_sku";
/// 404: no such reservation.
pub const UNKNOWN_RESERVATION: &str = "unknown_reservation";
/// 409: not enough units left.
pub const SOLD_OUT: &str = "sold_out";
/// 409: the user holds as many units as the per-user limit allows.
pub const USER_LIMIT: &str = "user_limit";
/// 409: the request id was used for another SKU or quantity.
pub const IDEMPOTENCY_MISMATCH: &str = "idempotency_mismatch";
/// 409: a confirm of a reservation that lapsed or was cancelled.
pub const NOT_RESERVED: &str = "not_reserved";
/// 409: a cancel of a paid reservation (a refund, not a release).
pub const CONFIRMED: &str = "confirmed";
/// 503: the reservation did not complete in time or safely; retry with
/// the same request id.
pub const RETRY: &str = "retry";
/// 503: Redis lost the sale's stock; the inventory refuses to sell it.
pub const STOCK_LOST: &str = "stock_lost";
/// 503: the stock store is unavailable.
pub const UNAVAILABLE: &str = "unavailable";
/// 503: this region's Redis is a read-only replica (a standby region's);
/// the inventory sells once it is promoted.
pub const STANDBY: &str = "standby";
