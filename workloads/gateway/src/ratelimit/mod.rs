//! Per-user rate limit: GCRA, decided at once by this replica, with the
//! quota shared by every replica through Redis.
//!
//! A request is decided by the replica's in-process GCRA (the `governor`
//! crate, same policy), so no request waits for Redis. A request it lets
//! through is then charged to the user's GCRA in Redis ([`shared`]: one
//! integer per user, one script call, the Redis server's clock for every
//! replica). The charge answers how long the user must wait before the
//! shared quota admits another request, and until then this replica refuses
//! the user. A charge over the quota is made all the same (the request was
//! served): that debt delays the user's next requests, so over any long span
//! a user gets the policy's rate however many replicas their requests reach.
//!
//! Overshoot bound: a user whose requests reach N replicas at once gets more
//! than the quota only while the charges that used it up are still on their
//! way back (one Redis round trip, at most the Redis timeout): at most N ×
//! the burst in that span, plus one request on each replica whose own
//! charges were answered before the others' (that request's charge tells
//! it of the debt). Their next requests then pay it back. Every charge is
//! counted, within or over the quota (`gateway_rate_limit_charges_total`).
//!
//! Each charge is bounded ([`Settings::redis_timeout`], 5 ms). Whether the
//! following requests are charged at all is [`fallback`]'s decision: only
//! after [`Thresholds::failures`] failed charges in a row lasting
//! [`Thresholds::failing_for`] (3 and 20 ms by default) does the replica
//! stop charging and decide alone; then one charge per
//! [`Thresholds::hold_off`] (1 s) probes Redis until it answers again. Each
//! switch is logged (warn to local, info back), and every decision reports
//! its [`Source`] (`gateway_rate_limit_decisions_total{source}`).
//!
//! Fail-open bound: while decisions are local each replica enforces the
//! policy on its own, so a user whose requests are spread over N replicas
//! gets at most N × the rate (and N × the burst) until Redis answers again.

mod fallback;
mod headers;
mod shared;

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use flashsale_runtime::RedisConnection;
use governor::{
    Quota,
    clock::{Clock, DefaultClock},
    middleware::StateInformationMiddleware,
    state::keyed::DefaultKeyedStateStore,
};

use fallback::Route;
pub use fallback::{Switch, Thresholds};
pub use headers::rate_limit_headers;
pub use shared::Charges;
use shared::Shared;

/// The GCRA charge script; `KEYS[1]` the user's key, `ARGV` interval (µs)
/// and burst.
pub const GCRA_LUA: &str = include_str!("gcra.lua");

/// How many requests a user may make: `rate` per second on average, up to
/// `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Requests per second, sustained.
    pub rate: NonZeroU32,
    /// Requests allowed back to back.
    pub burst: NonZeroU32,
}

impl Policy {
    /// The emission interval T = 1 s / rate, in microseconds.
    pub fn interval_micros(&self) -> u64 {
        1_000_000 / u64::from(self.rate.get())
    }

    /// Time for an exhausted burst to refill: the policy's window.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.interval_micros() * u64::from(self.burst.get()))
    }
}

/// Under which quota a decision was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The quota shared through Redis is in force: the request is charged
    /// to it, or it was refused because the quota holds the user back.
    Redis,
    /// This replica's own limiter alone (no Redis, or Redis failing).
    Local,
}

/// One rate-limit decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may go on.
    pub allowed: bool,
    /// Requests left right now.
    pub remaining: u32,
    /// When refused: how long until one request is allowed.
    pub retry_after: Duration,
    /// Until the burst is whole again.
    pub reset: Duration,
    /// Under which quota.
    pub source: Source,
}

/// Rate-limiter settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The per-user policy.
    pub policy: Policy,
    /// Longest wait for a charge's answer before counting it failed.
    pub redis_timeout: Duration,
    /// When to stop charging Redis, and how often to try again meanwhile.
    pub fallback: Thresholds,
}

impl Settings {
    /// Defaults for `policy`: 5 ms Redis bound; local decisions after 3
    /// failed charges in a row over at least 20 ms; then one probe per second.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            redis_timeout: Duration::from_millis(5),
            fallback: Thresholds {
                failures: 3,
                failing_for: Duration::from_millis(20),
                hold_off: Duration::from_secs(1),
            },
        }
    }
}

/// The in-process GCRA, keyed by user, reporting the remaining burst.
type LocalLimiter = governor::RateLimiter<
    String,
    DefaultKeyedStateStore<String>,
    DefaultClock,
    StateInformationMiddleware,
>;

/// The per-user limiter; cheap to clone.
#[derive(Clone)]
pub struct RateLimiter {
    /// What its keys count (`rl`: users), the middle part of each key.
    kind: &'static str,
    policy: Policy,
    local: Arc<LocalLimiter>,
    /// The quota shared through Redis; `None`: this replica alone.
    shared: Option<Arc<Shared>>,
}

impl RateLimiter {
    /// A limiter over Redis (`None`: local only, for a single replica),
    /// counting its charges in `charges`.
    pub fn new(redis: Option<RedisConnection>, settings: Settings, charges: Charges) -> Self {
        let policy = settings.policy;
        let quota = Quota::per_second(policy.rate).allow_burst(policy.burst);
        Self {
            kind: "rl",
            policy,
            local: Arc::new(governor::RateLimiter::keyed(quota).with_middleware()),
            shared: redis.map(|redis| Arc::new(Shared::new(redis, settings, charges))),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The same limiter counting other things than users, under keys
    /// `fs:{sale}:<kind>:<id>`, so its ids never share a quota with users'.
    pub fn counting(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// The Redis key of `user` in `sale` (the sale's slot, per the key contract).
    pub fn key(sale: &str, user: &str) -> String {
        key_of("rl", sale, user)
    }

    /// Decides for one request of `user` in `sale` under the shared quota:
    /// at once, by this replica's limiter unless the quota holds the user
    /// back; a request let through is charged to the quota afterwards.
    pub fn check(&self, sale: &str, user: &str) -> Decision {
        let key = key_of(self.kind, sale, user);
        let Some(shared) = &self.shared else {
            return self.decide(&key, Source::Local);
        };
        if let Some(wait) = shared.held_for(&key) {
            return self.refusal(wait, Source::Redis);
        }
        let mut decision = self.decide(&key, Source::Local);
        if !decision.allowed {
            if shared.in_force() {
                decision.source = Source::Redis;
            }
            return decision;
        }
        let route = shared.route();
        match route {
            Route::Redis => decision.source = Source::Redis,
            Route::Probe | Route::Local => {}
        }
        if route != Route::Local {
            shared.charge(key, route);
        }
        decision
    }

    /// Decides with this replica's limiter only, for requests that cost no
    /// shared resource (reads served from the gateway's own cache): even a
    /// charge after the answer would cost more than such a request, and the
    /// bound is the same as during a Redis outage (N replicas → N × rate).
    pub fn check_locally(&self, sale: &str, user: &str) -> Decision {
        self.decide(&key_of(self.kind, sale, user), Source::Local)
    }

    /// This replica's limiter's decision for `key`.
    #[allow(
        clippy::ptr_arg,
        reason = "the keyed limiter takes its key type, a String"
    )]
    fn decide(&self, key: &String, source: Source) -> Decision {
        match self.local.check_key(key) {
            Ok(snapshot) => Decision {
                allowed: true,
                remaining: snapshot.remaining_burst_capacity(),
                retry_after: Duration::ZERO,
                reset: self.policy.window(),
                source,
            },
            // The limiter's own clock: making one calibrates it anew, which
            // cost more than the whole decision.
            Err(not_until) => {
                self.refusal(not_until.wait_time_from(self.local.clock().now()), source)
            }
        }
    }

    fn refusal(&self, retry_after: Duration, source: Source) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            retry_after,
            reset: self.policy.window(),
            source,
        }
    }

    /// Forgets local state of users idle for a whole window and holds that
    /// ended (call now and then, so the limiter's memory stays bounded).
    pub fn prune_local(&self) {
        self.local.retain_recent();
        if let Some(shared) = &self.shared {
            shared.prune();
        }
    }
}

/// The Redis key of `id`, counted as `kind`, in `sale` (the sale's slot).
fn key_of(kind: &str, sale: &str, id: &str) -> String {
    format!("fs:{{{sale}}}:{kind}:{id}")
}

#[cfg(test)]
mod tests;
