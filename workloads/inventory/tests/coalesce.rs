//! Coalesced one-shard reservations against real Redis: a batch decides
//! every request exactly as one call per request would, and a failed batch
//! fails all its members, whose retries then succeed exactly once.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    pin::Pin,
    sync::Arc,
    task::Poll,
    time::Duration,
};

use flashsale_e2e::{private_redis::PrivateRedis, stack, wait::poll_until};
use flashsale_runtime::{RedisConnection, RedisTarget, RedisTimeouts, metrics::render};
use inventory::{
    coalesce::BatchError,
    fence::{Fence, Held},
    keys::SaleKeys,
    metrics::Metrics,
    store::{
        ItemDefinition, ReserveOutcome, ReserveRequest, SaleDefinition, StockLevel, Store,
        StoreError,
    },
};
use prometheus_client::registry::Registry;

/// One reservation request, owned so it can move into a task.
#[derive(Debug, Clone)]
struct Ask {
    user: String,
    quantity: u64,
    request_id: String,
}

fn ask(user: impl Into<String>, quantity: u64, request_id: impl Into<String>) -> Ask {
    Ask {
        user: user.into(),
        quantity,
        request_id: request_id.into(),
    }
}

async fn load(store: &Store, stock: u64, limit: u64) -> anyhow::Result<String> {
    let sale = stack::unique_name("coal");
    store
        .load(&SaleDefinition {
            sale: sale.clone(),
            opens_at_ms: None,
            reservation_ttl_ms: 600_000,
            items: vec![ItemDefinition {
                sku: "HOT".into(),
                stock,
                per_user_limit: limit,
                shards: 1,
            }],
        })
        .await?;
    Ok(sale)
}

/// A store on the stack's Redis whose batch sizes land in a registry.
async fn store() -> anyhow::Result<(Store, Registry)> {
    let store = Store::connect(&stack::redis_url()?).await?;
    let mut registry = Registry::default();
    store.record_batch_sizes(&Metrics::register(&mut registry));
    Ok((store, registry))
}

async fn reserve(store: &Store, sale: &str, ask: &Ask) -> Result<ReserveOutcome, StoreError> {
    store
        .reserve(&ReserveRequest {
            sale,
            sku: "HOT",
            user: &ask.user,
            quantity: ask.quantity,
            request_id: &ask.request_id,
            amount_minor: ask.quantity * 100,
        })
        .await
}

/// Runs every ask at once, each on a task of its own.
async fn concurrently(
    store: &Store,
    sale: &str,
    asks: &[Ask],
) -> anyhow::Result<Vec<Result<ReserveOutcome, StoreError>>> {
    let tasks: Vec<_> = asks
        .iter()
        .map(|a| {
            let (store, sale, a) = (store.clone(), sale.to_owned(), a.clone());
            tokio::spawn(async move { reserve(&store, &sale, &a).await })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await?);
    }
    Ok(outcomes)
}

/// Runs every ask concurrently, each starting in the order given: the first
/// poll of each request queues it in the coalescer before the next one is
/// polled, so the batches see the asks in exactly this order.
async fn concurrently_in_order(
    store: &Store,
    sale: &str,
    asks: &[Ask],
) -> Vec<Result<ReserveOutcome, StoreError>> {
    type Pending = Pin<Box<dyn Future<Output = Result<ReserveOutcome, StoreError>> + Send>>;
    let mut futures: Vec<Pending> = asks
        .iter()
        .map(|a| {
            let (store, sale, a) = (store.clone(), sale.to_owned(), a.clone());
            Box::pin(async move { reserve(&store, &sale, &a).await }) as Pending
        })
        .collect();
    let mut done: Vec<Option<Result<ReserveOutcome, StoreError>>> =
        asks.iter().map(|_| None).collect();
    // Unconstrained: no cooperative budget may postpone a later ask's first poll.
    tokio::task::unconstrained(std::future::poll_fn(|cx| {
        for (future, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_none()
                && let Poll::Ready(outcome) = future.as_mut().poll(cx)
            {
                *slot = Some(outcome);
            }
        }
        if done.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }))
    .await;
    done.into_iter().flatten().collect()
}

/// Whether some reserve script call decided more than one request.
fn batched(registry: &Registry) -> anyhow::Result<bool> {
    let text = render(registry)?;
    let value = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let singles = value(r#"flashsale_inventory_reserve_batch_size_bucket{le="1.0"}"#);
    let calls = value("flashsale_inventory_reserve_batch_size_count");
    anyhow::ensure!(calls > 0, "no reserve call was recorded:\n{text}");
    Ok(calls > singles)
}

async fn stock_of(store: &Store, sale: &str) -> anyhow::Result<StockLevel> {
    store
        .stock(sale, "HOT")
        .await?
        .ok_or_else(|| anyhow::anyhow!("SKU HOT of {sale} is not loaded"))
}

/// 200 reservations in two concurrent waves (30 first buyers, then 140 new
/// ones with 20 retries and 10 retries for another quantity) on stock 50,
/// limit 2, 60 users: exactly 50 units go, nobody exceeds the limit, a
/// retry gets its reservation and a changed retry is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reservations_are_coalesced_and_never_oversell() -> anyhow::Result<()> {
    let (store, registry) = store().await?;
    let sale = load(&store, 50, 2).await?;

    let first: Vec<Ask> = (0..30)
        .map(|i| ask(format!("u{i}"), 1, format!("a{i}")))
        .collect();
    let mut ids = HashMap::new();
    for (a, outcome) in first.iter().zip(concurrently(&store, &sale, &first).await?) {
        match outcome? {
            ReserveOutcome::Reserved(r) => ids.insert(a.request_id.clone(), r.id),
            other => anyhow::bail!("{a:?} got {other:?} with stock to spare"),
        };
    }

    let mut second: Vec<Ask> = (0..140)
        .map(|i| ask(format!("u{}", i % 60), 1, format!("b{i}")))
        .collect();
    second.extend((0..20).map(|i| ask(format!("u{i}"), 1, format!("a{i}"))));
    second.extend((20..30).map(|i| ask(format!("u{i}"), 2, format!("a{i}"))));
    let outcomes = concurrently(&store, &sale, &second).await?;
    let mut reserved = first.len();
    for (a, outcome) in second.iter().zip(outcomes) {
        let outcome = outcome?;
        match (ids.get(&a.request_id), outcome) {
            (None, ReserveOutcome::Reserved(_)) => reserved += 1,
            (None, ReserveOutcome::SoldOut | ReserveOutcome::UserLimit { .. }) => {}
            (Some(id), ReserveOutcome::Existing(r)) if a.quantity == 1 => {
                anyhow::ensure!(&r.id == id, "{a:?}: retry got {} not {id}", r.id);
            }
            (Some(id), ReserveOutcome::Mismatch { id: other }) if a.quantity == 2 => {
                anyhow::ensure!(&other == id, "{a:?}: mismatch names {other} not {id}");
            }
            (_, other) => anyhow::bail!("{a:?} got {other:?}"),
        }
    }
    anyhow::ensure!(reserved == 50, "{reserved} reservations for stock 50");
    let level = stock_of(&store, &sale).await?;
    anyhow::ensure!(
        level.reserved == 50 && level.available == 0,
        "stock after the waves: {level:?}"
    );
    let mut held = 0;
    for user in 0..60 {
        let units = store.held_by(&sale, "HOT", &format!("u{user}")).await?;
        anyhow::ensure!(units <= 2, "u{user} holds {units} over the limit");
        held += units;
    }
    anyhow::ensure!(held == 50, "users hold {held} units, 50 were reserved");
    anyhow::ensure!(
        batched(&registry)?,
        "no call decided more than one request: coalescing did not happen"
    );
    Ok(())
}

/// An outcome without what differs between two runs (reservation ids and
/// times): the user, quantity and request id of what it names.
fn describe(outcome: &ReserveOutcome, request_of: &HashMap<String, String>) -> String {
    let request = |id: &str| {
        request_of
            .get(id)
            .cloned()
            .unwrap_or_else(|| format!("?{id}"))
    };
    match outcome {
        ReserveOutcome::Reserved(r) => {
            format!("reserved {} {} {}", r.user, r.quantity, r.request_id)
        }
        ReserveOutcome::Existing(r) => format!(
            "existing {} {} {} {:?}",
            request(&r.id),
            r.user,
            r.quantity,
            r.state
        ),
        ReserveOutcome::Mismatch { id } => format!("mismatch {}", request(id)),
        ReserveOutcome::SoldOut => "sold_out".to_owned(),
        ReserveOutcome::UserLimit { held } => format!("user_limit {held}"),
        ReserveOutcome::UnknownSku => "unknown_sku".to_owned(),
    }
}

fn describe_all(outcomes: &[ReserveOutcome]) -> Vec<String> {
    let mut request_of = HashMap::new();
    outcomes
        .iter()
        .map(|outcome| {
            if let ReserveOutcome::Reserved(r) = outcome {
                request_of.insert(r.id.clone(), r.request_id.clone());
            }
            describe(outcome, &request_of)
        })
        .collect()
}

/// A fixed mix: 25 users, quantities 1 and 2, retries of earlier request
/// ids (some refused before, so decided again), and retries for another
/// quantity.
fn sequence() -> Vec<Ask> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |bound: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % bound
    };
    let mut asks: Vec<Ask> = Vec::new();
    for i in 0..180 {
        let roll = next(10);
        let a = if roll < 2 && !asks.is_empty() {
            // The same request again.
            asks[next(asks.len() as u64) as usize].clone()
        } else if roll < 3 && !asks.is_empty() {
            // The same request id for another quantity.
            let mut changed = asks[next(asks.len() as u64) as usize].clone();
            changed.quantity = 3 - changed.quantity;
            changed
        } else {
            ask(format!("u{}", next(25)), 1 + next(2), format!("q{i}"))
        };
        asks.push(a);
    }
    asks
}

/// The same requests, once one by one and once all at once through the
/// coalescer (in the same order), answer the same and leave the same counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_decides_as_one_call_per_request_would() -> anyhow::Result<()> {
    let (store, registry) = store().await?;
    let (serial_sale, batched_sale) = (load(&store, 40, 3).await?, load(&store, 40, 3).await?);
    let asks = sequence();

    let mut serial = Vec::new();
    for a in &asks {
        serial.push(reserve(&store, &serial_sale, a).await?);
    }
    let coalesced = concurrently_in_order(&store, &batched_sale, &asks)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    anyhow::ensure!(batched(&registry)?, "the concurrent run was not coalesced");

    let (serial, coalesced) = (describe_all(&serial), describe_all(&coalesced));
    for (i, (one, batch)) in serial.iter().zip(&coalesced).enumerate() {
        anyhow::ensure!(
            one == batch,
            "request {i} {:?}: one by one {one}, batched {batch}",
            asks[i]
        );
    }
    let kinds: HashSet<&str> = serial.iter().filter_map(|d| d.split(' ').next()).collect();
    for kind in ["reserved", "existing", "mismatch", "sold_out", "user_limit"] {
        anyhow::ensure!(
            kinds.contains(kind),
            "the sequence never answered {kind}: {kinds:?}"
        );
    }
    anyhow::ensure!(
        stock_of(&store, &serial_sale).await? == stock_of(&store, &batched_sale).await?,
        "the two runs left different stock"
    );
    for user in 0..25 {
        let user = format!("u{user}");
        anyhow::ensure!(
            store.held_by(&serial_sale, "HOT", &user).await?
                == store.held_by(&batched_sale, "HOT", &user).await?,
            "{user} holds different units after the two runs"
        );
    }
    Ok(())
}

/// A SKU record without its limit answers `unknown_sku` to every member of a
/// batch, as it would to each alone, and takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sku_without_a_limit_is_unknown_to_every_member() -> anyhow::Result<()> {
    let (store, _registry) = store().await?;
    let sale = load(&store, 10, 2).await?;
    let mut conn = redis::Client::open(stack::redis_url()?)?
        .get_multiplexed_async_connection()
        .await?;
    let _: i64 = redis::cmd("HDEL")
        .arg(format!("fs:{{{sale}}}:sku:HOT"))
        .arg("limit")
        .query_async(&mut conn)
        .await?;
    let asks: Vec<Ask> = (0..8)
        .map(|i| ask(format!("u{i}"), 1, format!("x{i}")))
        .collect();
    for outcome in concurrently_in_order(&store, &sale, &asks).await {
        anyhow::ensure!(matches!(outcome?, ReserveOutcome::UnknownSku));
    }
    anyhow::ensure!(stock_of(&store, &sale).await?.available == 10);
    Ok(())
}

/// Redis stops answering while a batch is in flight (`CLIENT PAUSE` on a
/// private server, short response timeout): every member fails with an
/// error; retries under the same request ids then succeed exactly once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_fails_every_member_and_retries_succeed_once() -> anyhow::Result<()> {
    let redis = PrivateRedis::start(&[]).await?;
    let target: RedisTarget = redis.url.parse()?;
    let timeouts = RedisTimeouts {
        connect: Duration::from_secs(1),
        response: Duration::from_millis(300),
        ..RedisTimeouts::default()
    };
    let store = Store::new(RedisConnection::connect(&target, timeouts).await?);
    let mut registry = Registry::default();
    store.record_batch_sizes(&Metrics::register(&mut registry));
    let sale = load(&store, 100, 2).await?;
    let mut admin = redis::Client::open(redis.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_500)
        .arg("WRITE")
        .query_async(&mut admin)
        .await?;
    let asks: Vec<Ask> = (0..20)
        .map(|i| ask(format!("u{i}"), 1, format!("f{i}")))
        .collect();
    for (a, outcome) in asks.iter().zip(concurrently(&store, &sale, &asks).await?) {
        anyhow::ensure!(
            matches!(outcome, Err(StoreError::Redis(_))),
            "{a:?} answered {outcome:?} while Redis was paused"
        );
    }
    anyhow::ensure!(
        batched(&registry)?,
        "the failed requests were never in one call"
    );

    // Each client retries under its own request id until Redis answers.
    let mut ids = HashMap::new();
    for a in &asks {
        let (store, sale) = (&store, &sale);
        let outcome = poll_until(
            "a retry to be answered",
            Duration::from_secs(15),
            Duration::from_millis(100),
            || async move { reserve(store, sale, a).await.map_err(|e| e.to_string()) },
        )
        .await?;
        let id = match outcome {
            ReserveOutcome::Reserved(r) | ReserveOutcome::Existing(r) => r.id,
            other => anyhow::bail!("{a:?}: retry answered {other:?}"),
        };
        anyhow::ensure!(
            ids.insert(id.clone(), a.request_id.clone()).is_none(),
            "reservation {id} answered two request ids"
        );
    }
    // Once more: every request id keeps its one reservation.
    for a in &asks {
        match reserve(&store, &sale, a).await? {
            ReserveOutcome::Existing(r) => anyhow::ensure!(
                ids.get(&r.id) == Some(&a.request_id),
                "{a:?} now answers reservation {}",
                r.id
            ),
            other => anyhow::bail!("{a:?}: second retry answered {other:?}"),
        }
        anyhow::ensure!(store.held_by(&sale, "HOT", &a.user).await? == 1);
    }
    let level = stock_of(&store, &sale).await?;
    anyhow::ensure!(
        level.reserved == 20 && level.available == 80,
        "after the retries: {level:?}"
    );
    Ok(())
}

/// The value of `field` in the `INFO commandstats` line of `command`.
async fn command_calls(url: &str, command: &str) -> anyhow::Result<u64> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0))
}

/// Under the replicated policy a batch's members share one `WAIT`, and
/// batches confirmed in the same round share it too: at most one `WAIT` per
/// script call. On a private Redis with no replica yet, every `WAIT` times
/// out: every member of every batch fails as not durable, though the script
/// made their reservations. Once a replica has joined, retries under the
/// same request ids succeed, each once, with the reservation first made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_share_a_wait_and_a_failed_wait_fails_every_member() -> anyhow::Result<()> {
    let primary = PrivateRedis::start(&[]).await?;
    let target: RedisTarget = primary.url.parse()?;
    let replicated = inventory::store::Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };
    let store = Store::new(RedisConnection::connect(&target, RedisTimeouts::default()).await?)
        .with_durability(replicated);
    let mut registry = Registry::default();
    store.record_batch_sizes(&Metrics::register(&mut registry));
    let sale = load(&store, 100, 2).await?;

    let waits_before = command_calls(&primary.url, "wait").await?;
    let asks: Vec<Ask> = (0..20)
        .map(|i| ask(format!("u{i}"), 1, format!("w{i}")))
        .collect();
    for (a, outcome) in asks.iter().zip(concurrently(&store, &sale, &asks).await?) {
        anyhow::ensure!(
            matches!(
                outcome,
                Err(StoreError::NotDurable {
                    acked: 0,
                    wanted: 1
                })
            ),
            "{a:?} answered {outcome:?} with no replica"
        );
    }
    anyhow::ensure!(batched(&registry)?, "the requests were never in one call");
    let text = render(&registry)?;
    let calls = text
        .lines()
        .find_map(|l| l.strip_prefix("flashsale_inventory_reserve_batch_size_count"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let waits = command_calls(&primary.url, "wait").await? - waits_before;
    anyhow::ensure!(
        (1..=calls).contains(&waits) && calls < 20,
        "{waits} WAITs for {calls} script calls of 20 requests"
    );
    let level = stock_of(&store, &sale).await?;
    anyhow::ensure!(level.reserved == 20, "the script ran: {level:?}");

    // A replica joins; each client retries under its own request id.
    let _replica = replica_of(&primary).await?;
    let mut ids = HashSet::new();
    for a in &asks {
        let (store, sale) = (&store, &sale);
        let outcome = poll_until(
            "a retry to be confirmed by the replica",
            Duration::from_secs(15),
            Duration::from_millis(100),
            || async move { reserve(store, sale, a).await.map_err(|e| e.to_string()) },
        )
        .await?;
        match outcome {
            ReserveOutcome::Existing(r) => anyhow::ensure!(ids.insert(r.id), "{a:?}"),
            other => anyhow::bail!("{a:?}: retry answered {other:?}"),
        }
    }
    let level = stock_of(&store, &sale).await?;
    anyhow::ensure!(
        level.reserved == 20 && level.available == 80,
        "after the retries: {level:?}"
    );
    Ok(())
}

/// A replica of `primary`, once the primary counts it as connected and
/// in sync.
async fn replica_of(primary: &PrivateRedis) -> anyhow::Result<PrivateRedis> {
    let port = primary
        .url
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/');
    let replica = PrivateRedis::start(&["--replicaof", "127.0.0.1", port]).await?;
    let plain = redis::Client::open(primary.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    poll_until(
        "the replica to be connected",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || {
            let mut plain = plain.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut plain)
                    .await
                    .map_err(|e| e.to_string())?;
                (info.contains("connected_slaves:1") && info.contains("state=online"))
                    .then_some(())
                    .ok_or_else(|| "no replica yet".to_owned())
            }
        },
    )
    .await?;
    Ok(replica)
}

/// A primary with an in-sync replica, a plain connection to the primary,
/// and a fence over a connection of its own that waits 500 ms for the one
/// replica.
struct Fenced {
    primary: PrivateRedis,
    replica: PrivateRedis,
    plain: redis::aio::MultiplexedConnection,
    fence: Arc<Fence>,
}

impl Fenced {
    async fn start() -> anyhow::Result<Self> {
        let primary = PrivateRedis::start(&[]).await?;
        let replica = replica_of(&primary).await?;
        let plain = redis::Client::open(primary.url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let target: RedisTarget = primary.url.parse()?;
        let conn = RedisConnection::connect(&target, RedisTimeouts::default()).await?;
        let fence = Arc::new(Fence::new(conn, 1, Duration::from_millis(500)));
        Ok(Self {
            primary,
            replica,
            plain,
            fence,
        })
    }

    /// Writes reservation `name`'s request-id key as the reserve script
    /// would, and returns what the fence is asked to confirm for it.
    async fn reservation(&self, name: &str) -> anyhow::Result<Held> {
        let held = Held {
            key: SaleKeys::new("fenced").request(name),
            value: format!("{name}-id HOT 1"),
        };
        let () = redis::cmd("SET")
            .arg(&held.key)
            .arg(&held.value)
            .arg("PX")
            .arg(600_000)
            .query_async(&mut self.plain.clone())
            .await?;
        Ok(held)
    }
}

/// The fence vouches only for reservations its node holds. Sixteen batches
/// are confirmed at once: the eight whose request-id keys the node holds,
/// with the values that name their reservations, are confirmed. The eight
/// that also name a key the node lacks, or one that names another
/// reservation there (as a promoted replica would lack a write, or hold an
/// older one of the same request id), fail as not durable with no replica
/// counted, although they share rounds and `WAIT`s with confirmed ones.
/// The rewrite that moves the fence's offset leaves every key as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_vouches_only_for_reservations_its_node_holds() -> anyhow::Result<()> {
    let fenced = Fenced::start().await?;
    let mut held = Vec::new();
    for i in 0..16 {
        held.push(fenced.reservation(&format!("held-{i}")).await?);
    }
    let waits_before = command_calls(&fenced.primary.url, "wait").await?;
    let outcomes = futures::future::join_all(held.iter().enumerate().map(|(i, h)| {
        let mut batch = vec![h.clone()];
        match i % 4 {
            1 => batch.push(Held {
                key: SaleKeys::new("fenced").request(&format!("never-written-{i}")),
                value: format!("never-written-{i}-id HOT 1"),
            }),
            3 => batch.push(Held {
                key: held[i - 1].key.clone(),
                value: format!("other-{i}-id HOT 1"),
            }),
            _ => {}
        }
        let fence = fenced.fence.clone();
        async move { fence.confirm("fenced", batch).await }
    }))
    .await;
    let waits = command_calls(&fenced.primary.url, "wait").await? - waits_before;

    for (i, outcome) in outcomes.iter().enumerate() {
        let refused = matches!(
            outcome,
            Err(BatchError::NotDurable {
                acked: 0,
                wanted: 1
            })
        );
        anyhow::ensure!(
            refused == (i % 2 == 1) && (refused || outcome.is_ok()),
            "batch {i} answered {outcome:?}"
        );
    }
    anyhow::ensure!(
        (1..16).contains(&waits),
        "{waits} WAITs for 16 batches confirmed at once"
    );
    for h in &held {
        let (value, ttl): (String, i64) = redis::pipe()
            .get(&h.key)
            .pttl(&h.key)
            .query_async(&mut fenced.plain.clone())
            .await?;
        anyhow::ensure!(
            value == h.value && ttl > 0,
            "{} is now {value:?} with ttl {ttl}",
            h.key
        );
    }
    Ok(())
}

/// The fence's `WAIT` waits for what its node holds, not only for what its
/// own connection wrote before: with the replica frozen, a reservation
/// written since on another connection is not confirmed (a `WAIT` sent
/// alone on a connection with no write since counts a frozen replica at
/// once); once the replica runs again, it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_waits_until_the_replica_has_what_its_node_holds() -> anyhow::Result<()> {
    let fenced = Fenced::start().await?;
    let before = fenced.reservation("before").await?;
    fenced.fence.confirm("fenced", vec![before]).await?;

    let frozen = fenced.replica.pause().await?;
    let since = fenced.reservation("since").await?;
    let outcome = fenced.fence.confirm("fenced", vec![since.clone()]).await;
    anyhow::ensure!(
        matches!(
            outcome,
            Err(BatchError::NotDurable {
                acked: 0,
                wanted: 1
            })
        ),
        "confirmed while the replica was frozen: {outcome:?}"
    );
    frozen.resume()?;
    let fence = &fenced.fence;
    poll_until(
        "the thawed replica to confirm the reservation",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || {
            let since = since.clone();
            async move {
                fence
                    .confirm("fenced", vec![since])
                    .await
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await?;
    Ok(())
}
