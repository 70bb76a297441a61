//! What the inventory does when its work or its data goes missing, against
//! the real Redis of the local stack: sweepers that never loaded a sale,
//! expiry queues full of dead ids, sweepers sharing the work, Redis losing a
//! sale, and writes no replica confirmed.

mod common;

use std::time::Duration;

use flashsale_e2e::{stack, wait::poll_until};
use inventory::{
    keys::SaleKeys,
    store::{
        Durability, Holding, ItemDefinition, ReserveOutcome, ReserveRequest, SaleDefinition, Store,
        StoreError,
    },
};

fn definition(sale: &str, stock: u64, shards: u32, ttl_ms: u64) -> SaleDefinition {
    SaleDefinition {
        sale: sale.to_owned(),
        opens_at_ms: None,
        reservation_ttl_ms: ttl_ms,
        items: vec![ItemDefinition {
            sku: "HOT".into(),
            stock,
            per_user_limit: 100,
            shards,
        }],
    }
}

async fn connect() -> anyhow::Result<Store> {
    Ok(Store::connect(&stack::redis_url()?).await?)
}

async fn raw() -> anyhow::Result<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(stack::redis_url()?)?
        .get_multiplexed_async_connection()
        .await?)
}

async fn reserve(
    store: &Store,
    sale: &str,
    user: &str,
    request_id: &str,
) -> Result<ReserveOutcome, StoreError> {
    store
        .reserve(&ReserveRequest {
            sale,
            sku: "HOT",
            user,
            quantity: 1,
            request_id,
            amount_minor: 100,
        })
        .await
}

async fn available(store: &Store, sale: &str) -> anyhow::Result<u64> {
    Ok(store
        .stock(sale, "HOT")
        .await?
        .ok_or_else(|| anyhow::anyhow!("HOT not loaded"))?
        .available)
}

/// Redis's clock, Unix ms.
async fn redis_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// Deletes every key of `sale`, as a flush or a restart without persistence
/// would (only this sale's: other tests share the Redis).
async fn wipe(conn: &mut redis::aio::MultiplexedConnection, sale: &str) -> anyhow::Result<()> {
    for pattern in [format!("fs:{{{sale}}}:*"), format!("fs:{{{sale}#*")] {
        let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(conn).await?;
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(keys).query_async(conn).await?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_sweeper_that_never_loaded_the_sale_returns_every_shard_of_a_stuck_claim()
-> anyhow::Result<()> {
    let loader = connect().await?;
    let sale = stack::unique_name("inv-sweep-unknown");
    loader.load(&definition(&sale, 40, 4, 60_000)).await?;
    let keys = SaleKeys::new(&sale);
    let mut conn = raw().await?;
    // A claim whose replica died after taking 2 units from shard 3.
    let id = "stuck";
    let claim = redis::Script::new(inventory::store::CLAIM_LUA);
    let request = common::claim_request(&sale, "ivy", "i1");
    // A short claim window for the test.
    let claimed: Vec<String> = inventory::store::admission(&claim, &keys, &request, id, 200)
        .invoke_async(&mut conn)
        .await?;
    assert_eq!(claimed.first().map(String::as_str), Some("claimed"));
    let shard = keys.shard("HOT", 4, 3);
    let taken: String = redis::Script::new(inventory::store::TAKE_LUA)
        .key(shard.avail())
        .key(shard.held())
        .key(shard.taken(id))
        .arg(2)
        .invoke_async(&mut conn)
        .await?;
    assert_eq!(taken, "taken");
    assert_eq!(available(&loader, &sale).await?, 38);

    // Another replica, started after the sale was loaded, sweeps it: it
    // must learn the shard count from Redis, not guess one shard.
    let stranger = connect().await?;
    poll_until(
        "the stranger settles the claim",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            match stranger.sweep(&sale, 10).await.map_err(|e| e.to_string())? {
                0 => Err("not yet due".to_owned()),
                n => Ok(n),
            }
        },
    )
    .await?;
    assert_eq!(available(&loader, &sale).await?, 40, "units leaked");
    assert_eq!(loader.held_by(&sale, "HOT", "ivy").await?, 0);
    Ok(())
}

#[tokio::test]
async fn ids_without_a_record_leave_the_expiry_queue_instead_of_wedging_it() -> anyhow::Result<()> {
    let store = connect().await?;
    let sale = stack::unique_name("inv-sweep-dead");
    store.load(&definition(&sale, 10, 1, 150)).await?;
    let keys = SaleKeys::new(&sale);
    let mut conn = raw().await?;
    // 600 ids due long ago whose records are gone: more than one batch.
    let mut dead = redis::cmd("ZADD");
    dead.arg(keys.expiry());
    for n in 0..600 {
        dead.arg(n).arg(format!("dead-{n}"));
    }
    let _: () = dead.query_async(&mut conn).await?;
    let ReserveOutcome::Reserved(live) = reserve(&store, &sale, "lee", "l1").await? else {
        anyhow::bail!("not reserved");
    };

    poll_until(
        "the live reservation to be returned",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async {
            store.sweep(&sale, 512).await.map_err(|e| e.to_string())?;
            match available(&store, &sale).await.map_err(|e| e.to_string())? {
                10 => Ok(()),
                n => Err(format!("{n} available")),
            }
        },
    )
    .await?;
    let left: u64 = redis::cmd("ZCARD")
        .arg(keys.expiry())
        .query_async(&mut conn)
        .await?;
    assert_eq!(left, 0, "dead ids stayed queued");
    let state = store.reservation(&sale, &live.id).await?.map(|r| r.state);
    assert_eq!(state, Some(inventory::store::ReservationState::Released));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweepers_take_different_work() -> anyhow::Result<()> {
    let (one, two) = (connect().await?, connect().await?);
    let sale = stack::unique_name("inv-sweep-share");
    one.load(&definition(&sale, 40, 1, 100)).await?;
    two.load(&definition(&sale, 40, 1, 100)).await?;
    for n in 0..40 {
        let outcome = reserve(&one, &sale, &format!("u{n}"), &format!("r{n}")).await?;
        assert!(
            matches!(outcome, ReserveOutcome::Reserved(_)),
            "{outcome:?}"
        );
    }
    let keys = SaleKeys::new(&sale);
    let conn = raw().await?;
    // Every reservation due before either sweeps.
    poll_until(
        "all 40 due",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || {
            let (mut conn, expiry) = (conn.clone(), keys.expiry());
            async move {
                let now = redis_now_ms(&mut conn).await.map_err(|e| e.to_string())?;
                let due: u64 = redis::cmd("ZCOUNT")
                    .arg(expiry)
                    .arg("-inf")
                    .arg(now)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                (due == 40).then_some(()).ok_or(format!("{due} due"))
            }
        },
    )
    .await?;
    // One batch each, at once: together they return everything, each its own half.
    let (a, b) = tokio::join!(one.sweep(&sale, 20), two.sweep(&sale, 20));
    let (a, b) = (a?, b?);
    assert_eq!(
        a + b,
        40,
        "the sweepers repeated each other's work: {a} + {b}"
    );
    assert_eq!(available(&one, &sale).await?, 40);
    Ok(())
}

/// Polls Redis's clock until it reaches `opens` (Unix ms).
async fn until_open(conn: &redis::aio::MultiplexedConnection, opens: u64) -> anyhow::Result<()> {
    poll_until(
        "the sale to open",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || {
            let mut conn = conn.clone();
            async move {
                let now = redis_now_ms(&mut conn).await.map_err(|e| e.to_string())?;
                (now >= opens).then_some(()).ok_or("not yet".to_owned())
            }
        },
    )
    .await?;
    Ok(())
}

/// A sale of 10 `HOT` over 2 shards loaded into `store` 300 ms before its
/// opening, once Redis's clock has passed the opening; with a raw
/// connection to the same Redis.
async fn opened_sale(
    store: &Store,
    prefix: &str,
) -> anyhow::Result<(String, SaleDefinition, redis::aio::MultiplexedConnection)> {
    let sale = stack::unique_name(prefix);
    let mut conn = raw().await?;
    let mut def = definition(&sale, 10, 2, 60_000);
    def.opens_at_ms = Some(redis_now_ms(&mut conn).await? + 300);
    store.load(&def).await?;
    until_open(&conn, def.opening()).await?;
    Ok((sale, def, conn))
}

#[tokio::test]
async fn a_sale_redis_lost_after_opening_is_refused_and_never_recreated() -> anyhow::Result<()> {
    let store = connect().await?;
    let (sale, def, mut conn) = opened_sale(&store, "inv-lost").await?;
    assert_eq!(store.check_held(&sale).await?, Holding::Held);
    for n in 0..4 {
        reserve(&store, &sale, &format!("u{n}"), &format!("r{n}")).await?;
    }
    assert_eq!(available(&store, &sale).await?, 6);

    // Redis loses the sale under the running inventory.
    wipe(&mut conn, &sale).await?;
    assert_eq!(store.check_held(&sale).await?, Holding::LostNow);
    assert_eq!(store.lost_sales().await, std::slice::from_ref(&sale));
    let refused = reserve(&store, &sale, "late", "late-1").await;
    assert!(
        matches!(refused, Err(StoreError::StockLost { .. })),
        "{refused:?}"
    );

    // A restarted inventory loads the same definition: it creates nothing.
    let restarted = connect().await?;
    let reload = restarted.load(&def).await;
    assert!(
        matches!(&reload, Err(StoreError::StockLost { what, .. }) if what.contains("HOT")),
        "{reload:?}"
    );
    let keys = SaleKeys::new(&sale);
    let recreated: u64 = redis::cmd("EXISTS")
        .arg(keys.sku("HOT"))
        .arg(keys.shard("HOT", 2, 0).avail())
        .arg(keys.shard("HOT", 2, 1).avail())
        .query_async(&mut conn)
        .await?;
    assert_eq!(recreated, 0, "stock was created again");

    // Before its opening, a sale may be loaded again from nothing.
    let early = stack::unique_name("inv-early");
    let mut def = definition(&early, 10, 2, 60_000);
    def.opens_at_ms = Some(redis_now_ms(&mut conn).await? + 60_000);
    store.load(&def).await?;
    wipe(&mut conn, &early).await?;
    restarted.load(&def).await?;
    assert_eq!(available(&restarted, &early).await?, 10);
    Ok(())
}

#[tokio::test]
async fn auto_durability_on_a_redis_without_replica_acknowledges_on_the_primary()
-> anyhow::Result<()> {
    // The stack's single Redis has no replica: `auto` must not pick a policy
    // under which every write would be refused.
    let store = connect().await?;
    assert_eq!(store.fewest_replicas().await?, 0);
    let timeout = Duration::from_millis(30);
    assert_eq!(
        Durability::auto(store.fewest_replicas().await?, 1, timeout),
        Durability::Fast
    );
    Ok(())
}

#[tokio::test]
async fn a_write_no_replica_confirmed_is_not_acknowledged() -> anyhow::Result<()> {
    // The stack's single Redis has no replica: the replicated policy must
    // refuse to call a reservation safe, and the fast one must not wait.
    let safe = connect().await?.with_durability(Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_millis(30),
    });
    let sale = stack::unique_name("inv-durable");
    safe.load(&definition(&sale, 5, 1, 60_000)).await?;
    let refused = reserve(&safe, &sale, "dora", "d1").await;
    assert!(
        matches!(
            refused,
            Err(StoreError::NotDurable {
                acked: 0,
                wanted: 1
            })
        ),
        "{refused:?}"
    );
    // The retry is refused the same way (and takes nothing more)...
    let again = reserve(&safe, &sale, "dora", "d1").await;
    assert!(
        matches!(again, Err(StoreError::NotDurable { .. })),
        "{again:?}"
    );
    // ...while the fast policy answers it: the reservation the first call made.
    let fast = connect().await?;
    fast.load(&definition(&sale, 5, 1, 60_000)).await?;
    let answered = reserve(&fast, &sale, "dora", "d1").await?;
    assert!(
        matches!(answered, ReserveOutcome::Existing(_)),
        "{answered:?}"
    );
    assert_eq!(available(&fast, &sale).await?, 4);
    Ok(())
}

#[tokio::test]
async fn a_sale_opened_before_drill_stock_existed_loads_without_it() -> anyhow::Result<()> {
    let store = connect().await?;
    let (sale, mut def, mut conn) = opened_sale(&store, "inv-drill").await?;
    // An upgraded operator adds the drill SKU to a sale already open.
    def.items.push(ItemDefinition::drill());
    let restarted = connect().await?;
    let loaded = restarted.load(&def).await?;
    assert_eq!(loaded.len(), 1, "{loaded:?}");
    assert_eq!(restarted.check_held(&sale).await?, Holding::Held);
    let drill = restarted
        .reserve(&ReserveRequest {
            sku: flashsale_drill_buyer::SKU,
            ..common::claim_request(&sale, "drill:1", "d1")
        })
        .await?;
    assert!(matches!(drill, ReserveOutcome::UnknownSku), "{drill:?}");
    assert!(matches!(
        reserve(&restarted, &sale, "u1", "r1").await?,
        ReserveOutcome::Reserved(_)
    ));
    let keys = SaleKeys::new(&sale);
    let created: u64 = redis::cmd("EXISTS")
        .arg(keys.sku(flashsale_drill_buyer::SKU))
        .query_async(&mut conn)
        .await?;
    assert_eq!(created, 0, "drill stock was created after the opening");
    Ok(())
}
