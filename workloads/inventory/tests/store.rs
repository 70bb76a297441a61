//! The reservation store against the real Redis of the local stack.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

mod common;

use common::{hammer, reserve, stock_of};
use flashsale_e2e::{stack, wait::poll_until};
use inventory::store::{
    CancelOutcome, ConfirmOutcome, ItemDefinition, Reservation, ReservationState, ReserveOutcome,
    ReserveRequest, SaleDefinition, Store,
};

async fn store_with(
    stock: u64,
    limit: u64,
    shards: u32,
    ttl_ms: u64,
) -> anyhow::Result<(Store, String)> {
    common::store_on(
        &stack::redis_url()?,
        &stack::unique_name("inv"),
        stock,
        limit,
        shards,
        ttl_ms,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammer_one_shard_never_oversells() -> anyhow::Result<()> {
    hammer(&stack::redis_url()?, &stack::unique_name("inv"), 1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammer_eight_shards_never_oversells() -> anyhow::Result<()> {
    hammer(&stack::redis_url()?, &stack::unique_name("inv"), 8).await
}

#[tokio::test]
async fn a_retry_returns_the_same_reservation_and_takes_nothing_twice() -> anyhow::Result<()> {
    for shards in [1, 4] {
        let (store, sale) = store_with(10, 5, shards, 60_000).await?;
        let first = reserve(&store, &sale, "alice", 2, "req-1").await?;
        let ReserveOutcome::Reserved(Reservation { id, .. }) = first else {
            anyhow::bail!("{first:?}")
        };
        let retry = reserve(&store, &sale, "alice", 2, "req-1").await?;
        match retry {
            ReserveOutcome::Existing(r) => {
                assert_eq!(r.id, id);
                assert_eq!((r.quantity, r.state), (2, ReservationState::Reserved));
            }
            other => anyhow::bail!("retry answered {other:?}"),
        }
        let level = stock_of(&store, &sale).await?;
        assert_eq!((level.available, level.reserved), (8, 2), "shards={shards}");
        assert_eq!(store.held_by(&sale, "HOT", "alice").await?, 2);
    }
    Ok(())
}

#[tokio::test]
async fn per_user_limit_and_unknown_sku() -> anyhow::Result<()> {
    let (store, sale) = store_with(10, 2, 1, 60_000).await?;
    assert!(matches!(
        reserve(&store, &sale, "bob", 2, "b1").await?,
        ReserveOutcome::Reserved(_)
    ));
    assert_eq!(
        reserve(&store, &sale, "bob", 1, "b2").await?,
        ReserveOutcome::UserLimit { held: 2 }
    );
    let unknown = store
        .reserve(&ReserveRequest {
            sale: &sale,
            sku: "NOPE",
            user: "bob",
            quantity: 1,
            request_id: "b3",
            amount_minor: 100,
        })
        .await?;
    assert_eq!(unknown, ReserveOutcome::UnknownSku);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpaid_reservations_return_once_with_two_sweepers() -> anyhow::Result<()> {
    for shards in [1, 4] {
        let (store, sale) = store_with(100, 1, shards, 300).await?;
        let mut ids = Vec::new();
        for u in 0..50 {
            match reserve(&store, &sale, &format!("u{u}"), 1, &format!("r{u}")).await? {
                ReserveOutcome::Reserved(Reservation { id, .. }) => ids.push(id),
                other => anyhow::bail!("{other:?}"),
            }
        }
        let released = Arc::new(AtomicU64::new(0));
        let sweeper = |store: Store, sale: String, released: Arc<AtomicU64>| async move {
            poll_until(
                "every reservation swept",
                Duration::from_secs(20),
                Duration::from_millis(20),
                || {
                    let (store, sale, released) = (store.clone(), sale.clone(), released.clone());
                    async move {
                        let n = store.sweep(&sale, 16).await.map_err(|e| e.to_string())?;
                        let total = released.fetch_add(n, Ordering::SeqCst) + n;
                        if total >= 50 {
                            Ok(())
                        } else {
                            Err(format!("{total} of 50 swept"))
                        }
                    }
                },
            )
            .await
        };
        let (a, b) = tokio::join!(
            tokio::spawn(sweeper(store.clone(), sale.clone(), released.clone())),
            tokio::spawn(sweeper(store.clone(), sale.clone(), released.clone())),
        );
        a??;
        b??;
        // One more pass from each finds nothing left.
        assert_eq!(
            store.sweep(&sale, 100).await? + store.sweep(&sale, 100).await?,
            0
        );
        assert_eq!(
            released.load(Ordering::SeqCst),
            50,
            "each reservation counted once (shards={shards})"
        );
        let level = stock_of(&store, &sale).await?;
        assert_eq!(
            (level.available, level.reserved, level.sold),
            (100, 0, 0),
            "shards={shards}"
        );
        assert_eq!(store.held_by(&sale, "HOT", "u7").await?, 0);
        assert_eq!(
            store.confirm(&sale, &ids[0]).await?,
            ConfirmOutcome::NotReserved
        );
        let state = store
            .reservation(&sale, &ids[0])
            .await?
            .map(|r| (r.state, r.reason));
        assert_eq!(
            state,
            Some((ReservationState::Released, Some("expired".to_owned())))
        );
    }
    Ok(())
}

#[tokio::test]
async fn confirm_after_expiry_is_refused_before_any_sweep() -> anyhow::Result<()> {
    let (store, sale) = store_with(5, 1, 1, 200).await?;
    let ReserveOutcome::Reserved(Reservation {
        id, expires_at_ms, ..
    }) = reserve(&store, &sale, "carol", 1, "c1").await?
    else {
        anyhow::bail!("not reserved")
    };
    let redis = redis::Client::open(stack::redis_url()?)?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    poll_until(
        "the reservation to lapse",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || {
            let mut conn = conn.clone();
            async move {
                let (s, us): (u64, u64) = redis::cmd("TIME")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if s * 1000 + us / 1000 > expires_at_ms {
                    Ok(())
                } else {
                    Err("not yet".into())
                }
            }
        },
    )
    .await?;
    assert_eq!(
        store.confirm(&sale, &id).await?,
        ConfirmOutcome::NotReserved
    );
    assert_eq!(store.sweep(&sale, 10).await?, 1);
    let level = stock_of(&store, &sale).await?;
    assert_eq!((level.available, level.sold), (5, 0));
    let _: () = redis::cmd("PING").query_async(&mut conn).await?;
    Ok(())
}

#[tokio::test]
async fn cancel_twice_is_harmless_and_paid_orders_are_not_released() -> anyhow::Result<()> {
    for shards in [1, 4] {
        let (store, sale) = store_with(10, 3, shards, 60_000).await?;
        let ReserveOutcome::Reserved(Reservation { id, .. }) =
            reserve(&store, &sale, "dave", 3, "d1").await?
        else {
            anyhow::bail!("not reserved")
        };
        assert_eq!(store.cancel(&sale, &id).await?, CancelOutcome::Cancelled);
        assert_eq!(
            store.cancel(&sale, &id).await?,
            CancelOutcome::AlreadyReleased
        );
        let level = stock_of(&store, &sale).await?;
        assert_eq!(
            (level.available, level.reserved),
            (10, 0),
            "shards={shards}"
        );
        assert_eq!(store.held_by(&sale, "HOT", "dave").await?, 0);

        let ReserveOutcome::Reserved(Reservation { id, .. }) =
            reserve(&store, &sale, "dave", 1, "d2").await?
        else {
            anyhow::bail!("not reserved")
        };
        assert_eq!(store.confirm(&sale, &id).await?, ConfirmOutcome::Confirmed);
        assert_eq!(
            store.confirm(&sale, &id).await?,
            ConfirmOutcome::AlreadyConfirmed
        );
        assert_eq!(store.cancel(&sale, &id).await?, CancelOutcome::Confirmed);
        assert_eq!(
            store.cancel(&sale, "no-such-id").await?,
            CancelOutcome::Missing
        );
        let level = stock_of(&store, &sale).await?;
        assert_eq!((level.available, level.sold), (9, 1), "shards={shards}");
    }
    Ok(())
}

#[tokio::test]
async fn scripts_come_back_after_script_flush() -> anyhow::Result<()> {
    let (store, sale) = store_with(10, 5, 1, 60_000).await?;
    assert!(matches!(
        reserve(&store, &sale, "erin", 1, "e1").await?,
        ReserveOutcome::Reserved(_)
    ));
    let redis = redis::Client::open(stack::redis_url()?)?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await?;
    assert!(matches!(
        reserve(&store, &sale, "erin", 1, "e2").await?,
        ReserveOutcome::Reserved(_)
    ));
    let level = stock_of(&store, &sale).await?;
    assert_eq!(level.reserved, 2);
    Ok(())
}

#[tokio::test]
async fn loading_again_never_resets_counts() -> anyhow::Result<()> {
    let (store, sale) = store_with(20, 5, 4, 60_000).await?;
    let ReserveOutcome::Reserved(Reservation { id, .. }) =
        reserve(&store, &sale, "frank", 3, "f1").await?
    else {
        anyhow::bail!("not reserved")
    };
    assert_eq!(store.confirm(&sale, &id).await?, ConfirmOutcome::Confirmed);
    assert!(matches!(
        reserve(&store, &sale, "grace", 2, "g1").await?,
        ReserveOutcome::Reserved(_)
    ));

    // A restarted replica loads the same sale, even with an edited stock figure.
    let again = Store::connect(&stack::redis_url()?).await?;
    let loaded = again
        .load(&SaleDefinition {
            sale: sale.clone(),
            opens_at_ms: None,
            reservation_ttl_ms: 60_000,
            items: vec![ItemDefinition {
                sku: "HOT".into(),
                stock: 999,
                per_user_limit: 5,
                shards: 2,
            }],
        })
        .await?;
    assert!(!loaded[0].created);
    let level = stock_of(&again, &sale).await?;
    assert_eq!(
        (level.stock, level.available, level.reserved, level.sold),
        (20, 15, 2, 3)
    );
    Ok(())
}

/// A replica that dies between "claim" and "settle" of a sharded reservation
/// (here: the two scripts run by hand, as it would have) leaves units taken
/// from a shard; the sweeper returns them after the claim window, and a take
/// that comes after the window is refused.
#[tokio::test]
async fn a_crashed_sharded_claim_is_settled_by_the_sweeper() -> anyhow::Result<()> {
    use inventory::keys::SaleKeys;
    let (store, sale) = store_with(40, 2, 4, 60_000).await?;
    let keys = SaleKeys::new(&sale);
    let redis = redis::Client::open(stack::redis_url()?)?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let claim = redis::Script::new(inventory::store::CLAIM_LUA);
    let take = redis::Script::new(inventory::store::TAKE_LUA);
    let id = "crashed-claim";
    let request = common::claim_request(&sale, "henry", "h1");
    // A short claim window for the test.
    let claimed: Vec<String> = inventory::store::admission(&claim, &keys, &request, id, 300)
        .invoke_async(&mut conn)
        .await?;
    assert_eq!(
        claimed.first().map(String::as_str),
        Some("claimed"),
        "{claimed:?}"
    );
    let shard = keys.shard("HOT", 4, 2);
    let taken: String = take
        .key(shard.avail())
        .key(shard.held())
        .key(shard.taken(id))
        .arg(2)
        .invoke_async(&mut conn)
        .await?;
    assert_eq!(taken, "taken");
    // ...and the replica dies here. The units are out of the shard:
    let level = stock_of(&store, &sale).await?;
    assert_eq!((level.available, level.reserved + level.sold), (38, 2));
    assert_eq!(store.held_by(&sale, "HOT", "henry").await?, 2);

    poll_until(
        "the sweeper to settle the claim",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let (store, sale) = (store.clone(), sale.clone());
            async move {
                match store.sweep(&sale, 10).await.map_err(|e| e.to_string())? {
                    0 => Err("not yet due".to_owned()),
                    n => Ok(n),
                }
            }
        },
    )
    .await?;
    let level = stock_of(&store, &sale).await?;
    assert_eq!(
        (level.stock, level.available, level.reserved, level.sold),
        (40, 40, 0, 0)
    );
    assert_eq!(store.held_by(&sale, "HOT", "henry").await?, 0);
    let state = store.reservation(&sale, id).await?.map(|r| r.state);
    assert_eq!(state, Some(ReservationState::Released));

    // A take arriving after the release (a slow replica) meets the fence
    // the sweeper left on every shard, and takes nothing.
    let late: String = take
        .key(shard.avail())
        .key(shard.held())
        .key(shard.taken(id))
        .arg(2)
        .invoke_async(&mut conn)
        .await?;
    assert_eq!(late, "late");
    let level = stock_of(&store, &sale).await?;
    assert_eq!((level.stock, level.available), (40, 40));
    Ok(())
}

#[tokio::test]
async fn a_request_id_for_another_sku_or_quantity_is_refused_and_never_forgotten()
-> anyhow::Result<()> {
    for shards in [1, 4] {
        let (store, sale) = store_with(10, 5, shards, 60_000).await?;
        let ReserveOutcome::Reserved(first) = reserve(&store, &sale, "ivy", 1, "k1").await? else {
            anyhow::bail!("not reserved")
        };
        assert_eq!(
            reserve(&store, &sale, "ivy", 3, "k1").await?,
            ReserveOutcome::Mismatch {
                id: first.id.clone()
            },
            "shards={shards}"
        );
        let level = stock_of(&store, &sale).await?;
        assert_eq!(level.reserved, 1, "the refused request took nothing");
        // The request id lives as long as its reservation record: no TTL.
        let redis = redis::Client::open(stack::redis_url()?)?;
        let mut conn = redis.get_multiplexed_async_connection().await?;
        let keys = inventory::keys::SaleKeys::new(&sale);
        let ttl: i64 = redis::cmd("TTL")
            .arg(keys.request("k1"))
            .query_async(&mut conn)
            .await?;
        assert_eq!(ttl, -1, "request id key has no expiry (shards={shards})");
        let record = store.reservation(&sale, &first.id).await?;
        assert_eq!(
            record.map(|r| (r.amount_minor, r.request_id)),
            Some((100, "k1".to_owned()))
        );
    }
    Ok(())
}
