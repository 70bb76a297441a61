//! Who may call the reservation API: bearer tokens read from files (mounted
//! from a Secret the operator creates per sale).
//!
//! Two tokens, because the callers need different powers: the gateway and
//! the operator's probe send the *API token* (reserve, read, confirm,
//! cancel, stock); loading a sale and adjusting stock take the *admin
//! token*, which only the inventory's own pods and an operator hold. A
//! bearer token over the cluster network was chosen over mTLS: it needs no
//! certificate authority or rotation machinery in the operator, a Secret
//! update rotates it, and the per-workload NetworkPolicy already keeps other
//! pods from reaching the inventory at all. Tokens are compared in constant
//! time. With no token configured the API is open (local runs), and the
//! process says so at start.

use std::{path::Path, sync::Arc};

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::Response,
};
use flashsale_runtime::ApiError;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The API token or the admin token.
    Api,
    /// The admin token.
    Admin,
}

/// The tokens this inventory accepts.
#[derive(Clone, Default)]
pub struct Tokens {
    api: Option<Arc<[u8; 32]>>,
    admin: Option<Arc<[u8; 32]>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("api", &self.api.is_some())
            .field("admin", &self.admin.is_some())
            .finish()
    }
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("token file {path}: {reason}")]
pub struct TokenError {
    path: String,
    reason: String,
}

impl Tokens {
    /// Tokens given as values (tests, or callers that read them elsewhere).
    pub fn new(api: Option<&str>, admin: Option<&str>) -> Self {
        Self {
            api: api.map(digest),
            admin: admin.map(digest),
        }
    }

    /// Reads the tokens from files; surrounding whitespace is ignored and an
    /// empty file is an error (it would let an empty header in).
    pub fn from_files(api: Option<&Path>, admin: Option<&Path>) -> Result<Self, TokenError> {
        let read = |path: &Path| -> Result<String, TokenError> {
            let error = |reason: String| TokenError {
                path: path.display().to_string(),
                reason,
            };
            let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
            let token = text.trim();
            if token.len() < 16 {
                return Err(error("a token must be at least 16 characters".to_owned()));
            }
            Ok(token.to_owned())
        };
        let api = api.map(read).transpose()?;
        let admin = admin.map(read).transpose()?;
        Ok(Self::new(api.as_deref(), admin.as_deref()))
    }

    /// Whether any token is required.
    pub fn enforced(&self) -> bool {
        self.api.is_some() || self.admin.is_some()
    }

    /// Checks a request's `Authorization` value for `access`.
    pub fn check(&self, access: Access, authorization: Option<&str>) -> Result<(), ApiError> {
        if !self.enforced() {
            return Ok(());
        }
        let given = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| digest(t.trim()));
        let Some(given) = given else {
            return Err(unauthorized("a bearer token is required"));
        };
        let matches = |token: &Option<Arc<[u8; 32]>>| {
            token
                .as_deref()
                .is_some_and(|t| bool::from(t.ct_eq(&*given)))
        };
        if matches(&self.admin) {
            return Ok(());
        }
        if matches(&self.api) {
            return match access {
                Access::Api => Ok(()),
                Access::Admin => Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "this route needs the admin token",
                )),
            };
        }
        Err(unauthorized("the bearer token is not valid"))
    }
}

/// Hashing first makes every comparison the same length.
fn digest(token: &str) -> Arc<[u8; 32]> {
    Arc::new(Sha256::digest(token.as_bytes()).into())
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
}

/// Middleware for routes that need the API token.
pub async fn require_api(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    guard(&tokens, Access::Api, request, next).await
}

/// Middleware for routes that need the admin token.
pub async fn require_admin(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    guard(&tokens, Access::Admin, request, next).await
}

async fn guard(tokens: &Tokens, access: Access, request: Request, next: Next) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match tokens.check(access, authorization) {
        Ok(()) => next.run(request).await,
        Err(err) => axum::response::IntoResponse::into_response(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: &str = "api-token-0123456789";
    const ADMIN: &str = "admin-token-0123456789";

    fn status(tokens: &Tokens, access: Access, header: Option<&str>) -> Option<u16> {
        tokens
            .check(access, header)
            .err()
            .map(|e| e.status().as_u16())
    }

    #[test]
    fn each_token_opens_only_its_routes() {
        let tokens = Tokens::new(Some(API), Some(ADMIN));
        let bearer = |t: &str| format!("Bearer {t}");
        assert_eq!(status(&tokens, Access::Api, Some(&bearer(API))), None);
        assert_eq!(
            status(&tokens, Access::Admin, Some(&bearer(API))),
            Some(403)
        );
        assert_eq!(status(&tokens, Access::Admin, Some(&bearer(ADMIN))), None);
        assert_eq!(status(&tokens, Access::Api, Some(&bearer(ADMIN))), None);
        assert_eq!(status(&tokens, Access::Api, Some("Bearer nope")), Some(401));
        assert_eq!(status(&tokens, Access::Api, Some(API)), Some(401));
        assert_eq!(status(&tokens, Access::Api, None), Some(401));
    }

    #[test]
    fn no_tokens_means_open_and_admin_only_keeps_the_api_closed() {
        assert_eq!(status(&Tokens::default(), Access::Admin, None), None);
        let admin_only = Tokens::new(None, Some(ADMIN));
        assert_eq!(status(&admin_only, Access::Api, None), Some(401));
    }

    #[test]
    fn short_or_missing_token_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("inv-tokens-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let short = dir.join("short");
        let good = dir.join("good");
        let written = std::fs::write(&short, "abc\n")
            .and_then(|()| std::fs::write(&good, format!("{API}\n")));
        assert!(written.is_ok());
        assert!(Tokens::from_files(Some(&short), None).is_err());
        assert!(Tokens::from_files(Some(&dir.join("absent")), None).is_err());
        let tokens = Tokens::from_files(Some(&good), None);
        assert!(tokens.is_ok_and(|t| t.check(Access::Api, Some(&format!("Bearer {API}"))).is_ok()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
