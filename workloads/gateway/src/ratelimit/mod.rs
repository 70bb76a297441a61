//! Per-user rate limit: GCRA in Redis (one integer per user, one script call
//! per decision, the Redis server's clock for every gateway replica), falling
//! back to an in-process GCRA within a few milliseconds when Redis is slow or
//! down.
//!
//! Fail-open bound: while Redis is unavailable each replica enforces the
//! policy on its own, so a user whose requests are spread over N replicas
//! gets at most N × the rate (and N × the burst) until Redis answers again.

mod headers;

use std::{
    num::NonZeroU32,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use governor::{
    Quota,
    clock::{Clock, DefaultClock},
    middleware::StateInformationMiddleware,
    state::keyed::DefaultKeyedStateStore,
};
use redis::{Script, aio::ConnectionManager};

pub use headers::rate_limit_headers;

/// The GCRA script; `KEYS[1]` the user's key, `ARGV` interval (µs) and burst.
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

/// Who decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The shared limiter in Redis.
    Redis,
    /// This replica's own limiter (Redis slow or down).
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
    /// Who decided.
    pub source: Source,
}

/// Rate-limiter settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The per-user policy.
    pub policy: Policy,
    /// Longest wait for Redis before deciding locally.
    pub redis_timeout: Duration,
    /// After Redis failed, how long to decide locally before asking it again,
    /// so an outage costs no timeout per request.
    pub hold_off: Duration,
}

impl Settings {
    /// Defaults for `policy`: 5 ms Redis bound, 1 s hold-off.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            redis_timeout: Duration::from_millis(5),
            hold_off: Duration::from_secs(1),
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
    redis: Option<ConnectionManager>,
    script: Arc<Script>,
    settings: Settings,
    local: Arc<LocalLimiter>,
    /// Micros since `started` until which Redis is not asked.
    redis_skipped_until: Arc<AtomicU64>,
    started: Instant,
}

impl RateLimiter {
    /// A limiter over Redis (`None`: local only, for a single replica).
    pub fn new(redis: Option<ConnectionManager>, settings: Settings) -> Self {
        let quota = Quota::per_second(settings.policy.rate).allow_burst(settings.policy.burst);
        Self {
            redis,
            script: Arc::new(Script::new(GCRA_LUA)),
            settings,
            local: Arc::new(governor::RateLimiter::keyed(quota).with_middleware()),
            redis_skipped_until: Arc::new(AtomicU64::new(0)),
            started: Instant::now(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.settings.policy
    }

    /// The Redis key of `user` in `sale` (the sale's slot, per the key contract).
    pub fn key(sale: &str, user: &str) -> String {
        format!("fs:{{{sale}}}:rl:{user}")
    }

    /// Decides for one request of `user` in `sale`.
    pub async fn check(&self, sale: &str, user: &str) -> Decision {
        let now = self.started.elapsed().as_micros() as u64;
        if let Some(redis) = &self.redis
            && now >= self.redis_skipped_until.load(Ordering::Relaxed)
        {
            let mut conn = redis.clone();
            let mut invocation = self.script.key(Self::key(sale, user));
            invocation
                .arg(self.settings.policy.interval_micros())
                .arg(self.settings.policy.burst.get());
            let call = invocation.invoke_async::<(i64, i64, i64, i64)>(&mut conn);
            match tokio::time::timeout(self.settings.redis_timeout, call).await {
                Ok(Ok((allowed, remaining, retry_after, reset))) => {
                    return Decision {
                        allowed: allowed == 1,
                        remaining: u32::try_from(remaining).unwrap_or(0),
                        retry_after: micros(retry_after),
                        reset: micros(reset),
                        source: Source::Redis,
                    };
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "rate limit: Redis failed; deciding locally")
                }
                Err(_) => tracing::warn!(
                    timeout_ms = self.settings.redis_timeout.as_millis() as u64,
                    "rate limit: Redis too slow; deciding locally"
                ),
            }
            let until = now + self.settings.hold_off.as_micros() as u64;
            self.redis_skipped_until.store(until, Ordering::Relaxed);
        }
        self.check_locally(sale, user)
    }

    /// Decides with this replica's limiter only, for requests that cost no
    /// shared resource (reads served from the gateway's own cache): a Redis
    /// round trip would cost more than such a request, and the bound is the
    /// same as during a Redis outage (N replicas → N × rate).
    pub fn check_locally(&self, sale: &str, user: &str) -> Decision {
        let key = Self::key(sale, user);
        let window = self.settings.policy.window();
        match self.local.check_key(&key) {
            Ok(snapshot) => Decision {
                allowed: true,
                remaining: snapshot.remaining_burst_capacity(),
                retry_after: Duration::ZERO,
                reset: window,
                source: Source::Local,
            },
            Err(not_until) => Decision {
                allowed: false,
                remaining: 0,
                retry_after: not_until.wait_time_from(DefaultClock::default().now()),
                reset: window,
                source: Source::Local,
            },
        }
    }

    /// Forgets local state of users idle for a whole window (call now and
    /// then, so the fallback's memory stays bounded).
    pub fn prune_local(&self) {
        self.local.retain_recent();
    }
}

fn micros(value: i64) -> Duration {
    Duration::from_micros(u64::try_from(value).unwrap_or(0))
}

#[cfg(test)]
mod tests;
