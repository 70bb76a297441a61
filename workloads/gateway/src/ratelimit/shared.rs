//! The quota every replica shares. Each request a replica let through is
//! charged, after its answer, to the user's GCRA in Redis
//! ([`super::GCRA_LUA`]). The charge says how long the user must wait before
//! the quota admits another request; until then this replica refuses the
//! user ([`Holds`]). Whether charges are made at all is [`Fallback`]'s
//! decision, fed with each charge's outcome.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use flashsale_runtime::RedisConnection;
use prometheus_client::metrics::counter::Counter;
use redis::Script;
use tokio::sync::Semaphore;

use super::{
    Policy, Settings,
    fallback::{Fallback, Route, Switch},
};

/// Charges in flight at most: beyond them Redis is not keeping up, and a
/// request that finds none free counts as a failed charge (so a flood moves
/// the replica to local decisions rather than queueing charges without end).
const MAX_IN_FLIGHT: usize = 512;

/// What the charges came to, counted (`gateway_rate_limit_charges_total`).
#[derive(Debug, Clone, Default)]
pub struct Charges {
    /// Within the shared quota.
    pub within: Counter,
    /// Over it: requests let through before this replica learnt that the
    /// user's other requests had used the quota up (the overshoot, paid back
    /// by the user's next requests).
    pub over: Counter,
    /// Not made: Redis failed, did not answer in time, or had too many
    /// charges in flight.
    pub failed: Counter,
}

/// Users the shared quota holds back on this replica, and until when.
#[derive(Debug, Default)]
pub struct Holds(HashMap<String, Instant>);

impl Holds {
    /// Holds `key` back until `until` (or longer, if it already is).
    pub fn hold(&mut self, key: String, until: Instant) {
        let held = self.0.entry(key).or_insert(until);
        *held = (*held).max(until);
    }

    /// How long `key` is still held back at `now`, if it is.
    pub fn held_for(&self, key: &str, now: Instant) -> Option<Duration> {
        let until = self.0.get(key)?;
        until
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }

    /// Forgets the holds that ended by `now`.
    pub fn prune(&mut self, now: Instant) {
        self.0.retain(|_, until| *until > now);
    }
}

/// One charge's answer.
struct Charge {
    within: bool,
    wait: Duration,
}

/// Why a charge was not made.
enum Failure {
    Redis(redis::RedisError),
    Timeout,
    Busy,
}

/// The shared side of a limiter.
pub(super) struct Shared {
    redis: RedisConnection,
    script: Script,
    settings: Settings,
    fallback: Mutex<Fallback>,
    /// The origin of the fallback's times.
    started: Instant,
    holds: Mutex<Holds>,
    in_flight: Arc<Semaphore>,
    charges: Charges,
}

impl Shared {
    pub(super) fn new(redis: RedisConnection, settings: Settings, charges: Charges) -> Self {
        Self {
            redis,
            script: Script::new(super::GCRA_LUA),
            fallback: Mutex::new(Fallback::new(settings.fallback)),
            settings,
            started: Instant::now(),
            holds: Mutex::new(Holds::default()),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            charges,
        }
    }

    /// How long the quota still holds `key` back, if it does.
    pub(super) fn held_for(&self, key: &str) -> Option<Duration> {
        lock(&self.holds).held_for(key, Instant::now())
    }

    /// How a request let through is charged: as a probe too, while
    /// decisions are local.
    pub(super) fn route(&self) -> Route {
        lock(&self.fallback).route(self.started.elapsed())
    }

    /// Whether the quota is shared now (for a refused request, which is not
    /// charged and so must not take a probe's turn).
    pub(super) fn in_force(&self) -> bool {
        lock(&self.fallback).on_redis()
    }

    /// Charges a request let through on `route` to `key`'s quota, in a task
    /// of its own: the request's answer does not wait for it.
    pub(super) fn charge(self: &Arc<Self>, key: String, route: Route) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(slot) = self.in_flight.clone().try_acquire_owned() else {
            self.settle(route, Err(Failure::Busy));
            return;
        };
        let shared = self.clone();
        runtime.spawn(async move {
            // The wait runs from Redis's clock when the charge arrived, which
            // is no earlier than this: a hold from here never outlasts it.
            let sent = Instant::now();
            let outcome = shared.ask(&key).await;
            drop(slot);
            if let Ok(charge) = &outcome
                && !charge.wait.is_zero()
            {
                lock(&shared.holds).hold(key, sent + charge.wait);
            }
            shared.settle(route, outcome);
        });
    }

    /// One charge, bounded by the Redis timeout.
    async fn ask(&self, key: &str) -> Result<Charge, Failure> {
        let mut conn = self.redis.clone();
        let policy: Policy = self.settings.policy;
        let mut invocation = self.script.key(key);
        invocation
            .arg(policy.interval_micros())
            .arg(policy.burst.get());
        let call = invocation.invoke_async::<(i64, i64, i64)>(&mut conn);
        match tokio::time::timeout(self.settings.redis_timeout, call).await {
            Ok(Ok((within, _remaining, wait))) => Ok(Charge {
                within: within == 1,
                wait: Duration::from_micros(u64::try_from(wait).unwrap_or(0)),
            }),
            Ok(Err(err)) => Err(Failure::Redis(err)),
            Err(_) => Err(Failure::Timeout),
        }
    }

    /// Counts a charge's outcome and feeds it to the fallback.
    fn settle(&self, route: Route, outcome: Result<Charge, Failure>) {
        let switch = lock(&self.fallback).record(self.started.elapsed(), route, outcome.is_ok());
        let failure = match outcome {
            Ok(charge) => {
                if charge.within {
                    self.charges.within.inc();
                } else {
                    self.charges.over.inc();
                }
                report(switch, None);
                return;
            }
            Err(failure) => failure,
        };
        self.charges.failed.inc();
        let reason = match &failure {
            Failure::Redis(err) => err.to_string(),
            Failure::Timeout => format!(
                "no answer within {} ms",
                self.settings.redis_timeout.as_millis()
            ),
            Failure::Busy => format!("{MAX_IN_FLIGHT} charges already in flight"),
        };
        tracing::debug!(reason, ?route, "rate limit: a charge to Redis failed");
        report(switch, Some(&reason));
    }

    /// Forgets the holds that ended.
    pub(super) fn prune(&self) {
        lock(&self.holds).prune(Instant::now());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Logs a switch between shared and local decisions; `reason` is the
/// failure of the charge that caused a switch to local ones.
fn report(switch: Option<Switch>, reason: Option<&str>) {
    match switch {
        Some(Switch::ToLocal { failures, over }) => tracing::warn!(
            failures,
            over_ms = over.as_millis() as u64,
            reason = reason.unwrap_or_default(),
            "rate limit: charges to Redis keep failing; deciding locally (each replica alone) until it answers a probe"
        ),
        Some(Switch::ToRedis { after }) => tracing::info!(
            local_for_ms = after.as_millis() as u64,
            "rate limit: Redis answers again; the shared quota is in force"
        ),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_lasts_until_its_end_and_a_later_one_extends_it() {
        let now = Instant::now();
        let mut holds = Holds::default();
        assert_eq!(holds.held_for("u", now), None);
        holds.hold("u".into(), now + Duration::from_millis(30));
        assert_eq!(holds.held_for("u", now), Some(Duration::from_millis(30)));
        // An earlier end, from a charge answered late, does not shorten it.
        holds.hold("u".into(), now + Duration::from_millis(10));
        assert_eq!(
            holds.held_for("u", now + Duration::from_millis(20)),
            Some(Duration::from_millis(10))
        );
        holds.hold("u".into(), now + Duration::from_millis(50));
        assert_eq!(
            holds.held_for("u", now + Duration::from_millis(30)),
            Some(Duration::from_millis(20))
        );
        assert_eq!(holds.held_for("u", now + Duration::from_millis(50)), None);
        assert_eq!(holds.held_for("v", now), None);
    }

    #[test]
    fn pruning_forgets_only_the_holds_that_ended() {
        let now = Instant::now();
        let mut holds = Holds::default();
        holds.hold("ended".into(), now + Duration::from_millis(5));
        holds.hold("held".into(), now + Duration::from_millis(50));
        holds.prune(now + Duration::from_millis(10));
        assert_eq!(holds.0.len(), 1);
        assert!(holds.held_for("held", now).is_some());
    }
}
