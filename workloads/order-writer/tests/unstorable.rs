//! Events the writer cannot store as they come are never dropped silently:
//! a status event whose order is not stored yet is parked and applied once
//! its `created` event arrives; after a few retries a `paid` one is
//! dead-lettered (`missing_order`) and an `expired` one is acknowledged as
//! nothing to expire (its order's `created` event never landed), counted;
//! a `created` event whose idempotency key belongs to another order is
//! dead-lettered (`idempotency_conflict`). Meanwhile the group's offset
//! never passes an event that is neither stored, dead-lettered nor given
//! up after the parking window.
//! Real Kafka, PostgreSQL and MariaDB, each in a database of its own.

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use common::Topics;
use flashsale_e2e::{stack, wait::poll_until};
use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ProducerSettings};
use flashsale_runtime::{Shutdown, metrics::render};
use order_writer::{metrics::WriterMetrics, sink::Sink, writer::Writer};
use prometheus_client::registry::Registry;
use rdkafka::{
    ClientConfig, Message, Offset, TopicPartitionList,
    consumer::{Consumer, StreamConsumer},
    message::Headers,
};
use tokio::task::JoinHandle;

/// The `kind` event of order `n` of `sale`.
fn event(sale: &str, n: usize, kind: EventKind) -> OrderEvent {
    OrderEvent {
        kind,
        ..common::event(sale, n)
    }
}

/// A dead letter: its reason, error and original offset headers.
#[derive(Debug, PartialEq, Eq)]
struct DeadLetter {
    reason: String,
    error: String,
    offset: i64,
}

/// Reads the whole DLQ (`expected` messages, then checks nothing follows).
async fn dead_letters(topics: &Topics, expected: usize) -> anyhow::Result<Vec<DeadLetter>> {
    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &topics.brokers)
        .set("group.id", stack::unique_name("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .create()?;
    reader.subscribe(&[&topics.dlq])?;
    let mut letters = Vec::new();
    while letters.len() < expected {
        let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
            .await
            .map_err(|_| anyhow::anyhow!("only {} dead letters", letters.len()))??;
        let header = |key: &str| {
            message
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == key))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        letters.push(DeadLetter {
            reason: header("flashsale-dlq-reason"),
            error: header("flashsale-dlq-error"),
            offset: header("flashsale-original-offset").parse()?,
        });
    }
    assert_eq!(
        topics.message_count(&topics.dlq, 1).await?,
        expected as i64,
        "dead letters beyond those expected: {letters:?}"
    );
    letters.sort_by_key(|l| l.offset);
    Ok(letters)
}

/// The order's status, if it is stored.
async fn status(sink: &Sink, order_id: &str) -> anyhow::Result<Option<String>> {
    Ok(match sink {
        Sink::Postgres(pool) => {
            sqlx::query_scalar("SELECT status FROM orders WHERE order_id = $1")
                .bind(order_id)
                .fetch_optional(pool)
                .await?
        }
        Sink::Mysql(pool) => {
            sqlx::query_scalar("SELECT status FROM orders WHERE order_id = ?")
                .bind(order_id)
                .fetch_optional(pool)
                .await?
        }
    })
}

/// Watches the group's committed offset of partition 0 until stopped, and
/// records every time it passed `offset` while `settled` did not hold yet.
/// The offset is read first, so `settled` is seen at least as late as it
/// was when the commit was sent; once it holds, it holds for good.
fn watch_commits<F, Fut>(
    topics: &Topics,
    group: &str,
    offset: i64,
    settled: F,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<tokio::task::JoinHandle<Vec<String>>>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let probe: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &topics.brokers)
        .set("group.id", group)
        .create()?;
    let (probe, topic) = (Arc::new(probe), topics.topic.clone());
    Ok(tokio::spawn(async move {
        let (mut violations, mut was_settled) = (Vec::new(), false);
        while !stop.load(Ordering::Relaxed) {
            let (probe, topic) = (Arc::clone(&probe), topic.clone());
            let committed = tokio::task::spawn_blocking(move || {
                let mut list = TopicPartitionList::new();
                list.add_partition(&topic, 0);
                let offsets = probe.committed_offsets(list, Duration::from_secs(5)).ok()?;
                match offsets.elements().first()?.offset() {
                    Offset::Offset(n) => Some(n),
                    _ => None,
                }
            })
            .await
            .ok()
            .flatten();
            if let Some(n) = committed
                && n > offset
                && !was_settled
            {
                was_settled = settled().await;
                if !was_settled {
                    violations.push(format!("committed {n} past unsettled offset {offset}"));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        violations
    }))
}

/// A writer on a task of its own over a topic of one partition and a
/// database of its own, with the producer the test sends through.
struct Stage {
    topics: Topics,
    database: common::PrivateDatabase,
    sink: Sink,
    sale: String,
    producer: OrderProducer,
    group: String,
    registry: Arc<Registry>,
    shutdown: Shutdown,
    running: JoinHandle<common::WriterEnd>,
}

impl Stage {
    /// Creates the topic and a database on the server of `server_url`,
    /// names the sale and the group after `name`, and starts the writer.
    async fn start(server_url: &str, name: &str) -> anyhow::Result<Self> {
        let topics = Topics::create(1).await?;
        let database = common::PrivateDatabase::create(server_url).await?;
        let sink = Sink::connect(&database.url, 4).await?;
        let sale = stack::unique_name(name);
        let mut settings = ProducerSettings::new(&topics.brokers);
        settings.topic = topics.topic.clone();
        let producer = OrderProducer::new(&settings)?;

        let group = stack::unique_name(&format!("{name}-group"));
        let mut registry = Registry::default();
        let metrics = WriterMetrics::register(&mut registry);
        let writer = Writer::new(
            common::writer_settings(&topics.brokers, &topics.topic, &topics.dlq, &group),
            sink.clone(),
            metrics,
        )?;
        let shutdown = Shutdown::new();
        let running = common::spawn_writer(writer, &shutdown);
        Ok(Self {
            topics,
            database,
            sink,
            sale,
            producer,
            group,
            registry: Arc::new(registry),
            shutdown,
            running,
        })
    }
}

/// Sends `events` in turn, each checked to land at the next offset from 0.
async fn send_in_order(producer: &OrderProducer, events: &[OrderEvent]) -> anyhow::Result<()> {
    for (expected_offset, e) in events.iter().enumerate() {
        let delivered = producer.send(e).await?;
        assert_eq!(delivered.offset, expected_offset as i64);
    }
    Ok(())
}

/// Watches the two offsets the group must not pass early. Offset 2 is a
/// payment for an order that never comes: until it is dead-lettered, the
/// group's offset must stay at or before it. Offset 6 expires an order
/// (`late_order`) whose `created` event comes later: until it is applied,
/// the offset must stay at or before it.
fn watch_ghost_and_late(
    stage: &Stage,
    late_order: String,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<[JoinHandle<Vec<String>>; 2]> {
    // Both dead letters (offsets 2 and 4, checked at the end) are in once
    // the DLQ holds two; the clash at 4 goes first, at once.
    let ghost_watch = watch_commits(
        &stage.topics,
        &stage.group,
        2,
        {
            let (brokers, dlq) = (stage.topics.brokers.clone(), stage.topics.dlq.clone());
            move || {
                let (brokers, dlq) = (brokers.clone(), dlq.clone());
                async move { dlq_count(&brokers, &dlq).await >= 2 }
            }
        },
        stop.clone(),
    )?;
    let late_watch = watch_commits(
        &stage.topics,
        &stage.group,
        6,
        {
            let (sink, order) = (stage.sink.clone(), late_order);
            move || {
                let (sink, order) = (sink.clone(), order.clone());
                async move { matches!(status(&sink, &order).await, Ok(Some(s)) if s == "expired") }
            }
        },
        stop.clone(),
    )?;
    Ok([ghost_watch, late_watch])
}

/// What must hold once everything settled: each order's status, the two
/// dead letters with their reasons, and the writer's counters.
async fn check_settled(stage: &Stage) -> anyhow::Result<()> {
    let id = |n| common::order_id(&stage.sale, n);
    let mut statuses = Vec::new();
    for n in 0..4 {
        statuses.push(status(&stage.sink, &id(n)).await?.unwrap_or_default());
    }
    assert_eq!(
        statuses,
        ["paid", "pending_payment", "expired", "pending_payment"],
        "orders 0..4"
    );
    let letters = dead_letters(&stage.topics, 2).await?;
    assert_eq!(
        letters
            .iter()
            .map(|l| (l.offset, l.reason.as_str()))
            .collect::<Vec<_>>(),
        [(2, "missing_order"), (4, "idempotency_conflict")]
    );
    assert!(letters[0].error.contains(&id(8)), "{letters:?}");
    assert!(
        letters[1].error.contains(&format!(
            "idempotency key already stored for order {}",
            id(0)
        )),
        "{letters:?}"
    );
    for line in [
        "order_writer_dlq_total{reason=\"missing_order\"} 1",
        "order_writer_dlq_total{reason=\"idempotency_conflict\"} 1",
        "order_writer_expired_without_order_total 0",
        "order_writer_persisted_total 4",
    ] {
        let text = render(&stage.registry)?;
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    Ok(())
}

async fn nothing_unstorable_is_dropped(server_url: String) -> anyhow::Result<()> {
    let stage = Stage::start(&server_url, "unstorable").await?;
    let (sink, sale) = (&stage.sink, &stage.sale);
    let id = |n| common::order_id(sale, n);
    let stop = Arc::new(AtomicBool::new(false));
    let [ghost_watch, late_watch] = watch_ghost_and_late(&stage, id(2), &stop)?;

    let mut clash = event(sale, 9, EventKind::Created);
    clash.idempotency_key = event(sale, 0, EventKind::Created).idempotency_key;
    send_in_order(
        &stage.producer,
        &[
            event(sale, 0, EventKind::Created),
            event(sale, 0, EventKind::Paid), // its order is inserted by the same batch
            event(sale, 8, EventKind::Paid), // an order that never comes
            event(sale, 1, EventKind::Created),
            clash,                              // order 0's key under order 9
            event(sale, 0, EventKind::Created), // order 0 again: a replay, a no-op
            event(sale, 2, EventKind::Expired), // before its `created` event
            event(sale, 3, EventKind::Created),
        ],
    )
    .await?;
    // Order 3 stored means the expiry of order 2, before it, was tried and
    // found no order; only now does order 2 arrive.
    poll_until(
        "order 3 stored",
        Duration::from_secs(30),
        Duration::from_millis(10),
        || async {
            match status(sink, &id(3)).await {
                Ok(Some(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    assert_eq!(
        status(sink, &id(2)).await?,
        None,
        "order 2 is not produced yet"
    );
    stage
        .producer
        .send(&event(sale, 2, EventKind::Created))
        .await?;

    common::wait_stored_exactly(
        sink,
        sale,
        &common::order_ids(sale, 0..4),
        Duration::from_secs(30),
    )
    .await?;
    stage
        .topics
        .wait_committed_to_end(&stage.group, Duration::from_secs(30))
        .await?;
    stop.store(true, Ordering::Relaxed);
    let violations = [ghost_watch.await?, late_watch.await?].concat();
    assert!(violations.is_empty(), "{violations:?}");
    check_settled(&stage).await?;

    stage.shutdown.trigger();
    let (stats, closed) = stage.running.await?;
    let stats = stats?;
    assert!(
        closed,
        "the writer did not leave the consumer group within 10 s"
    );
    assert_eq!(
        (
            stats.inserted,
            stats.dead_lettered,
            stats.expired_without_order
        ),
        (4, 2, 0),
        "order 2's expiry waited for its order and was applied"
    );
    stage.topics.delete().await?;
    stage.database.remove().await
}

/// Watches offset 1, which expires an order that never comes: until the
/// writer gave up on it (and counted it), the group's offset stays at or
/// before it.
fn watch_orphan_expiry(
    stage: &Stage,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<Vec<String>>> {
    watch_commits(
        &stage.topics,
        &stage.group,
        1,
        {
            let registry = Arc::clone(&stage.registry);
            move || {
                let registry = Arc::clone(&registry);
                async move {
                    matches!(
                        common::sample(&registry, "order_writer_expired_without_order_total"),
                        Ok(Some(n)) if n >= 1
                    )
                }
            }
        },
        stop.clone(),
    )
}

/// An `expired` event whose order never comes (the gateway's publish of its
/// `created` event failed, or the gateway died before it) is not poison:
/// after the parking window it is acknowledged, counted, and not
/// dead-lettered. A `paid` event whose order never comes still is.
async fn expired_without_order_is_acknowledged(server_url: String) -> anyhow::Result<()> {
    let stage = Stage::start(&server_url, "orphan").await?;
    let (sink, sale, registry) = (&stage.sink, &stage.sale, &stage.registry);

    let stop = Arc::new(AtomicBool::new(false));
    let watch = watch_orphan_expiry(&stage, &stop)?;
    let started = std::time::Instant::now();
    send_in_order(
        &stage.producer,
        &[
            event(sale, 0, EventKind::Created),
            event(sale, 7, EventKind::Expired), // an order that never comes
            event(sale, 8, EventKind::Paid),    // an order that never comes
            event(sale, 1, EventKind::Created),
        ],
    )
    .await?;
    stage
        .topics
        .wait_committed_to_end(&stage.group, Duration::from_secs(30))
        .await?;
    let settled_after = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let violations = watch.await?;
    common::wait_stored_exactly(
        sink,
        sale,
        &common::order_ids(sale, 0..2),
        Duration::from_secs(10),
    )
    .await?;
    assert_eq!(status(sink, &common::order_id(sale, 7)).await?, None);

    let letters = dead_letters(&stage.topics, 1).await?;
    assert_eq!(
        letters
            .iter()
            .map(|l| (l.offset, l.reason.as_str()))
            .collect::<Vec<_>>(),
        [(2, "missing_order")],
        "only the payment is a dead letter"
    );
    let text = render(registry)?;
    for line in [
        "order_writer_expired_without_order_total 1",
        "order_writer_dlq_total{reason=\"missing_order\"} 1",
        "order_writer_persisted_total 2",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    assert!(violations.is_empty(), "{violations:?}");
    assert!(
        settled_after >= Duration::from_millis(15_800),
        "given up only after the parking window, not after {settled_after:?}"
    );

    stage.shutdown.trigger();
    let (stats, closed) = stage.running.await?;
    let stats = stats?;
    assert!(closed, "the writer did not leave the group within 10 s");
    assert_eq!(
        (
            stats.inserted,
            stats.dead_lettered,
            stats.expired_without_order
        ),
        (2, 1, 1)
    );
    stage.topics.delete().await?;
    stage.database.remove().await
}

/// Messages in the one-partition DLQ; 0 when it cannot be read.
async fn dlq_count(brokers: &str, dlq: &str) -> i64 {
    let probe: Result<StreamConsumer, _> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", stack::unique_name("dlq-probe"))
        .create();
    let Ok(probe) = probe else { return 0 };
    let dlq = dlq.to_owned();
    tokio::task::spawn_blocking(move || {
        probe
            .fetch_watermarks(&dlq, 0, Duration::from_secs(5))
            .map_or(0, |(low, high)| high - low)
    })
    .await
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_parks_then_stores_or_dead_letters_and_reports_clashes() -> anyhow::Result<()> {
    nothing_unstorable_is_dropped(stack::postgres_url()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_parks_then_stores_or_dead_letters_and_reports_clashes() -> anyhow::Result<()> {
    nothing_unstorable_is_dropped(stack::mysql_url()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_acknowledges_an_expired_event_whose_order_never_came() -> anyhow::Result<()> {
    expired_without_order_is_acknowledged(stack::postgres_url()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_acknowledges_an_expired_event_whose_order_never_came() -> anyhow::Result<()> {
    expired_without_order_is_acknowledged(stack::mysql_url()?).await
}
