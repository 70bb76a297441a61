//! The sale's one clock: Redis's.
//!
//! Rate limits, waiting-room passes and reservations are timed inside Redis
//! scripts with `TIME`, so a replica whose own clock drifts cannot stretch
//! them. What the gateway still times itself (a buyer's token expiry, a bot
//! shield challenge's) reads this clock: the replica's wall clock corrected
//! by the offset to Redis's, measured before the gateway serves and every
//! second after. The offset is also exported, so a drifting node shows up
//! on a dashboard before anything depends on it.

use std::{
    sync::atomic::{AtomicBool, AtomicI64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use flashsale_runtime::RedisConnection;

/// The replica's clock corrected to Redis's; the wall clock itself until
/// Redis has answered once.
#[derive(Debug, Default)]
pub struct SaleClock {
    /// Redis minus local, milliseconds, at the last measurement.
    offset_ms: AtomicI64,
    measured: AtomicBool,
}

impl SaleClock {
    /// Measures the offset to Redis's clock, halving the round trip; the
    /// replica's skew (local minus Redis) in seconds.
    pub async fn sync(&self, redis: &RedisConnection) -> redis::RedisResult<f64> {
        let mut conn = redis.clone();
        let sent = local_ms();
        let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let received = local_ms();
        let remote = seconds * 1000 + micros / 1000;
        let offset = remote - (sent + received) / 2;
        self.offset_ms.store(offset, Ordering::Relaxed);
        self.measured.store(true, Ordering::Relaxed);
        Ok(-offset as f64 / 1000.0)
    }

    /// A clock `offset_ms` ahead of this replica's, as if measured.
    #[cfg(test)]
    pub(crate) fn with_offset_ms(offset_ms: i64) -> Self {
        Self {
            offset_ms: AtomicI64::new(offset_ms),
            measured: AtomicBool::new(true),
        }
    }

    /// Now, Unix seconds, on the sale's clock.
    pub fn now_seconds(&self) -> i64 {
        self.now_ms().div_euclid(1000)
    }

    /// Now, Unix milliseconds, on the sale's clock.
    pub fn now_ms(&self) -> i64 {
        local_ms() + self.offset()
    }

    fn offset(&self) -> i64 {
        if self.measured.load(Ordering::Relaxed) {
            self.offset_ms.load(Ordering::Relaxed)
        } else {
            0
        }
    }
}

/// The replica's wall clock, Unix milliseconds.
fn local_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_a_measurement_the_sale_clock_is_the_wall_clock() {
        let clock = SaleClock::default();
        clock.offset_ms.store(3_600_000, Ordering::Relaxed);
        let wall = local_ms().div_euclid(1000);
        assert!((clock.now_seconds() - wall).abs() <= 1);
        clock.measured.store(true, Ordering::Relaxed);
        assert!((clock.now_seconds() - wall - 3600).abs() <= 1);
    }
}
