//! The waiting room over HTTP: a user without a pass is queued (202 with a
//! signed ticket, as a cookie and in JSON), polls `GET /api/v1/queue/status`
//! (or watches the `/queue` page, which polls for them), and once admitted
//! receives a one-time pass that `POST /api/v1/orders` redeems.
//!
//! The status needs the buyer's bearer token, and the ticket must be theirs.
//! Tickets and passes travel in a header or a cookie, never in the URL (where
//! access logs, proxies and `Referer` headers would keep them): a status
//! request with a query string is refused. The gateway's cookies are
//! `HttpOnly; SameSite=Lax; Secure`; `waitingRoom.insecureCookies: true`
//! drops `Secure` for local runs over plain HTTP.
//!
//! With the bot shield on, joining (or, where the sale has no waiting
//! room, ordering) takes a solved challenge from
//! `POST /api/v1/queue/challenge`, carried in `X-Queue-Proof`
//! ([`crate::bot_shield`]).

use std::net::{IpAddr, SocketAddr};

use axum::{
    Extension, Json,
    extract::{ConnectInfo, State},
    http::{HeaderMap, HeaderValue, StatusCode, Uri, header},
    response::{Html, IntoResponse, Response},
};
use flashsale_runtime::ApiError;
use serde_json::json;

use crate::{
    app::{AppState, RateHeaders, RateScope},
    auth::User,
    bot_shield::{ALGORITHM, PROOF_HEADER},
    waiting_room::{Error as RoomError, OrderSpends, PassLease, Refusal, Spend, WaitingRoom},
};

/// Cookie holding the queue ticket.
pub const TICKET_COOKIE: &str = "fs_queue_ticket";
/// Cookie holding the checkout pass.
pub const PASS_COOKIE: &str = "fs_queue_pass";
/// Header alternatives for clients that do not keep cookies.
pub const TICKET_HEADER: &str = "x-queue-ticket";
/// Header carrying the pass.
pub const PASS_HEADER: &str = "x-queue-pass";

const PAGE: &str = include_str!("queue.html");

/// What the waiting room says about an order request.
pub enum Entry<A> {
    /// The pass was good: go on with `A` (what the redemption left to do).
    Admitted(A),
    /// No pass: queued; this is the 202 answer.
    Queued(Response),
}

/// Redeems the request's pass on lease, or queues the user when there is
/// none, spending `spend`, the join challenge [`proof`] checked. Call
/// [`PassLease::commit`] once the order succeeded and
/// [`PassLease::give_back`] when it failed for a reason that is not the
/// buyer's; a lease dropped undecided (the client went away) gives the pass
/// back by itself.
pub async fn lease_pass(
    state: &AppState,
    room: &WaitingRoom,
    headers: &HeaderMap,
    user: &User,
    spend: Option<Spend>,
) -> Result<Entry<PassLease>, ApiError> {
    match pass_or_queue(state, room, headers, user, spend).await? {
        Ok(pass) => room
            .lease(&pass, &user.0)
            .await
            .map(Entry::Admitted)
            .map_err(room_error),
        Err(queued) => Ok(Entry::Queued(queued)),
    }
}

/// The request's pass, or (when it has none) the user queued and the 202
/// answer saying so.
async fn pass_or_queue(
    state: &AppState,
    room: &WaitingRoom,
    headers: &HeaderMap,
    user: &User,
    spend: Option<Spend>,
) -> Result<Result<String, Response>, ApiError> {
    if let Some(pass) = pass_of(headers) {
        return Ok(Ok(pass));
    }
    queued(state, room, user, spend).await.map(Err)
}

/// Queues `user`, spending `spend`: the 202 answer with the ticket.
async fn queued(
    state: &AppState,
    room: &WaitingRoom,
    user: &User,
    spend: Option<Spend>,
) -> Result<Response, ApiError> {
    let joined = room
        .join_spending(&user.0, spend)
        .await
        .map_err(|err| match err {
            RoomError::Refused(refusal) => refused_proof(state, refusal),
            other => room_error(other),
        })?;
    let body = json!({
        "status": "queued",
        "ticket": joined.ticket,
        "position": joined.position,
        "ahead": joined.ahead,
        "estimatedWaitSeconds": joined.estimated_wait.as_secs_f64().ceil() as u64,
        "nextPollMs": joined.next_poll.as_millis() as u64,
        "statusUrl": "/api/v1/queue/status",
        "queueUrl": "/queue",
    });
    let mut response = (StatusCode::ACCEPTED, Json(body)).into_response();
    set_cookie(
        state,
        &mut response,
        TICKET_COOKIE,
        &joined.ticket,
        state.config.waiting_room.pass_ttl_seconds.max(3600),
    );
    Ok(response)
}

/// `POST /api/v1/queue/join`: queues the caller without an order, as the
/// `/queue` page does once it has solved its challenge; the same 202 as an
/// order without a pass. Only inside the sale window, and with a proof
/// when the sale has a bot shield.
pub async fn join(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some(room) = &state.waiting_room else {
        return Err(no_waiting_room());
    };
    let user = state.user(&headers)?;
    state.config.window_state(jiff::Timestamp::now()).check()?;
    let (spend, rate) = proven_and_limited(&state, &headers, peer, &user, true)?;
    Ok(rate.on(queued(&state, room, &user, spend).await?))
}

/// A request's proof, checked by [`proof`] when it needs one (`proving`:
/// a join, or an order where the sale has no waiting room), then its rate
/// limit: a request that spends a proof is limited by this replica alone,
/// since a charge to the shared quota would write to Redis before the
/// proof is spent, and the proof is the dearer limit; anything else under
/// the shared quota. A proven request the user's limit lets through is
/// then charged to its source's budget, when the shield has one.
pub fn proven_and_limited(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    user: &User,
    proving: bool,
) -> Result<(Option<Spend>, RateHeaders), ApiError> {
    let spend = if proving {
        proof(state, headers, user)?
    } else {
        None
    };
    let scope = if spend.is_some() {
        RateScope::Replica
    } else {
        RateScope::Shared
    };
    let rate = state.rate_limit(user, scope)?;
    if spend.is_some() {
        let peer = peer.map(|Extension(ConnectInfo(peer))| peer.ip());
        charge_source(state, headers, peer)?;
    }
    Ok((spend, rate))
}

fn no_waiting_room() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_waiting_room",
        "this sale has no waiting room; order directly",
    )
}

/// The request's order pass, from its header or its cookie: a request
/// without one is a join.
pub fn pass_of(headers: &HeaderMap) -> Option<String> {
    presented(headers, PASS_HEADER, PASS_COOKIE)
}

/// The challenge the request's proof spends, checked: one HMAC and one
/// hash, no Redis call. `None` when the sale has no bot shield.
fn proof(state: &AppState, headers: &HeaderMap, user: &User) -> Result<Option<Spend>, ApiError> {
    let Some(shield) = &state.bot_shield else {
        return Ok(None);
    };
    let Some(proof) = headers.get(PROOF_HEADER) else {
        state.metrics.bot_refusal("missing");
        return Err(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "challenge_required",
            "joining the queue (or ordering, where a sale has none) takes a solved challenge: POST /api/v1/queue/challenge, then send <challenge>:<solution> in the X-Queue-Proof header",
        ));
    };
    proof
        .to_str()
        .map_err(|_| Refusal::Malformed)
        .and_then(|proof| shield.check(proof, &user.0))
        .map(Some)
        .map_err(|refusal| refused_proof(state, refusal))
}

/// Charges a proven request to the budget of its source (`peer`'s, or the
/// one a trusted proxy names), when the shield has one: 429 once it is
/// used up, whatever the accounts.
fn charge_source(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<(), ApiError> {
    let Some(budget) = &state.source_budget else {
        return Ok(());
    };
    let decision = budget.check(&state.config.sale, &budget.source(peer, headers));
    if decision.allowed {
        return Ok(());
    }
    state.metrics.bot_refusal("source_budget");
    let wait = decision.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    Err(ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "source_budget",
        "too many proven requests from this source, whatever the accounts; retry after the Retry-After delay",
    )
    .with_header(header::RETRY_AFTER, HeaderValue::from(wait)))
}

/// Spends `spend`, the proof of an order placed without a waiting room,
/// for the order of `request_id` (whose retry may spend it again). Without
/// Redis's answer the order is refused (503): a proof that cannot be
/// spent cannot be told from a replay.
pub async fn spend_for_order(
    state: &AppState,
    spends: &OrderSpends,
    spend: Spend,
    request_id: &str,
) -> Result<(), ApiError> {
    match spends.spend(spend, request_id).await {
        Ok(()) => Ok(()),
        Err(RoomError::Refused(refusal)) => Err(refused_proof(state, refusal)),
        Err(err) => {
            tracing::warn!(error = %err, "bot shield: an order's proof not spent");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the bot shield cannot spend proofs right now; retry shortly with the same proof",
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1")))
        }
    }
}

/// The answer to a refused proof, counted by reason.
fn refused_proof(state: &AppState, refusal: Refusal) -> ApiError {
    state.metrics.bot_refusal(refusal.code());
    room_error(refusal.into())
}

/// `POST /api/v1/queue/challenge`: a join challenge for the caller (an
/// order's, when the sale has no waiting room), at the difficulty of the
/// degradation tier in force. Needs the buyer's bearer token; costs one
/// HMAC and no Redis call: its expiry is on the sale's clock, this
/// replica's reading of Redis's.
pub async fn challenge(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some(shield) = &state.bot_shield else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_bot_shield",
            "this sale asks no proof of work",
        ));
    };
    let user = state.user(&headers)?;
    let rate = state.rate_limit(&user, RateScope::Replica)?;
    let now_ms = u64::try_from(state.clock.now_ms()).unwrap_or(0);
    let issued = shield.issue(&user.0, state.switches.current().tier, now_ms);
    let body = json!({
        "challenge": issued.token,
        "difficulty": issued.difficulty,
        "algorithm": ALGORITHM,
        "expiresAtMs": issued.expires_at_ms,
        "proofHeader": "X-Queue-Proof",
    });
    let mut response = rate.on(Json(body));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `GET /api/v1/queue/status`: position, estimated wait, next poll time;
/// the pass once admitted. Needs the bearer token of the ticket's user and
/// the ticket in `X-Queue-Ticket` or the ticket cookie.
pub async fn status(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let Some(room) = &state.waiting_room else {
        return Err(no_waiting_room());
    };
    let user = state.user(&headers)?;
    if uri.query().is_some() {
        return Err(ApiError::bad_request(format!(
            "the queue status takes no query string: send the ticket in the {TICKET_HEADER} header or the {TICKET_COOKIE} cookie, never in a URL"
        )));
    }
    let ticket = presented(&headers, TICKET_HEADER, TICKET_COOKIE).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_ticket",
            "no queue ticket: POST /api/v1/orders to join the queue",
        )
    })?;
    let status = room.status(&ticket, &user.0).await.map_err(room_error)?;
    let body = json!({
        "position": status.position,
        "ahead": status.ahead,
        "estimatedWaitSeconds": status.estimated_wait.as_secs_f64().ceil() as u64,
        "nextPollMs": status.next_poll.as_millis() as u64,
        "admitted": status.admitted,
        "pass": status.pass,
        "passExpiresAtMs": status.pass_expires_at_ms,
    });
    let mut response = Json(body).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(pass) = &status.pass {
        set_cookie(
            &state,
            &mut response,
            PASS_COOKIE,
            pass,
            state.config.waiting_room.pass_ttl_seconds,
        );
    }
    Ok(response)
}

/// `GET /queue`: the page a queued shopper watches.
pub async fn page() -> Response {
    let mut response = Html(PAGE).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn room_error(err: RoomError) -> ApiError {
    match err {
        RoomError::Refused(refusal) => {
            let status = if refusal.code() == "malformed" {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::FORBIDDEN
            };
            ApiError::new(status, refusal.code(), refusal.to_string())
        }
        RoomError::InvalidUser(_) | RoomError::WeakKey(_) => ApiError::bad_request(err.to_string()),
        other => {
            tracing::warn!(error = %other, "waiting room unavailable");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the waiting room cannot answer right now; retry shortly",
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
        }
    }
}

/// A token from its header, else from its cookie.
fn presented(headers: &HeaderMap, header_name: &str, cookie: &str) -> Option<String> {
    if let Some(value) = headers.get(header_name).and_then(|v| v.to_str().ok()) {
        return Some(value.trim().to_owned()).filter(|v| !v.is_empty());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == cookie)
        .map(|(_, value)| value.to_owned())
        .filter(|v| !v.is_empty())
}

fn set_cookie(
    state: &AppState,
    response: &mut Response,
    name: &str,
    value: &str,
    max_age_seconds: u64,
) {
    let secure = !state.config.waiting_room.insecure_cookies;
    if let Ok(value) = HeaderValue::try_from(cookie(name, value, max_age_seconds, secure)) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

/// A `Set-Cookie` value. HttpOnly: page scripts never need the token, the
/// browser sends it. Secure unless turned off, so the browser never sends a
/// ticket or pass over plain HTTP, where anyone on the way could read it.
fn cookie(name: &str, value: &str, max_age_seconds: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={value}; Path=/; Max-Age={max_age_seconds}; HttpOnly; SameSite=Lax{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_from_the_header_first_then_the_cookie() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; fs_queue_ticket=T1; b=2"),
        );
        assert_eq!(
            presented(&headers, TICKET_HEADER, TICKET_COOKIE),
            Some("T1".into())
        );
        headers.insert(TICKET_HEADER, HeaderValue::from_static("T2"));
        assert_eq!(
            presented(&headers, TICKET_HEADER, TICKET_COOKIE),
            Some("T2".into())
        );
        assert_eq!(presented(&HeaderMap::new(), PASS_HEADER, PASS_COOKIE), None);
    }

    #[test]
    fn cookies_are_secure_unless_turned_off() {
        assert_eq!(
            cookie("fs_queue_ticket", "T", 60, true),
            "fs_queue_ticket=T; Path=/; Max-Age=60; HttpOnly; SameSite=Lax; Secure"
        );
        assert_eq!(
            cookie("fs_queue_pass", "P", 5, false),
            "fs_queue_pass=P; Path=/; Max-Age=5; HttpOnly; SameSite=Lax"
        );
    }
}
