//! Queue tickets, order passes and join challenges:
//! `base64url(payload) "." base64url(mac)`,
//! the MAC being HMAC-SHA256 over a kind's domain tag followed by the payload,
//! the payload compact JSON with a version field.

use std::time::Duration;

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::Sha256;

use super::Error;

/// Shortest signing key accepted: the HMAC-SHA256 output size, so the key is
/// never the weak link.
pub const MIN_KEY_LEN: usize = 32;

/// Longest token looked at; anything longer is refused before decoding, and
/// every token the room signs stays below it (and below the 4 KiB a browser
/// keeps per cookie).
pub const MAX_TOKEN_LEN: usize = 4_096;

/// Bytes of an HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;

/// The payload format; a token of another version is `malformed`.
const VERSION: u8 = 1;

/// Domain tags: a ticket's MAC can never verify as a pass's, or the reverse.
/// They differ at a fixed offset, so no tag plus payload spells the other.
const TICKET_TAG: &[u8] = b"flashsale.waiting-room.ticket.v1\0";
const PASS_TAG: &[u8] = b"flashsale.waiting-room.pass.v1\0";
const CHALLENGE_TAG: &[u8] = b"flashsale.waiting-room.challenge.v1\0";

/// Why a ticket or pass was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a token at all: empty, too long, no dot, bad base64, a MAC of the
    /// wrong size, or a payload this version cannot read.
    #[error("not a waiting-room token")]
    Malformed,
    /// The signature does not match: altered, or signed with another key.
    #[error("the token's signature does not match")]
    Forged,
    /// A genuine token of another kind: a ticket where a pass is needed, a
    /// pass where a ticket is, either where a join challenge is.
    #[error("a queue ticket, an order pass and a join challenge cannot stand in for each other")]
    WrongKind,
    /// The ticket or pass is past its lifetime.
    #[error("the token has expired")]
    Expired,
    /// Issued to another user.
    #[error("the token was issued to another user")]
    OtherUser,
    /// Issued for another sale.
    #[error("the token was issued for another sale")]
    OtherSale,
    /// The pass was already used for an order, or the challenge for a join.
    #[error("the pass or challenge was already used")]
    Replayed,
    /// The challenge's solution does not have the leading zero bits the
    /// challenge asks for.
    #[error("the solution does not do the challenge's work")]
    Unsolved,
}

impl Refusal {
    /// A stable snake_case reason for JSON bodies and metrics labels.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Forged => "forged",
            Self::WrongKind => "wrong_kind",
            Self::Expired => "expired",
            Self::OtherUser => "other_user",
            Self::OtherSale => "other_sale",
            Self::Replayed => "replayed",
            Self::Unsolved => "unsolved",
        }
    }
}

/// What a queue ticket says: `user` holds `position` in `sale`'s queue since
/// `issued_at_ms` (Unix ms, Redis clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The user the ticket was issued to.
    pub user: String,
    /// The sale whose queue it is.
    pub sale: String,
    /// Place in the queue, from 1.
    pub position: u64,
    /// When the position was taken (Unix ms, Redis clock).
    pub issued_at_ms: u64,
}

impl Ticket {
    /// `Expired` once `ttl` has passed since issue at `now_ms`.
    pub fn check_fresh(&self, ttl: Duration, now_ms: u64) -> Result<(), Refusal> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if now_ms >= self.issued_at_ms.saturating_add(ttl_ms) {
            return Err(Refusal::Expired);
        }
        Ok(())
    }
}

/// What an order pass says: `user`, admitted at `position` of `sale`, may
/// place an order until `expires_at_ms` (Unix ms, Redis clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The user the pass was issued to.
    pub user: String,
    /// The sale it admits to.
    pub sale: String,
    /// The queue position it was issued for (one redemption per position).
    pub position: u64,
    /// End of validity (Unix ms, Redis clock).
    pub expires_at_ms: u64,
}

/// What a join challenge says: `user` may join `sale`'s queue with a
/// solution of `difficulty` bits until `expires_at_ms` (Unix ms, Redis
/// clock). Its random `nonce` makes it one of a kind, spent by one join
/// (or, without a waiting room, by one order and its retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// The user it was issued to.
    pub user: String,
    /// The sale whose queue it opens.
    pub sale: String,
    /// Random, so no two challenges are alike.
    pub nonce: u64,
    /// Leading zero bits a solution's hash must have.
    pub difficulty: u8,
    /// End of validity (Unix ms, Redis clock).
    pub expires_at_ms: u64,
}

/// The wire payload of a ticket.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TicketWire {
    v: u8,
    u: String,
    s: String,
    p: u64,
    i: u64,
}

/// The wire payload of a pass.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PassWire {
    v: u8,
    u: String,
    s: String,
    p: u64,
    e: u64,
}

/// The wire payload of a challenge.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChallengeWire {
    v: u8,
    u: String,
    s: String,
    p: u64,
    e: u64,
    d: u8,
}

/// Signs and checks tickets, passes and challenges with one HMAC-SHA256
/// key, shared by all gateway replicas of a sale.
#[derive(Clone)]
pub struct Signer {
    /// Keyed once; cloned per token, which skips re-hashing the key.
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer { key: <hidden> }")
    }
}

impl Signer {
    /// A signer with `key`; keys shorter than [`MIN_KEY_LEN`] bytes are refused.
    pub fn new(key: &[u8]) -> Result<Self, Error> {
        if key.len() < MIN_KEY_LEN {
            return Err(Error::WeakKey(key.len()));
        }
        let mac = Hmac::<Sha256>::new_from_slice(key).map_err(|_| Error::WeakKey(key.len()))?;
        Ok(Self { mac })
    }

    /// The token of `ticket`.
    pub fn sign_ticket(&self, ticket: &Ticket) -> String {
        let payload = json(
            &ticket.user,
            &ticket.sale,
            ticket.position,
            &[("i", ticket.issued_at_ms)],
        );
        self.seal(TICKET_TAG, &payload)
    }

    /// The token of `pass`.
    pub fn sign_pass(&self, pass: &Pass) -> String {
        let payload = json(
            &pass.user,
            &pass.sale,
            pass.position,
            &[("e", pass.expires_at_ms)],
        );
        self.seal(PASS_TAG, &payload)
    }

    /// The token of `challenge`.
    pub fn sign_challenge(&self, challenge: &Challenge) -> String {
        let payload = json(
            &challenge.user,
            &challenge.sale,
            challenge.nonce,
            &[
                ("e", challenge.expires_at_ms),
                ("d", u64::from(challenge.difficulty)),
            ],
        );
        self.seal(CHALLENGE_TAG, &payload)
    }

    /// The ticket in `token` if it is genuine, of `sale`, and (when `user` is
    /// given) of `user`. Freshness needs the time: [`Ticket::check_fresh`].
    pub fn open_ticket(
        &self,
        token: &str,
        sale: &str,
        user: Option<&str>,
    ) -> Result<Ticket, Refusal> {
        let (payload, _) = self.unseal(token, TICKET_TAG)?;
        let wire: TicketWire = serde_json::from_slice(&payload).map_err(|_| Refusal::Malformed)?;
        check_claims(wire.v, &wire.s, &wire.u, sale, user)?;
        Ok(Ticket {
            user: wire.u,
            sale: wire.s,
            position: wire.p,
            issued_at_ms: wire.i,
        })
    }

    /// The pass in `token` if it is genuine, of `sale` and of `user`. Its
    /// expiry is checked where it is redeemed, against the Redis clock.
    pub fn open_pass(&self, token: &str, sale: &str, user: &str) -> Result<Pass, Refusal> {
        let (payload, _) = self.unseal(token, PASS_TAG)?;
        let wire: PassWire = serde_json::from_slice(&payload).map_err(|_| Refusal::Malformed)?;
        check_claims(wire.v, &wire.s, &wire.u, sale, Some(user))?;
        Ok(Pass {
            user: wire.u,
            sale: wire.s,
            position: wire.p,
            expires_at_ms: wire.e,
        })
    }

    /// The challenge in `token` if it is genuine, of `sale` and of `user`,
    /// with its MAC, which a solution's work is hashed over. Its expiry is
    /// checked where it is spent, against the Redis clock.
    pub fn open_challenge(
        &self,
        token: &str,
        sale: &str,
        user: &str,
    ) -> Result<(Challenge, [u8; MAC_LEN]), Refusal> {
        let (payload, mac) = self.unseal(token, CHALLENGE_TAG)?;
        let wire: ChallengeWire =
            serde_json::from_slice(&payload).map_err(|_| Refusal::Malformed)?;
        check_claims(wire.v, &wire.s, &wire.u, sale, Some(user))?;
        let challenge = Challenge {
            user: wire.u,
            sale: wire.s,
            nonce: wire.p,
            difficulty: wire.d,
            expires_at_ms: wire.e,
        };
        Ok((challenge, mac))
    }

    fn mac(&self, tag: &[u8], payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(tag);
        mac.update(payload);
        mac
    }

    fn seal(&self, tag: &[u8], payload: &[u8]) -> String {
        let code = self.mac(tag, payload).finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(code)
        )
    }

    /// The authenticated payload of `token`, signed under `tag`, and its
    /// MAC. The MAC is checked before the payload is parsed, so forgeries
    /// cost no JSON work; only when it fails are the other kinds' tags
    /// tried, to name a kind mix-up.
    fn unseal(&self, token: &str, tag: &[u8]) -> Result<(Vec<u8>, [u8; MAC_LEN]), Refusal> {
        if token.is_empty() || token.len() > MAX_TOKEN_LEN {
            return Err(Refusal::Malformed);
        }
        let (payload, code) = token.split_once('.').ok_or(Refusal::Malformed)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| Refusal::Malformed)?;
        let code = URL_SAFE_NO_PAD
            .decode(code)
            .map_err(|_| Refusal::Malformed)?;
        let code: [u8; MAC_LEN] = code.try_into().map_err(|_| Refusal::Malformed)?;
        if self.mac(tag, &payload).verify_slice(&code).is_ok() {
            return Ok((payload, code));
        }
        let other_kind = [TICKET_TAG, PASS_TAG, CHALLENGE_TAG]
            .into_iter()
            .filter(|other| *other != tag)
            .any(|other| self.mac(other, &payload).verify_slice(&code).is_ok());
        Err(if other_kind {
            Refusal::WrongKind
        } else {
            Refusal::Forged
        })
    }
}

/// Compact JSON payload; built from values, so it cannot fail.
fn json(user: &str, sale: &str, position: u64, fields: &[(&str, u64)]) -> Vec<u8> {
    let mut map = Map::new();
    map.insert("v".into(), VERSION.into());
    map.insert("u".into(), user.into());
    map.insert("s".into(), sale.into());
    map.insert("p".into(), position.into());
    for &(name, value) in fields {
        map.insert(name.into(), value.into());
    }
    Value::Object(map).to_string().into_bytes()
}

/// The sale before the user: a token of another sale is wrong whoever holds it.
fn check_claims(
    version: u8,
    token_sale: &str,
    token_user: &str,
    sale: &str,
    user: Option<&str>,
) -> Result<(), Refusal> {
    if version != VERSION {
        return Err(Refusal::Malformed);
    }
    if token_sale != sale {
        return Err(Refusal::OtherSale);
    }
    if user.is_some_and(|user| user != token_user) {
        return Err(Refusal::OtherUser);
    }
    Ok(())
}
