//! The order event and its validation. Anything that fails validation is a
//! poison message with a reason, never a panic.

pub use flashsale_inventory_api::{ORDER_ID_PREFIX, order_id, reservation_id};
use serde::{Deserialize, Serialize};

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: u32 = 1;
/// Largest event accepted, in bytes; bigger ones are poison.
pub const MAX_EVENT_BYTES: usize = 16 * 1024;

/// What happened to an order. Status only moves forward:
/// created (pending payment) → paid or expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Stock reserved, payment pending.
    Created,
    /// Paid.
    Paid,
    /// Not paid in time; the stock went back.
    Expired,
}

/// One order event, as JSON on `flashsale.orders`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderEvent {
    /// Version of this schema ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// What happened.
    #[serde(default = "created")]
    pub kind: EventKind,
    /// Order id.
    pub order_id: String,
    /// Sale.
    pub sale: String,
    /// Buyer (the user id rule, [`crate::user`]); also the Kafka key, so one
    /// user's events stay in order.
    pub user_id: String,
    /// SKU.
    pub sku: String,
    /// Units.
    pub quantity: i64,
    /// Total price in minor units.
    pub amount_minor: i64,
    /// Unique per order attempt: a replayed event is a no-op in the database.
    pub idempotency_key: String,
    /// The inventory reservation behind the order.
    pub reservation_id: String,
    /// When the order was created.
    pub created_at: jiff::Timestamp,
}

fn created() -> EventKind {
    EventKind::Created
}

/// What the inventory's record says about a reservation: every event of an
/// order is built from it, never from a client's request, so an order is
/// exactly what was reserved.
#[derive(Debug, Clone, Copy)]
pub struct ReservedFacts<'a> {
    /// Sale id.
    pub sale: &'a str,
    /// Reservation id.
    pub reservation_id: &'a str,
    /// Buyer.
    pub user_id: &'a str,
    /// SKU.
    pub sku: &'a str,
    /// Units.
    pub quantity: u64,
    /// Total price in minor units.
    pub amount_minor: u64,
    /// The inventory request id the reservation was made under (the
    /// created event's idempotency key).
    pub request_id: &'a str,
}

impl OrderEvent {
    /// The `kind` event of the order behind a reservation, stamped `at`.
    /// `created` carries the request id as its idempotency key; `paid` and
    /// `expired` carry one of their own per order.
    pub fn of_reservation(kind: EventKind, facts: ReservedFacts<'_>, at: jiff::Timestamp) -> Self {
        let order_id = order_id(facts.reservation_id);
        let idempotency_key = match kind {
            EventKind::Created => facts.request_id.to_owned(),
            EventKind::Paid => format!("paid:{order_id}"),
            EventKind::Expired => format!("expired:{order_id}"),
        };
        Self {
            schema_version: SCHEMA_VERSION,
            kind,
            order_id,
            sale: facts.sale.to_owned(),
            user_id: facts.user_id.to_owned(),
            sku: facts.sku.to_owned(),
            // Both are bounded by validation; out-of-range values fail it.
            quantity: i64::try_from(facts.quantity).unwrap_or(i64::MAX),
            amount_minor: i64::try_from(facts.amount_minor).unwrap_or(i64::MAX),
            idempotency_key,
            reservation_id: facts.reservation_id.to_owned(),
            created_at: at,
        }
    }
}

/// Why an event cannot be stored; the reason header of its dead letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Poison {
    /// Larger than [`MAX_EVENT_BYTES`].
    #[error("event of {0} bytes exceeds {MAX_EVENT_BYTES}")]
    Oversize(usize),
    /// Not JSON, or not this shape.
    #[error("malformed event: {0}")]
    Malformed(String),
    /// Written by a schema this code does not know.
    #[error("unknown schema_version {0}")]
    UnknownSchemaVersion(u64),
    /// A field breaks the contract.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

impl Poison {
    /// Short machine-readable reason, for the DLQ header and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Oversize(_) => "oversize",
            Self::Malformed(_) => "malformed",
            Self::UnknownSchemaVersion(_) => "unknown_schema_version",
            Self::Invalid { .. } => "invalid_field",
        }
    }
}

impl OrderEvent {
    /// Parses and validates an event from its Kafka payload.
    pub fn parse(payload: &[u8]) -> Result<Self, Poison> {
        if payload.len() > MAX_EVENT_BYTES {
            return Err(Poison::Oversize(payload.len()));
        }
        // The version decides how to read the rest, so look at it first.
        let value: serde_json::Value =
            serde_json::from_slice(payload).map_err(|e| Poison::Malformed(e.to_string()))?;
        match value
            .get("schema_version")
            .and_then(serde_json::Value::as_u64)
        {
            Some(v) if v == u64::from(SCHEMA_VERSION) => {}
            Some(v) => return Err(Poison::UnknownSchemaVersion(v)),
            None => {
                return Err(Poison::Malformed(
                    "schema_version missing or not a number".to_owned(),
                ));
            }
        }
        let event: Self =
            serde_json::from_value(value).map_err(|e| Poison::Malformed(e.to_string()))?;
        event.validate()?;
        Ok(event)
    }

    /// Checks the contract the database relies on.
    pub fn validate(&self) -> Result<(), Poison> {
        let invalid = |field, reason| Err(Poison::Invalid { field, reason });
        if !(1..=1_000).contains(&self.quantity) {
            return invalid("quantity", "must be 1-1000");
        }
        if self.amount_minor < 0 {
            return invalid("amount_minor", "must not be negative");
        }
        for (field, value, max) in [
            ("order_id", &self.order_id, 64),
            ("sale", &self.sale, 128),
            ("sku", &self.sku, 64),
            ("idempotency_key", &self.idempotency_key, 128),
            ("reservation_id", &self.reservation_id, 64),
        ] {
            if value.is_empty() || value.len() > max {
                return invalid(field, "must be non-empty and within its length limit");
            }
        }
        if crate::user::check_user_id(&self.user_id).is_err() {
            return invalid("user_id", "breaks the user id rule");
        }
        Ok(())
    }

    /// The JSON payload.
    pub fn to_payload(&self) -> Vec<u8> {
        // Serialising plain fields into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> OrderEvent {
        OrderEvent {
            schema_version: SCHEMA_VERSION,
            kind: EventKind::Created,
            order_id: "o-1".into(),
            sale: "singles-day".into(),
            user_id: "u-42".into(),
            sku: "PHONE".into(),
            quantity: 1,
            amount_minor: 399_900,
            idempotency_key: "k-1".into(),
            reservation_id: "r-1".into(),
            created_at: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn events_of_a_reservation_share_the_order_and_differ_in_key() {
        let facts = ReservedFacts {
            sale: "ns.sale.0123abcd",
            reservation_id: "r1",
            user_id: "u1",
            sku: "PHONE",
            quantity: 2,
            amount_minor: 500,
            request_id: "req-1",
        };
        let at = jiff::Timestamp::UNIX_EPOCH;
        let created = OrderEvent::of_reservation(EventKind::Created, facts, at);
        let paid = OrderEvent::of_reservation(EventKind::Paid, facts, at);
        let expired = OrderEvent::of_reservation(EventKind::Expired, facts, at);
        assert_eq!(created.order_id, "ord-r1");
        assert_eq!(reservation_id(&created.order_id), Some("r1"));
        assert_eq!(created.idempotency_key, "req-1");
        assert_eq!(paid.idempotency_key, "paid:ord-r1");
        assert_eq!(expired.idempotency_key, "expired:ord-r1");
        for e in [&created, &paid, &expired] {
            assert_eq!(
                (e.quantity, e.amount_minor, e.sku.as_str()),
                (2, 500, "PHONE")
            );
            assert_eq!(e.validate(), Ok(()));
        }
    }

    #[test]
    fn round_trips_and_defaults_kind() {
        let e = event();
        assert_eq!(OrderEvent::parse(&e.to_payload()), Ok(e.clone()));
        let mut json: serde_json::Value = serde_json::to_value(&e).unwrap_or_default();
        json.as_object_mut().map(|o| o.remove("kind"));
        let parsed = OrderEvent::parse(json.to_string().as_bytes());
        assert_eq!(parsed.map(|p| p.kind), Ok(EventKind::Created));
    }

    #[test]
    fn poison_is_named_not_panicked() {
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = serde_json::to_value(event()).unwrap_or_default();
            f(&mut v);
            OrderEvent::parse(v.to_string().as_bytes())
                .err()
                .map(|p| p.reason())
        };
        assert_eq!(
            OrderEvent::parse(b"{not json").err().map(|p| p.reason()),
            Some("malformed")
        );
        assert_eq!(
            OrderEvent::parse(&vec![b' '; MAX_EVENT_BYTES + 1])
                .err()
                .map(|p| p.reason()),
            Some("oversize")
        );
        assert_eq!(
            with(&|v| v["schema_version"] = 2.into()),
            Some("unknown_schema_version")
        );
        assert_eq!(
            with(&|v| v["quantity"] = (-1).into()),
            Some("invalid_field")
        );
        assert_eq!(
            with(&|v| v["amount_minor"] = (-5).into()),
            Some("invalid_field")
        );
        assert_eq!(with(&|v| v["user_id"] = "".into()), Some("invalid_field"));
        assert_eq!(
            with(&|v| v["user_id"] = "josé@example.com".into()),
            Some("invalid_field")
        );
        assert_eq!(
            with(&|v| v["user_id"] = "ann.buyer+sale@example.com".into()),
            None
        );
        assert_eq!(with(&|v| v["surprise"] = 1.into()), Some("malformed"));
        assert_eq!(
            with(&|v| v["created_at"] = "yesterday".into()),
            Some("malformed")
        );
        assert_eq!(with(&|v| v["kind"] = "refunded".into()), Some("malformed"));
    }
}
