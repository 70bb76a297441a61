//! The waiting room over HTTP: a user without a pass is queued (202 with a
//! signed ticket, as a cookie and in JSON), polls `GET /api/v1/queue/status`
//! (or watches the `/queue` page, which polls for them), and once admitted
//! receives a one-time pass that `POST /api/v1/orders` redeems.

use axum::{
    Json,
    extract::{Query, State, rejection::QueryRejection},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{Html, IntoResponse, Response},
};
use flashsale_runtime::ApiError;
use serde::Deserialize;
use serde_json::json;

use crate::{
    app::AppState,
    auth::User,
    waiting_room::{Error as RoomError, Redeemed, WaitingRoom},
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
pub enum Entry {
    /// The pass was good: go on.
    Admitted(Redeemed),
    /// No pass: queued; this is the 202 answer.
    Queued(Response),
}

/// Redeems the request's pass, or queues the user when there is none.
pub async fn redeem_pass(
    state: &AppState,
    room: &WaitingRoom,
    headers: &HeaderMap,
    user: &User,
) -> Result<Entry, ApiError> {
    let Some(pass) = presented(headers, PASS_HEADER, PASS_COOKIE) else {
        let joined = room.join(&user.0).await.map_err(room_error)?;
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
            &mut response,
            TICKET_COOKIE,
            &joined.ticket,
            state.config.waiting_room.pass_ttl_seconds.max(3600),
        );
        return Ok(Entry::Queued(response));
    };
    let redeemed = room.redeem(&pass, &user.0).await.map_err(room_error)?;
    Ok(Entry::Admitted(redeemed))
}

/// Where a ticket may come from besides the cookie and header.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// The ticket, for pages opened from a link.
    #[serde(default)]
    ticket: Option<String>,
}

/// `GET /api/v1/queue/status`: position, estimated wait, next poll time;
/// the pass once admitted. The ticket proves who polls; a bearer token,
/// when sent, must name the ticket's user.
pub async fn status(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let Some(room) = &state.waiting_room else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_waiting_room",
            "this sale has no waiting room; order directly",
        ));
    };
    let ticket = query
        .ticket
        .or_else(|| presented(&headers, TICKET_HEADER, TICKET_COOKIE))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing_ticket",
                "no queue ticket: POST /api/v1/orders to join the queue",
            )
        })?;
    let user = match headers.contains_key(header::AUTHORIZATION) {
        true => Some(state.user(&headers)?),
        false => None,
    };
    let status = room
        .status(&ticket, user.as_ref().map(|u| u.0.as_str()))
        .await
        .map_err(room_error)?;
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

fn set_cookie(response: &mut Response, name: &str, value: &str, max_age_seconds: u64) {
    // HttpOnly: page scripts never need the token, the browser sends it.
    let cookie =
        format!("{name}={value}; Path=/; Max-Age={max_age_seconds}; HttpOnly; SameSite=Lax");
    if let Ok(value) = HeaderValue::try_from(cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
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
}
