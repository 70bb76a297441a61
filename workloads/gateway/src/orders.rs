//! Order intake: one durable write, then the answer. The inventory's
//! reserve script puts the order's `created` event into the sale's outbox
//! in the same atomic step that takes the units, and the inventory's relay
//! publishes it to Kafka (`acks=all`). So an order is acknowledged once the
//! reservation is as durable as the inventory's policy makes it (on the
//! primary, or confirmed by a replica's `WAIT`), without a Kafka round trip
//! in series, and a reserved unit and its order's event exist together or
//! not at all: there is no "reserved but not published" case to undo.
//! Kafka being down delays orders reaching the database, not the buyers.
//!
//! Ids are derived, not stored: the inventory request id is a hash of (sale,
//! user, idempotency key), so a client's retry finds the same reservation
//! (and adds no second event), and the order id is `ord-<reservation id>`,
//! so the same retry names the same order.
//!
//! A retry finds the reservation as it is now. One past its deadline has
//! lapsed, even before the inventory's sweeper returns its units: the retry
//! is told `order_lapsed`.
//!
//! Behind a waiting room the gateway also notes each order's answer in
//! Redis under its request id: a retry that comes with the pass its order
//! used up is answered from the note, without a pass.

use std::{net::SocketAddr, time::Duration};

use axum::{
    Extension, Json,
    extract::{ConnectInfo, State, rejection::JsonRejection},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use flashsale_inventory_api::{Reservation, ReservationState, codes};
use flashsale_orders::{OrderEvent, ReservedFacts, order_id, reservation_id};
use flashsale_runtime::ApiError;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::{
    app::{AppState, MAX_BODY_BYTES},
    auth::User,
    concurrency::Partition,
    inventory_client::InventoryError,
    metrics::DrillOrder,
    queue,
    waiting_room::{PassLease, Spend},
};

/// Longest idempotency key accepted.
const MAX_KEY_LEN: usize = 64;
/// Body of `POST /api/v1/orders`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderRequest {
    /// Optional; must be this gateway's sale when given.
    #[serde(default)]
    sale: Option<String>,
    sku: String,
    quantity: i64,
    /// Also accepted as the `Idempotency-Key` header.
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// `POST /api/v1/orders`.
pub async fn place(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Result<Json<OrderRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    if let Some(buyer) = state.drill_buyer(&headers) {
        let placed = match buyer {
            Ok(buyer) => place_drill(&state, buyer, &headers, body).await,
            Err(refused) => Err(refused),
        };
        let mut answer = placed.into_response();
        answer.extensions_mut().insert(DrillOrder);
        return Ok(answer);
    }
    let user = state.user(&headers)?;
    let Json(request) = body.map_err(|r| ApiError::json(r, MAX_BODY_BYTES))?;
    let order = validate(&state, &user, &request, &headers, || {
        state.config.price(&request.sku).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_sku",
                format!("sale {:?} has no SKU {:?}", state.config.sale, request.sku),
            )
        })
    })?;
    // The sale window, after the token (anonymous callers learn nothing of
    // the sale) and the local checks of the request, but before the rate
    // limit (a charge to the shared quota), the waiting room, a concurrency
    // slot and the inventory: an order outside the window can never
    // succeed, so it costs nothing downstream, holds no stock and burns no
    // pass.
    state.config.window_state(jiff::Timestamp::now()).check()?;
    // A SKU known sold out is answered from memory, before the rate limit
    // (a charge to the shared quota) and everything after it.
    if state
        .items
        .sold_out()
        .is_sold_out(&order.sku, Instant::now())
    {
        state.metrics.sold_out_from_memory();
        return Err(sold_out(&order.sku));
    }
    // With a bot shield, a join (no pass, behind a waiting room) or, with
    // no room, every order has its proof of work checked first: a refused
    // one costs one HMAC and one hash and no Redis call. A join spends it
    // in the join script; an order without a room under its concurrency
    // slot, so an order shed for overload keeps its proof.
    let joining = queue::pass_of(&headers).is_none();
    let proving = joining || state.waiting_room.is_none();
    let (spend, rate) = queue::proven_and_limited(&state, &headers, peer, &user, proving)?;
    // The pass is held on a lease: only an order that went through uses it
    // up. Any failure (sold out, a 503, a gateway crash, a client that went
    // away) leaves it to the buyer for another try.
    let lease = match &state.waiting_room {
        Some(room) => match queue::lease_pass(&state, room, &headers, &user, spend).await {
            Ok(queue::Entry::Admitted(lease)) => Some(lease),
            Ok(queue::Entry::Queued(answer)) => return Ok(rate.on(answer)),
            // A retry of an order that went through comes with the pass it
            // used up: it gets the order again, as without a waiting room.
            // Only replays pay for the lookup.
            Err(refusal) if refusal.code() == "replayed" && !joining => {
                return match replayed(&state, &order.request_id).await {
                    Some(Ok(answer)) => Ok(rate.on(answer)),
                    Some(Err(refused)) => Err(refused),
                    None => Err(refusal),
                };
            }
            Err(refusal) => return Err(refusal),
        },
        None => None,
    };
    let outcome = under_limit(&state, &user, &order, spend).await;
    if outcome.is_ok() && lease.is_some() {
        state.metrics.admitted();
    }
    decide(lease, outcome.is_ok()).await;
    Ok(rate.on(outcome?))
}

/// A drill buyer's order (see [`flashsale_drill_buyer`]): the drill SKU
/// only, at no price, and taken before the opening too, since drills run
/// before a sale goes Live. No rate limit, waiting room or proof of work
/// (the drill paces its buyer, and a queue or a challenge would only delay
/// what it measures), but the concurrency limit as for any order: it
/// guards the inventory and Kafka.
async fn place_drill(
    state: &AppState,
    user: User,
    headers: &HeaderMap,
    body: Result<Json<OrderRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(request) = body.map_err(|r| ApiError::json(r, MAX_BODY_BYTES))?;
    if request.sku != flashsale_drill_buyer::SKU {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "drill_sku_only",
            format!(
                "a drill buyer orders only SKU {:?}",
                flashsale_drill_buyer::SKU
            ),
        ));
    }
    let order = validate(state, &user, &request, headers, || Ok(0))?;
    under_limit(state, &user, &order, None).await
}

/// Takes the order under a slot of the concurrency limit (a 503 at once
/// without one), telling the limit how the downstream calls went. With
/// no waiting room, the order first spends `spend`, its bot shield proof.
async fn under_limit(
    state: &AppState,
    user: &User,
    order: &Order,
    spend: Option<Spend>,
) -> Result<Response, ApiError> {
    let permit = state.permit(Partition::Core)?;
    let outcome = async {
        if let (Some(spends), Some(spend)) = (&state.order_spends, spend) {
            queue::spend_for_order(state, spends, spend, &order.request_id).await?;
        }
        intake(state, user, order).await
    }
    .await;
    match &outcome {
        Err(err) if !err.status().is_server_error() => permit.ignore(),
        _ => permit.success(),
    }
    outcome
}

/// Uses the pass up after a successful order; gives it back otherwise.
async fn decide(lease: Option<PassLease>, succeeded: bool) {
    let Some(lease) = lease else { return };
    let decided = if succeeded {
        lease.commit().await
    } else {
        lease.give_back().await
    };
    if let Err(err) = decided {
        // A lease left undecided lapses on its own within seconds.
        tracing::warn!(error = %err, succeeded, "waiting-room pass not settled");
    }
}

/// A checked order request.
struct Order {
    sku: String,
    quantity: u64,
    request_id: String,
    amount_minor: u64,
}

fn validate(
    state: &AppState,
    user: &User,
    request: &OrderRequest,
    headers: &HeaderMap,
    price: impl FnOnce() -> Result<i64, ApiError>,
) -> Result<Order, ApiError> {
    let sale = &state.config.sale;
    if request.sale.as_ref().is_some_and(|s| s != sale) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_sale",
            format!("this gateway serves sale {sale:?}"),
        ));
    }
    let price = price()?;
    let quantity = u64::try_from(request.quantity)
        .ok()
        .filter(|q| (1..=1_000).contains(q))
        .ok_or_else(|| ApiError::bad_request("quantity must be 1-1000"))?;
    let header_key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"'));
    let key = request
        .idempotency_key
        .as_deref()
        .or(header_key)
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "an idempotency key of 1-{MAX_KEY_LEN} characters is required (idempotencyKey or the Idempotency-Key header)"
            ))
        })?;
    Ok(Order {
        sku: request.sku.clone(),
        quantity,
        request_id: request_id(sale, &user.0, key),
        // The configuration refuses negative prices.
        amount_minor: u64::try_from(price).unwrap_or(0).saturating_mul(quantity),
    })
}

/// The inventory request id of a client's order: stable across retries,
/// unique per (sale, user, key), and within the inventory's id alphabet.
/// Order events and rows carry it as their idempotency key.
pub fn request_id(sale: &str, user: &str, key: &str) -> String {
    let mut hash = Sha256::new();
    for part in [sale, user, key] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

async fn intake(state: &AppState, user: &User, order: &Order) -> Result<Response, ApiError> {
    let deadline = Instant::now() + state.config.request_timeout();
    let record = state
        .inventory
        .reserve(
            &order.sku,
            &user.0,
            order.quantity,
            order.amount_minor,
            &order.request_id,
            deadline,
        )
        .await
        .map_err(|err| {
            let refusal = inventory_refusal(err);
            if refusal.code() == "sold_out" {
                state.items.sold_out().mark(&order.sku, Instant::now());
            }
            refusal
        })?;
    if let Some(answer) = standing(&record, now_ms())? {
        return Ok(answer);
    }
    if state.waiting_room.is_some() {
        note_order(state, &record).await;
    }
    Ok(accepted(&record, "reserved", StatusCode::CREATED))
}

/// What an existing reservation makes of a request for its order at
/// `now_ms` (Unix ms): `None` while it awaits payment (the order stands and
/// goes on), else the answer (paid) or the refusal. A reservation past its
/// deadline is lapsed even before the sweeper returns its units: a retry
/// must not answer it as an order.
fn standing(record: &Reservation, now_ms: u64) -> Result<Option<Response>, ApiError> {
    match record.state {
        ReservationState::Reserved if record.lapsed_at(now_ms) => Err(order_lapsed(record)),
        ReservationState::Reserved => Ok(None),
        // A retry of an order already paid.
        ReservationState::Confirmed => Ok(Some(accepted(record, "paid", StatusCode::OK))),
        // A sharded claim not settled yet holds no stock for sure: not an order.
        ReservationState::Pending => Err(unavailable(
            "the reservation is still being made; retry with the same idempotency key",
        )),
        ReservationState::Releasing | ReservationState::Released => Err(ApiError::new(
            StatusCode::CONFLICT,
            "order_abandoned",
            "an earlier attempt with this idempotency key failed or lapsed and its stock was returned; use a new key",
        )),
    }
}

/// 409 `order_lapsed`: `record` was not paid by its deadline.
pub(crate) fn order_lapsed(record: &Reservation) -> ApiError {
    let deadline = i64::try_from(record.expires_at_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{} ms", record.expires_at_ms),
            |at| at.to_string(),
        );
    ApiError::new(
        StatusCode::CONFLICT,
        "order_lapsed",
        format!(
            "order {} was not paid by its deadline {deadline} and lapsed; nothing can be paid for it, order again with a new idempotency key",
            order_id(&record.id)
        ),
    )
}

/// The gateway's clock in Unix ms, the scale of a reservation's deadline.
pub(crate) fn now_ms() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

/// What the order events of `record` say.
pub(crate) fn facts<'a>(state: &'a AppState, record: &'a Reservation) -> ReservedFacts<'a> {
    ReservedFacts {
        sale: &state.config.sale,
        reservation_id: &record.id,
        user_id: &record.user,
        sku: &record.sku,
        quantity: record.quantity,
        amount_minor: record.amount_minor,
        request_id: &record.request_id,
    }
}

/// How long the acknowledgement note of an order is kept: far longer than
/// any client retries.
const ACK_NOTE_SECONDS: u64 = 24 * 3600;
/// A note is an optimisation; Redis gets little time for it.
const NOTE_BUDGET: Duration = Duration::from_millis(50);

fn ack_key(state: &AppState, request_id: &str) -> String {
    format!("fs:{{{}}}:ord:req:{request_id}", state.config.sale)
}

/// The answer (body) an order got, if this request id's order was noted
/// (a retry behind a waiting room).
async fn noted(state: &AppState, request_id: &str) -> Option<serde_json::Value> {
    let redis = state.redis.as_ref()?;
    let mut conn = redis.clone();
    let mut get = redis::cmd("GET");
    get.arg(ack_key(state, request_id));
    let read = get.query_async::<Option<String>>(&mut conn);
    let text = tokio::time::timeout(NOTE_BUDGET, read).await.ok()?.ok()??;
    serde_json::from_str(&text).ok()
}

/// The answer to a retry that came with the pass its order used up, if
/// the order was noted: its noted answer while it awaits payment;
/// once the note's deadline has passed, what its reservation says now
/// (paid, or lapsed), so a lapsed order is not answered as one.
async fn replayed(state: &AppState, request_id: &str) -> Option<Result<Response, ApiError>> {
    let body = noted(state, request_id).await?;
    let order = body["orderId"].as_str().unwrap_or_default();
    let pay_before = body["payBeforeMs"].as_u64().unwrap_or_default();
    let current = if now_ms() < pay_before {
        Ok(None)
    } else {
        let deadline = Instant::now() + state.config.request_timeout();
        reservation_of(state, order, deadline)
            .await
            .and_then(|record| standing(&record, now_ms()))
    };
    Some(
        current.map(|answer| {
            answer.unwrap_or_else(|| (StatusCode::CREATED, Json(body)).into_response())
        }),
    )
}

/// Notes the order's answer under its request id, so a retry does not
/// need a pass again.
async fn note_order(state: &AppState, record: &Reservation) {
    let Some(redis) = &state.redis else {
        return;
    };
    let mut conn = redis.clone();
    let mut command = redis::cmd("SET");
    command
        .arg(ack_key(state, &record.request_id))
        .arg(answer(record, "reserved").to_string())
        .arg("EX")
        .arg(ACK_NOTE_SECONDS);
    let set = command.query_async::<()>(&mut conn);
    if !matches!(tokio::time::timeout(NOTE_BUDGET, set).await, Ok(Ok(()))) {
        tracing::debug!(
            order_id = order_id(&record.id),
            "could not note the order; a retry with its used-up pass is refused as replayed"
        );
    }
}

/// Publishes and waits for the acknowledgement. Not cut short by the
/// request's deadline: the producer's own message timeout is the request
/// timeout, and only when the client library has given the message up is a
/// failure final.
pub(crate) async fn publish(state: &AppState, event: &OrderEvent) -> Result<(), String> {
    state
        .producer
        .send(event)
        .await
        .map(drop)
        .map_err(|err| err.to_string())
}

fn accepted(record: &Reservation, status: &str, code: StatusCode) -> Response {
    (code, Json(answer(record, status))).into_response()
}

/// The body of an order's answer.
fn answer(record: &Reservation, status: &str) -> serde_json::Value {
    json!({
        "orderId": order_id(&record.id),
        "reservationId": record.id,
        "sku": record.sku,
        "quantity": record.quantity,
        "amountMinor": record.amount_minor,
        "status": status,
        "payBeforeMs": record.expires_at_ms,
    })
}

/// 409 `sold_out`, answered from this gateway's memory.
fn sold_out(sku: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "sold_out",
        format!("SKU {sku:?} is sold out"),
    )
}

/// A 503 the client should retry after a second.
pub(crate) fn unavailable(message: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
}

/// The inventory's refusals pass through with their codes; trouble is a 503.
pub(crate) fn inventory_refusal(err: InventoryError) -> ApiError {
    match err {
        InventoryError::Refused {
            status,
            code,
            message,
        } => {
            let code: &'static str = match code.as_str() {
                codes::SOLD_OUT => "sold_out",
                codes::USER_LIMIT => "user_limit",
                codes::UNKNOWN_SKU => "unknown_sku",
                codes::UNKNOWN_RESERVATION => "unknown_order",
                codes::NOT_RESERVED => "order_lapsed",
                codes::CONFIRMED => "already_paid",
                codes::IDEMPOTENCY_MISMATCH => "idempotency_key_reused",
                _ => "refused",
            };
            let status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::CONFLICT);
            ApiError::new(status, code, message)
        }
        InventoryError::Unavailable { attempts, last } => {
            tracing::warn!(attempts, %last, "inventory unavailable");
            unavailable("stock cannot be checked right now; retry shortly")
        }
    }
}

/// The reservation behind order id `order`, read from the inventory.
/// An id that is not an order id is an unknown order.
pub(crate) async fn reservation_of(
    state: &AppState,
    order: &str,
    deadline: Instant,
) -> Result<Reservation, ApiError> {
    let reservation_id = reservation_id(order)
        .filter(|id| {
            !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .ok_or_else(|| unknown_order(order))?;
    state
        .inventory
        .reservation(reservation_id, deadline)
        .await
        .map_err(inventory_refusal)
}

/// A 404 naming an order that does not exist (or is someone else's).
pub(crate) fn unknown_order(order: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_order",
        format!("no order {order:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_stable_and_distinct() {
        let a = request_id("s", "u1", "k");
        assert_eq!(a, request_id("s", "u1", "k"));
        assert_eq!(a.len(), 64);
        assert_ne!(a, request_id("s", "u2", "k"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(request_id("s", "ab", "c"), request_id("s", "a", "bc"));
    }
}
