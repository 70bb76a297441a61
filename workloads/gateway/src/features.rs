//! The non-core (tier-1/2) routes. They exist so that degradation is real:
//! each one answers in its degraded mode as soon as its switch says so,
//! before the rate limit or a concurrency slot is spent on it. Their backends
//! are outside this project; the gateway answers the normal mode with what a
//! backend would return (a per-user list, a full window, an accepted write),
//! which is enough to measure what degrading saves.
//!
//! Every answer names the mode it was served in (`mode`), and degraded
//! answers carry `X-Flashsale-Degraded: <feature>=<mode>`.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use axum::{
    Json,
    extract::{
        Path, Query, State,
        rejection::{JsonRejection, PathRejection, QueryRejection},
    },
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use flashsale_runtime::ApiError;
use governor::{Quota, RateLimiter, clock::DefaultClock, state::keyed::DefaultKeyedStateStore};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{
    app::{AppState, MAX_BODY_BYTES, RateScope},
    concurrency::Partition,
    degradation::{
        MiniGamesMode, OrderHistoryMode, RecommendationsMode, ReviewsMode, ShopChatMode,
        VoucherPushMode,
    },
    items::ItemError,
};

const DEGRADED: HeaderName = HeaderName::from_static("x-flashsale-degraded");
/// Shop chat while throttled: one message per this interval per user.
pub const CHAT_INTERVAL: Duration = Duration::from_secs(5);
/// Order history window while degraded.
const DEGRADED_HISTORY_DAYS: u32 = 7;
const MAX_HISTORY_DAYS: u32 = 365;

/// Per-user limiter of the throttled shop chat (local to the replica: the
/// degraded mode is a relief valve, not an exact quota).
#[derive(Clone)]
pub struct ChatThrottle(Arc<RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>>);

impl Default for ChatThrottle {
    fn default() -> Self {
        let quota = Quota::with_period(CHAT_INTERVAL)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::MIN);
        Self(Arc::new(RateLimiter::keyed(quota)))
    }
}

impl ChatThrottle {
    /// Forgets users idle for a whole interval.
    pub fn prune(&self) {
        self.0.retain_recent();
    }
}

fn degraded(feature: &str, mode: &str, code: StatusCode, body: Value) -> Response {
    let mut response = (code, Json(body)).into_response();
    if let Ok(value) = HeaderValue::try_from(format!("{feature}={mode}")) {
        response.headers_mut().insert(DEGRADED, value);
    }
    response
}

/// `GET /api/v1/items/{sku}`: stock status from the cache, rate-limited per
/// replica (no Redis round trip for a read that costs nothing shared); under load
/// (degradation tier ≥ 1, or a stale reading) only "available" / "sold out".
pub async fn item_status(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(sku) = path?;
    // Served from this replica's cache: limited by this replica alone.
    let admitted = state.admit(&headers, Partition::NonCore, RateScope::Replica)?;
    let result = state.items.get(&sku).await;
    admitted.permit.success();
    let status = result.map_err(|err| match err {
        ItemError::UnknownSku(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "unknown_sku", err.to_string())
        }
        other => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            other.to_string(),
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("1")),
    })?;
    let coarse = status.stale || state.switches.current().tier >= 1;
    let availability = if status.level.available > 0 {
        "available"
    } else {
        "sold_out"
    };
    let body = if coarse {
        json!({"sku": sku, "status": availability, "detail": "coarse"})
    } else {
        json!({"sku": sku, "status": availability, "available": status.level.available, "stock": status.level.stock})
    };
    let mut response = Json(body).into_response();
    let max_age = state.config.item_cache_ms.div_ceil(1000).max(1);
    if let Ok(value) = HeaderValue::try_from(format!("public, max-age={max_age}")) {
        response.headers_mut().insert(header::CACHE_CONTROL, value);
    }
    Ok(admitted.rate.on(response))
}

/// `GET /api/v1/recommendations`: per-user picks, or one static list.
pub async fn recommendations(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let skus: Vec<&str> = state.config.items.iter().map(|i| i.sku.as_str()).collect();
    if state.switches.current().switches.recommendations == RecommendationsMode::Static {
        let picks: Vec<&str> = skus.iter().take(10).copied().collect();
        return Ok(degraded(
            "recommendations",
            "static",
            StatusCode::OK,
            json!({"mode": "static", "items": picks}),
        ));
    }
    let admitted = state.admit(&headers, Partition::NonCore, RateScope::Shared)?;
    // Stands in for a per-user model: a stable per-user order of the SKUs.
    let mut ranked: Vec<(Vec<u8>, &str)> = skus
        .iter()
        .map(|sku| {
            let score = Sha256::digest(format!("{}\0{sku}", admitted.user.0).as_bytes()).to_vec();
            (score, *sku)
        })
        .collect();
    ranked.sort();
    let picks: Vec<&str> = ranked.into_iter().take(10).map(|(_, sku)| sku).collect();
    admitted.permit.success();
    Ok(admitted
        .rate
        .on(Json(json!({"mode": "personal", "items": picks}))))
}

/// Query of the order history.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// Days back to search (default 30).
    #[serde(default)]
    days: Option<u32>,
}

/// `GET /api/v1/orders/history?days=N`: the window searched shrinks to the
/// last 7 days when degraded (the expensive part of a history search is
/// its range).
pub async fn order_history(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let asked = query.days.unwrap_or(30);
    if !(1..=MAX_HISTORY_DAYS).contains(&asked) {
        return Err(ApiError::bad_request(format!(
            "days must be 1-{MAX_HISTORY_DAYS}"
        )));
    }
    let admitted = state.admit(&headers, Partition::NonCore, RateScope::Shared)?;
    let limited = state.switches.current().switches.order_history == OrderHistoryMode::Last7Days;
    let days = if limited {
        asked.min(DEGRADED_HISTORY_DAYS)
    } else {
        asked
    };
    let to = jiff::Timestamp::now();
    let from = to
        .checked_sub(jiff::SignedDuration::from_hours(24 * i64::from(days)))
        .unwrap_or(to);
    admitted.permit.success();
    let body = json!({
        "mode": if limited { "last7Days" } else { "normal" },
        "from": from.to_string(), "to": to.to_string(), "days": days, "orders": [],
    });
    let response = if limited {
        degraded("orderHistory", "last7Days", StatusCode::OK, body)
    } else {
        Json(body).into_response()
    };
    Ok(admitted.rate.on(response))
}

/// `POST /api/v1/vouchers/push`: sent now (200), or accepted for later (202).
pub async fn voucher_push(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let admitted = state.admit(&headers, Partition::NonCore, RateScope::Shared)?;
    admitted.permit.success();
    let response = if state.switches.current().switches.voucher_push == VoucherPushMode::Deferred {
        degraded(
            "voucherPush",
            "deferred",
            StatusCode::ACCEPTED,
            json!({"mode": "deferred", "status": "deferred"}),
        )
    } else {
        Json(json!({"mode": "normal", "status": "sent"})).into_response()
    };
    Ok(admitted.rate.on(response))
}

/// Body of a review.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewBody {
    sku: String,
    rating: u8,
    #[serde(default)]
    text: String,
}

/// `POST /api/v1/reviews`: written (201), or queued for later (202).
pub async fn review(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<ReviewBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let user = state.user(&headers)?;
    let Json(review) = body.map_err(|r| ApiError::json(r, MAX_BODY_BYTES))?;
    if !(1..=5).contains(&review.rating) || review.text.len() > 4_000 {
        return Err(ApiError::bad_request(
            "rating must be 1-5 and text at most 4000 bytes",
        ));
    }
    if state.config.price(&review.sku).is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_sku",
            format!("no SKU {:?}", review.sku),
        ));
    }
    let rate = state.rate_limit(&user, RateScope::Shared)?;
    let queued = state.switches.current().switches.reviews == ReviewsMode::Queued;
    let response = if queued {
        degraded(
            "reviews",
            "queued",
            StatusCode::ACCEPTED,
            json!({"mode": "queued", "status": "queued"}),
        )
    } else {
        let permit = state.permit(Partition::NonCore)?;
        permit.success();
        (
            StatusCode::CREATED,
            Json(json!({"mode": "normal", "status": "written"})),
        )
            .into_response()
    };
    Ok(rate.on(response))
}

/// `POST /api/v1/chat/messages`: unthrottled, or one message per 5 s per user.
pub async fn chat_message(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let admitted = state.admit(&headers, Partition::NonCore, RateScope::Shared)?;
    admitted.permit.success();
    if state.switches.current().switches.shop_chat == ShopChatMode::Throttled {
        if let Err(not_until) = state.chat.0.check_key(&admitted.user.0) {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(state.chat.0.clock()));
            let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "chat_throttled",
                format!(
                    "shop chat is limited to one message per {} s during the sale",
                    CHAT_INTERVAL.as_secs()
                ),
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from(seconds))
            .with_header(DEGRADED, HeaderValue::from_static("shopChat=throttled")));
        }
        return Ok(admitted.rate.on(degraded(
            "shopChat",
            "throttled",
            StatusCode::OK,
            json!({"mode": "throttled", "status": "delivered"}),
        )));
    }
    Ok(admitted
        .rate
        .on(Json(json!({"mode": "normal", "status": "delivered"}))))
}

/// `GET /api/v1/games`: open, or a closed notice with 200 (a page, not an error).
pub async fn mini_games(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if state.switches.current().switches.mini_games == MiniGamesMode::Closed {
        return Ok(degraded(
            "miniGames",
            "closed",
            StatusCode::OK,
            json!({"mode": "closed", "open": false, "notice": "Mini-games are paused during the sale. They will be back soon."}),
        ));
    }
    let admitted = state.admit(&headers, Partition::NonCore, RateScope::Shared)?;
    admitted.permit.success();
    Ok(admitted
        .rate
        .on(Json(json!({"mode": "normal", "open": true}))))
}
