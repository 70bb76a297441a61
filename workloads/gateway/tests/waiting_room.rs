//! The waiting room against the real Redis of the local stack, with two
//! `WaitingRoom`s on separate connections standing in for two gateway
//! replicas.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use flashsale_e2e::{
    private_redis::PrivateRedis, redis_connection::connect, redis_keys::unlink_matching, stack,
    wait::poll_until,
};
use gateway::waiting_room::{
    Error, Joined, PassLease, Refusal, Settings, Signer, Status, WaitingRoom,
};

const KEY: &[u8] = b"waiting-room integration key, 32+ bytes";

/// A replica of the gateway: its own connection, the shared key.
async fn replica(
    sale: &str,
    admit_per_second: u32,
    tweak: impl FnOnce(&mut Settings),
) -> anyhow::Result<WaitingRoom> {
    replica_on(&stack::redis_url()?, sale, admit_per_second, tweak).await
}

/// A replica over the Redis at `url`.
async fn replica_on(
    url: &str,
    sale: &str,
    admit_per_second: u32,
    tweak: impl FnOnce(&mut Settings),
) -> anyhow::Result<WaitingRoom> {
    let conn = connect(url).await?;
    let mut settings = Settings::new(sale, admit_per_second);
    // These tests are about the algorithm, not latency, on a busy machine.
    settings.redis_timeout = Duration::from_secs(2);
    tweak(&mut settings);
    Ok(WaitingRoom::new(conn, Signer::new(KEY)?, settings))
}

/// Runs `body` with a fresh sale name, then removes the keys of that sale
/// and of `<sale>-other`, even when the body failed or panicked.
async fn with_sale<F, Fut>(prefix: &str, body: F) -> anyhow::Result<()>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let url = stack::redis_url()?;
    let sale = stack::unique_name(prefix);
    let outcome = tokio::spawn(body(sale.clone())).await;
    for name in [sale.clone(), format!("{sale}-other")] {
        unlink_matching(&url, &format!("fs:{{{name}}}:*")).await?;
    }
    match outcome {
        Ok(result) => result,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(err) => Err(err.into()),
    }
}

/// The refusal in `result`, or what came instead.
fn refusal<T: std::fmt::Debug>(result: Result<T, Error>) -> Result<Refusal, String> {
    match result {
        Err(Error::Refused(refusal)) => Ok(refusal),
        other => Err(format!("{other:?}")),
    }
}

/// Status polls read the frontier in Redis every time instead of using the
/// replica's recent reading, so one sweep over two replicas sees a single
/// growing frontier.
fn read_on_every_poll(settings: &mut Settings) {
    settings.frontier_max_age = Duration::ZERO;
}

/// Polls `room` with `joined`'s ticket until the user is admitted.
async fn admitted(room: &WaitingRoom, joined: &Joined, user: &str) -> anyhow::Result<Status> {
    Ok(poll_until(
        &format!("{user} to be admitted"),
        Duration::from_secs(10),
        Duration::from_millis(10),
        || async {
            match room.status(&joined.ticket, user).await {
                Ok(status) if status.admitted => Ok(status),
                Ok(status) => Err(format!("{status:?}")),
                Err(err) => Err(err.to_string()),
            }
        },
    )
    .await?)
}

/// The Redis clock (the room's only clock), Unix ms.
async fn redis_now_ms() -> anyhow::Result<u64> {
    let mut conn = redis::Client::open(stack::redis_url()?)?
        .get_multiplexed_async_connection()
        .await?;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    Ok(secs * 1_000 + micros / 1_000)
}

/// Waits until the Redis clock reaches `at_ms`.
async fn redis_clock_reaches(at_ms: u64) -> anyhow::Result<()> {
    poll_until(
        "the Redis clock",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || async {
            match redis_now_ms().await {
                Ok(now_ms) if now_ms >= at_ms => Ok(()),
                Ok(now_ms) => Err(format!("{now_ms} < {at_ms}")),
                Err(err) => Err(err.to_string()),
            }
        },
    )
    .await?;
    Ok(())
}

/// Calls `advance` on `room` every few milliseconds until stopped, as each
/// replica's background task does (every ~100 ms) in production.
struct Advancer {
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Advancer {
    fn start(room: &WaitingRoom) -> Self {
        let (room, stop, calls) = (
            room.clone(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (task_stop, task_calls) = (stop.clone(), calls.clone());
        let task = tokio::spawn(async move {
            while !task_stop.load(Ordering::Relaxed) {
                room.advance().await?;
                task_calls.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Ok(())
        });
        Self { stop, calls, task }
    }

    /// Stops it; how many calls it made.
    async fn stop(self) -> anyhow::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await??;
        Ok(self.calls.load(Ordering::Relaxed))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_admit_in_position_order_at_the_configured_rate() -> anyhow::Result<()> {
    with_sale("wr-rate", |sale| async move {
        const USERS: u64 = 50;
        const RATE: u32 = 20;
        let replicas = [
            replica(&sale, RATE, read_on_every_poll).await?,
            replica(&sale, RATE, read_on_every_poll).await?,
        ];
        let mut joined = Vec::new();
        for i in 0..USERS {
            let user = format!("user-{i}");
            let place = replicas[(i % 2) as usize].join(&user).await?;
            joined.push((user, place));
        }
        let positions: Vec<u64> = joined.iter().map(|(_, j)| j.position).collect();
        assert_eq!(positions, (1..=USERS).collect::<Vec<_>>());

        // Both replicas advance at once, far more often than in production,
        // so any double spending of credit would show in the rate.
        let advancers = [Advancer::start(&replicas[0]), Advancer::start(&replicas[1])];

        // Users poll through either replica. A sweep goes from the last
        // position to the first; the frontier only grows, so once a sweep
        // met an admitted user, everyone before them must be admitted too.
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut seen = vec![false; USERS as usize];
        let mut depths = Vec::new();
        let mut violations = Vec::new();
        while !seen.iter().all(|&s| s) {
            let depth = replicas[0].advance().await?;
            depths.push((Instant::now(), depth.admitted));
            anyhow::ensure!(
                Instant::now() < deadline,
                "not all admitted in time: {depth:?}"
            );
            let mut passed = false;
            for (i, (user, place)) in joined.iter().enumerate().rev() {
                if seen[i] {
                    passed = true;
                    continue;
                }
                let status = replicas[i % 2].status(&place.ticket, user).await?;
                if status.admitted {
                    assert!(status.pass.is_some() && status.ahead == 0, "{status:?}");
                    seen[i] = true;
                    passed = true;
                } else {
                    // The frontier is at least where this sweep began.
                    let most_ahead = place.position.saturating_sub(depth.admitted + 1);
                    assert!(status.ahead <= most_ahead, "{status:?} after {depth:?}");
                    if passed {
                        violations.push(place.position);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut calls = 0;
        for advancer in advancers {
            calls += advancer.stop().await?;
        }

        assert!(
            violations.is_empty(),
            "positions still waiting after a later one was admitted: {violations:?}"
        );
        let depth = replicas[1].advance().await?;
        assert_eq!((depth.issued, depth.admitted), (USERS, USERS));
        assert!(calls > 100, "the advancers barely ran: {calls} calls");

        // The rate between the first crossings of two frontier values the
        // depth samples saw: from the 5th admission (or the first one after
        // the first sample, on a slow start) to the 45th; not the 50th, which
        // a sweep's status calls may see before any depth sample does.
        let first_at = |n: u64| depths.iter().find(|(_, a)| *a >= n).map(|(t, _)| *t);
        let low = depths.first().map_or(5, |(_, a)| (a + 1).max(5));
        anyhow::ensure!(low <= 25, "the sampling started late: {depths:?}");
        let (Some(from), Some(to)) = (first_at(low), first_at(45)) else {
            panic!("no samples: {depths:?}");
        };
        let rate = (45 - low) as f64 / (to - from).as_secs_f64();
        println!("measured admission rate: {rate:.2}/s (setting {RATE}/s)");
        assert!(
            (rate - f64::from(RATE)).abs() <= f64::from(RATE) * 0.1,
            "measured {rate:.2}/s, set {RATE}/s"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn joining_twice_returns_the_same_place_and_ticket() -> anyhow::Result<()> {
    with_sale("wr-rejoin", |sale| async move {
        let (a, b) = (
            replica(&sale, 1, |_| ()).await?,
            replica(&sale, 1, |_| ()).await?,
        );
        let first = a.join("alice").await?;
        let again = b.join("alice").await?;
        assert_eq!(first.position, 1);
        assert_eq!(again.position, first.position);
        assert_eq!(again.ticket, first.ticket);
        let bob = b.join("bob").await?;
        assert_eq!(bob.position, 2);
        assert!(
            bob.estimated_wait > Duration::ZERO && bob.estimated_wait <= Duration::from_secs(2)
        );
        assert!(bob.next_poll >= Duration::from_secs(2) && bob.next_poll < Duration::from_secs(3));
        assert!(matches!(a.join("").await, Err(Error::InvalidUser(0))));
        assert!(matches!(
            a.join(&"u".repeat(257)).await,
            Err(Error::InvalidUser(257))
        ));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_pass_works_once_and_can_be_given_back() -> anyhow::Result<()> {
    with_sale("wr-pass", |sale| async move {
        let (a, b) = (
            replica(&sale, 1_000, |_| ()).await?,
            replica(&sale, 1_000, |_| ()).await?,
        );
        let joined = a.join("alice").await?;
        let status = admitted(&a, &joined, "alice").await?;
        let Some(pass) = status.pass else {
            panic!("admitted without a pass: {status:?}");
        };
        let first = b.redeem(&pass, "alice").await?;
        assert_eq!(first.position, joined.position);
        assert_eq!(
            refusal(a.redeem(&pass, "alice").await),
            Ok(Refusal::Replayed)
        );
        // A fresh pass from another poll is for the same position: spent too.
        let again = admitted(&b, &joined, "alice").await?;
        let Some(fresh) = again.pass else {
            panic!("admitted without a pass: {again:?}");
        };
        assert_eq!(
            refusal(b.redeem(&fresh, "alice").await),
            Ok(Refusal::Replayed)
        );

        // The order failed downstream (503): the pass works again, once.
        a.give_back(&first).await?;
        let second = a.redeem(&pass, "alice").await?;
        assert_eq!(
            refusal(b.redeem(&pass, "alice").await),
            Ok(Refusal::Replayed)
        );
        // A stale give-back of the first redemption does not reopen the second.
        b.give_back(&first).await?;
        assert_eq!(
            refusal(b.redeem(&pass, "alice").await),
            Ok(Refusal::Replayed)
        );
        b.give_back(&second).await?;
        b.redeem(&fresh, "alice").await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn tickets_and_passes_of_someone_else_are_refused() -> anyhow::Result<()> {
    with_sale("wr-other", |sale| async move {
        let room = replica(&sale, 1_000, |_| ()).await?;
        let other_sale = replica(&format!("{sale}-other"), 1_000, |_| ()).await?;
        let alice = room.join("alice").await?;
        room.join("bob").await?;
        let Some(pass) = admitted(&room, &alice, "alice").await?.pass else {
            panic!("admitted without a pass");
        };

        assert_eq!(
            refusal(room.redeem(&pass, "bob").await),
            Ok(Refusal::OtherUser)
        );
        assert_eq!(
            refusal(room.status(&alice.ticket, "bob").await),
            Ok(Refusal::OtherUser)
        );
        assert_eq!(
            refusal(room.redeem(&alice.ticket, "alice").await),
            Ok(Refusal::WrongKind)
        );
        assert_eq!(
            refusal(room.status(&pass, "alice").await),
            Ok(Refusal::WrongKind)
        );

        let elsewhere = other_sale.join("alice").await?;
        assert_eq!(
            refusal(room.status(&elsewhere.ticket, "alice").await),
            Ok(Refusal::OtherSale)
        );
        let Some(pass_elsewhere) = admitted(&other_sale, &elsewhere, "alice").await?.pass else {
            panic!("admitted without a pass");
        };
        assert_eq!(
            refusal(room.redeem(&pass_elsewhere, "alice").await),
            Ok(Refusal::OtherSale)
        );

        let forger = Signer::new(b"not the gateway's key, but 32+ bytes")?;
        let forged_room = WaitingRoom::new(
            connect(&stack::redis_url()?).await?,
            forger,
            Settings::new(sale.clone(), 1_000),
        );
        let forged = forged_room.join("mallory").await?;
        assert_eq!(
            refusal(room.status(&forged.ticket, "mallory").await),
            Ok(Refusal::Forged)
        );
        assert_eq!(
            refusal(room.status("garbage", "alice").await),
            Ok(Refusal::Malformed)
        );
        // The genuine pass still works for its owner.
        room.redeem(&pass, "alice").await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn users_who_never_poll_do_not_stall_later_users() -> anyhow::Result<()> {
    with_sale("wr-noshow", |sale| async move {
        const RATE: u32 = 20;
        let room = replica(&sale, RATE, |_| ()).await?;
        let started = Instant::now();
        let mut joined = Vec::new();
        for i in 0..10 {
            joined.push(room.join(&format!("user-{i}")).await?);
        }
        // Nine users never poll; the tenth does, and gets in once the
        // frontier has passed the nine: after 10 admissions' time.
        let last = &joined[9];
        let status = admitted(&room, last, "user-9").await?;
        let waited = started.elapsed();
        assert!(status.pass.is_some());
        assert!(
            waited >= Duration::from_millis(400) && waited < Duration::from_secs(3),
            "admitted after {waited:?}"
        );
        // The no-shows' turns are spent: a returning one is admitted at once.
        let back = room.status(&joined[0].ticket, "user-0").await?;
        assert!(back.admitted && back.pass.is_some(), "{back:?}");
        let depth = room.advance().await?;
        assert_eq!((depth.issued, depth.admitted, depth.waiting()), (10, 10, 0));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn an_idle_queue_hoards_no_admission_credit() -> anyhow::Result<()> {
    with_sale("wr-idle", |sale| async move {
        let room = replica(&sale, 20, |_| ()).await?;
        let first = room.join("early").await?;
        admitted(&room, &first, "early").await?;
        // The queue is empty for over a second while the replica advances.
        let advancer = Advancer::start(&room);
        redis_clock_reaches(redis_now_ms().await? + 1_200).await?;
        advancer.stop().await?;
        // Ten users arrive at once: they are let in at the rate, not in a
        // burst paid for by the idle second.
        for i in 0..10 {
            room.join(&format!("late-{i}")).await?;
        }
        let depth = room.advance().await?;
        assert_eq!(depth.issued, 11);
        assert!(depth.admitted <= 3, "{depth:?} right after the arrivals");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn expired_passes_and_tickets_are_refused() -> anyhow::Result<()> {
    with_sale("wr-expiry", |sale| async move {
        let room = replica(&sale, 1_000, |s| {
            s.ticket_ttl = Duration::from_millis(1_500);
            s.pass_ttl = Duration::from_millis(200);
        })
        .await?;
        let joined = room.join("alice").await?;
        let status = admitted(&room, &joined, "alice").await?;
        let (Some(pass), Some(expires_at_ms)) = (status.pass.clone(), status.pass_expires_at_ms)
        else {
            panic!("admitted without a pass: {status:?}");
        };
        redis_clock_reaches(expires_at_ms).await?;
        assert_eq!(
            refusal(room.redeem(&pass, "alice").await),
            Ok(Refusal::Expired)
        );

        let ticket = Signer::new(KEY)?.open_ticket(&joined.ticket, &sale, Some("alice"))?;
        redis_clock_reaches(ticket.issued_at_ms + 1_500).await?;
        assert_eq!(
            refusal(room.status(&joined.ticket, "alice").await),
            Ok(Refusal::Expired)
        );
        // The position expired with the ticket: joining again queues anew.
        assert_eq!(room.join("alice").await?.position, 2);
        Ok(())
    })
    .await
}

/// Lua script runs (EVALSHA and EVAL) the server counted since its stats
/// were reset.
async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

#[tokio::test]
async fn polling_faster_than_the_hint_costs_no_redis_call_per_poll() -> anyhow::Result<()> {
    // A Redis of its own: its command counts are this test's alone.
    let redis = PrivateRedis::start(&[]).await?;
    let mut conn = redis::Client::open(redis.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let room = replica_on(&redis.url, &stack::unique_name("wr-polls"), 1, |_| ()).await?;
    let max_age = room.settings().frontier_max_age;
    room.join("alice").await?;
    let bob = room.join("bob").await?;
    // Loads the admission script, so each later read is one EVALSHA.
    room.advance().await?;
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut conn)
        .await?;
    // Bob polls 200 times as fast as he can, far faster than his hint.
    let started = Instant::now();
    for _ in 0..200 {
        let status = room.status(&bob.ticket, "bob").await?;
        assert_eq!((status.position, status.admitted), (2, false), "{status:?}");
    }
    let took = started.elapsed();
    let calls = script_calls(&mut conn).await?;
    // One frontier read per max_age at most, whatever the number of polls.
    let most = 1 + (took.as_millis() / max_age.as_millis().max(1)) as u64;
    println!("200 polls in {took:?}: {calls} Redis script calls");
    assert!(
        calls <= most,
        "{calls} script calls for 200 polls in {took:?}"
    );
    // Admission still reaches the polls, within the reading's age.
    let status = admitted(&room, &bob, "bob").await?;
    assert!(status.pass.is_some());
    Ok(())
}

/// The pass from `room`'s status for `joined`, once admitted.
async fn pass_of(room: &WaitingRoom, joined: &Joined, user: &str) -> anyhow::Result<String> {
    let status = admitted(room, joined, user).await?;
    status
        .pass
        .clone()
        .ok_or_else(|| anyhow::anyhow!("admitted without a pass: {status:?}"))
}

#[tokio::test]
async fn a_redemption_never_committed_frees_the_pass_after_its_lease() -> anyhow::Result<()> {
    with_sale("wr-lease", |sale| async move {
        let lease = Duration::from_millis(500);
        let room = replica(&sale, 1_000, |s| s.lease_ttl = lease).await?;
        let joined = room.join("alice").await?;
        let pass = pass_of(&room, &joined, "alice").await?;
        // The gateway redeems, then dies before the order is done.
        let started = Instant::now();
        let lost = room.redeem(&pass, "alice").await?;
        assert_eq!(lost.position, joined.position);
        assert_eq!(
            refusal(room.redeem(&pass, "alice").await),
            Ok(Refusal::Replayed)
        );
        // Within seconds the same pass works again, and a fresh one too
        // (rejoining returns the same ticket, hence the same position).
        let again = poll_until(
            "the lease to lapse",
            Duration::from_secs(5),
            Duration::from_millis(20),
            || async {
                room.redeem(&pass, "alice")
                    .await
                    .map_err(|err| err.to_string())
            },
        )
        .await?;
        assert!(
            started.elapsed() >= lease,
            "freed after {:?}",
            started.elapsed()
        );
        room.give_back(&again).await?;
        let rejoined = room.join("alice").await?;
        assert_eq!(rejoined.ticket, joined.ticket);
        let fresh = pass_of(&room, &rejoined, "alice").await?;
        let committed = room.redeem(&fresh, "alice").await?;
        room.commit(&committed).await?;
        // Committed: spent beyond the lease.
        redis_clock_reaches(redis_now_ms().await? + 2 * lease.as_millis() as u64).await?;
        for pass in [&pass, &fresh] {
            assert_eq!(
                refusal(room.redeem(pass, "alice").await),
                Ok(Refusal::Replayed)
            );
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_commit_after_the_lease_lapsed_keeps_the_order_or_reports_the_loss() -> anyhow::Result<()>
{
    with_sale("wr-late", |sale| async move {
        let room = replica(&sale, 1_000, |s| s.lease_ttl = Duration::from_millis(200)).await?;
        let joined = room.join("alice").await?;
        let pass = pass_of(&room, &joined, "alice").await?;
        // A slow order: the lease lapses, nobody redeems meanwhile, the
        // order succeeds and commits: the pass is spent.
        let slow = room.redeem(&pass, "alice").await?;
        redis_clock_reaches(redis_now_ms().await? + 400).await?;
        room.commit(&slow).await?;
        assert_eq!(
            refusal(room.redeem(&pass, "alice").await),
            Ok(Refusal::Replayed)
        );
        // Same again, but a second order redeemed the pass meanwhile.
        let bob = room.join("bob").await?;
        let bobs = pass_of(&room, &bob, "bob").await?;
        let first = room.redeem(&bobs, "bob").await?;
        let second = poll_until(
            "the lease to lapse",
            Duration::from_secs(5),
            Duration::from_millis(20),
            || async { room.redeem(&bobs, "bob").await.map_err(|e| e.to_string()) },
        )
        .await?;
        assert!(matches!(room.commit(&first).await, Err(Error::LeaseLost)));
        room.commit(&second).await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_lease_dropped_undecided_gives_the_pass_back() -> anyhow::Result<()> {
    with_sale("wr-guard", |sale| async move {
        // A long lease: the pass must come back from the drop, not the lapse.
        let room = replica(&sale, 1_000, |s| s.lease_ttl = Duration::from_secs(60)).await?;
        let joined = room.join("alice").await?;
        let pass = pass_of(&room, &joined, "alice").await?;
        let lease: PassLease = room.lease(&pass, "alice").await?;
        assert_eq!(lease.position(), joined.position);
        assert_eq!(
            refusal(room.lease(&pass, "alice").await),
            Ok(Refusal::Replayed)
        );
        // The request future is dropped (the client went away).
        let request = tokio::spawn(async move {
            let _held = lease;
            std::future::pending::<()>().await;
        });
        request.abort();
        let _ = request.await;
        let lease = poll_until(
            "the dropped lease to give the pass back",
            Duration::from_secs(5),
            Duration::from_millis(10),
            || async { room.lease(&pass, "alice").await.map_err(|e| e.to_string()) },
        )
        .await?;
        // Given back explicitly: usable again at once.
        lease.give_back().await?;
        let lease = room.lease(&pass, "alice").await?;
        // Committed: spent, and dropping nothing gives it back.
        lease.commit().await?;
        assert_eq!(
            refusal(room.lease(&pass, "alice").await),
            Ok(Refusal::Replayed)
        );
        Ok(())
    })
    .await
}
