//! The inventory's HTTP API (JSON), serving the contract of
//! `flashsale-inventory-api` (routes, bodies, answers, error codes). Every
//! refusal is a 4xx with a JSON body `{"error": <code>, "message": <text>}`;
//! nothing a client sends can panic it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{
        DefaultBodyLimit, Path, State,
        rejection::{JsonRejection, PathRejection},
    },
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use flashsale_inventory_api::{
    AdjustBody, ErrorBody, LoadedSale, MAX_BATCH, MemberAnswer, Reservation, ReservationState,
    ReserveBatchAnswer, ReserveBatchBody, ReserveBody, StateChange, codes, paths,
};
use flashsale_runtime::ApiError;

use crate::{
    auth::{self, Tokens},
    metrics::Metrics,
    store::{
        CancelOutcome, ConfirmOutcome, ReserveOutcome, ReserveRequest, SaleDefinition, Store,
        StoreError,
    },
};

/// Largest request body accepted (a sale definition with many SKUs fits).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
const MAX_QUANTITY: u64 = 1_000;
const MAX_ID_LEN: usize = 128;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    store: Store,
    metrics: Metrics,
    sold_out: Arc<Mutex<HashMap<(String, String), Instant>>>,
    sold_out_staleness: Duration,
    tokens: Tokens,
}

impl AppState {
    /// State over a store. A replica that saw a SKU sold out answers so
    /// without Redis for `sold_out_staleness`; a release on this replica
    /// clears the flag at once. The store's reserve batch sizes go into `metrics`.
    pub fn new(store: Store, metrics: Metrics, sold_out_staleness: Duration) -> Self {
        store.record_batch_sizes(&metrics);
        Self {
            store,
            metrics,
            sold_out: Arc::default(),
            sold_out_staleness,
            tokens: Tokens::default(),
        }
    }

    /// Requires these tokens on every route (see [`auth`]).
    pub fn with_tokens(mut self, tokens: Tokens) -> Self {
        self.tokens = tokens;
        self
    }

    fn known_sold_out(&self, sale: &str, sku: &str) -> bool {
        let flags = self
            .sold_out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        flags
            .get(&(sale.to_owned(), sku.to_owned()))
            .is_some_and(|at| at.elapsed() < self.sold_out_staleness)
    }

    fn set_sold_out(&self, sale: &str, sku: &str, sold_out: bool) {
        let mut flags = self
            .sold_out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (sale.to_owned(), sku.to_owned());
        if sold_out {
            flags.insert(key, Instant::now());
        } else {
            flags.remove(&key);
        }
    }

    /// Clears every sold-out flag of a sale (after a sweep returned units).
    pub fn clear_sold_out(&self, sale: &str) {
        let mut flags = self
            .sold_out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        flags.retain(|(s, _), _| s != sale);
    }
}

/// The API routes; loading a sale and adjusting stock need the admin token,
/// the rest the API token (when tokens are configured).
pub fn router(state: AppState) -> Router {
    let tokens = state.tokens.clone();
    let admin = Router::new()
        .route(paths::SALES, post(load_sale))
        .route(paths::ADJUSTMENTS, post(adjust))
        .route_layer(axum::middleware::from_fn_with_state(
            tokens.clone(),
            auth::require_admin,
        ));
    Router::new()
        .route(paths::RESERVATIONS, post(reserve))
        .route(paths::RESERVATION_BATCHES, post(reserve_batch))
        .route(paths::RESERVATION, get(reservation))
        .route(paths::CONFIRM, post(confirm))
        .route(paths::CANCEL, post(cancel))
        .route(paths::STOCK, get(stock))
        .route_layer(axum::middleware::from_fn_with_state(
            tokens,
            auth::require_api,
        ))
        .merge(admin)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::UnknownSale(sale) => Self::new(
                StatusCode::NOT_FOUND,
                codes::UNKNOWN_SALE,
                format!("sale {sale:?} is not loaded"),
            ),
            StoreError::ClaimExpired(_) | StoreError::NotDurable { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::RETRY,
                err.to_string(),
            ),
            StoreError::Standby => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::STANDBY,
                err.to_string(),
            ),
            StoreError::StockLost { .. } => {
                tracing::error!(error = %err, "refusing to sell");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::STOCK_LOST,
                    err.to_string(),
                )
            }
            other => {
                tracing::warn!(error = %other, "store error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    codes::UNAVAILABLE,
                    "stock store unavailable; retry later",
                )
            }
        }
    }
}

fn check_id(field: &str, value: &str) -> Result<(), ApiError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_ID_LEN
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{field} must be 1-{MAX_ID_LEN} characters of letters, digits, '-', '_', '.', ':'"
        )))
    }
}

async fn load_sale(
    State(state): State<AppState>,
    body: Result<Json<SaleDefinition>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(def) = body.map_err(|r| ApiError::json(r, MAX_BODY_BYTES))?;
    check_id("sale", &def.sale)?;
    if def.items.is_empty() {
        return Err(ApiError::bad_request("items must not be empty"));
    }
    if def.reservation_ttl_ms == 0 {
        return Err(ApiError::bad_request("reservationTtlMs must be positive"));
    }
    for item in &def.items {
        check_id("sku", &item.sku)?;
        if item.per_user_limit == 0 {
            return Err(ApiError::bad_request(format!(
                "perUserLimit of {} must be at least 1",
                item.sku
            )));
        }
        if !(1..=64).contains(&item.shards) {
            return Err(ApiError::bad_request(format!(
                "shards of {} must be 1-64",
                item.sku
            )));
        }
    }
    let items = state.store.load(&def).await?;
    Ok(Json(LoadedSale {
        items,
        sale: def.sale,
    })
    .into_response())
}

async fn reserve(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<ReserveBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path(sale) = path?;
    let Json(body) = body.map_err(|r| ApiError::json(r, MAX_BODY_BYTES))?;
    let (status, record) = reserve_one(&state, sale, body).await?;
    Ok((status, Json(record)).into_response())
}

/// Each member decided as if posted alone, all at once: concurrent members
/// of one SKU join one call of the reserve script.
async fn reserve_batch(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<ReserveBatchBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path(sale) = path?;
    let Json(batch) = body.map_err(|r| ApiError::json(r, MAX_BODY_BYTES))?;
    if !(1..=MAX_BATCH).contains(&batch.reservations.len()) {
        return Err(ApiError::bad_request(format!(
            "reservations must hold 1-{MAX_BATCH} requests"
        )));
    }
    let members = batch
        .reservations
        .into_iter()
        .map(|body| reserve_one(&state, sale.clone(), body));
    let results = futures::future::join_all(members)
        .await
        .into_iter()
        .map(|outcome| match outcome {
            Ok((status, record)) => MemberAnswer {
                status: status.as_u16(),
                reservation: Some(record),
                error: None,
            },
            Err(err) => MemberAnswer {
                status: err.status().as_u16(),
                reservation: None,
                error: Some(ErrorBody {
                    error: err.code().to_owned(),
                    message: err.message().to_owned(),
                }),
            },
        })
        .collect();
    Ok(Json(ReserveBatchAnswer { results }).into_response())
}

/// One reservation request of `sale`, checked and decided: the status it
/// is answered with (201 made now, 200 a repeat) and the record, or the
/// refusal.
async fn reserve_one(
    state: &AppState,
    sale: String,
    body: ReserveBody,
) -> Result<(StatusCode, Reservation), ApiError> {
    let (quantity, amount_minor) = check_reserve_body(&body)?;
    if state.known_sold_out(&sale, &body.sku) {
        state.metrics.reservation("sold_out");
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::SOLD_OUT,
            format!("{} is sold out", body.sku),
        ));
    }
    // A sharded reservation takes several steps; run them on a task of
    // their own so a caller that goes away mid-way does not leave a claim
    // pending until the sweeper's deadline.
    let store = state.store.clone();
    let (task_sale, sku, user, request_id) = (
        sale.clone(),
        body.sku.clone(),
        body.user.clone(),
        body.request_id.clone(),
    );
    let outcome = tokio::spawn(async move {
        let request = ReserveRequest {
            sale: &task_sale,
            sku: &sku,
            user: &user,
            quantity,
            request_id: &request_id,
            amount_minor,
        };
        store.reserve(&request).await
    })
    .await
    .map_err(|err| {
        tracing::warn!(error = %err, "reservation task failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::UNAVAILABLE,
            "the reservation did not finish; retry with the same request id",
        )
    })?
    .inspect_err(|_| state.metrics.reservation("error"))?;
    reserve_answer(state, &sale, &body, outcome)
}

/// The checked quantity and amount of a reservation request, or the 400
/// naming the field that is wrong.
fn check_reserve_body(body: &ReserveBody) -> Result<(u64, u64), ApiError> {
    check_id("sku", &body.sku)?;
    // The rule every part of the order path shares, so a buyer the gateway
    // admits is one the inventory serves.
    flashsale_orders::check_user_id(&body.user)
        .map_err(|err| ApiError::bad_request(format!("user: {err}")))?;
    check_id("requestId", &body.request_id)?;
    let quantity = u64::try_from(body.quantity)
        .ok()
        .filter(|q| (1..=MAX_QUANTITY).contains(q))
        .ok_or_else(|| ApiError::bad_request(format!("quantity must be 1-{MAX_QUANTITY}")))?;
    let amount_minor = u64::try_from(body.amount_minor)
        .map_err(|_| ApiError::bad_request("amountMinor must not be negative"))?;
    Ok((quantity, amount_minor))
}

/// The answer to a reservation the store decided, counted in the metrics;
/// a sold-out answer is remembered for `sale`'s SKU.
fn reserve_answer(
    state: &AppState,
    sale: &str,
    body: &ReserveBody,
    outcome: ReserveOutcome,
) -> Result<(StatusCode, Reservation), ApiError> {
    match outcome {
        ReserveOutcome::Reserved(record) => {
            state.metrics.reservation("ok");
            Ok((StatusCode::CREATED, record))
        }
        ReserveOutcome::Existing(existing) => Ok((StatusCode::OK, existing)),
        ReserveOutcome::Mismatch { id } => Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::IDEMPOTENCY_MISMATCH,
            format!(
                "request id {:?} was used for another SKU or quantity (reservation {id})",
                body.request_id
            ),
        )),
        ReserveOutcome::SoldOut => {
            state.metrics.reservation("sold_out");
            state.set_sold_out(sale, &body.sku, true);
            Err(ApiError::new(
                StatusCode::CONFLICT,
                codes::SOLD_OUT,
                format!("{} is sold out", body.sku),
            ))
        }
        ReserveOutcome::UserLimit { held } => {
            state.metrics.reservation("user_limit");
            Err(ApiError::new(
                StatusCode::CONFLICT,
                codes::USER_LIMIT,
                format!(
                    "user already holds {held} of {}; the per-user limit allows no more",
                    body.sku
                ),
            ))
        }
        ReserveOutcome::UnknownSku => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_SKU,
            format!("sale {sale:?} has no SKU {:?}", body.sku),
        )),
    }
}

async fn reservation(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((sale, id)) = path?;
    match state.store.reservation(&sale, &id).await? {
        Some(r) => Ok(Json(r).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_RESERVATION,
            format!("no reservation {id:?}"),
        )),
    }
}

async fn confirm(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((sale, id)) = path?;
    match state.store.confirm(&sale, &id).await? {
        ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed => Ok(Json(StateChange {
            id,
            state: ReservationState::Confirmed,
        })
        .into_response()),
        ConfirmOutcome::NotReserved => Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::NOT_RESERVED,
            "the reservation lapsed or was cancelled before payment",
        )),
        ConfirmOutcome::Missing => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_RESERVATION,
            format!("no reservation {id:?}"),
        )),
    }
}

async fn cancel(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((sale, id)) = path?;
    match state.store.cancel(&sale, &id).await? {
        CancelOutcome::Cancelled => {
            state.clear_sold_out(&sale);
            Ok(released(id))
        }
        CancelOutcome::AlreadyReleased => Ok(released(id)),
        CancelOutcome::Confirmed => Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::CONFIRMED,
            "a paid reservation is refunded, not cancelled",
        )),
        CancelOutcome::Missing => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_RESERVATION,
            format!("no reservation {id:?}"),
        )),
    }
}

/// The answer to a cancel, whether it released the units now or before.
fn released(id: String) -> Response {
    Json(StateChange {
        id,
        state: ReservationState::Released,
    })
    .into_response()
}

async fn stock(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((sale, sku)) = path?;
    match state.store.stock(&sale, &sku).await? {
        Some(level) => {
            state.metrics.stock(&sku, level.available);
            Ok(Json(level).into_response())
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_SKU,
            format!("sale {sale:?} has no SKU {sku:?}"),
        )),
    }
}

async fn adjust(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Json<AdjustBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Path((sale, sku)) = path?;
    let Json(body) = body.map_err(|r| ApiError::json(r, MAX_BODY_BYTES))?;
    if body.delta == 0 || body.delta.unsigned_abs() > 1_000_000_000 {
        return Err(ApiError::bad_request(
            "delta must be non-zero and at most 1e9 in size",
        ));
    }
    if body.reason.trim().is_empty() || body.reason.len() > 512 {
        return Err(ApiError::bad_request(
            "reason must be 1-512 characters: adjustments are audited",
        ));
    }
    match state
        .store
        .adjust(&sale, &sku, body.delta, &body.reason)
        .await?
    {
        Some(report) => {
            if report.applied > 0 {
                state.set_sold_out(&sale, &sku, false);
            }
            state.metrics.stock(&sku, report.after.available);
            Ok(Json(report).into_response())
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            codes::UNKNOWN_SKU,
            format!("sale {sale:?} has no SKU {sku:?}"),
        )),
    }
}
