//! Payments come from the payment provider, never from the buyer.
//!
//! The buyer's `POST /api/v1/orders/{id}/pay` only starts a payment: it
//! answers what to pay (amount, currency, deadline) and changes nothing. The
//! order is paid when the provider calls `POST /api/v1/payments/callback`,
//! signed with the secret the sale shares with it:
//!
//! ```text
//! Flashsale-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
//! {"paymentId": "...", "orderId": "ord-...", "amountMinor": 1999, "currency": "CNY", "status": "succeeded"}
//! ```
//!
//! The timestamp must lie within [`REPLAY_WINDOW`] of the gateway's clock,
//! so a captured callback cannot be replayed later; inside the window a
//! replay is harmless, because confirming and publishing are idempotent.
//! Several `v1=` values may be sent while the secret rotates. The amount and
//! currency must equal the order's (from the inventory's reservation record),
//! or nothing is confirmed.
//!
//! A reservation past its deadline is lapsed even while the inventory's
//! sweeper has not returned it yet: `/pay` refuses it (`order_lapsed`), and
//! the inventory refuses to confirm it. A signed payment that arrives for an
//! order that cannot take it (lapsed or cancelled first, or the wrong
//! amount) has moved money all the same, so besides the refusal it is
//! flagged for a refund: an error log naming order, payment and amount, and
//! `gateway_refunds_needed_total{reason}`.
//!
//! This is the integration point for a real provider: an adapter that
//! receives the provider's own webhook and re-signs it in this format, or a
//! provider configured to sign this way. [`sign`] is the test provider the
//! tests and the local drill use.

use std::time::Duration;

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State, rejection::PathRejection},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use flashsale_inventory_api::{Reservation, ReservationState, codes};
use flashsale_orders::{EventKind, OrderEvent};
use flashsale_runtime::ApiError;
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use serde_json::json;
use sha2::Sha256;
use tokio::time::Instant;

use crate::{
    app::{AppState, MAX_BODY_BYTES, RateScope},
    concurrency::Partition,
    inventory_client::InventoryError,
    metrics::RefundReason,
    orders::{
        facts, inventory_refusal, now_ms, order_lapsed, publish, reservation_of, unavailable,
        unknown_order,
    },
};

/// Header carrying the provider's signature.
pub const SIGNATURE_HEADER: &str = "flashsale-signature";
/// How far a callback's timestamp may be from the gateway's clock.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(300);
/// Shortest secret accepted: HMAC-SHA256 wants at least its output size.
const MIN_SECRET_BYTES: usize = 32;

/// Checks callback signatures with the sale's shared secret.
#[derive(Clone)]
pub struct PaymentVerifier {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for PaymentVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PaymentVerifier")
    }
}

/// Why a secret or a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The secret is too short to sign with.
    #[error("the payment secret must be at least {MIN_SECRET_BYTES} bytes, got {0}")]
    WeakSecret(usize),
    /// No signature header, or not `t=...,v1=...`.
    #[error("missing or malformed {SIGNATURE_HEADER} header")]
    Malformed,
    /// The timestamp is outside the replay window.
    #[error("signature timestamp {0} is outside the {window}s window", window = REPLAY_WINDOW.as_secs())]
    Stale(i64),
    /// No `v1` value matches.
    #[error("no signature matches")]
    Mismatch,
}

impl PaymentVerifier {
    /// A verifier over `secret`.
    pub fn new(secret: &[u8]) -> Result<Self, SignatureError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(SignatureError::WeakSecret(secret.len()));
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret)
            .map_err(|_| SignatureError::WeakSecret(secret.len()))?;
        Ok(Self { mac })
    }

    /// Checks `header` over `body` at `now` (Unix seconds).
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Malformed)?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
                Some(("v1", v)) => signatures.push(decode_hex(v).ok_or(SignatureError::Malformed)?),
                _ => {}
            }
        }
        let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
        if signatures.is_empty() {
            return Err(SignatureError::Malformed);
        }
        if timestamp.abs_diff(now) > REPLAY_WINDOW.as_secs() {
            return Err(SignatureError::Stale(timestamp));
        }
        let signed = self.signed(timestamp, body);
        // verify_slice compares in constant time.
        if signatures
            .iter()
            .any(|s| signed.clone().verify_slice(s).is_ok())
        {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }

    fn signed(&self, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// The signature header a provider sends for `body` at `timestamp`: the
/// test provider of the tests and the local drill.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> Result<String, SignatureError> {
    let verifier = PaymentVerifier::new(secret)?;
    let tag = verifier.signed(timestamp, body).finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("t={timestamp},v1={hex}"))
}

/// The body a provider sends when order `order_id` was paid `amount_minor`
/// in `currency` (payment id `pay-<order id>`): the test provider's, signed
/// with [`sign`].
pub fn succeeded(order_id: &str, amount_minor: u64, currency: &str) -> Vec<u8> {
    json!({
        "paymentId": format!("pay-{order_id}"),
        "orderId": order_id,
        "amountMinor": amount_minor,
        "currency": currency,
        "status": "succeeded",
    })
    .to_string()
    .into_bytes()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `POST /api/v1/orders/{id}/pay`: what the buyer must pay, and until when.
/// Confirms nothing: only the provider's callback does.
pub async fn start(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(order) = path?;
    let admitted = state.admit(&headers, Partition::Core, RateScope::Shared)?;
    let deadline = Instant::now() + state.config.request_timeout();
    let result = reservation_of(&state, &order, deadline)
        .await
        .and_then(|r| {
            // Someone else's order is "not found", not "forbidden": ids do not leak.
            if r.user != admitted.user.0 {
                return Err(unknown_order(&order));
            }
            payment_answer(&state, &order, &r, now_ms())
        });
    if result
        .as_ref()
        .is_err_and(|e| !e.status().is_server_error())
    {
        admitted.permit.ignore();
    } else {
        admitted.permit.success();
    }
    Ok(admitted.rate.on(result?))
}

/// What the buyer of `r` is told at `now_ms`: to pay only while it awaits
/// payment, never once its deadline passed (the inventory would refuse the
/// payment and the money would have to go back).
fn payment_answer(
    state: &AppState,
    order: &str,
    r: &Reservation,
    now_ms: u64,
) -> Result<Response, ApiError> {
    match r.state {
        ReservationState::Reserved if r.lapsed_at(now_ms) => Err(order_lapsed(r)),
        ReservationState::Reserved => Ok((
            StatusCode::ACCEPTED,
            Json(json!({
                "orderId": order,
                "amountMinor": r.amount_minor,
                "currency": state.config.currency,
                "payBeforeMs": r.expires_at_ms,
                "status": "awaiting_payment",
            })),
        )
            .into_response()),
        ReservationState::Confirmed => {
            Ok(Json(json!({"orderId": order, "status": "paid"})).into_response())
        }
        ReservationState::Pending => Err(unavailable(
            "the order is still being reserved; retry shortly",
        )),
        ReservationState::Releasing | ReservationState::Released => Err(ApiError::new(
            StatusCode::CONFLICT,
            "order_lapsed",
            "the order lapsed or was cancelled before payment",
        )),
    }
}

/// Body of the provider's callback.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Callback {
    payment_id: String,
    order_id: String,
    amount_minor: i64,
    currency: String,
    status: CallbackStatus,
}

/// What the provider reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CallbackStatus {
    /// The money moved: the order is paid.
    Succeeded,
    /// It did not: nothing changes, the reservation lapses at its time.
    Failed,
}

/// `POST /api/v1/payments/callback`: the provider says an order was paid.
/// A tier-0 route: no user token, no per-user rate limit, never degraded;
/// it takes a core concurrency slot like an order.
pub async fn callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Some(verifier) = &state.payments else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "payments_not_configured",
            "this gateway has no payment secret (--payment-secret-file)",
        ));
    };
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body exceeds {MAX_BODY_BYTES} bytes"),
        ));
    }
    let signature = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    verifier
        .verify(signature, &body, jiff::Timestamp::now().as_second())
        .map_err(|err| {
            state.metrics.payment_callback("unauthenticated");
            ApiError::new(StatusCode::UNAUTHORIZED, "bad_signature", err.to_string())
        })?;
    let callback: Callback = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("not a payment callback: {e}")))?;
    let permit = state.permit(Partition::Core)?;
    let result = settle(&state, &callback).await;
    let outcome = match &result {
        Ok(_) => "paid",
        Err(e) if e.status().is_server_error() => "error",
        Err(_) => "refused",
    };
    state.metrics.payment_callback(outcome);
    if result
        .as_ref()
        .is_err_and(|e| !e.status().is_server_error())
    {
        permit.ignore();
    } else {
        permit.success();
    }
    result
}

async fn settle(state: &AppState, callback: &Callback) -> Result<Response, ApiError> {
    let order = &callback.order_id;
    if callback.status == CallbackStatus::Failed {
        tracing::info!(
            order,
            payment = callback.payment_id,
            "payment failed; the reservation lapses at its time"
        );
        return Ok(Json(json!({"orderId": order, "status": "awaiting_payment"})).into_response());
    }
    let deadline = Instant::now() + state.config.request_timeout();
    let record = reservation_of(state, order, deadline).await?;
    let amount_matches = u64::try_from(callback.amount_minor).ok() == Some(record.amount_minor);
    if !amount_matches || callback.currency != state.config.currency {
        tracing::warn!(
            order,
            payment = callback.payment_id,
            paid = callback.amount_minor,
            currency = callback.currency,
            due = record.amount_minor,
            "payment does not match the order; not confirmed"
        );
        refund_needed(state, callback, RefundReason::AmountMismatch);
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "amount_mismatch",
            format!(
                "the order costs {} {}; the payment says {} {}",
                record.amount_minor,
                state.config.currency,
                callback.amount_minor,
                callback.currency
            ),
        ));
    }
    match state.inventory.confirm(&record.id, deadline).await {
        Ok(()) => {}
        // Lapsed (swept or not) or cancelled before the money came: the
        // inventory's clock decides, and the payment must go back.
        Err(InventoryError::Refused { code, .. }) if code == codes::NOT_RESERVED => {
            refund_needed(state, callback, RefundReason::Lapsed);
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "order_lapsed",
                format!(
                    "order {order} lapsed or was cancelled before the payment; refund payment {}",
                    callback.payment_id
                ),
            ));
        }
        Err(err) => return Err(inventory_refusal(err)),
    }
    let event = OrderEvent::of_reservation(
        EventKind::Paid,
        facts(state, &record),
        jiff::Timestamp::now(),
    );
    publish(state, &event).await.map_err(|reason| {
        tracing::warn!(order, %reason, "paid event not acknowledged");
        unavailable("payment recorded in stock but not yet in orders; retry the callback")
    })?;
    Ok(Json(json!({"orderId": order, "status": "paid"})).into_response())
}

/// Flags a payment that moved money for an order that cannot take it: a
/// person (or a refund job reading the log) must give it back.
fn refund_needed(state: &AppState, callback: &Callback, reason: RefundReason) {
    state.metrics.refund_needed(reason);
    tracing::error!(
        order = callback.order_id,
        payment = callback.payment_id,
        amount_minor = callback.amount_minor,
        currency = callback.currency,
        reason = reason.as_str(),
        "payment received for an order that cannot take it; refund needed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"payment-secret-payment-secret-0123";

    #[test]
    fn a_signed_body_verifies_and_anything_else_does_not() {
        let verifier = PaymentVerifier::new(SECRET);
        assert!(verifier.is_ok());
        let Ok(verifier) = verifier else { return };
        let body = br#"{"orderId":"ord-1"}"#;
        let now = 1_800_000_000;
        let header = sign(SECRET, now, body).unwrap_or_default();
        assert_eq!(verifier.verify(Some(&header), body, now), Ok(()));
        assert_eq!(verifier.verify(Some(&header), body, now + 299), Ok(()));
        // Replayed outside the window, tampered, or signed with another secret.
        assert_eq!(
            verifier.verify(Some(&header), body, now + 301),
            Err(SignatureError::Stale(now))
        );
        assert_eq!(
            verifier.verify(Some(&header), br#"{"orderId":"ord-2"}"#, now),
            Err(SignatureError::Mismatch)
        );
        let other = sign(b"another-secret-another-secret-0123", now, body).unwrap_or_default();
        assert_eq!(
            verifier.verify(Some(&other), body, now),
            Err(SignatureError::Mismatch)
        );
        // During a rotation the provider sends both; either one will do.
        let v1 = |h: &str| {
            h.split_once("v1=")
                .map(|(_, v)| v.to_owned())
                .unwrap_or_default()
        };
        let both = format!("t={now},v1={},v1={}", v1(&other), v1(&header));
        assert_eq!(verifier.verify(Some(&both), body, now), Ok(()));
    }

    #[test]
    fn malformed_headers_and_weak_secrets_are_refused() {
        let Ok(verifier) = PaymentVerifier::new(SECRET) else {
            panic!("secret refused")
        };
        for header in [
            None,
            Some(""),
            Some("t=1"),
            Some("v1=00"),
            Some("t=x,v1=00"),
            Some("t=1,v1=0g"),
        ] {
            assert_eq!(
                verifier.verify(header, b"{}", 1),
                Err(SignatureError::Malformed),
                "{header:?}"
            );
        }
        assert_eq!(
            PaymentVerifier::new(b"short").err(),
            Some(SignatureError::WeakSecret(5))
        );
    }
}
