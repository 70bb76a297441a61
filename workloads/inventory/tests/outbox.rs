//! Expired orders are announced: a reservation that lapses unpaid puts its
//! `expired` order event on the order topic (real Redis, real Kafka), once
//! per lapse, and nothing else does.

use std::time::Duration;

use flashsale_e2e::{kafka, stack, wait::poll_until};
use flashsale_orders::{EventKind, OrderProducer, ProducerSettings};
use inventory::{
    keys::SaleKeys,
    outbox::{self, Round},
    store::{ItemDefinition, ReserveOutcome, ReserveRequest, SaleDefinition, Store},
};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_reservations_and_only_they_become_expired_events() -> anyhow::Result<()> {
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

    // Two publishers, as two replicas would be: the entry goes out once.
    let first = outbox::publish_round(&store, &producer, &sale, "replica-a").await?;
    let second = outbox::publish_round(&store, &producer, &sale, "replica-b").await?;
    assert_eq!(
        first,
        Round {
            published: 1,
            pending: 0
        }
    );
    assert_eq!(
        second,
        Round {
            published: 0,
            pending: 0
        }
    );

    let events = kafka::events(&brokers, &topic).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event.kind, EventKind::Expired);
    assert_eq!(event.order_id, flashsale_orders::order_id(&lapsed));
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
    flashsale_e2e::redis_keys::unlink_matching(
        &stack::redis_url()?,
        &format!(
            "{}*",
            SaleKeys::new(&sale).outbox().trim_end_matches("outbox")
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_entry_whose_event_kafka_refused_stays_until_it_is_published() -> anyhow::Result<()> {
    let (store, sale) = sale("outbox-down", 100, 1).await?;
    reserve(&store, &sale, "dan", "d1").await?;
    swept(&store, &sale).await?;
    // Nobody listens on this port: the send fails at its bound.
    let down = OrderProducer::new(&ProducerSettings {
        send_timeout: Duration::from_millis(300),
        ..ProducerSettings::new("127.0.0.1:1")
    })?;
    let failed = outbox::publish_round(&store, &down, &sale, "replica-a").await?;
    assert_eq!(
        failed,
        Round {
            published: 0,
            pending: 1
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
    assert_eq!(
        retried,
        Round {
            published: 1,
            pending: 0
        }
    );
    assert_eq!(kafka::events(&brokers, &topic).await?.len(), 1);
    Ok(())
}
