//! Who is calling: the user comes only from a verified bearer token (a JWT
//! signed with HS256 or RS256, `sub` = user id, `exp` required), never from a
//! header a client could simply set.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use flashsale_runtime::ApiError;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;

/// Longest user id accepted (the order event's limit).
const MAX_USER_LEN: usize = 128;

/// Why a verifier could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    /// The RS256 public key is not a PEM RSA public key.
    #[error("the JWT public key is not a PEM-encoded RSA public key: {0}")]
    BadPublicKey(jsonwebtoken::errors::Error),
    /// The HS256 secret was refused by the JWT library.
    #[error("the HS256 secret cannot be used: {0}")]
    BadSecret(jsonwebtoken::errors::Error),
    /// An HS256 secret shorter than the hash (RFC 7518 §3.2).
    #[error("the HS256 secret must be at least 32 bytes, got {0}")]
    ShortSecret(usize),
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User(pub String);

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    exp: i64,
}

/// Verified tokens remembered so a shopper's every request does not pay for
/// signature checking and JSON parsing again (as Envoy's JWT filter caches
/// them). Keyed by the whole token, so only the exact bytes once verified
/// hit; an entry is honoured only until the token's `exp`. Bounded: when
/// full it starts over, which costs one verification per active token.
const CACHE_ENTRIES: usize = 50_000;

type TokenCache = std::sync::Mutex<std::collections::HashMap<String, (User, i64)>>;

/// Verifies bearer tokens with one key and algorithm.
#[derive(Clone)]
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
    cache: std::sync::Arc<TokenCache>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// HS256 with a shared secret.
    pub fn hs256(secret: &[u8]) -> Result<Self, AuthSetupError> {
        if secret.len() < 32 {
            return Err(AuthSetupError::ShortSecret(secret.len()));
        }
        let key = DecodingKey::from_secret(secret).map_err(AuthSetupError::BadSecret)?;
        Ok(Self::with(key, Algorithm::HS256))
    }

    /// RS256 with the issuer's public key (PEM).
    pub fn rs256_pem(pem: &[u8]) -> Result<Self, AuthSetupError> {
        let key = DecodingKey::from_rsa_pem(pem).map_err(AuthSetupError::BadPublicKey)?;
        Ok(Self::with(key, Algorithm::RS256))
    }

    fn with(key: DecodingKey, algorithm: Algorithm) -> Self {
        // Only the algorithm of the key: a token naming another one (`none`,
        // or HS256 signed with the RSA public key) is refused.
        let mut validation = Validation::new(algorithm);
        validation.leeway = 5;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Self {
            key,
            validation,
            cache: std::sync::Arc::default(),
        }
    }

    /// Also require `iss` to be `issuer`.
    pub fn with_issuer(mut self, issuer: &str) -> Self {
        self.validation.set_issuer(&[issuer]);
        self
    }

    /// Also require `aud` to contain `audience`.
    pub fn with_audience(mut self, audience: &str) -> Self {
        self.validation.set_audience(&[audience]);
        self
    }

    /// The user of the request's `Authorization: Bearer` token; 401 with a
    /// JSON reason and `WWW-Authenticate` otherwise.
    pub fn user(&self, headers: &HeaderMap) -> Result<User, ApiError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing_token", "send Authorization: Bearer <JWT>"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("missing_token", "send Authorization: Bearer <JWT>"))?;
        let now = jiff::Timestamp::now().as_second();
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .filter(|(_, exp)| *exp > now)
            .map(|(user, _)| user.clone());
        if let Some(user) = cached {
            return Ok(user);
        }
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|err| {
                match err.kind() {
                    ErrorKind::ExpiredSignature => {
                        unauthorized("token_expired", "the token has expired")
                    }
                    ErrorKind::InvalidSignature => {
                        unauthorized("invalid_token", "the token's signature does not verify")
                    }
                    ErrorKind::InvalidAlgorithm => unauthorized(
                        "invalid_token",
                        "the token is signed with another algorithm",
                    ),
                    _ => unauthorized(
                        "invalid_token",
                        format!("the token is not acceptable: {err}"),
                    ),
                }
            })?;
        let user = data.claims.sub;
        let valid = !user.is_empty()
            && user.len() <= MAX_USER_LEN
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '@'));
        if !valid {
            return Err(unauthorized(
                "invalid_token",
                format!(
                    "sub must be 1-{MAX_USER_LEN} characters of letters, digits, '-', '_', '.', ':', '@'"
                ),
            ));
        }
        let user = User(user);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(token.to_owned(), (user.clone(), data.claims.exp));
        Ok(user)
    }
}

fn unauthorized(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, code, message).with_header(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"flashsale\""),
    )
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::try_from(format!("Bearer {token}")) {
            headers.insert(header::AUTHORIZATION, value);
        }
        headers
    }

    fn token(claims: serde_json::Value, secret: &[u8]) -> String {
        EncodingKey::from_secret(secret)
            .and_then(|key| encode(&Header::default(), &claims, &key))
            .unwrap_or_default()
    }

    fn in_an_hour() -> i64 {
        jiff::Timestamp::now().as_second() + 3600
    }

    #[test]
    fn a_valid_token_names_the_user() -> Result<(), Box<dyn std::error::Error>> {
        let verifier = Verifier::hs256(SECRET)?;
        let t = token(json!({"sub": "u-1", "exp": in_an_hour()}), SECRET);
        assert_eq!(
            verifier.user(&bearer(&t)).map_err(|e| e.to_string())?,
            User("u-1".into())
        );
        Ok(())
    }

    #[test]
    fn bad_tokens_are_refused_with_a_reason() -> Result<(), Box<dyn std::error::Error>> {
        let verifier = Verifier::hs256(SECRET)?;
        let code =
            |headers: &HeaderMap| verifier.user(headers).err().map(|e| (e.status(), e.code()));
        let unauthorized = |c| Some((StatusCode::UNAUTHORIZED, c));
        assert_eq!(code(&HeaderMap::new()), unauthorized("missing_token"));
        let forged = token(
            json!({"sub": "u-1", "exp": in_an_hour()}),
            b"another-secret-another-secret-xx",
        );
        assert_eq!(code(&bearer(&forged)), unauthorized("invalid_token"));
        let expired = token(json!({"sub": "u-1", "exp": 1_000}), SECRET);
        assert_eq!(code(&bearer(&expired)), unauthorized("token_expired"));
        let no_exp = token(json!({"sub": "u-1"}), SECRET);
        assert_eq!(code(&bearer(&no_exp)), unauthorized("invalid_token"));
        let odd_user = token(json!({"sub": "a b", "exp": in_an_hour()}), SECRET);
        assert_eq!(code(&bearer(&odd_user)), unauthorized("invalid_token"));
        assert_eq!(code(&bearer("not.a.jwt")), unauthorized("invalid_token"));
        Ok(())
    }

    /// RS256 with a key pair made by `openssl` (installed by the stack).
    #[test]
    fn rs256_tokens_verify_with_the_public_key_only() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("fs-rsa-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (private, public) = (dir.join("key.pem"), dir.join("pub.pem"));
        let run =
            |args: &[&std::ffi::OsStr]| std::process::Command::new("openssl").args(args).output();
        run(&[
            "genpkey".as_ref(),
            "-algorithm".as_ref(),
            "RSA".as_ref(),
            "-out".as_ref(),
            private.as_os_str(),
        ])?;
        run(&[
            "pkey".as_ref(),
            "-in".as_ref(),
            private.as_os_str(),
            "-pubout".as_ref(),
            "-out".as_ref(),
            public.as_os_str(),
        ])?;
        let verifier = Verifier::rs256_pem(&std::fs::read(&public)?)?;
        let key = EncodingKey::from_rsa_pem(&std::fs::read(&private)?)?;
        let claims = json!({"sub": "u-9", "exp": in_an_hour()});
        let signed = encode(&Header::new(Algorithm::RS256), &claims, &key)?;
        assert_eq!(
            verifier.user(&bearer(&signed)).map_err(|e| e.to_string())?,
            User("u-9".into())
        );
        // An HS256 token "signed" with the public key's bytes is refused.
        let confused = EncodingKey::from_secret(&std::fs::read(&public)?)
            .and_then(|k| encode(&Header::default(), &claims, &k))?;
        assert_eq!(
            verifier.user(&bearer(&confused)).err().map(|e| e.code()),
            Some("invalid_token")
        );
        assert!(Verifier::rs256_pem(b"not a key").is_err());
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn a_remembered_token_is_honoured_only_until_its_exp() -> Result<(), Box<dyn std::error::Error>>
    {
        let verifier = Verifier::hs256(SECRET)?;
        let good = token(json!({"sub": "u-1", "exp": in_an_hour()}), SECRET);
        assert!(verifier.user(&bearer(&good)).is_ok());
        let remember = |exp: i64| {
            let mut cache = verifier.cache.lock().unwrap_or_else(|p| p.into_inner());
            // An entry no signature would pass shows whether the cache answered.
            cache.insert("remembered".to_owned(), (User("u-2".into()), exp));
        };
        remember(in_an_hour());
        assert_eq!(
            verifier.user(&bearer("remembered")).ok(),
            Some(User("u-2".into()))
        );
        remember(jiff::Timestamp::now().as_second() - 1);
        let code = verifier.user(&bearer("remembered")).err().map(|e| e.code());
        assert_eq!(
            code,
            Some("invalid_token"),
            "past its exp the token is verified again"
        );
        Ok(())
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert!(matches!(
            Verifier::hs256(b"short"),
            Err(AuthSetupError::ShortSecret(5))
        ));
    }
}
