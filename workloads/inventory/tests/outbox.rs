//! Every order is announced from the sale's outbox (real Redis, real
//! Kafka): a reservation puts its `created` order event in the outbox in
//! the step that takes the units, and one that lapses unpaid or is
//! cancelled its `expired` event, once per release; the relay publishes
//! them in that order, and nothing else.

use std::time::Duration;

use flashsale_e2e::{kafka, stack, wait::poll_until};
use flashsale_orders::{EventKind, OrderProducer, ProducerSettings};
use inventory::{
    keys::SaleKeys,
    outbox::{self, Round},
    store::{CancelOutcome, ItemDefinition, ReserveOutcome, ReserveRequest, SaleDefinition, Store},
};
use redis::Script;

async fn reserve(store: &Store, sale: &str, user: &str, rid: &str) -> anyhow::Result<String> {
    match store
        .reserve(&ReserveRequest {
            sale,
            sku: "HOT",
            user,
            quantity: 2,
            request_id: rid,
            amount_minor: 3998,
        })
        .await?
    {
        ReserveOutcome::Reserved(r) => Ok(r.id),
        other => anyhow::bail!("{other:?}"),
    }
}

/// A sale of 20 × HOT over `shards` whose reservations lapse after `ttl_ms`.
async fn sale(prefix: &str, ttl_ms: u64, shards: u32) -> anyhow::Result<(Store, String)> {
    let store = Store::connect(&stack::redis_url()?).await?;
    let sale = stack::unique_name(prefix);
    store
        .load(&SaleDefinition {
            sale: sale.clone(),
            opens_at_ms: None,
            reservation_ttl_ms: ttl_ms,
            items: vec![ItemDefinition {
                sku: "HOT".into(),
                stock: 20,
                per_user_limit: 4,
                shards,
            }],
        })
        .await?;
    Ok((store, sale))
}

/// Sweeps until the sweeper returned something (a reservation lapsed).
async fn swept(store: &Store, sale: &str) -> anyhow::Result<()> {
    poll_until(
        "a lapsed reservation to be swept",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let (store, sale) = (store.clone(), sale.to_owned());
            async move {
                match store.sweep(&sale, 10).await.map_err(|e| e.to_string())? {
                    0 => Err("nothing swept yet".to_owned()),
                    _ => Ok(()),
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// The (kind, reservation id) entries of the sale's outbox, oldest first.
async fn outbox_ids(sale: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut conn = redis_connection().await?;
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(SaleKeys::new(sale).outbox())
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await?;
    Ok(entries
        .into_iter()
        .filter_map(|(_, fields)| match fields.as_slice() {
            [k, kind, r, id] if k == "kind" && r == "reservation" => {
                Some((kind.clone(), id.clone()))
            }
            _ => None,
        })
        .collect())
}

async fn redis_connection() -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(stack::redis_url()?)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Removes the sale's keys (one slot, and its shards' slots).
async fn remove(sale: &str) -> anyhow::Result<()> {
    flashsale_e2e::redis_keys::unlink_matching(
        &stack::redis_url()?,
        &format!(
            "{}*",
            SaleKeys::new(sale).outbox().trim_end_matches("outbox")
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_cancelled_reservation_enters_the_outbox_once() -> anyhow::Result<()> {
    for shards in [1, 2] {
        let (store, sale) = sale("outbox-cancel", 60_000, shards).await?;
        let id = reserve(&store, &sale, "eve", "e1").await?;
        let created = |id: &str| ("created".to_owned(), id.to_owned());
        let expired = |id: &str| ("expired".to_owned(), id.to_owned());
        assert_eq!(outbox_ids(&sale).await?, [created(&id)], "shards={shards}");
        // A retry of the reservation adds nothing.
        let retried = store
            .reserve(&ReserveRequest {
                sale: &sale,
                sku: "HOT",
                user: "eve",
                quantity: 2,
                request_id: "e1",
                amount_minor: 3998,
            })
            .await?;
        assert!(
            matches!(retried, ReserveOutcome::Existing(_)),
            "{retried:?}"
        );
        assert_eq!(store.cancel(&sale, &id).await?, CancelOutcome::Cancelled);
        assert_eq!(
            outbox_ids(&sale).await?,
            [created(&id), expired(&id)],
            "shards={shards}"
        );
        // A retried cancel, and a sweep, add nothing.
        assert_eq!(
            store.cancel(&sale, &id).await?,
            CancelOutcome::AlreadyReleased
        );
        assert_eq!(store.sweep(&sale, 10).await?, 0);
        assert_eq!(
            outbox_ids(&sale).await?,
            [created(&id), expired(&id)],
            "shards={shards}"
        );

        // A cancel that died after its first step (the real script, run
        // alone): the sweeper finishes the release, and the reservation is
        // announced all the same, once.
        let broken = reserve(&store, &sale, "fay", "f1").await?;
        let keys = SaleKeys::new(&sale);
        let begun: Vec<String> = Script::new(include_str!("../src/lua/begin_release.lua"))
            .key(keys.reservation(&broken))
            .key(keys.expiry())
            .arg(&broken)
            .arg("cancelled")
            .arg("now")
            .invoke_async(&mut redis_connection().await?)
            .await?;
        assert_eq!(begun.first().map(String::as_str), Some("releasing"));
        assert_eq!(store.sweep(&sale, 10).await?, 1, "shards={shards}");
        assert_eq!(store.sweep(&sale, 10).await?, 0, "shards={shards}");
        assert_eq!(
            outbox_ids(&sale).await?,
            [
                created(&id),
                expired(&id),
                created(&broken),
                expired(&broken)
            ],
            "shards={shards}"
        );
        let level = store
            .stock(&sale, "HOT")
            .await?
            .ok_or_else(|| anyhow::anyhow!("no stock"))?;
        assert_eq!(
            (level.available, level.reserved),
            (20, 0),
            "shards={shards}"
        );
        remove(&sale).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reservation_is_created_and_only_lapsed_and_cancelled_ones_expire()
-> anyhow::Result<()> {
    let (store, sale) = sale("outbox", 200, 2).await?;
    let brokers = stack::kafka_brokers()?;
    let topic = stack::unique_name("outbox-orders");
    kafka::create_topic(&brokers, &topic, 2).await?;
    let producer = OrderProducer::new(&ProducerSettings {
        topic: topic.clone(),
        ..ProducerSettings::new(brokers.clone())
    })?;

    let lapsed = reserve(&store, &sale, "ann", "a1").await?;
    let cancelled = reserve(&store, &sale, "ben", "b1").await?;
    let paid = reserve(&store, &sale, "cat", "c1").await?;
    store.cancel(&sale, &cancelled).await?;
    store.confirm(&sale, &paid).await?;
    swept(&store, &sale).await?;

    // Two publishers, as two replicas would be: each entry goes out once.
    let first = outbox::publish_round(&store, &producer, &sale, "replica-a").await?;
    let second = outbox::publish_round(&store, &producer, &sale, "replica-b").await?;
    assert_eq!(
        first,
        Round {
            created: 3,
            expired: 2,
            unsent: 0,
            pending: 0
        }
    );
    assert_eq!(second, Round::default());

    // Each order's events in the order they happened (one user, one partition).
    let mut events = kafka::events(&brokers, &topic).await?;
    events.sort_by_key(|e| e.user_id.clone());
    let order = |id: &str| flashsale_orders::order_id(id);
    assert_eq!(
        events
            .iter()
            .map(|e| (e.kind, e.order_id.clone()))
            .collect::<Vec<_>>(),
        [
            (EventKind::Created, order(&lapsed)),
            (EventKind::Expired, order(&lapsed)),
            (EventKind::Created, order(&cancelled)),
            (EventKind::Expired, order(&cancelled)),
            (EventKind::Created, order(&paid)),
        ],
        "every reservation is an order; only the lapsed and the cancelled one expired"
    );
    let created = &events[0];
    assert_eq!(created.idempotency_key, "a1", "the request id");
    let age = jiff::Timestamp::now().duration_since(created.created_at);
    assert!(
        age > jiff::SignedDuration::ZERO && age < jiff::SignedDuration::from_secs(30),
        "stamped when reserved, by Redis: {created:?}"
    );
    let event = &events[1];
    assert_eq!(
        (
            event.sale.as_str(),
            event.user_id.as_str(),
            event.sku.as_str(),
            event.quantity,
            event.amount_minor
        ),
        (sale.as_str(), "ann", "HOT", 2, 3998),
        "built from the reservation record"
    );
    assert_eq!(event.idempotency_key, format!("expired:{}", event.order_id));
    remove(&sale).await
}

#[tokio::test]
async fn an_entry_whose_event_kafka_refused_stays_until_it_is_published() -> anyhow::Result<()> {
    let (store, sale) = sale("outbox-down", 100, 1).await?;
    reserve(&store, &sale, "dan", "d1").await?;
    swept(&store, &sale).await?;
    let both = Round {
        created: 1,
        expired: 1,
        unsent: 0,
        pending: 0,
    };
    // Nobody listens on this port: the send fails at its bound.
    let down = OrderProducer::new(&ProducerSettings {
        send_timeout: Duration::from_millis(300),
        ..ProducerSettings::new("127.0.0.1:1")
    })?;
    let failed = outbox::publish_round(&store, &down, &sale, "replica-a").await?;
    assert_eq!(
        failed,
        Round {
            unsent: 2,
            pending: 2,
            ..Round::default()
        }
    );

    let brokers = stack::kafka_brokers()?;
    let topic = stack::unique_name("outbox-retry");
    kafka::create_topic(&brokers, &topic, 1).await?;
    let up = OrderProducer::new(&ProducerSettings {
        topic: topic.clone(),
        ..ProducerSettings::new(brokers.clone())
    })?;
    // The same replica retries its own unacknowledged entry.
    let retried = outbox::publish_round(&store, &up, &sale, "replica-a").await?;
    assert_eq!(retried, both);
    let kinds: Vec<EventKind> = kafka::events(&brokers, &topic)
        .await?
        .iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, [EventKind::Created, EventKind::Expired]);
    Ok(())
}
