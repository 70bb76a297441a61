//! The one error answer of every flash-sale HTTP API: a status with a JSON
//! body `{"error": <stable code>, "message": <text>}`, so clients branch on
//! the code and people read the message.

use axum::{
    Json,
    extract::rejection::{JsonRejection, PathRejection, QueryRejection},
    http::{HeaderName, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::json;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl ApiError {
    /// An answer with `status`, a stable snake_case `code` and a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    /// 400 `invalid_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// The answer to a JSON body that could not be taken: 413 naming the
    /// endpoint's `max_body_bytes`, 415 without a JSON content type, 400 for
    /// syntax errors, 422 for wrong types or missing and unknown fields.
    pub fn json(rejection: JsonRejection, max_body_bytes: usize) -> Self {
        match rejection {
            JsonRejection::BytesRejection(_)
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Self::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("bodies are limited to {max_body_bytes} bytes"),
                )
            }
            JsonRejection::MissingJsonContentType(_) => Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send Content-Type: application/json",
            ),
            other => Self::new(other.status(), "invalid_json", other.body_text()),
        }
    }

    /// Adds a response header (e.g. `Retry-After`).
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The status of this answer.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code of this answer.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message of this answer.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(json!({"error": self.code, "message": self.message})),
        )
            .into_response();
        response.headers_mut().extend(self.headers);
        response
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}
