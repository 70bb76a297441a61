//! The bot shield in front of the waiting room: joining the queue (or,
//! where the sale has no waiting room, ordering) takes a solved
//! proof-of-work challenge, whose cost follows the sale's degradation tier.
//!
//! # Flow
//!
//! 1. `POST /api/v1/queue/challenge` (with the buyer's bearer token)
//!    answers a **challenge**: a random nonce bound to the user and the
//!    sale, the difficulty in force and an expiry on the Redis clock,
//!    MACed with the waiting-room key under a domain tag of its own
//!    ([`crate::waiting_room`]'s token format), so it can stand in for no
//!    ticket or pass, nor they for it. Issuing it costs one HMAC and no
//!    Redis call: the expiry is on the sale's clock
//!    ([`crate::clock::SaleClock`]).
//! 2. The client searches a **solution** ([`work`]): about
//!    `2^difficulty` SHA-256 hashes of one block each.
//! 3. The join (`POST /api/v1/orders` without a pass) carries
//!    `X-Queue-Proof: <challenge>:<solution>`. [`Shield::check`] verifies
//!    the MAC, the sale, the user and the work: one HMAC and one hash,
//!    before anything touches Redis, so a forged, foreign or unsolved proof
//!    costs the gateway no more than that. A proof that passes is **spent**
//!    by the join script in the call that queues the user
//!    ([`WaitingRoom::join_spending`]): its expiry is checked against the
//!    Redis clock and its marker set with `SET NX`, before any write, so a
//!    replay or a late solution is refused on any replica without a write.
//!
//! # Without a waiting room
//!
//! Every order carries a proof, checked as above, and spends it itself
//! before it reaches the inventory ([`crate::waiting_room::OrderSpends`]):
//! the marker holds the order's request id, so a retry of that order may
//! spend the same proof again, and any other order is refused `replayed`.
//!
//! # Difficulty follows load
//!
//! The sale sets leading zero bits per tier (`difficultyBits`, the last
//! entry for any higher tier); the tier is the one the gateway's
//! degradation switches are at. A challenge carries the difficulty it was
//! issued with and its solution is judged by that: a person who started
//! solving before the tier rose is never refused for it, and a tier that
//! falls lowers only the challenges issued after it.
//!
//! # Refusals
//!
//! A join (or an order, without a waiting room) without a proof is
//! answered 428 `challenge_required`, naming the challenge route. A refused proof is 400 (`malformed`) or 403 (`forged`,
//! `wrong_kind`, `other_user`, `other_sale`, `unsolved`, `expired`,
//! `replayed`), each counted in `gateway_bot_refusals_total{reason}`.

pub mod source;
pub mod work;

use std::{sync::Arc, time::Duration};

use crate::waiting_room::{Challenge, Refusal, Signer, Spend, WaitingRoom};

/// The header a join (or an order, without a waiting room) carries its
/// proof in: `<challenge>:<solution>`.
pub const PROOF_HEADER: &str = "x-queue-proof";

/// The work's definition, named in every challenge answer so a client can
/// tell which search to run.
pub const ALGORITHM: &str = "sha256-leading-zero-bits-v1";

/// Shield settings of one sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Leading zero bits a solution needs, by tier (index); the last entry
    /// serves every higher tier, and an empty list asks for no work.
    pub difficulty_bits: Vec<u8>,
    /// How long a challenge may be solved and spent.
    pub challenge_ttl: Duration,
}

impl Settings {
    /// The difficulty of a challenge issued at `tier`.
    pub fn difficulty(&self, tier: u32) -> u8 {
        self.difficulty_bits
            .get(usize::try_from(tier).unwrap_or(usize::MAX))
            .or(self.difficulty_bits.last())
            .copied()
            .unwrap_or(0)
    }
}

/// A challenge as handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The signed challenge.
    pub token: String,
    /// Leading zero bits its solution needs.
    pub difficulty: u8,
    /// When it expires (Unix ms, Redis clock).
    pub expires_at_ms: u64,
}

/// Issues and checks one sale's join challenges; cheap to clone.
#[derive(Clone)]
pub struct Shield {
    signer: Arc<Signer>,
    sale: String,
    settings: Arc<Settings>,
}

impl Shield {
    /// The shield of `room`'s sale, signing with the room's key.
    pub fn new(room: &WaitingRoom, settings: Settings) -> Self {
        Self::signing(room.signer(), room.settings().sale.clone(), settings)
    }

    /// The shield of `sale` signing with `signer`, which must be the sale's
    /// waiting-room key for its joins to be spent (see [`Shield::new`]).
    pub fn signing(signer: Arc<Signer>, sale: String, settings: Settings) -> Self {
        Self {
            signer,
            sale,
            settings: Arc::new(settings),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// A challenge for `user` at `tier`, issued at `now_ms` (Unix ms, Redis
    /// clock).
    pub fn issue(&self, user: &str, tier: u32, now_ms: u64) -> Issued {
        let difficulty = self.settings.difficulty(tier);
        let ttl_ms = u64::try_from(self.settings.challenge_ttl.as_millis()).unwrap_or(u64::MAX);
        let expires_at_ms = now_ms.saturating_add(ttl_ms);
        let token = self.signer.sign_challenge(&Challenge {
            user: user.to_owned(),
            sale: self.sale.clone(),
            nonce: rand::random(),
            difficulty,
            expires_at_ms,
        });
        Issued {
            token,
            difficulty,
            expires_at_ms,
        }
    }

    /// The challenge `proof` (`<challenge>:<solution>`) spends, if it is
    /// genuine, `user`'s, this sale's, and its solution does the
    /// challenge's work. One HMAC and one hash; no Redis call. Whether it
    /// was spent already, or has expired, the script that spends it decides
    /// (the join's, or an order's without a waiting room).
    pub fn check(&self, proof: &str, user: &str) -> Result<Spend, Refusal> {
        let (token, solution) = proof.rsplit_once(':').ok_or(Refusal::Malformed)?;
        let solution: u64 = solution.parse().map_err(|_| Refusal::Malformed)?;
        let (challenge, mac) = self.signer.open_challenge(token, &self.sale, user)?;
        if !work::solves(&mac, solution, challenge.difficulty) {
            return Err(Refusal::Unsolved);
        }
        Ok(Spend {
            nonce: challenge.nonce,
            expires_at_ms: challenge.expires_at_ms,
        })
    }
}

#[cfg(test)]
mod tests;
