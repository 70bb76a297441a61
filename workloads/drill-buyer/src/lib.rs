//! The drill buyer: the synthetic buyer a failover drill sends down a sale's
//! real order path (gateway → inventory → Kafka → database), so that what a
//! failover costs in orders and in stock is counted on orders that really
//! went through. It must never take a unit a real buyer could have bought,
//! and no real buyer may pose as it:
//!
//! - it orders only [`SKU`], which no FlashSale can name (a spec's SKUs
//!   start with a letter or a digit), stocked with [`STOCK`] units of its
//!   own beside the sale's;
//! - its tokens are HS256 JWTs signed with the sale's drill key, a random
//!   key of the sale's internal Secret that only the operator and the
//!   sale's gateways hold. A token names the key id [`KEY_ID`] and the
//!   audience [`audience`] of one sale, so it buys in no other;
//! - a gateway takes its orders before the sale opens as well (drills run
//!   before a sale goes Live), and nothing else from it.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// The SKU only drill buyers order. A FlashSale's SKUs match
/// `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`, so none is this one.
pub const SKU: &str = "_drill";

/// Units of [`SKU`] each sale stocks. Drill orders are never paid, so every
/// unit comes back when its reservation lapses; this bounds how many drill
/// orders may be unpaid at once.
pub const STOCK: u64 = 1_000_000;

/// The key id (`kid`) of every drill buyer token.
pub const KEY_ID: &str = "flashsale-drill-buyer";

/// Shortest drill key accepted: the hash's length (RFC 7518 §3.2).
pub const MIN_KEY_BYTES: usize = 32;

/// Clock skew tolerated on `exp` between the signer and the gateway.
pub const LEEWAY_SECONDS: u64 = 30;

/// The audience of a drill buyer token for the sale with id `sale`.
pub fn audience(sale: &str) -> String {
    format!("flashsale-drill:{sale}")
}

/// The claims of a drill buyer token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The buyer: the user id of its orders.
    pub sub: String,
    /// [`audience`] of the sale.
    pub aud: String,
    /// Expiry, Unix seconds.
    pub exp: u64,
}

/// Why a drill key or token could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DrillTokenError {
    /// The key is shorter than [`MIN_KEY_BYTES`].
    #[error("the drill buyer key must be at least {MIN_KEY_BYTES} bytes, got {0}")]
    ShortKey(usize),
    /// The token is not a drill buyer token of this sale signed with its key.
    #[error("not a valid drill buyer token of this sale: {0}")]
    Invalid(jsonwebtoken::errors::Error),
    /// The token expired (beyond [`LEEWAY_SECONDS`]).
    #[error("the drill buyer token expired")]
    Expired,
}

/// The key as signer and checker both use it: surrounding ASCII whitespace
/// dropped, so a key file or Secret written with a trailing newline is the
/// same key to the gateway that reads the file and the operator that reads
/// the Secret.
fn checked(key: &[u8]) -> Result<&[u8], DrillTokenError> {
    let key = key.trim_ascii();
    if key.len() < MIN_KEY_BYTES {
        return Err(DrillTokenError::ShortKey(key.len()));
    }
    Ok(key)
}

/// A token for `buyer` of the sale with id `sale`, signed with the sale's
/// drill `key`, valid until `expires` (Unix seconds).
pub fn sign(key: &[u8], sale: &str, buyer: &str, expires: u64) -> Result<String, DrillTokenError> {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(KEY_ID.to_owned());
    let claims = Claims {
        sub: buyer.to_owned(),
        aud: audience(sale),
        exp: expires,
    };
    let key = EncodingKey::from_secret(checked(key)?).map_err(DrillTokenError::Invalid)?;
    jsonwebtoken::encode(&header, &claims, &key).map_err(DrillTokenError::Invalid)
}

/// Whether `token`'s header names the drill key: such a token is checked as
/// a drill buyer's and as nothing else. Says nothing of its validity.
pub fn names_drill_key(token: &str) -> bool {
    jsonwebtoken::decode_header(token).is_ok_and(|h| h.kid.as_deref() == Some(KEY_ID))
}

/// Checks the drill buyer tokens of one sale.
pub struct Checker {
    key: DecodingKey,
    validation: Validation,
}

impl Checker {
    /// A checker of sale `sale`'s tokens signed with `key`.
    pub fn new(key: &[u8], sale: &str) -> Result<Self, DrillTokenError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[audience(sale)]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        // Expiry is checked against the caller's clock (the sale's).
        validation.validate_exp = false;
        Ok(Self {
            key: DecodingKey::from_secret(checked(key)?).map_err(DrillTokenError::Invalid)?,
            validation,
        })
    }

    /// The buyer (`sub`) of `token` if it is valid at `now` (Unix seconds).
    pub fn buyer(&self, token: &str, now: u64) -> Result<Claims, DrillTokenError> {
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(DrillTokenError::Invalid)?
            .claims;
        if claims.exp.saturating_add(LEEWAY_SECONDS) <= now {
            return Err(DrillTokenError::Expired);
        }
        Ok(claims)
    }
}

impl std::fmt::Debug for Checker {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checker { .. }")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_800_000_000;

    #[test]
    fn a_signed_token_names_its_buyer_to_its_sale_only() -> Result<(), DrillTokenError> {
        let token = sign(KEY, "shop.spring.1a2b3c4d", "drill:failover:1", NOW + 60)?;
        assert!(names_drill_key(&token));
        let claims = Checker::new(KEY, "shop.spring.1a2b3c4d")?.buyer(&token, NOW)?;
        assert_eq!(claims.sub, "drill:failover:1");
        let other_sale = Checker::new(KEY, "shop.autumn.5e6f7a8b")?.buyer(&token, NOW);
        assert!(
            matches!(other_sale, Err(DrillTokenError::Invalid(_))),
            "{other_sale:?}"
        );
        Ok(())
    }

    #[test]
    fn a_key_with_a_trailing_newline_is_the_same_key() -> Result<(), DrillTokenError> {
        let written = [KEY, b"\n"].concat();
        let token = sign(&written, "s", "drill:1", NOW + 60)?;
        assert_eq!(Checker::new(KEY, "s")?.buyer(&token, NOW)?.sub, "drill:1");
        let token = sign(KEY, "s", "drill:1", NOW + 60)?;
        assert_eq!(
            Checker::new(&written, "s")?.buyer(&token, NOW)?.sub,
            "drill:1"
        );
        // Whitespace does not count towards the key's length.
        let padded = [&[b' '; 40][..], b"short"].concat();
        assert!(matches!(
            Checker::new(&padded, "s"),
            Err(DrillTokenError::ShortKey(5))
        ));
        Ok(())
    }

    #[test]
    fn another_key_or_a_late_token_is_refused() -> Result<(), DrillTokenError> {
        let token = sign(KEY, "s", "drill:1", NOW + 60)?;
        let other = Checker::new(b"fedcba9876543210fedcba9876543210", "s")?.buyer(&token, NOW);
        assert!(
            matches!(other, Err(DrillTokenError::Invalid(_))),
            "{other:?}"
        );
        let checker = Checker::new(KEY, "s")?;
        // Within the leeway, then past it.
        assert!(checker.buyer(&token, NOW + 60 + LEEWAY_SECONDS - 1).is_ok());
        let late = checker.buyer(&token, NOW + 60 + LEEWAY_SECONDS);
        assert!(matches!(late, Err(DrillTokenError::Expired)), "{late:?}");
        Ok(())
    }

    #[test]
    fn a_short_key_is_refused_and_other_tokens_are_not_drill_tokens() {
        assert!(matches!(
            sign(b"short", "s", "b", NOW),
            Err(DrillTokenError::ShortKey(5))
        ));
        assert!(matches!(
            Checker::new(b"short", "s"),
            Err(DrillTokenError::ShortKey(5))
        ));
        assert!(!names_drill_key("not a token"));
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("issuer-key-1".into());
        let claims = Claims {
            sub: "u".into(),
            aud: audience("s"),
            exp: NOW,
        };
        let buyer_token = EncodingKey::from_secret(KEY)
            .and_then(|key| jsonwebtoken::encode(&header, &claims, &key));
        assert!(buyer_token.is_ok_and(|t| !names_drill_key(&t)));
    }
}
