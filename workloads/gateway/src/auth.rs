//! Who is calling: the user comes only from a verified bearer token (a JWT,
//! `sub` = user id, `exp` required), never from a header a client could
//! simply set.
//!
//! Tokens are signed either with HS256 and a shared secret, or with RS256
//! and the issuer's public keys: one PEM key, a JSON Web Key Set (RFC 7517)
//! whose RSA keys are chosen by the token's `kid`, or both (the PEM key then
//! serves tokens without a `kid`). A set can be re-read while the gateway
//! runs ([`Verifier::watch_jwks_file`]), so the issuer can rotate its keys:
//! publish the new key beside the old one, sign with it, retire the old one.
//!
//! Checks, besides the signature: only the configured algorithm (no `none`,
//! no HS256 signed with an RSA public key); `exp` and `nbf` against the
//! sale's clock ([`SaleClock`]: Redis's, so a replica whose own clock runs
//! behind does not accept expired tokens) with [`LEEWAY_SECONDS`] of skew
//! between the issuer and the sale either way; a configured
//! issuer or audience must be *in* the token (`iss` equal, `aud` containing
//! it), a token without the claim is refused; when no audience is
//! configured, a token that names one is refused (it was meant for someone
//! else).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use flashsale_runtime::ApiError;
use jsonwebtoken::{
    Algorithm, DecodingKey, Validation,
    errors::ErrorKind,
    jwk::{AlgorithmParameters, Jwk, KeyAlgorithm, PublicKeyUse},
};
use serde::Deserialize;

use crate::clock::SaleClock;

/// Clock skew tolerated between the token issuer and this process, on `exp`
/// and `nbf` alike.
pub const LEEWAY_SECONDS: u64 = 30;

/// Why a verifier could not be built, or a key set not loaded.
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
    /// The key set is not a JWKS document (`{"keys": [...]}`).
    #[error("the JWT key set is not a JSON Web Key Set: {0}")]
    BadKeySet(serde_json::Error),
    /// An RSA key of the set has unusable parameters.
    #[error("the JWT key set's key {kid:?} is not a usable RSA key: {source}")]
    BadSetKey {
        /// The key's `kid`.
        kid: String,
        /// What the JWT library said.
        source: jsonwebtoken::errors::Error,
    },
    /// Two keys of the set share a `kid`, so a token could not name one.
    #[error("the JWT key set has two keys with kid {0:?}")]
    DuplicateKid(String),
    /// The set has no RSA signing key with a `kid` for RS256.
    #[error(
        "the JWT key set has no RS256 signing key with a kid (RSA, use \"sig\" or none, alg \"RS256\" or none)"
    )]
    NoSetKey,
    /// RS256 was asked for with neither a PEM key nor a key set.
    #[error("RS256 needs a public key or a key set")]
    NoKey,
    /// A key set was given to a verifier of HS256 tokens.
    #[error("a JWT key set only applies to RS256 verification")]
    NotRs256,
}

/// A verified caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User(pub String);

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    exp: i64,
    #[serde(default)]
    nbf: Option<i64>,
}

/// Verified tokens remembered so a shopper's every request does not pay for
/// signature checking and JSON parsing again (as Envoy's JWT filter caches
/// them). Keyed by the whole token, so only the exact bytes once verified
/// hit; an entry is honoured only until the token's `exp`. Bounded: when
/// full it starts over, which costs one verification per active token.
/// Emptied whenever the keys change, so a retired key's tokens stop working
/// at once.
const CACHE_ENTRIES: usize = 50_000;

type TokenCache = Mutex<HashMap<String, (User, i64)>>;

/// The keys tokens are checked with.
enum Keys {
    /// One shared secret; `kid` is not looked at.
    Hs256(DecodingKey),
    /// The issuer's public keys.
    Rs256 {
        /// The PEM key: for tokens without `kid`, and for every token when
        /// there is no set (then `kid` is not looked at, as before sets).
        pem: Option<DecodingKey>,
        /// The set's keys by `kid`.
        set: HashMap<String, DecodingKey>,
    },
}

/// Why no key could be chosen for a token.
enum NoKeyFor {
    /// The token names a `kid` the set does not have.
    UnknownKid,
    /// The token names no `kid` and only a set is configured.
    MissingKid,
}

impl Keys {
    /// The key for a token whose header names `kid`.
    fn select(&self, kid: Option<&str>) -> Result<&DecodingKey, NoKeyFor> {
        match self {
            Self::Hs256(key) => Ok(key),
            Self::Rs256 {
                pem: Some(pem),
                set,
            } if set.is_empty() => Ok(pem),
            Self::Rs256 { pem, set } => match kid {
                Some(kid) => set.get(kid).ok_or(NoKeyFor::UnknownKid),
                None => pem.as_ref().ok_or(NoKeyFor::MissingKid),
            },
        }
    }
}

/// Verifies bearer tokens; cheap to clone, and clones share keys and cache
/// (so a reloaded key set reaches every handler).
#[derive(Clone)]
pub struct Verifier {
    keys: Arc<RwLock<Keys>>,
    validation: Validation,
    cache: Arc<TokenCache>,
    clock: Arc<SaleClock>,
    drill: Option<Arc<flashsale_drill_buyer::Checker>>,
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
        Ok(Self::with(Keys::Hs256(key), Algorithm::HS256))
    }

    /// RS256 with the issuer's public key (PEM); a token's `kid` is not
    /// looked at.
    pub fn rs256_pem(pem: &[u8]) -> Result<Self, AuthSetupError> {
        Self::rs256(Some(pem), None)
    }

    /// RS256 with the issuer's key set (JWKS JSON): a token's `kid` chooses
    /// the key, and a token without one, or with one the set lacks, is
    /// refused.
    pub fn rs256_jwks(jwks: &[u8]) -> Result<Self, AuthSetupError> {
        Self::rs256(None, Some(jwks))
    }

    /// RS256 with a PEM key, a key set, or both: with both, tokens naming a
    /// `kid` are checked with the set's key of that id and tokens without
    /// one with the PEM key.
    pub fn rs256(pem: Option<&[u8]>, jwks: Option<&[u8]>) -> Result<Self, AuthSetupError> {
        if pem.is_none() && jwks.is_none() {
            return Err(AuthSetupError::NoKey);
        }
        let pem = pem
            .map(DecodingKey::from_rsa_pem)
            .transpose()
            .map_err(AuthSetupError::BadPublicKey)?;
        let set = jwks.map(parse_key_set).transpose()?.unwrap_or_default();
        Ok(Self::with(Keys::Rs256 { pem, set }, Algorithm::RS256))
    }

    fn with(keys: Keys, algorithm: Algorithm) -> Self {
        // Only the algorithm of the key: a token naming another one (`none`,
        // or HS256 signed with the RSA public key) is refused.
        let mut validation = Validation::new(algorithm);
        // Times are checked against the sale's clock, not the library's.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Self {
            keys: Arc::new(RwLock::new(keys)),
            validation,
            cache: Arc::default(),
            clock: Arc::default(),
            drill: None,
        }
    }

    /// Also takes drill buyers' tokens ([`Self::drill_buyer`]) checked by
    /// `checker`.
    pub fn with_drill_buyers(mut self, checker: flashsale_drill_buyer::Checker) -> Self {
        self.drill = Some(Arc::new(checker));
        self
    }

    /// Checks `exp` and `nbf` against `clock` (the wall clock until it is
    /// first synchronised).
    pub fn with_clock(mut self, clock: Arc<SaleClock>) -> Self {
        self.clock = clock;
        self
    }

    /// Also require `iss` to be `issuer` (a token without `iss` is refused).
    pub fn with_issuer(mut self, issuer: &str) -> Self {
        self.validation.set_issuer(&[issuer]);
        self.validation.required_spec_claims.insert("iss".into());
        self
    }

    /// Also require `aud` to contain `audience` (a token without `aud` is
    /// refused).
    pub fn with_audience(mut self, audience: &str) -> Self {
        self.validation.set_audience(&[audience]);
        self.validation.required_spec_claims.insert("aud".into());
        self
    }

    /// Replaces the key set with `jwks` (the PEM key, if any, stays) and
    /// forgets remembered tokens; returns how many keys the set has. On an
    /// error the keys in force are kept.
    pub fn replace_key_set(&self, jwks: &[u8]) -> Result<usize, AuthSetupError> {
        let fresh = parse_key_set(jwks)?;
        let count = fresh.len();
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        match &mut *keys {
            Keys::Rs256 { set, .. } => *set = fresh,
            Keys::Hs256(_) => return Err(AuthSetupError::NotRs256),
        }
        drop(keys);
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(count)
    }

    /// Re-reads the key set at `path` every `every` and puts it in force
    /// when its content differs from `loaded` (what the verifier was built
    /// with) or from the last read. A Kubernetes Secret update swaps the
    /// mounted file within about a minute, so keys rotate without a restart.
    /// A file that cannot be read or parsed is logged and the keys in force
    /// stay. Runs until dropped.
    pub async fn watch_jwks_file(self, path: PathBuf, mut loaded: Vec<u8>, every: Duration) {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let read = match std::fs::read(&path) {
                Ok(read) => read,
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "JWT key set not re-read; the keys in force stay");
                    continue;
                }
            };
            if read == loaded {
                continue;
            }
            match self.replace_key_set(&read) {
                Ok(keys) => {
                    tracing::info!(path = %path.display(), keys, "JWT key set reloaded");
                }
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "JWT key set refused; the keys in force stay");
                }
            }
            // A refused file is not parsed again until it changes.
            loaded = read;
        }
    }

    /// The user of the request's `Authorization: Bearer` token; 401 with a
    /// JSON reason and `WWW-Authenticate` otherwise.
    pub fn user(&self, headers: &HeaderMap) -> Result<User, ApiError> {
        let token = bearer_token(headers)
            .ok_or_else(|| unauthorized("missing_token", "send Authorization: Bearer <JWT>"))?;
        let now = self.clock.now_seconds();
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
        let claims = self.verify(token, now)?;
        // The order path's one user id rule: a subject the inventory, the
        // order event and its row could not carry is refused here.
        flashsale_orders::check_user_id(&claims.sub)
            .map_err(|err| unauthorized("invalid_token", format!("sub: {err}")))?;
        let user = User(claims.sub);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(token.to_owned(), (user.clone(), claims.exp));
        Ok(user)
    }

    /// The drill buyer of the request when its bearer token names the drill
    /// key ([`flashsale_drill_buyer::KEY_ID`]), or why it is refused; `None`
    /// for every other request, which [`Self::user`] judges. Such a token is
    /// checked with the drill key only: it never stands for a buyer.
    pub fn drill_buyer(&self, headers: &HeaderMap) -> Option<Result<User, ApiError>> {
        let token = bearer_token(headers).filter(|t| flashsale_drill_buyer::names_drill_key(t))?;
        let Some(checker) = &self.drill else {
            return Some(Err(unauthorized(
                "invalid_token",
                "this gateway has no drill key, so it takes no drill orders",
            )));
        };
        let now = u64::try_from(self.clock.now_seconds()).unwrap_or(0);
        Some(match checker.buyer(token, now) {
            Ok(claims) => flashsale_orders::check_user_id(&claims.sub)
                .map(|()| User(claims.sub))
                .map_err(|err| unauthorized("invalid_token", format!("sub: {err}"))),
            Err(flashsale_drill_buyer::DrillTokenError::Expired) => Err(expired()),
            Err(err) => Err(unauthorized("invalid_token", err.to_string())),
        })
    }

    /// The token's claims if its key, signature and claims check out at
    /// `now` (Unix seconds).
    fn verify(&self, token: &str, now: i64) -> Result<Claims, ApiError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|err| unauthorized("invalid_token", format!("not a JWT: {err}")))?;
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let key = keys
            .select(header.kid.as_deref())
            .map_err(|missing| match missing {
                NoKeyFor::UnknownKid => unauthorized(
                    "invalid_token",
                    "the token's key id (kid) is not one of the issuer's keys",
                ),
                NoKeyFor::MissingKid => unauthorized(
                    "invalid_token",
                    "the token names no key id (kid) to check it with",
                ),
            })?;
        let claims = jsonwebtoken::decode::<Claims>(token, key, &self.validation)
            .map(|data| data.claims)
            .map_err(refusal)?;
        let leeway = LEEWAY_SECONDS as i64;
        if claims.exp < now - leeway {
            return Err(expired());
        }
        if claims.nbf.is_some_and(|nbf| nbf > now + leeway) {
            return Err(immature());
        }
        Ok(claims)
    }
}

/// The token of an `Authorization: Bearer` header.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn expired() -> ApiError {
    unauthorized("token_expired", "the token has expired")
}

fn immature() -> ApiError {
    unauthorized("invalid_token", "the token is not valid yet (nbf)")
}

/// The 401 for a token the JWT library refused.
fn refusal(err: jsonwebtoken::errors::Error) -> ApiError {
    match err.kind() {
        ErrorKind::ExpiredSignature => expired(),
        ErrorKind::ImmatureSignature => immature(),
        ErrorKind::InvalidSignature => {
            unauthorized("invalid_token", "the token's signature does not verify")
        }
        ErrorKind::InvalidAlgorithm => unauthorized(
            "invalid_token",
            "the token is signed with another algorithm",
        ),
        ErrorKind::MissingRequiredClaim(claim) => {
            unauthorized("invalid_token", format!("the token has no {claim} claim"))
        }
        ErrorKind::InvalidIssuer => {
            unauthorized("invalid_token", "the token is from another issuer")
        }
        ErrorKind::InvalidAudience => {
            unauthorized("invalid_token", "the token is meant for another audience")
        }
        _ => unauthorized(
            "invalid_token",
            format!("the token is not acceptable: {err}"),
        ),
    }
}

/// The RS256 keys of a JWKS document, by `kid`. Keys that cannot verify
/// RS256 signatures (other key types, encryption keys, another `alg`, or
/// a form this library does not read) and RSA keys without a `kid` (no token
/// could choose them) are skipped; at least one key must remain.
fn parse_key_set(jwks: &[u8]) -> Result<HashMap<String, DecodingKey>, AuthSetupError> {
    #[derive(Deserialize)]
    struct Document {
        keys: Vec<serde_json::Value>,
    }
    let document: Document = serde_json::from_slice(jwks).map_err(AuthSetupError::BadKeySet)?;
    let mut set = HashMap::new();
    for value in document.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        let AlgorithmParameters::RSA(rsa) = &jwk.algorithm else {
            continue;
        };
        let common = &jwk.common;
        let signing = matches!(common.public_key_use, None | Some(PublicKeyUse::Signature));
        let rs256 = matches!(common.key_algorithm, None | Some(KeyAlgorithm::RS256));
        let Some(kid) = common.key_id.clone().filter(|_| signing && rs256) else {
            continue;
        };
        let key = DecodingKey::from_rsa_components(&rsa.n, &rsa.e).map_err(|source| {
            AuthSetupError::BadSetKey {
                kid: kid.clone(),
                source,
            }
        })?;
        if set.insert(kid.clone(), key).is_some() {
            return Err(AuthSetupError::DuplicateKid(kid));
        }
    }
    if set.is_empty() {
        return Err(AuthSetupError::NoSetKey);
    }
    Ok(set)
}

fn unauthorized(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, code, message).with_header(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"flashsale\""),
    )
}

#[cfg(test)]
mod tests {
    use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
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
    fn expiry_is_read_on_the_sale_clock_not_the_replicas() -> Result<(), Box<dyn std::error::Error>>
    {
        // This replica's clock runs two minutes behind Redis's: a token
        // whose `exp` is the replica's now expired 90 s past the leeway.
        let behind = Arc::new(SaleClock::with_offset_ms(120_000));
        let verifier = Verifier::hs256(SECRET)?.with_clock(behind);
        let wall = jiff::Timestamp::now().as_second();
        let stale = token(json!({"sub": "u-1", "exp": wall}), SECRET);
        let refused = verifier.user(&bearer(&stale)).err().map(|e| e.code());
        assert_eq!(refused, Some("token_expired"));
        // Nor is a token valid only from the replica's future refused.
        let early = token(
            json!({"sub": "u-1", "exp": wall + 3600, "nbf": wall + 100}),
            SECRET,
        );
        assert!(verifier.user(&bearer(&early)).is_ok());
        let later = token(
            json!({"sub": "u-1", "exp": wall + 3600, "nbf": wall + 200}),
            SECRET,
        );
        let refused = verifier.user(&bearer(&later)).err().map(|e| e.code());
        assert_eq!(refused, Some("invalid_token"));
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

    /// An RSA key pair made by `openssl` (installed by the stack).
    struct RsaPair {
        private: EncodingKey,
        public_pem: Vec<u8>,
        /// The public key's modulus, base64url (a JWK's `n`).
        n: String,
    }

    impl RsaPair {
        fn generate() -> Result<Self, Box<dyn std::error::Error>> {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("fs-rsa-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let (private, public) = (dir.join("key.pem"), dir.join("pub.pem"));
            let run = |args: &[&std::ffi::OsStr]| {
                std::process::Command::new("openssl").args(args).output()
            };
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
            let modulus = run(&[
                "rsa".as_ref(),
                "-pubin".as_ref(),
                "-in".as_ref(),
                public.as_os_str(),
                "-noout".as_ref(),
                "-modulus".as_ref(),
            ])?;
            let hex = String::from_utf8(modulus.stdout)?;
            let hex = hex.trim().trim_start_matches("Modulus=");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()?;
            let pair = Self {
                private: EncodingKey::from_rsa_pem(&std::fs::read(&private)?)?,
                public_pem: std::fs::read(&public)?,
                n: URL_SAFE_NO_PAD.encode(bytes),
            };
            std::fs::remove_dir_all(&dir)?;
            Ok(pair)
        }

        /// This public key as a JWK with `kid`.
        fn jwk(&self, kid: &str) -> serde_json::Value {
            json!({"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid, "n": self.n, "e": "AQAB"})
        }

        /// A token for `sub`, naming `kid` when given.
        fn sign(&self, sub: &str, kid: Option<&str>) -> String {
            let mut header = Header::new(Algorithm::RS256);
            header.kid = kid.map(str::to_owned);
            encode(
                &header,
                &json!({"sub": sub, "exp": in_an_hour()}),
                &self.private,
            )
            .unwrap_or_default()
        }
    }

    fn key_set(keys: &[serde_json::Value]) -> Vec<u8> {
        json!({ "keys": keys }).to_string().into_bytes()
    }

    /// The user, or the refusal's code and message.
    fn check(verifier: &Verifier, token: &str) -> Result<String, (String, String)> {
        verifier
            .user(&bearer(token))
            .map(|user| user.0)
            .map_err(|e| (e.code().to_owned(), e.to_string()))
    }

    #[test]
    fn rs256_tokens_verify_with_the_public_key_only() -> Result<(), Box<dyn std::error::Error>> {
        let pair = RsaPair::generate()?;
        let verifier = Verifier::rs256_pem(&pair.public_pem)?;
        assert_eq!(check(&verifier, &pair.sign("u-9", None)), Ok("u-9".into()));
        // With a single PEM key the kid is not looked at, as before key sets.
        assert_eq!(
            check(&verifier, &pair.sign("u-9", Some("any"))),
            Ok("u-9".into())
        );
        // An HS256 token "signed" with the public key's bytes is refused.
        let claims = json!({"sub": "u-9", "exp": in_an_hour()});
        let confused = EncodingKey::from_secret(&pair.public_pem)
            .and_then(|k| encode(&Header::default(), &claims, &k))?;
        assert_eq!(
            verifier.user(&bearer(&confused)).err().map(|e| e.code()),
            Some("invalid_token")
        );
        assert!(Verifier::rs256_pem(b"not a key").is_err());
        Ok(())
    }

    #[test]
    fn a_key_set_chooses_the_key_by_kid() -> Result<(), Box<dyn std::error::Error>> {
        let (old, new) = (RsaPair::generate()?, RsaPair::generate()?);
        let verifier = Verifier::rs256_jwks(&key_set(&[old.jwk("old"), new.jwk("new")]))?;
        assert_eq!(
            check(&verifier, &old.sign("u-1", Some("old"))),
            Ok("u-1".into())
        );
        assert_eq!(
            check(&verifier, &new.sign("u-2", Some("new"))),
            Ok("u-2".into())
        );
        let refused = |token: &str| check(&verifier, token).err();
        // Signed with one key, naming the other: the named key decides.
        let crossed = refused(&old.sign("u-1", Some("new")));
        assert!(
            crossed
                .as_ref()
                .is_some_and(|(code, m)| code == "invalid_token" && m.contains("signature")),
            "{crossed:?}"
        );
        let unknown = refused(&old.sign("u-1", Some("retired")));
        assert!(
            unknown
                .as_ref()
                .is_some_and(|(code, m)| code == "invalid_token" && m.contains("kid")),
            "{unknown:?}"
        );
        let unnamed = refused(&old.sign("u-1", None));
        assert!(
            unnamed
                .as_ref()
                .is_some_and(|(code, m)| code == "invalid_token" && m.contains("kid")),
            "{unnamed:?}"
        );
        Ok(())
    }

    #[test]
    fn a_pem_key_beside_a_set_serves_tokens_without_kid() -> Result<(), Box<dyn std::error::Error>>
    {
        let (pem, set) = (RsaPair::generate()?, RsaPair::generate()?);
        let verifier = Verifier::rs256(Some(&pem.public_pem), Some(&key_set(&[set.jwk("k2")])))?;
        assert_eq!(check(&verifier, &pem.sign("u-1", None)), Ok("u-1".into()));
        assert_eq!(
            check(&verifier, &set.sign("u-2", Some("k2"))),
            Ok("u-2".into())
        );
        // A kid the set lacks is refused, not tried against the PEM key.
        assert!(check(&verifier, &pem.sign("u-1", Some("k9"))).is_err());
        assert!(matches!(
            Verifier::rs256(None, None),
            Err(AuthSetupError::NoKey)
        ));
        Ok(())
    }

    #[test]
    fn a_replaced_key_set_retires_the_old_keys_at_once() -> Result<(), Box<dyn std::error::Error>> {
        let (old, new) = (RsaPair::generate()?, RsaPair::generate()?);
        let verifier = Verifier::rs256_jwks(&key_set(&[old.jwk("old")]))?;
        let handler = verifier.clone();
        let before = old.sign("u-1", Some("old"));
        assert_eq!(check(&handler, &before), Ok("u-1".into()));
        assert_eq!(verifier.replace_key_set(&key_set(&[new.jwk("new")]))?, 1);
        // The clone sees the new set, and the remembered token is forgotten.
        assert!(check(&handler, &before).is_err());
        assert_eq!(
            check(&handler, &new.sign("u-2", Some("new"))),
            Ok("u-2".into())
        );
        // A bad set is refused and the set in force stays.
        assert!(verifier.replace_key_set(b"{}").is_err());
        assert_eq!(
            check(&handler, &new.sign("u-2", Some("new"))),
            Ok("u-2".into())
        );
        assert!(matches!(
            Verifier::hs256(SECRET)?.replace_key_set(&key_set(&[new.jwk("new")])),
            Err(AuthSetupError::NotRs256)
        ));
        Ok(())
    }

    #[test]
    fn only_rs256_signing_keys_with_a_kid_are_taken_from_a_set()
    -> Result<(), Box<dyn std::error::Error>> {
        let pair = RsaPair::generate()?;
        let mut no_kid = pair.jwk("x");
        no_kid.as_object_mut().map(|k| k.remove("kid"));
        let mut encryption = pair.jwk("enc");
        encryption["use"] = json!("enc");
        let mut other_alg = pair.jwk("ps");
        other_alg["alg"] = json!("PS256");
        let ec = json!({"kty": "EC", "crv": "P-256", "kid": "ec",
            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
            "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        let unknown_type = json!({"kty": "future", "kid": "f"});
        let skipped = [no_kid, encryption, other_alg, ec, unknown_type];
        assert!(matches!(
            Verifier::rs256_jwks(&key_set(&skipped)),
            Err(AuthSetupError::NoSetKey)
        ));
        let mut keys = skipped.to_vec();
        keys.push(pair.jwk("good"));
        let verifier = Verifier::rs256_jwks(&key_set(&keys))?;
        assert_eq!(
            check(&verifier, &pair.sign("u", Some("good"))),
            Ok("u".into())
        );
        assert!(check(&verifier, &pair.sign("u", Some("enc"))).is_err());
        assert!(matches!(
            Verifier::rs256_jwks(&key_set(&[pair.jwk("a"), pair.jwk("a")])),
            Err(AuthSetupError::DuplicateKid(kid)) if kid == "a"
        ));
        assert!(matches!(
            Verifier::rs256_jwks(b"not json"),
            Err(AuthSetupError::BadKeySet(_))
        ));
        Ok(())
    }

    #[tokio::test]
    async fn a_watched_key_set_file_is_reloaded_when_it_changes()
    -> Result<(), Box<dyn std::error::Error>> {
        let (old, new) = (RsaPair::generate()?, RsaPair::generate()?);
        let path = std::env::temp_dir().join(format!("fs-jwks-{}.json", std::process::id()));
        let first = key_set(&[old.jwk("old")]);
        std::fs::write(&path, &first)?;
        let verifier = Verifier::rs256_jwks(&first)?;
        let watch = tokio::spawn(verifier.clone().watch_jwks_file(
            path.clone(),
            first,
            Duration::from_millis(20),
        ));
        // Rotation: the new key beside the old one, then the old one retired.
        std::fs::write(&path, key_set(&[old.jwk("old"), new.jwk("new")]))?;
        let new_token = new.sign("u-2", Some("new"));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while check(&verifier, &new_token).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the new key never came"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            check(&verifier, &old.sign("u-1", Some("old"))),
            Ok("u-1".into())
        );
        std::fs::write(&path, key_set(&[new.jwk("new")]))?;
        let old_token = old.sign("u-1", Some("old"));
        while check(&verifier, &old_token).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "the old key never left"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A broken file keeps the keys in force.
        std::fs::write(&path, b"{\"keys\": 7}")?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(check(&verifier, &new_token), Ok("u-2".into()));
        watch.abort();
        std::fs::remove_file(&path)?;
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
    fn a_configured_issuer_or_audience_must_be_in_the_token()
    -> Result<(), Box<dyn std::error::Error>> {
        let verifier = Verifier::hs256(SECRET)?
            .with_issuer("https://id.example")
            .with_audience("flashsale");
        let code = |claims| {
            verifier
                .user(&bearer(&token(claims, SECRET)))
                .err()
                .map(|e| e.code())
        };
        let exp = in_an_hour();
        let both =
            json!({"sub": "u-1", "exp": exp, "iss": "https://id.example", "aud": "flashsale"});
        assert_eq!(code(both), None);
        let no_iss = json!({"sub": "u-1", "exp": exp, "aud": "flashsale"});
        assert_eq!(code(no_iss), Some("invalid_token"), "a token without iss");
        let no_aud = json!({"sub": "u-1", "exp": exp, "iss": "https://id.example"});
        assert_eq!(code(no_aud), Some("invalid_token"), "a token without aud");
        let other_aud =
            json!({"sub": "u-1", "exp": exp, "iss": "https://id.example", "aud": "another"});
        assert_eq!(code(other_aud), Some("invalid_token"));
        Ok(())
    }

    #[test]
    fn a_token_is_refused_before_its_nbf_beyond_the_leeway()
    -> Result<(), Box<dyn std::error::Error>> {
        let verifier = Verifier::hs256(SECRET)?;
        let now = jiff::Timestamp::now().as_second();
        let code = |nbf: i64| {
            let claims = json!({"sub": "u-1", "exp": in_an_hour(), "nbf": nbf});
            verifier
                .user(&bearer(&token(claims, SECRET)))
                .err()
                .map(|e| e.code())
        };
        assert_eq!(code(now + 600), Some("invalid_token"), "ten minutes early");
        assert_eq!(code(now + 10), None, "within the clock-skew leeway");
        assert_eq!(code(now - 10), None);
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
