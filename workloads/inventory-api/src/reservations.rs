//! Reservations: the request that makes one, the record, and the answer to
//! a confirm or a cancel.

use serde::{Deserialize, Serialize};

/// Prefix of every order id: an order is named after its reservation.
pub const ORDER_ID_PREFIX: &str = "ord-";

/// The order id of a reservation. The gateway (created, paid) and the
/// inventory (expired) name an order the same way without asking each other.
pub fn order_id(reservation_id: &str) -> String {
    format!("{ORDER_ID_PREFIX}{reservation_id}")
}

/// The reservation id inside an order id, if `order_id` is one.
pub fn reservation_id(order_id: &str) -> Option<&str> {
    order_id.strip_prefix(ORDER_ID_PREFIX)
}

/// Body of a reservation request ([`crate::paths::RESERVATIONS`]).
///
/// `N` is the type of the counts. The inventory reads them signed (the
/// default), so a negative count is refused with a message naming the field
/// rather than as malformed JSON; a client sends them as it holds them
/// (`ReserveBody<u64>`). The fields are in their order on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReserveBody<N = i64> {
    /// The price of the units in minor units, as the caller computed it;
    /// kept on the record so every event of the order says the same amount.
    /// Zero when absent.
    #[serde(default)]
    pub amount_minor: N,
    /// Units, 1 to 1,000.
    pub quantity: N,
    /// Client-chosen id: a repeat gets the same reservation as it is now,
    /// and one for another SKU or quantity is refused
    /// ([`crate::codes::IDEMPOTENCY_MISMATCH`]).
    pub request_id: String,
    /// SKU.
    pub sku: String,
    /// Buyer (`flashsale_orders::check_user_id`).
    pub user: String,
}

/// Most members of one [`ReserveBatchBody`].
pub const MAX_BATCH: usize = 256;

/// Body of a batch of reservations ([`crate::paths::RESERVATION_BATCHES`]):
/// one request for many, so a caller with many concurrent reservations
/// pays the HTTP exchange once for all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    bound(deserialize = "N: Deserialize<'de> + Default")
)]
pub struct ReserveBatchBody<N = i64> {
    /// 1 to [`MAX_BATCH`] reservation requests, each as for one alone.
    pub reservations: Vec<ReserveBody<N>>,
}

/// The answer to a batch: one per member, in the request's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveBatchAnswer {
    /// The members' answers.
    pub results: Vec<MemberAnswer>,
}

/// One member's answer: the status and body it would have had alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAnswer {
    /// HTTP status it would have had alone (201, 200, 409, 503, ...).
    pub status: u16,
    /// The reservation, on 201 or 200.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Reservation>,
    /// The refusal or failure, otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::ErrorBody>,
}

/// Lifecycle of a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservationState {
    /// A sharded claim between its steps: not yet holding stock for sure.
    Pending,
    /// Units held, payment awaited.
    Reserved,
    /// Paid.
    Confirmed,
    /// Units being returned.
    Releasing,
    /// Units returned (cancelled, expired or sold out).
    Released,
}

/// A reservation record as the inventory keeps it: what an order is made
/// of, whatever a client's request said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// Reservation id.
    pub id: String,
    /// SKU.
    pub sku: String,
    /// Buyer.
    pub user: String,
    /// Units.
    pub quantity: u64,
    /// Price of the units in minor units, as priced when reserved.
    pub amount_minor: u64,
    /// The request id it was made under.
    pub request_id: String,
    /// Where it is in its life.
    pub state: ReservationState,
    /// Why it was released, if it was (`null` otherwise).
    pub reason: Option<String>,
    /// When it lapses (or lapsed) unless confirmed, Unix ms by Redis's clock.
    pub expires_at_ms: u64,
}

impl Reservation {
    /// Whether the reservation is still `reserved` at `now_ms` (Unix ms)
    /// although its deadline has passed: lapsed, with its units not yet
    /// returned by the inventory's sweeper. The inventory refuses to confirm
    /// it from the same deadline on (by Redis's clock; a caller's clock
    /// differs by the hosts' clock skew).
    pub fn lapsed_at(&self, now_ms: u64) -> bool {
        self.state == ReservationState::Reserved && now_ms >= self.expires_at_ms
    }
}

/// The answer to a confirm ([`crate::paths::CONFIRM`], state `confirmed`)
/// or a cancel ([`crate::paths::CANCEL`], state `released`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChange {
    /// The reservation.
    pub id: String,
    /// Its state now.
    pub state: ReservationState,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    type Result = std::result::Result<(), serde_json::Error>;

    fn record(state: ReservationState, reason: Option<&str>) -> Reservation {
        Reservation {
            id: "5f0c2a9e".into(),
            sku: "A".into(),
            user: "buyer+1@example.com".into(),
            quantity: 2,
            amount_minor: 3998,
            request_id: "req-1".into(),
            state,
            reason: reason.map(str::to_owned),
            expires_at_ms: 1_700_000_300_000,
        }
    }

    #[test]
    fn a_batch_answer_carries_each_members_status_and_body() -> Result {
        let answer = ReserveBatchAnswer {
            results: vec![
                MemberAnswer {
                    status: 201,
                    reservation: Some(record(ReservationState::Reserved, None)),
                    error: None,
                },
                MemberAnswer {
                    status: 409,
                    reservation: None,
                    error: Some(crate::ErrorBody {
                        error: "sold_out".into(),
                        message: "A is sold out".into(),
                    }),
                },
            ],
        };
        let wire = serde_json::to_value(&answer)?;
        assert_eq!(wire["results"][0]["status"], 201);
        assert_eq!(wire["results"][0]["reservation"]["id"], "5f0c2a9e");
        assert!(wire["results"][0].get("error").is_none());
        assert_eq!(
            wire["results"][1],
            json!({"status": 409, "error": {"error": "sold_out", "message": "A is sold out"}})
        );
        assert_eq!(serde_json::from_value::<ReserveBatchAnswer>(wire)?, answer);
        let body: ReserveBatchBody = serde_json::from_value(
            json!({"reservations": [{"quantity": 1, "requestId": "r", "sku": "A", "user": "u"}]}),
        )?;
        assert_eq!(body.reservations[0].quantity, 1);
        Ok(())
    }

    #[test]
    fn a_reserve_body_goes_out_as_the_inventory_reads_it() -> Result {
        let sent = ReserveBody::<u64> {
            amount_minor: 3998,
            quantity: 2,
            request_id: "req-1".into(),
            sku: "A".into(),
            user: "u1".into(),
        };
        let wire = r#"{"amountMinor":3998,"quantity":2,"requestId":"req-1","sku":"A","user":"u1"}"#;
        assert_eq!(serde_json::to_string(&sent)?, wire);
        let read: ReserveBody = serde_json::from_str(wire)?;
        assert_eq!(
            read,
            ReserveBody {
                amount_minor: 3998,
                quantity: 2,
                request_id: "req-1".into(),
                sku: "A".into(),
                user: "u1".into(),
            }
        );
        Ok(())
    }

    #[test]
    fn the_inventory_reads_negative_counts_a_missing_amount_and_no_strangers() -> Result {
        let read: ReserveBody =
            serde_json::from_str(r#"{"sku":"A","user":"u1","quantity":-1,"requestId":"r"}"#)?;
        assert_eq!((read.quantity, read.amount_minor), (-1, 0));
        assert!(
            serde_json::from_str::<ReserveBody>(
                r#"{"sku":"A","user":"u1","quantity":1,"requestId":"r","price":5}"#
            )
            .is_err()
        );
        // Snake case is not the request's casing.
        assert!(
            serde_json::from_str::<ReserveBody>(
                r#"{"sku":"A","user":"u1","quantity":1,"request_id":"r"}"#
            )
            .is_err()
        );
        Ok(())
    }

    #[test]
    fn a_reservation_is_snake_case_with_a_null_reason() -> Result {
        let wire = r#"{"id":"5f0c2a9e","sku":"A","user":"buyer+1@example.com","quantity":2,"amount_minor":3998,"request_id":"req-1","state":"reserved","reason":null,"expires_at_ms":1700000300000}"#;
        let reserved = record(ReservationState::Reserved, None);
        assert_eq!(serde_json::to_string(&reserved)?, wire);
        assert_eq!(serde_json::from_str::<Reservation>(wire)?, reserved);
        let released = record(ReservationState::Released, Some("expired"));
        let value = serde_json::to_value(&released)?;
        assert_eq!(value["state"], "released");
        assert_eq!(value["reason"], "expired");
        assert_eq!(serde_json::from_value::<Reservation>(value)?, released);
        Ok(())
    }

    #[test]
    fn a_reservation_without_reason_or_with_more_fields_is_read() -> Result {
        let read: Reservation = serde_json::from_value(json!({
            "id": "5f0c2a9e", "state": "reserved", "expires_at_ms": 1_700_000_300_000_u64,
            "user": "buyer+1@example.com", "sku": "A", "quantity": 2, "amount_minor": 3998,
            "request_id": "req-1", "shard": 3,
        }))?;
        assert_eq!(read, record(ReservationState::Reserved, None));
        Ok(())
    }

    #[test]
    fn states_are_spelled_in_snake_case() -> Result {
        for (state, wire) in [
            (ReservationState::Pending, "\"pending\""),
            (ReservationState::Reserved, "\"reserved\""),
            (ReservationState::Confirmed, "\"confirmed\""),
            (ReservationState::Releasing, "\"releasing\""),
            (ReservationState::Released, "\"released\""),
        ] {
            assert_eq!(serde_json::to_string(&state)?, wire);
            assert_eq!(serde_json::from_str::<ReservationState>(wire)?, state);
        }
        Ok(())
    }

    #[test]
    fn confirm_and_cancel_answer_the_id_and_the_state() -> Result {
        for (state, wire) in [
            (
                ReservationState::Confirmed,
                r#"{"id":"5f0c2a9e","state":"confirmed"}"#,
            ),
            (
                ReservationState::Released,
                r#"{"id":"5f0c2a9e","state":"released"}"#,
            ),
        ] {
            let answer = StateChange {
                id: "5f0c2a9e".into(),
                state,
            };
            assert_eq!(serde_json::to_string(&answer)?, wire);
            assert_eq!(serde_json::from_str::<StateChange>(wire)?, answer);
        }
        Ok(())
    }

    #[test]
    fn only_a_reserved_record_past_its_deadline_has_lapsed_unswept() {
        let at = |state| Reservation {
            expires_at_ms: 1_000,
            ..record(state, None)
        };
        let reserved = at(ReservationState::Reserved);
        assert!(!reserved.lapsed_at(999));
        // The deadline itself is past, as in the inventory's confirm.
        assert!(reserved.lapsed_at(1_000));
        assert!(reserved.lapsed_at(5_000));
        // Paid, returned or not settled: each has its own answer.
        for state in [
            ReservationState::Pending,
            ReservationState::Confirmed,
            ReservationState::Releasing,
            ReservationState::Released,
        ] {
            assert!(!at(state).lapsed_at(5_000), "{state:?}");
        }
    }
}
