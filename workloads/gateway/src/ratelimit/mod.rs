//! Per-user rate limit: GCRA in Redis (one integer per user, one script call
//! per decision, the Redis server's clock for every gateway replica), falling
//! back to an in-process GCRA when Redis is slow or down.
//!
//! Each Redis call is bounded ([`Settings::redis_timeout`], 5 ms); a call
//! that fails or times out is decided locally. Whether the following
//! requests skip Redis is [`fallback`]'s decision: only after
//! [`Thresholds::failures`] failures in a row lasting
//! [`Thresholds::failing_for`] (3 and 20 ms by default), so one slow call
//! or a short blip leaves the replica on Redis; then one probe per
//! [`Thresholds::hold_off`] (1 s) until Redis answers again. Each switch is
//! logged (warn to local, info back), and every decision reports its
//! [`Source`], which the gateway counts
//! (`gateway_rate_limit_decisions_total{source}`).
//!
//! Fail-open bound: while decisions are local each replica enforces the
//! policy on its own, so a user whose requests are spread over N replicas
//! gets at most N × the rate (and N × the burst) until Redis answers again.

mod fallback;
mod headers;

use std::{
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use flashsale_runtime::RedisConnection;
use governor::{
    Quota,
    clock::{Clock, DefaultClock},
    middleware::StateInformationMiddleware,
    state::keyed::DefaultKeyedStateStore,
};
use redis::Script;

use fallback::{Fallback, Route};
pub use fallback::{Switch, Thresholds};
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
    /// When to stop asking Redis, and how often to ask again meanwhile.
    pub fallback: Thresholds,
}

impl Settings {
    /// Defaults for `policy`: 5 ms Redis bound; local decisions after 3
    /// failures in a row over at least 20 ms; then one probe per second.
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
    redis: Option<RedisConnection>,
    script: Arc<Script>,
    settings: Settings,
    local: Arc<LocalLimiter>,
    /// Whether to ask Redis; shared by the clones, held only to route a
    /// request or record an outcome.
    fallback: Arc<Mutex<Fallback>>,
    /// The origin of the fallback's times.
    started: Instant,
}

/// Why a Redis call gave no decision.
enum Failure {
    Redis(redis::RedisError),
    Timeout,
}

impl RateLimiter {
    /// A limiter over Redis (`None`: local only, for a single replica).
    pub fn new(redis: Option<RedisConnection>, settings: Settings) -> Self {
        let quota = Quota::per_second(settings.policy.rate).allow_burst(settings.policy.burst);
        Self {
            redis,
            script: Arc::new(Script::new(GCRA_LUA)),
            local: Arc::new(governor::RateLimiter::keyed(quota).with_middleware()),
            fallback: Arc::new(Mutex::new(Fallback::new(settings.fallback))),
            settings,
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

    /// Decides for one request of `user` in `sale`: in Redis, or locally
    /// when Redis is not configured, is not in use, or fails this call.
    pub async fn check(&self, sale: &str, user: &str) -> Decision {
        let Some(redis) = &self.redis else {
            return self.check_locally(sale, user);
        };
        let route = self.lock_fallback().route(self.started.elapsed());
        if route == Route::Local {
            return self.check_locally(sale, user);
        }
        let outcome = self.ask_redis(redis, sale, user).await;
        let switch = self
            .lock_fallback()
            .record(self.started.elapsed(), route, outcome.is_ok());
        let failure = match outcome {
            Ok(decision) => {
                report(switch, None);
                return decision;
            }
            Err(failure) => failure,
        };
        let reason = match &failure {
            Failure::Redis(err) => err.to_string(),
            Failure::Timeout => format!(
                "no answer within {} ms",
                self.settings.redis_timeout.as_millis()
            ),
        };
        tracing::debug!(
            reason,
            ?route,
            "rate limit: Redis gave no decision; this one is local"
        );
        report(switch, Some(&reason));
        self.check_locally(sale, user)
    }

    /// One GCRA call, bounded by the Redis timeout.
    async fn ask_redis(
        &self,
        redis: &RedisConnection,
        sale: &str,
        user: &str,
    ) -> Result<Decision, Failure> {
        let mut conn = redis.clone();
        let mut invocation = self.script.key(Self::key(sale, user));
        invocation
            .arg(self.settings.policy.interval_micros())
            .arg(self.settings.policy.burst.get());
        let call = invocation.invoke_async::<(i64, i64, i64, i64)>(&mut conn);
        let (allowed, remaining, retry_after, reset) =
            match tokio::time::timeout(self.settings.redis_timeout, call).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(err)) => return Err(Failure::Redis(err)),
                Err(_) => return Err(Failure::Timeout),
            };
        Ok(Decision {
            allowed: allowed == 1,
            remaining: u32::try_from(remaining).unwrap_or(0),
            retry_after: micros(retry_after),
            reset: micros(reset),
            source: Source::Redis,
        })
    }

    fn lock_fallback(&self) -> std::sync::MutexGuard<'_, Fallback> {
        self.fallback.lock().unwrap_or_else(|p| p.into_inner())
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
                // The limiter's own clock: making one calibrates it anew,
                // which cost more than the whole decision.
                retry_after: not_until.wait_time_from(self.local.clock().now()),
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

/// Logs a switch between Redis and local decisions; `reason` is the failure
/// of the call that caused a switch to local ones.
fn report(switch: Option<Switch>, reason: Option<&str>) {
    match switch {
        Some(Switch::ToLocal { failures, over }) => tracing::warn!(
            failures,
            over_ms = over.as_millis() as u64,
            reason = reason.unwrap_or_default(),
            "rate limit: Redis keeps failing; deciding locally (each replica alone) until it answers a probe"
        ),
        Some(Switch::ToRedis { after }) => tracing::info!(
            local_for_ms = after.as_millis() as u64,
            "rate limit: Redis answers again; deciding in Redis"
        ),
        None => {}
    }
}

fn micros(value: i64) -> Duration {
    Duration::from_micros(u64::try_from(value).unwrap_or(0))
}

#[cfg(test)]
mod tests;
