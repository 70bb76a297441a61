//! The producer against the real Kafka broker of the local stack.

use std::{collections::HashMap, time::Duration};

use flashsale_e2e::{
    faults,
    orders::{Stream, Topics},
    stack,
    wait::poll_until,
};
use flashsale_orders::{
    EventKind, OrderEvent, OrderProducer, ProduceError, ProducerSettings, SCHEMA_VERSION,
};
use rdkafka::{
    ClientConfig, Message,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{Consumer, StreamConsumer},
    mocking::MockCluster,
    types::{RDKafkaApiKey, RDKafkaRespErr},
};

fn event(n: usize) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        kind: EventKind::Created,
        order_id: format!("o-{n}"),
        sale: "s".into(),
        user_id: format!("u-{}", n % 13),
        sku: "PHONE".into(),
        quantity: 1,
        amount_minor: 100,
        idempotency_key: format!("k-{n}"),
        reservation_id: format!("r-{n}"),
        created_at: jiff::Timestamp::now(),
    }
}

#[tokio::test]
async fn acknowledged_events_are_all_there_keyed_by_user() -> anyhow::Result<()> {
    // Not while another test stops the broker.
    let _exclusive = faults::exclusive().await;
    let brokers = stack::kafka_brokers()?;
    let topic = stack::unique_name("orders");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            &[NewTopic::new(&topic, 6, TopicReplication::Fixed(1))],
            &options,
        )
        .await?
    {
        result.map_err(|(name, code)| anyhow::anyhow!("creating {name}: {code}"))?;
    }

    let mut settings = ProducerSettings::new(&brokers);
    settings.topic = topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let mut partition_of_user: HashMap<String, i32> = HashMap::new();
    for n in 0..300 {
        let e = event(n);
        let delivered = producer.send(&e).await?;
        let first = *partition_of_user
            .entry(e.user_id.clone())
            .or_insert(delivered.partition);
        assert_eq!(
            first, delivered.partition,
            "one user's events share a partition"
        );
    }

    let mut bad = event(999);
    bad.quantity = 0;
    assert!(
        producer.send(&bad).await.is_err(),
        "an invalid event is refused before sending"
    );

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", stack::unique_name("orders-check"))
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&topic])?;
    let mut seen = HashMap::new();
    while seen.len() < 300 {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .map_err(|_| anyhow::anyhow!("only {} of 300 events within 30 s", seen.len()))??;
        let parsed = OrderEvent::parse(message.payload().unwrap_or_default())?;
        assert_eq!(message.key(), Some(parsed.user_id.as_bytes()));
        seen.insert(parsed.order_id.clone(), parsed);
    }
    assert_eq!(seen.len(), 300);
    assert!(!seen.contains_key("o-999"));
    admin.delete_topics(&[&topic], &options).await?;
    Ok(())
}

/// How soon after an outage events are acknowledged again: runs here have
/// seen a producer acknowledge nothing for 60 s after an outage, not fatal;
/// its 10 s stall bound (three 1 s send bounds, at least 10 s) replaces
/// such a producer well within this.
const BACK_WITHIN: Duration = Duration::from_secs(30);

/// A broker outage longer than the send bound times out messages already
/// given sequence numbers; librdkafka's idempotent producer may then find
/// its sequence out of step with the broker's and turn fatal, refusing
/// every later send at once. Orders must be acknowledged again once the
/// broker is back, whichever way the outage went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_acknowledged_again_after_broker_outages_longer_than_the_send_bound()
-> anyhow::Result<()> {
    let _exclusive = faults::exclusive().await;
    let topics = Topics::create(3).await?;
    let mut settings = ProducerSettings::new(&topics.brokers);
    settings.topic = topics.topic.clone();
    settings.send_timeout = Duration::from_secs(1);
    let producer = OrderProducer::new(&settings)?;
    let stream = Stream::start(&producer, "outages", 32, Duration::from_secs(240));

    for (round, (fault, hold)) in [("pause", 3), ("down", 2), ("pause", 3), ("down", 2)]
        .into_iter()
        .enumerate()
    {
        stream
            .wait_acked(
                stream.acked(),
                300,
                &format!("events acknowledged before outage {round}"),
                BACK_WITHIN,
            )
            .await?;
        let outage = if fault == "pause" {
            faults::Outage::pause("kafka").await?
        } else {
            faults::Outage::begin("kafka").await?
        };
        // The outage itself: held past the 1 s send bound.
        tokio::time::sleep(Duration::from_secs(hold)).await;
        outage.end().await?;
        eprintln!("outage {round}: broker {fault} for {hold} s, back");
    }
    stream
        .wait_acked(
            stream.acked(),
            300,
            "events acknowledged after the last outage",
            BACK_WITHIN,
        )
        .await?;
    let sent = stream.stop().await;
    eprintln!(
        "{} acknowledged, {} refused across the outages",
        sent.acked.len(),
        sent.failed.len()
    );
    topics.delete().await?;
    Ok(())
}

/// The branch the outages above may or may not reach, forced: librdkafka's
/// own mock broker answers the first produce request out of sequence, which
/// makes an idempotent producer fatal. The send that met it fails; the
/// sends after it are acknowledged by the producer that replaced it.
#[tokio::test]
async fn a_producer_turned_fatal_is_replaced_and_later_events_are_acknowledged()
-> anyhow::Result<()> {
    let cluster = MockCluster::new(1)?;
    let topic = "orders";
    cluster.create_topic(topic, 1, 1)?;
    let mut settings = ProducerSettings::new(cluster.bootstrap_servers());
    settings.topic = topic.to_owned();
    let producer = OrderProducer::new(&settings)?;
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
    );
    let refused = producer.send(&event(0)).await;
    assert!(
        matches!(refused, Err(ProduceError::NotAcknowledged(_))),
        "{refused:?}"
    );
    for n in 1..=10 {
        producer.send(&event(n)).await?;
    }
    Ok(())
}

/// A producer that fails every send, not fatal, is replaced once that has
/// lasted its stall bound: librdkafka's own mock broker holds every answer
/// for a minute, so each send times out, then answers at once again; the
/// replaced producer's sends are acknowledged.
#[tokio::test]
async fn a_producer_failing_every_send_for_its_stall_bound_is_replaced() -> anyhow::Result<()> {
    let cluster = MockCluster::new(1)?;
    let topic = "orders";
    cluster.create_topic(topic, 1, 1)?;
    let mut settings = ProducerSettings::new(cluster.bootstrap_servers());
    settings.topic = topic.to_owned();
    settings.send_timeout = Duration::from_secs(1);
    let producer = OrderProducer::new(&settings)?;
    // A first send may time out while the client connects on a busy machine.
    let acknowledged = |what: &'static str, first: usize| {
        let producer = producer.clone();
        let mut n = first;
        async move {
            poll_until(what, Duration::from_secs(20), Duration::ZERO, || {
                n += 1;
                let (producer, n) = (producer.clone(), n);
                async move { producer.send(&event(n)).await.map_err(|e| e.to_string()) }
            })
            .await
        }
    };
    acknowledged("a first event acknowledged", 0).await?;

    cluster.broker_round_trip_time(1, Duration::from_secs(60))?;
    // 1 s sends under a 10 s stall bound: the 11th failure comes after it.
    let mut n = 100;
    poll_until(
        "the stalled producer replaced",
        Duration::from_secs(30),
        Duration::ZERO,
        || {
            n += 1;
            let (producer, n) = (producer.clone(), n);
            async move {
                let sent = producer.send(&event(n)).await;
                match (sent, producer.replacements()) {
                    (Err(_), 0) => Err("sends fail, not replaced yet".to_owned()),
                    (Err(_), _) => Ok(()),
                    (Ok(_), _) => Err("acknowledged under the held answers".to_owned()),
                }
            }
        },
    )
    .await?;
    assert_eq!(
        producer.replacements(),
        1,
        "replaced once, not per failed send"
    );

    cluster.broker_round_trip_time(1, Duration::ZERO)?;
    acknowledged("an event acknowledged by the new producer", 200).await?;
    assert_eq!(producer.replacements(), 1);
    Ok(())
}
