//! The GCRA limit against the real Redis of the local stack, and its local
//! fallback when Redis is unreachable.

use std::{
    num::NonZeroU32,
    time::{Duration, Instant},
};

use flashsale_e2e::{private_redis::PrivateRedis, stack};
use gateway::ratelimit::{Policy, RateLimiter, Settings, Source};

fn policy(rate: u32, burst: u32) -> anyhow::Result<Policy> {
    Ok(Policy {
        rate: NonZeroU32::new(rate).ok_or_else(|| anyhow::anyhow!("rate 0"))?,
        burst: NonZeroU32::new(burst).ok_or_else(|| anyhow::anyhow!("burst 0"))?,
    })
}

async fn redis_limiter(policy: Policy) -> anyhow::Result<RateLimiter> {
    let client = redis::Client::open(stack::redis_url()?)?;
    let conn = redis::aio::ConnectionManager::new(client).await?;
    let mut settings = Settings::new(policy);
    // Conformance is about the algorithm: never fall back in these tests.
    settings.redis_timeout = Duration::from_secs(2);
    Ok(RateLimiter::new(Some(conn), settings))
}

#[tokio::test]
async fn a_burst_is_allowed_then_one_request_per_interval() -> anyhow::Result<()> {
    let limiter = redis_limiter(policy(10, 5)?).await?;
    let (sale, user) = (stack::unique_name("rl"), "u1");
    for n in 0..5 {
        let d = limiter.check(&sale, user).await;
        assert_eq!(d.source, Source::Redis);
        assert!(d.allowed, "request {n} of the burst");
        assert_eq!(d.remaining, 4 - n);
    }
    let refused = limiter.check(&sale, user).await;
    assert!(!refused.allowed);
    assert!(
        refused.retry_after > Duration::ZERO && refused.retry_after <= Duration::from_millis(100),
        "{refused:?}"
    );
    // Waiting out the retry time buys exactly one request, not a new burst.
    tokio::time::sleep(refused.retry_after + Duration::from_millis(5)).await;
    assert!(limiter.check(&sale, user).await.allowed);
    assert!(!limiter.check(&sale, user).await.allowed);
    // Another user has a whole burst of their own.
    assert!(limiter.check(&sale, "u2").await.allowed);
    Ok(())
}

/// A fixed-window counter lets a client spend two windows' quota within a
/// few milliseconds around a window boundary. GCRA bounds every interval:
/// at most burst + rate × length requests in any span.
#[tokio::test]
async fn no_span_gets_more_than_burst_plus_rate() -> anyhow::Result<()> {
    let (rate, burst) = (50, 10);
    let limiter = redis_limiter(policy(rate, burst)?).await?;
    let sale = stack::unique_name("rl-boundary");
    let started = Instant::now();
    let mut allowed = Vec::new();
    let mut attempts = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        attempts += 1;
        if limiter.check(&sale, "hammer").await.allowed {
            allowed.push(started.elapsed());
        }
    }
    assert!(
        attempts > allowed.len() * 2,
        "the client must outrun the limit"
    );
    // Any 1-second span holds at most burst + rate (+1 for the span's edges).
    let most = allowed
        .iter()
        .map(|&from| {
            allowed
                .iter()
                .filter(|&&t| t >= from && t < from + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        most <= (burst + rate + 1) as usize,
        "{most} allowed within one second"
    );
    // And the long-run total follows the rate: burst + rate × 1.5 s.
    let expected = burst as f64 + rate as f64 * 1.5;
    let total = allowed.len() as f64;
    assert!(
        (total - expected).abs() <= expected * 0.1,
        "{total} allowed, expected about {expected}"
    );
    Ok(())
}

#[tokio::test]
async fn without_redis_decisions_are_local_and_still_limit() -> anyhow::Result<()> {
    // A port nothing listens on: every Redis call fails at once.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    drop(listener);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let conn = redis::aio::ConnectionManager::new_lazy_with_config(
        client,
        redis::aio::ConnectionManagerConfig::new(),
    )?;
    let limiter = RateLimiter::new(Some(conn), Settings::new(policy(10, 3)?));
    let sale = stack::unique_name("rl-local");
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let d = limiter.check(&sale, "u1").await;
        assert_eq!(d.source, Source::Local);
        outcomes.push(d.allowed);
    }
    assert_eq!(outcomes, [true, true, true, false, false]);
    Ok(())
}

#[tokio::test]
async fn a_stalled_redis_costs_one_timeout_then_local_decisions() -> anyhow::Result<()> {
    let redis = PrivateRedis::start(&["--enable-debug-command", "yes"]).await?;
    let client = redis::Client::open(redis.url.as_str())?;
    let limiter = RateLimiter::new(
        Some(redis::aio::ConnectionManager::new(client.clone()).await?),
        Settings::new(policy(10, 3)?),
    );
    let sale = stack::unique_name("rl-stall");
    assert_eq!(limiter.check(&sale, "u1").await.source, Source::Redis);

    // Redis stops answering for 2 s (a long fork, a slow script, a failover).
    let mut staller = client.get_multiplexed_async_connection().await?;
    let stall = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(2)
            .query_async::<()>(&mut staller)
            .await
    });
    flashsale_e2e::wait::poll_until(
        "Redis to stall",
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            match limiter.check(&sale, "probe").await.source {
                Source::Local => Ok(()),
                Source::Redis => Err("Redis still answers".to_owned()),
            }
        },
    )
    .await?;
    // Within the hold-off every decision is local and immediate, and the
    // local limiter still enforces the policy.
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        let d = limiter.check(&sale, "u2").await;
        assert_eq!(d.source, Source::Local);
        outcomes.push(d.allowed);
    }
    assert_eq!(outcomes, [true, true, true, false]);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "decisions stalled for {:?} while Redis slept",
        started.elapsed()
    );
    // The staller's own client may give up waiting for DEBUG's reply; the
    // server slept either way, which is all this test needed.
    let _ = stall.await;
    Ok(())
}
