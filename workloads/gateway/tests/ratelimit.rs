//! The GCRA limit against the real Redis of the local stack: one replica's
//! decisions, the quota that replicas share through their charges, and the
//! local fallback when Redis is unreachable, slow for a moment, or stalled.

mod common;

use std::{
    num::NonZeroU32,
    time::{Duration, Instant},
};

use common::{Funnel, Options, order};
use flashsale_e2e::{
    private_redis::PrivateRedis, redis_connection::connect, stack, wait::poll_until,
};
use gateway::ratelimit::{Charges, Policy, RateLimiter, Settings, Source};
use serde_json::json;

fn policy(rate: u32, burst: u32) -> anyhow::Result<Policy> {
    Ok(Policy {
        rate: NonZeroU32::new(rate).ok_or_else(|| anyhow::anyhow!("rate 0"))?,
        burst: NonZeroU32::new(burst).ok_or_else(|| anyhow::anyhow!("burst 0"))?,
    })
}

/// A replica's limiter on the stack's Redis, with the counters of its
/// charges.
async fn redis_limiter(policy: Policy) -> anyhow::Result<(RateLimiter, Charges)> {
    let conn = connect(&stack::redis_url()?).await?;
    let mut settings = Settings::new(policy);
    // Conformance is about the algorithm: never fall back in these tests.
    settings.redis_timeout = Duration::from_secs(2);
    let charges = Charges::default();
    Ok((
        RateLimiter::new(Some(conn), settings, charges.clone()),
        charges,
    ))
}

/// Waits until the replicas counting in `of` answered `count` charges
/// between them, within the quota or over it; returns how many were over.
async fn charged(of: &[&Charges], count: u64) -> anyhow::Result<u64> {
    let sum = |counter: fn(&Charges) -> u64| of.iter().map(|c| counter(c)).sum::<u64>();
    let within = |c: &Charges| c.within.get();
    let over = |c: &Charges| c.over.get();
    let failed = |c: &Charges| c.failed.get();
    poll_until(
        &format!("{count} charges answered"),
        Duration::from_secs(5),
        Duration::from_millis(2),
        || async {
            let answered = sum(within) + sum(over);
            if answered >= count {
                Ok(())
            } else {
                Err(format!("{answered} answered, {} failed", sum(failed)))
            }
        },
    )
    .await?;
    Ok(sum(over))
}

#[tokio::test]
async fn a_burst_is_allowed_then_one_request_per_interval() -> anyhow::Result<()> {
    let (limiter, charges) = redis_limiter(policy(10, 5)?).await?;
    let (sale, user) = (stack::unique_name("rl"), "u1");
    for n in 0..5 {
        let d = limiter.check(&sale, user);
        assert_eq!(d.source, Source::Redis);
        assert!(d.allowed, "request {n} of the burst");
        assert_eq!(d.remaining, 4 - n);
    }
    let refused = limiter.check(&sale, user);
    assert!(!refused.allowed);
    assert!(
        refused.retry_after > Duration::ZERO && refused.retry_after <= Duration::from_millis(100),
        "{refused:?}"
    );
    // Waiting out the retry time buys exactly one request, not a new burst;
    // the margin covers the time the first charge took to reach Redis.
    tokio::time::sleep(refused.retry_after + Duration::from_millis(20)).await;
    assert!(limiter.check(&sale, user).allowed);
    assert!(!limiter.check(&sale, user).allowed);
    // Another user has a whole burst of their own.
    assert!(limiter.check(&sale, "u2").allowed);
    // Every request let through was charged, and all within the quota.
    assert_eq!(charged(&[&charges], 7).await?, 0);
    assert_eq!(charges.within.get(), 7);
    Ok(())
}

/// A fixed-window counter lets a client spend two windows' quota within a
/// few milliseconds around a window boundary. GCRA bounds every interval:
/// at most burst + rate × length requests in any span, and over 1.5 s the
/// total follows the rate (burst + rate × 1.5 s, within `tolerance`).
/// `replicas` share the quota, the client's requests going to each in turn.
/// Returns how many were let through.
async fn hammer(
    replicas: &[RateLimiter],
    rate: u32,
    burst: u32,
    tolerance: f64,
) -> anyhow::Result<u64> {
    let sale = stack::unique_name("rl-boundary");
    let started = Instant::now();
    let mut allowed = Vec::new();
    let mut attempts = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        let replica = &replicas[attempts % replicas.len()];
        attempts += 1;
        if replica.check(&sale, "hammer").allowed {
            allowed.push(started.elapsed());
        }
        // About as often as a client that waits for each answer.
        tokio::time::sleep(Duration::from_micros(200)).await;
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
    let expected = burst as f64 + rate as f64 * 1.5;
    let total = allowed.len() as f64;
    assert!(
        (total - expected).abs() <= expected * tolerance,
        "{total} allowed over {} replicas, expected about {expected}",
        replicas.len()
    );
    Ok(allowed.len() as u64)
}

/// Two replicas' limiters on the stack's Redis, with their charges.
async fn two_replicas(policy: Policy) -> anyhow::Result<[(RateLimiter, Charges); 2]> {
    Ok([redis_limiter(policy).await?, redis_limiter(policy).await?])
}

#[tokio::test]
async fn no_span_gets_more_than_burst_plus_rate() -> anyhow::Result<()> {
    let (rate, burst) = (50, 10);
    let (limiter, _) = redis_limiter(policy(rate, burst)?).await?;
    hammer(&[limiter], rate, burst, 0.1).await?;
    Ok(())
}

/// Two replicas, each deciding at once with its own limiter, still give a
/// user spread over both one quota: each replica alone would let through
/// twice as much.
#[tokio::test]
async fn replicas_share_one_quota_through_their_charges() -> anyhow::Result<()> {
    let (rate, burst) = (50, 10);
    let [(a, a_charges), (b, b_charges)] = two_replicas(policy(rate, burst)?).await?;
    // Each replica alone would let through twice the total.
    let allowed = hammer(&[a, b], rate, burst, 0.15).await?;
    // Every request let through was charged to the shared quota.
    let both = [&a_charges, &b_charges];
    charged(&both, allowed).await?;
    let answered: u64 = both.iter().map(|c| c.within.get() + c.over.get()).sum();
    assert_eq!(answered, allowed, "one charge per request let through");
    assert_eq!(a_charges.failed.get() + b_charges.failed.get(), 0);
    Ok(())
}

/// A burst that reaches two replicas at once, before either hears of the
/// other's charges, gets through on both (the overshoot bound: N × burst);
/// the quota then holds the user back on both until the debt is paid, after
/// at most one more request on a replica that had not heard of it.
#[tokio::test]
async fn an_overshoot_is_paid_back_on_every_replica() -> anyhow::Result<()> {
    let burst = 10;
    let [(a, a_charges), (b, b_charges)] = two_replicas(policy(50, burst)?).await?;
    let sale = stack::unique_name("rl-debt");
    // No await between the checks: no charge can be answered meanwhile.
    let through = (0..burst)
        .flat_map(|_| [&a, &b])
        .filter(|replica| replica.check(&sale, "both").allowed)
        .count();
    assert_eq!(through, 2 * burst as usize);
    let both = [&a_charges, &b_charges];
    assert_eq!(
        charged(&both, u64::from(2 * burst)).await?,
        u64::from(burst)
    );
    // Each replica's own limiter allows the user again after one interval
    // (20 ms). A replica whose charges were all answered before the other's
    // has not heard of the debt yet: its next request is let through, and
    // that charge tells it. From then on the debt of about ten intervals
    // holds the user back on both.
    let interval = Duration::from_millis(20);
    tokio::time::sleep(interval + Duration::from_millis(5)).await;
    let more = [&a, &b]
        .into_iter()
        .filter(|replica| replica.check(&sale, "both").allowed)
        .count();
    assert!(
        more <= 1,
        "{more} more let through: the debt is on a replica"
    );
    charged(&both, u64::from(2 * burst) + more as u64).await?;
    for replica in [&a, &b] {
        let held = replica.check(&sale, "both");
        assert!(!held.allowed, "{held:?}");
        assert_eq!(held.source, Source::Redis);
        assert!(held.retry_after > interval * burst / 2, "{held:?}");
    }
    Ok(())
}

#[tokio::test]
async fn without_redis_decisions_are_local_and_still_limit() -> anyhow::Result<()> {
    // A Redis that is gone once connected to: every charge fails at once.
    let mut redis = PrivateRedis::start(&[]).await?;
    let conn = connect(&redis.url).await?;
    redis.kill().await?;
    let charges = Charges::default();
    let limiter = RateLimiter::new(Some(conn), Settings::new(policy(10, 3)?), charges.clone());
    let sale = stack::unique_name("rl-local");
    let outcomes: Vec<bool> = (0..5).map(|_| limiter.check(&sale, "u1").allowed).collect();
    assert_eq!(outcomes, [true, true, true, false, false]);
    // Charges keep failing, so the replica soon decides alone.
    until_under(&limiter, &sale, "probe", Source::Local).await?;
    assert!(charges.failed.get() >= 3, "{:?}", charges.failed);
    Ok(())
}

/// Polls `user`'s decisions until one is taken under `wanted`.
async fn until_under(
    limiter: &RateLimiter,
    sale: &str,
    user: &str,
    wanted: Source,
) -> anyhow::Result<()> {
    poll_until(
        &format!("a decision under {wanted:?}"),
        Duration::from_secs(5),
        Duration::from_millis(5),
        || async {
            match limiter.check(sale, user).source {
                got if got == wanted => Ok(()),
                got => Err(format!("under {got:?}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// A limiter with the production settings over a Redis of the test's own
/// whose `DEBUG SLEEP` can stall it, a second connection to stall it with,
/// and the counters of its charges, once it answered a first one (the
/// script loaded).
async fn stallable(
    policy: Policy,
) -> anyhow::Result<(PrivateRedis, RateLimiter, redis::Client, Charges)> {
    let redis = PrivateRedis::start(&["--enable-debug-command", "yes"]).await?;
    let client = redis::Client::open(redis.url.as_str())?;
    let charges = Charges::default();
    let limiter = RateLimiter::new(
        Some(connect(&redis.url).await?),
        Settings::new(policy),
        charges.clone(),
    );
    // The first calls to a fresh server also load the script, and may time
    // out on a busy machine.
    poll_until(
        "a charge answered",
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            limiter.check("warm-up", "probe");
            tokio::time::sleep(Duration::from_millis(5)).await;
            if charges.within.get() > 0 {
                Ok(())
            } else {
                Err(format!("{} failed", charges.failed.get()))
            }
        },
    )
    .await?;
    Ok((redis, limiter, client, charges))
}

/// Stalls the server for `seconds` from another connection.
async fn stall(
    client: &redis::Client,
    seconds: f64,
) -> anyhow::Result<tokio::task::JoinHandle<redis::RedisResult<()>>> {
    let mut staller = client.get_multiplexed_async_connection().await?;
    // Connected before the stall: a connection's handshake would wait it out.
    let pinger = client.get_multiplexed_async_connection().await?;
    let stalled = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(seconds)
            .query_async::<()>(&mut staller)
            .await
    });
    // The stall has begun once a PING from a third connection goes unanswered.
    poll_until(
        "Redis stalled",
        Duration::from_secs(5),
        Duration::from_millis(1),
        || {
            let mut pinger = pinger.clone();
            async move {
                let ping = redis::cmd("PING");
                let answered = ping.query_async::<String>(&mut pinger);
                match tokio::time::timeout(Duration::from_millis(10), answered).await {
                    Err(_) => Ok(()),
                    Ok(_) => Err("PING answered".to_owned()),
                }
            }
        },
    )
    .await?;
    drop(pinger);
    Ok(stalled)
}

/// Waits until `charges` counted `count` failures.
async fn failed(charges: &Charges, count: u64) -> anyhow::Result<()> {
    poll_until(
        &format!("{count} failed charges"),
        Duration::from_secs(5),
        Duration::from_millis(1),
        || async {
            match charges.failed.get() {
                n if n >= count => Ok(()),
                n => Err(format!("{n} failed")),
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn one_slow_charge_leaves_the_replica_on_redis() -> anyhow::Result<()> {
    let (_redis, limiter, client, charges) = stallable(policy(10, 3)?).await?;
    let sale = stack::unique_name("rl-blip");
    // Redis pauses for 50 ms (a fork, a slow command) while one charge waits.
    let blip = stall(&client, 0.05).await?;
    assert!(limiter.check(&sale, "u1").allowed);
    failed(&charges, 1).await?;
    // The staller's own client may give up waiting for DEBUG's reply; the
    // server slept either way.
    let _ = blip.await;
    // The shared quota is still in force: the next decisions are charged,
    // well within the 1 s a switched replica would wait before a probe.
    let within = charges.within.get();
    let d = limiter.check(&sale, "u2");
    assert_eq!(d.source, Source::Redis);
    charged(&[&charges], within + charges.over.get() + 1).await?;
    assert_eq!(charges.failed.get(), 1);
    Ok(())
}

#[tokio::test]
async fn a_stalled_redis_costs_a_few_failed_charges_then_local_decisions() -> anyhow::Result<()> {
    let (_redis, limiter, client, charges) = stallable(policy(10, 3)?).await?;
    let sale = stack::unique_name("rl-stall");
    // Redis stops answering for 2 s (a long fork, a slow script, a failover).
    let stalled = stall(&client, 2.0).await?;
    // Requests keep coming; their charges time out until the failures have
    // lasted long enough; no decision waits for them meanwhile.
    let mut n = 0;
    poll_until(
        "decisions taken locally",
        Duration::from_secs(1),
        Duration::from_millis(1),
        || {
            n += 1;
            let started = Instant::now();
            let d = limiter.check(&sale, &format!("u{n}"));
            let took = started.elapsed();
            async move {
                assert!(took < Duration::from_millis(5), "a decision took {took:?}");
                match d.source {
                    Source::Local => Ok(()),
                    Source::Redis => Err("the quota is still shared".to_owned()),
                }
            }
        },
    )
    .await?;
    assert!(charges.failed.get() >= 3, "{:?}", charges.failed);
    // From then on decisions are local and charge nothing, and the local
    // limiter still enforces the policy.
    let outcomes: Vec<bool> = (0..4)
        .map(|_| limiter.check(&sale, "local").allowed)
        .collect();
    assert_eq!(outcomes, [true, true, true, false]);
    for n in 0..100 {
        assert_eq!(limiter.check(&sale, &format!("v{n}")).source, Source::Local);
    }
    // The charges begun before the switch have all timed out by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let settled = charges.failed.get();
    for n in 0..100 {
        limiter.check(&sale, &format!("w{n}"));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        charges.failed.get() <= settled + 1,
        "at most one probe charged while local: {} more failed",
        charges.failed.get() - settled
    );
    let _ = stalled.await;
    // Once Redis answers a probe (one per second), the quota is shared again.
    until_under(&limiter, &sale, "back", Source::Redis).await?;
    Ok(())
}

/// The share of decisions taken locally, and the charges, show in the
/// gateway's metrics.
#[tokio::test]
async fn the_gateway_counts_decisions_by_where_they_were_taken() -> anyhow::Result<()> {
    let mut redis = PrivateRedis::start(&[]).await?;
    let funnel = Funnel::start(Options {
        redis_url: Some(redis.url.clone()),
        // A loaded machine can take more than the 5 ms default for one
        // charge; Redis up must mean the quota is shared here.
        config: json!({"rateLimit": {"perUserPerSecond": 1000, "burst": 1000, "redisTimeoutMs": 500}}),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway;
    let count = |source: &str| {
        gw.metric(&format!(
            "gateway_rate_limit_decisions_total{{source=\"{source}\"}}"
        ))
        .unwrap_or(f64::NAN)
    };
    let charges = |outcome: &str| {
        gw.metric(&format!(
            "gateway_rate_limit_charges_total{{quota=\"user\",outcome=\"{outcome}\"}}"
        ))
        .unwrap_or(f64::NAN)
    };
    assert_eq!((count("redis"), count("local")), (0.0, 0.0));
    assert_eq!(
        (charges("within"), charges("over"), charges("failed")),
        (0.0, 0.0, 0.0)
    );
    for n in 0..3 {
        let (status, body, _) = order(&gw.url, "u1", "A", &format!("k{n}"), None).await?;
        assert_eq!(status, 201, "{body}");
    }
    // Stock reads are limited per replica by design: not counted.
    let read = common::http()
        .get(format!("{}/api/v1/items/A", gw.url))
        .bearer_auth(common::token("u1"))
        .send()
        .await?;
    assert_eq!(read.status().as_u16(), 200);
    assert_eq!((count("redis"), count("local")), (3.0, 0.0));
    poll_until(
        "three orders charged",
        Duration::from_secs(5),
        Duration::from_millis(5),
        || async {
            let within = charges("within");
            if within == 3.0 {
                Ok(())
            } else {
                Err(format!("{within} charged"))
            }
        },
    )
    .await?;

    redis.kill().await?;
    // Whatever the orders' fate without their Redis, each decision was
    // taken; the replica decides alone once its charges keep failing.
    let mut placed = 3.0;
    poll_until(
        "decisions taken locally",
        Duration::from_secs(10),
        Duration::from_millis(5),
        || {
            placed += 1.0;
            let key = format!("after-{placed}");
            async move {
                order(&gw.url, "u1", "A", &key, None)
                    .await
                    .map_err(|e| e.to_string())?;
                if count("local") > 0.0 {
                    Ok(())
                } else {
                    Err("still shared".to_owned())
                }
            }
        },
    )
    .await?;
    assert_eq!(count("redis") + count("local"), placed);
    assert!(charges("failed") >= 3.0, "{}", charges("failed"));
    funnel.cleanup().await
}

/// What a load run saw.
#[derive(Debug, Default)]
struct LoadRun {
    decisions: u64,
    /// Decided by the replica alone: it had switched.
    local: u64,
}

/// `callers` concurrent users, each asking for a decision every `every`,
/// for `seconds`: a steady offered load whatever the charges cost.
async fn load(
    limiter: &RateLimiter,
    callers: usize,
    every: Duration,
    seconds: u64,
) -> anyhow::Result<LoadRun> {
    let sale = stack::unique_name("rl-load");
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let (limiter, sale) = (limiter.clone(), sale.clone());
        tasks.push(tokio::spawn(async move {
            let mut run = LoadRun::default();
            let user = format!("u{caller}");
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while Instant::now() < until {
                ticker.tick().await;
                run.decisions += 1;
                if limiter.check(&sale, &user).source == Source::Local {
                    run.local += 1;
                }
            }
            run
        }));
    }
    let mut total = LoadRun::default();
    for task in tasks {
        let run = task.await?;
        total.decisions += run.decisions;
        total.local += run.local;
    }
    Ok(total)
}

/// The switch's thresholds under a steady load on a healthy Redis: the
/// default (3 failed charges over 20 ms) beside the old rule (any failure
/// moves the replica to local decisions for the hold-off), at the same time
/// on the same server, 16 callers each asking every 2 ms (8 000 decisions a
/// second per rule). A measurement for the design notes, not a gate (it
/// depends on the machine's load):
/// `cargo test -p gateway --test ratelimit -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run by hand"]
async fn measure_the_fallback_under_steady_load() -> anyhow::Result<()> {
    let redis = PrivateRedis::start(&[]).await?;
    let seconds = 20;
    let mut limiters = Vec::new();
    for (failures, failing_for) in [(1, Duration::ZERO), (3, Duration::from_millis(20))] {
        let mut settings = Settings::new(policy(1_000_000, 1_000)?);
        settings.fallback.failures = failures;
        settings.fallback.failing_for = failing_for;
        let charges = Charges::default();
        let limiter = RateLimiter::new(Some(connect(&redis.url).await?), settings, charges.clone());
        limiters.push((limiter, charges));
    }
    let every = Duration::from_millis(2);
    let (old, new) = tokio::join!(
        load(&limiters[0].0, 16, every, seconds),
        load(&limiters[1].0, 16, every, seconds)
    );
    for ((name, run), (_, charges)) in [("any failure", old?), ("3 over 20 ms", new?)]
        .into_iter()
        .zip(&limiters)
    {
        println!(
            "{name}: {} decisions in {seconds} s, {} charges failed ({:.4}%), {} decided locally ({:.3}%)",
            run.decisions,
            charges.failed.get(),
            100.0 * charges.failed.get() as f64 / run.decisions as f64,
            run.local,
            100.0 * run.local as f64 / run.decisions as f64,
        );
    }
    Ok(())
}
