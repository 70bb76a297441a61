//! The inventory's reservation API as the gateway calls it: every call runs
//! within the caller's deadline, and only failures that cannot have changed
//! anything twice (the inventory's calls are idempotent by request id or
//! reservation id) or that were never answered are retried, with jittered
//! exponential backoff, until the deadline.

use std::time::Duration;

use rand::Rng;
use reqwest::{Method, StatusCode};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::json;
use tokio::time::Instant;

/// First backoff; doubles per retry up to [`MAX_BACKOFF`], full jitter.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// What went wrong calling the inventory.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The inventory answered with a refusal (4xx): final, not retried.
    #[error("inventory refused: {status} {code}: {message}")]
    Refused {
        /// HTTP status.
        status: StatusCode,
        /// The inventory's error code (`sold_out`, `user_limit`, ...).
        code: String,
        /// Its message.
        message: String,
    },
    /// No usable answer before the deadline (down, overloaded, too slow).
    #[error("inventory unavailable after {attempts} attempt(s): {last}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// The token cannot be sent in a header.
    #[error("the inventory token contains characters not allowed in a header")]
    Token,
}

/// A reservation record as the inventory keeps it: what an order is made
/// of, whatever a client's request said.
#[derive(Debug, Clone, Deserialize)]
pub struct Reservation {
    /// Reservation id.
    pub id: String,
    /// Where it is in its life.
    pub state: ReservationState,
    /// When it lapses unless confirmed (Unix ms).
    pub expires_at_ms: u64,
    /// Buyer.
    pub user: String,
    /// SKU.
    pub sku: String,
    /// Units.
    pub quantity: u64,
    /// Price of the units in minor units, as priced when reserved.
    pub amount_minor: u64,
    /// The request id it was made under.
    pub request_id: String,
}

impl Reservation {
    /// Whether the reservation is still `reserved` at `now_ms` (Unix ms)
    /// although its deadline has passed: lapsed, with its units not yet
    /// returned by the inventory's sweeper. The inventory refuses to confirm
    /// it from the same deadline on (by Redis's clock; the two differ by the
    /// hosts' clock skew).
    pub fn lapsed_at(&self, now_ms: u64) -> bool {
        self.state == ReservationState::Reserved && now_ms >= self.expires_at_ms
    }
}

/// The answer to a reservation request.
#[derive(Debug, Clone)]
pub struct Reserved {
    /// The reservation as it is now.
    pub record: Reservation,
    /// Whether this call made it (not a retry of an earlier one).
    pub fresh: bool,
}

/// Lifecycle of a reservation (the inventory's states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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

/// Stock of one SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct StockLevel {
    /// Units for sale in total.
    pub stock: u64,
    /// Units that can still be reserved.
    pub available: u64,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: String,
    message: String,
}

/// A client of one sale's reservation API.
#[derive(Debug, Clone)]
pub struct InventoryClient {
    http: reqwest::Client,
    base: String,
    sale: String,
    /// `Bearer <token>` when the inventory requires one.
    authorization: Option<reqwest::header::HeaderValue>,
}

impl InventoryClient {
    /// A client for `sale` at `base_url` (e.g. `http://inventory:8080`),
    /// sending `token` as a bearer token when given.
    pub fn new(base_url: &str, sale: &str, token: Option<&str>) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()?;
        let authorization = token
            .map(|t| {
                let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| ClientError::Token)?;
                value.set_sensitive(true);
                Ok::<_, ClientError>(value)
            })
            .transpose()?;
        Ok(Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            sale: sale.to_owned(),
            authorization,
        })
    }

    /// Reserves `quantity` of `sku` for `user` at `amount_minor`; a repeat
    /// of `request_id` returns the same reservation as it is now, and one
    /// for another SKU or quantity is refused (`idempotency_mismatch`).
    pub async fn reserve(
        &self,
        sku: &str,
        user: &str,
        quantity: u64,
        amount_minor: u64,
        request_id: &str,
        deadline: Instant,
    ) -> Result<Reserved, InventoryError> {
        let body = json!({
            "sku": sku,
            "user": user,
            "quantity": quantity,
            "amountMinor": amount_minor,
            "requestId": request_id,
        });
        let (status, record) = self
            .call(Method::POST, "reservations", Some(body), deadline)
            .await?;
        Ok(Reserved {
            record,
            fresh: status == StatusCode::CREATED,
        })
    }

    /// One reservation.
    pub async fn reservation(
        &self,
        id: &str,
        deadline: Instant,
    ) -> Result<Reservation, InventoryError> {
        self.call(Method::GET, &format!("reservations/{id}"), None, deadline)
            .await
            .map(|(_, record)| record)
    }

    /// Marks a reservation paid (idempotent).
    pub async fn confirm(&self, id: &str, deadline: Instant) -> Result<(), InventoryError> {
        let path = format!("reservations/{id}/confirm");
        self.call::<serde_json::Value>(Method::POST, &path, None, deadline)
            .await
            .map(drop)
    }

    /// Returns a reservation's units (idempotent).
    pub async fn cancel(&self, id: &str, deadline: Instant) -> Result<(), InventoryError> {
        let path = format!("reservations/{id}/cancel");
        self.call::<serde_json::Value>(Method::POST, &path, None, deadline)
            .await
            .map(drop)
    }

    /// Stock of `sku`.
    pub async fn stock(&self, sku: &str, deadline: Instant) -> Result<StockLevel, InventoryError> {
        self.call(Method::GET, &format!("items/{sku}/stock"), None, deadline)
            .await
            .map(|(_, level)| level)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        deadline: Instant,
    ) -> Result<(StatusCode, T), InventoryError> {
        let url = format!("{}/v1/sales/{}/{path}", self.base, self.sale);
        let mut attempts = 0;
        let mut backoff = FIRST_BACKOFF;
        loop {
            attempts += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let last = if left.is_zero() {
                "deadline reached".to_owned()
            } else {
                let mut request = self.http.request(method.clone(), &url).timeout(left);
                if let Some(authorization) = &self.authorization {
                    request = request.header(reqwest::header::AUTHORIZATION, authorization.clone());
                }
                if let Some(body) = &body {
                    request = request.json(body);
                }
                match self.attempt(request).await {
                    Ok(value) => return Ok(value),
                    Err(Attempt::Final(err)) => return Err(err),
                    Err(Attempt::Retry(reason)) => reason,
                }
            };
            // Full jitter: retries of many requests spread out instead of
            // hitting a recovering inventory together.
            let pause =
                Duration::from_micros(rand::rng().random_range(0..=backoff.as_micros() as u64));
            if Instant::now() + pause >= deadline {
                return Err(InventoryError::Unavailable { attempts, last });
            }
            tracing::debug!(%url, attempts, reason = %last, "retrying inventory call");
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    async fn attempt<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, T), Attempt> {
        let response = request
            .send()
            .await
            .map_err(|e| Attempt::Retry(e.to_string()))?;
        let status = response.status();
        if status.is_success() {
            return response
                .json::<T>()
                .await
                .map(|value| (status, value))
                .map_err(|e| Attempt::Retry(format!("unreadable answer: {e}")));
        }
        if status.is_server_error() {
            return Err(Attempt::Retry(format!("HTTP {status}")));
        }
        let (code, message) = match response.json::<ErrorBody>().await {
            Ok(body) => (body.error, body.message),
            Err(_) => ("unexpected".to_owned(), format!("HTTP {status}")),
        };
        Err(Attempt::Final(InventoryError::Refused {
            status,
            code,
            message,
        }))
    }
}

enum Attempt {
    Retry(String),
    Final(InventoryError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_reserved_record_past_its_deadline_has_lapsed_unswept() {
        let record = |state| Reservation {
            id: "r1".into(),
            state,
            expires_at_ms: 1_000,
            user: "u1".into(),
            sku: "A".into(),
            quantity: 1,
            amount_minor: 1999,
            request_id: "req".into(),
        };
        let reserved = record(ReservationState::Reserved);
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
            assert!(!record(state).lapsed_at(5_000), "{state:?}");
        }
    }
}
