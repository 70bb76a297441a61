//! The waiting room's Redis state: keys in the sale's slot and one Lua script
//! per operation, each call bounded by the configured timeout.

use std::{future::Future, sync::Arc, time::Duration};

use flashsale_runtime::RedisConnection;
use redis::{RedisResult, Script};

use super::{Error, Refusal, Spend, millis};

/// The admission script; `KEYS` frontier and counter, `ARGV` the rate.
const ADMISSION_LUA: &str = include_str!("admission.lua");
/// The join script; `KEYS` user, counter, frontier and (with a challenge)
/// its spent marker, `ARGV` the ticket TTL and the challenge's expiry.
const JOIN_LUA: &str = concat!(include_str!("challenge.lua"), include_str!("join.lua"));
/// The spend script of an order without a queue; `KEYS` the spent marker,
/// `ARGV` the challenge's expiry and the order's request id.
const SPEND_LUA: &str = concat!(include_str!("challenge.lua"), include_str!("spend.lua"));
/// The redeem script; `KEYS` the used marker, `ARGV` expiry, lease, claim.
const REDEEM_LUA: &str = include_str!("redeem.lua");
/// The commit script; `KEYS` the used marker, `ARGV` claim, final marker TTL.
const COMMIT_LUA: &str = include_str!("commit.lua");
/// The give-back script; `KEYS` the used marker, `ARGV` the claim.
const RELEASE_LUA: &str = include_str!("release.lua");

/// Keys of one sale's waiting room.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    pub(super) fn new(sale: &str) -> Self {
        Self {
            prefix: format!("fs:{{{sale}}}:wr:"),
        }
    }

    /// The last issued position (INCR).
    fn seq(&self) -> String {
        format!("{}seq", self.prefix)
    }

    /// The admission frontier: `admitted` position and `last_us`.
    fn frontier(&self) -> String {
        format!("{}frontier", self.prefix)
    }

    /// A user's `position` and `issued_ms`.
    fn user(&self, user: &str) -> String {
        format!("{}user:{user}", self.prefix)
    }

    /// Set while a position's pass is redeemed (on lease, then for good).
    fn used(&self, position: u64) -> String {
        format!("{}used:{position}", self.prefix)
    }

    /// Set once a join challenge is spent, until it expires.
    fn spent(&self, nonce: u64) -> String {
        format!("{}spent:{nonce}", self.prefix)
    }
}

/// The frontier as one script saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Frontier {
    /// Every position up to this one is admitted.
    pub admitted: u64,
    /// The last position handed out.
    pub issued: u64,
    /// The Redis clock when it was read (µs since the Unix epoch).
    pub now_us: u64,
}

/// A user's place, as the join script returns it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    pub position: u64,
    pub issued_at_ms: u64,
    /// The frontier when the user joined.
    pub admitted: u64,
}

/// What the redeem script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Redemption {
    Redeemed,
    Replayed,
    Expired,
}

/// The scripts over one connection; cheap to clone.
#[derive(Clone)]
pub(super) struct Store {
    redis: RedisConnection,
    keys: Keys,
    timeout: Duration,
    scripts: Arc<Scripts>,
}

struct Scripts {
    admission: Script,
    join: Script,
    spend: Script,
    redeem: Script,
    commit: Script,
    release: Script,
}

impl Store {
    pub(super) fn new(redis: RedisConnection, sale: &str, timeout: Duration) -> Self {
        Self {
            redis,
            keys: Keys::new(sale),
            timeout,
            scripts: Arc::new(Scripts {
                admission: Script::new(ADMISSION_LUA),
                join: Script::new(JOIN_LUA),
                spend: Script::new(SPEND_LUA),
                redeem: Script::new(REDEEM_LUA),
                commit: Script::new(COMMIT_LUA),
                release: Script::new(RELEASE_LUA),
            }),
        }
    }

    /// Moves the frontier by the time passed and reads it.
    pub(super) async fn advance(&self, rate: u32) -> Result<Frontier, Error> {
        let mut conn = self.redis.clone();
        let mut call = self.scripts.admission.key(self.keys.frontier());
        call.key(self.keys.seq()).arg(rate);
        let (admitted, issued, now_us) = self
            .bounded(call.invoke_async::<(u64, u64, u64)>(&mut conn))
            .await?;
        Ok(Frontier {
            admitted,
            issued,
            now_us,
        })
    }

    /// The user's place, taken now if they hold none, spending `spend`
    /// when it is given (and refused if it was spent or has expired).
    pub(super) async fn join(
        &self,
        user: &str,
        ticket_ttl: Duration,
        spend: Option<Spend>,
    ) -> Result<Place, Error> {
        let mut conn = self.redis.clone();
        let mut call = self.scripts.join.key(self.keys.user(user));
        call.key(self.keys.seq())
            .key(self.keys.frontier())
            .arg(expiry_ms(ticket_ttl));
        if let Some(spend) = spend {
            call.key(self.keys.spent(spend.nonce))
                .arg(spend.expires_at_ms);
        }
        let (position, issued_at_ms, admitted) = self
            .bounded(call.invoke_async::<(i64, u64, u64)>(&mut conn))
            .await?;
        spend_outcome(position)?;
        Ok(Place {
            position: position.unsigned_abs(),
            issued_at_ms,
            admitted,
        })
    }

    /// Spends `spend` for `holder`, an order's request id: a retry of the
    /// same order may spend it again.
    pub(super) async fn spend(&self, spend: Spend, holder: &str) -> Result<(), Error> {
        let mut conn = self.redis.clone();
        let mut call = self.scripts.spend.key(self.keys.spent(spend.nonce));
        call.arg(spend.expires_at_ms).arg(holder);
        spend_outcome(self.bounded(call.invoke_async::<i64>(&mut conn)).await?)
    }

    /// Marks `position` used under `claim` for `lease`, unless it already
    /// is or the pass (valid until `expires_at_ms`) has expired.
    pub(super) async fn redeem(
        &self,
        position: u64,
        expires_at_ms: u64,
        lease: Duration,
        claim: u64,
    ) -> Result<Redemption, Error> {
        let mut conn = self.redis.clone();
        let mut call = self.scripts.redeem.key(self.keys.used(position));
        call.arg(expires_at_ms).arg(expiry_ms(lease)).arg(claim);
        match self.bounded(call.invoke_async::<i64>(&mut conn)).await? {
            1 => Ok(Redemption::Redeemed),
            0 => Ok(Redemption::Replayed),
            _ => Ok(Redemption::Expired),
        }
    }

    /// Keeps `position`'s used marker for `marker_ttl` under `claim`;
    /// `false` if another claim holds it.
    pub(super) async fn commit(
        &self,
        position: u64,
        claim: u64,
        marker_ttl: Duration,
    ) -> Result<bool, Error> {
        let mut conn = self.redis.clone();
        let mut call = self.scripts.commit.key(self.keys.used(position));
        call.arg(claim).arg(expiry_ms(marker_ttl));
        let committed = self.bounded(call.invoke_async::<i64>(&mut conn)).await?;
        Ok(committed == 1)
    }

    /// Clears `position`'s used marker if `claim` still holds it.
    pub(super) async fn release(&self, position: u64, claim: u64) -> Result<(), Error> {
        let mut conn = self.redis.clone();
        let mut call = self.scripts.release.key(self.keys.used(position));
        call.arg(claim);
        self.bounded(call.invoke_async::<i64>(&mut conn))
            .await
            .map(drop)
    }

    async fn bounded<T>(&self, call: impl Future<Output = RedisResult<T>>) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(Error::Timeout),
        }
    }
}

/// The refusal a spending script's code names: -1 spent by another, -2
/// expired (challenge.lua); any other value went through.
fn spend_outcome(code: i64) -> Result<(), Error> {
    match code {
        -1 => Err(Refusal::Replayed.into()),
        -2 => Err(Refusal::Expired.into()),
        _ => Ok(()),
    }
}

/// A key lifetime in whole milliseconds, at least 1 (Redis refuses 0).
fn expiry_ms(duration: Duration) -> u64 {
    millis(duration).max(1)
}
