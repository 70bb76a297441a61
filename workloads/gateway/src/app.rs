//! The public HTTP API: shared state, the routes, and the guards every
//! request passes in the funnel's order (switched-off feature → token →
//! sale window (orders only) → rate limit → waiting room → concurrency
//! limit), each refusing as cheaply as it can.

use std::{sync::Arc, time::Instant};

use axum::{
    Router,
    extract::{DefaultBodyLimit, MatchedPath, Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use flashsale_orders::OrderProducer;
use flashsale_runtime::{ApiError, REGION_HEADER};

use crate::{
    auth::{User, Verifier},
    bot_shield::{Shield, source::SourceBudget},
    clock::SaleClock,
    concurrency::{ConcurrencyLimiter, Partition, Permit},
    config::GatewayConfig,
    degradation::Switchboard,
    features::{self, ChatThrottle},
    inventory_client::InventoryClient,
    items::ItemCache,
    metrics::{DrillOrder, GatewayMetrics},
    orders,
    payments::{self, PaymentVerifier},
    queue,
    ratelimit::{RateLimiter, rate_limit_headers},
    waiting_room::{OrderSpends, WaitingRoom},
};

/// Largest request body accepted: orders and feature posts are small.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Everything the handlers share; cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// The parts of [`AppState`].
pub struct Inner {
    /// The sale's configuration.
    pub config: GatewayConfig,
    /// Bearer-token verification.
    pub verifier: Verifier,
    /// The sale's clock (Redis's), shared with the verifier.
    pub clock: Arc<SaleClock>,
    /// Per-user rate limit.
    pub rate: RateLimiter,
    /// Adaptive concurrency limit.
    pub limiter: ConcurrencyLimiter,
    /// Degradation switches in force.
    pub switches: Switchboard,
    /// The waiting room, when the sale has one.
    pub waiting_room: Option<WaitingRoom>,
    /// The proof of work in front of the waiting room's join, or of every
    /// order when there is no room, when the sale has one.
    pub bot_shield: Option<Shield>,
    /// Where an order spends its proof: with a bot shield and no waiting
    /// room (a room's join spends it otherwise).
    pub order_spends: Option<OrderSpends>,
    /// The per-source quota of joins, when the shield has one.
    pub source_budget: Option<SourceBudget>,
    /// The inventory's API.
    pub inventory: InventoryClient,
    /// Order events to Kafka.
    pub producer: Arc<OrderProducer>,
    /// Redis shared by the replicas, when configured.
    pub redis: Option<flashsale_runtime::RedisConnection>,
    /// Stock status cache.
    pub items: ItemCache,
    /// Checks the payment provider's callbacks, when a secret is configured.
    pub payments: Option<PaymentVerifier>,
    /// Shop-chat throttle used when the chat is degraded.
    pub chat: ChatThrottle,
    /// Metrics.
    pub metrics: GatewayMetrics,
}

impl std::ops::Deref for AppState {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// State over its parts.
    pub fn new(inner: Inner) -> Self {
        Self(Arc::new(inner))
    }

    /// The caller, from the bearer token.
    pub fn user(&self, headers: &HeaderMap) -> Result<User, ApiError> {
        self.verifier.user(headers)
    }

    /// The drill buyer of the request, if its token is a drill buyer's
    /// (see [`Verifier::drill_buyer`]).
    pub fn drill_buyer(&self, headers: &HeaderMap) -> Option<Result<User, ApiError>> {
        self.verifier.drill_buyer(headers)
    }

    /// The per-user rate limit: the fields to add to the answer, or a 429.
    pub fn rate_limit(&self, user: &User, scope: RateScope) -> Result<RateHeaders, ApiError> {
        let policy = self.rate.policy();
        let decision = match scope {
            RateScope::Shared => {
                let decision = self.rate.check(&self.config.sale, &user.0);
                self.metrics.rate_limit_decision(decision.source);
                decision
            }
            RateScope::Replica => self.rate.check_locally(&self.config.sale, &user.0),
        };
        let headers = rate_limit_headers(policy, &decision);
        if decision.allowed {
            return Ok(RateHeaders(headers));
        }
        self.metrics.rate_limited();
        let mut refusal = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "at most {} requests per second (burst {}) per user; retry after the Retry-After delay",
                policy.rate, policy.burst
            ),
        );
        for (name, value) in headers {
            refusal = refusal.with_header(name, value);
        }
        Err(refusal)
    }

    /// A slot under the adaptive concurrency limit, or a 503 at once.
    pub fn permit(&self, partition: Partition) -> Result<Permit, ApiError> {
        self.limiter.try_acquire(partition).map_err(|rejected| {
            let label = match partition {
                Partition::Core => "core",
                Partition::NonCore => "non_core",
            };
            self.metrics.concurrency_rejected(label);
            let seconds = rejected.retry_after.as_secs().max(1);
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "the gateway is at its concurrency limit; retry shortly",
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from(seconds))
        })
    }

    /// The common guards of an authenticated route: user, rate limit, slot.
    pub fn admit(
        &self,
        headers: &HeaderMap,
        partition: Partition,
        scope: RateScope,
    ) -> Result<Admitted, ApiError> {
        let user = self.user(headers)?;
        let rate = self.rate_limit(&user, scope)?;
        let permit = self.permit(partition)?;
        Ok(Admitted { user, rate, permit })
    }
}

/// Where a request's rate-limit decision is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateScope {
    /// The shared GCRA in Redis: one quota per user across all replicas.
    Shared,
    /// This replica's in-process GCRA (same policy), for requests served
    /// from the gateway's own memory.
    Replica,
}

/// The rate-limit fields of an allowed request, added to its answer.
#[derive(Debug, Default)]
pub struct RateHeaders(Vec<(HeaderName, HeaderValue)>);

impl RateHeaders {
    /// `response` with the fields added.
    pub fn on(self, response: impl IntoResponse) -> Response {
        let mut response = response.into_response();
        response.headers_mut().extend(self.0);
        response
    }
}

/// A request past the common guards.
pub struct Admitted {
    /// The caller.
    pub user: User,
    /// Rate-limit fields for the answer.
    pub rate: RateHeaders,
    /// The concurrency slot; report how it went with `success`/`ignore`.
    pub permit: Permit,
}

/// The public routes over `state`.
pub fn router(state: AppState) -> Router {
    let edge = Edge {
        metrics: state.metrics.clone(),
        region: state
            .config
            .region
            .as_deref()
            .and_then(|region| HeaderValue::from_str(region).ok()),
    };
    Router::new()
        .route("/api/v1/orders", post(orders::place))
        .route("/api/v1/orders/{id}/pay", post(payments::start))
        .route("/api/v1/payments/callback", post(payments::callback))
        .route("/api/v1/orders/history", get(features::order_history))
        .route("/api/v1/items/{sku}", get(features::item_status))
        .route("/api/v1/recommendations", get(features::recommendations))
        .route("/api/v1/vouchers/push", post(features::voucher_push))
        .route("/api/v1/reviews", post(features::review))
        .route("/api/v1/chat/messages", post(features::chat_message))
        .route("/api/v1/games", get(features::mini_games))
        .route("/api/v1/queue/status", get(queue::status))
        .route("/api/v1/queue/challenge", post(queue::challenge))
        .route("/api/v1/queue/join", post(queue::join))
        .route("/queue", get(queue::page))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
        .layer(middleware::from_fn_with_state(edge, observe))
}

/// What every answer passes through on its way out.
#[derive(Clone)]
struct Edge {
    metrics: GatewayMetrics,
    /// The region stamped on every answer, when the sale names one.
    region: Option<HeaderValue>,
}

/// Counts, times and tracks every request by its route template, and names
/// the region on its answer.
async fn observe(
    State(Edge { metrics, region }): State<Edge>,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let route = matched
        .as_ref()
        .map(MatchedPath::as_str)
        .unwrap_or("unmatched")
        .to_owned();
    let started = Instant::now();
    metrics.inflight().inc();
    // Decrements even when the client goes away mid-request.
    scopeguard::defer! {
        metrics.inflight().dec();
    }
    let mut response = next.run(request).await;
    if let Some(region) = region {
        response.headers_mut().insert(REGION_HEADER, region);
    }
    let code = response.status().as_u16();
    if response.extensions().get::<DrillOrder>().is_some() {
        metrics.drill_order(code);
    } else {
        metrics.request(&route, code, started.elapsed().as_secs_f64());
    }
    response
}
