//! Bearer tokens for the buyers: HS256 JWTs with `sub` and `exp`, minted
//! here as the shop's identity provider would.

use std::time::Duration;

use jsonwebtoken::{EncodingKey, Header};
use serde::Serialize;

/// How long a minted token is valid.
const TTL: Duration = Duration::from_secs(3600);
/// A token is renewed this long before it expires, so no request carries
/// one that lapses on the way (the gateway allows 30 s of skew).
const RENEW_BEFORE: Duration = Duration::from_secs(120);

#[derive(Serialize)]
struct Claims<'a> {
    sub: &'a str,
    exp: i64,
}

/// Mints tokens with the sale's HS256 secret; cheap to clone.
#[derive(Clone)]
pub(crate) struct Minter {
    key: EncodingKey,
}

impl Minter {
    pub(crate) fn new(secret: &[u8]) -> Result<Self, jsonwebtoken::errors::Error> {
        Ok(Self {
            key: EncodingKey::from_secret(secret)?,
        })
    }

    /// A token for `user`, issued at `now` (Unix seconds).
    pub(crate) fn mint(&self, user: &str, now: i64) -> Result<Bearer, jsonwebtoken::errors::Error> {
        let exp = now.saturating_add(TTL.as_secs() as i64);
        let value =
            jsonwebtoken::encode(&Header::default(), &Claims { sub: user, exp }, &self.key)?;
        Ok(Bearer { value, exp })
    }
}

/// A minted token and its expiry.
#[derive(Debug, Clone)]
pub(crate) struct Bearer {
    pub(crate) value: String,
    exp: i64,
}

impl Bearer {
    /// Whether it should be replaced at `now` (Unix seconds).
    pub(crate) fn stale_at(&self, now: i64) -> bool {
        now.saturating_add(RENEW_BEFORE.as_secs() as i64) >= self.exp
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    struct Decoded {
        sub: String,
        exp: i64,
    }

    #[test]
    fn tokens_are_hs256_with_subject_and_expiry_and_renewed_before_they_lapse() -> anyhow::Result<()>
    {
        let secret = b"buyers-secret-buyers-secret-1234";
        let now = jiff::Timestamp::now().as_second();
        let bearer = Minter::new(secret)?.mint("buyer-7", now)?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        let claims = jsonwebtoken::decode::<Decoded>(
            &bearer.value,
            &DecodingKey::from_secret(secret)?,
            &validation,
        )?
        .claims;
        assert_eq!((claims.sub.as_str(), claims.exp), ("buyer-7", now + 3600));
        assert!(!bearer.stale_at(now));
        assert!(!bearer.stale_at(now + 3600 - 121));
        assert!(bearer.stale_at(now + 3600 - 120));
        Ok(())
    }
}
