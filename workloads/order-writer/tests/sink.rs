//! Idempotent batches on the real PostgreSQL and MariaDB of the local stack,
//! each test in a database of its own.

mod common;

use flashsale_e2e::stack;
use flashsale_orders::{EventKind, OrderEvent, SCHEMA_VERSION};
use order_writer::sink::{BatchOutcome, Conflict, ConflictKind, Sink, SourcedEvent};

/// A sink on a fresh database of the server at `server_url`.
async fn private_sink(
    server_url: String,
    connections: u32,
) -> anyhow::Result<(Sink, common::PrivateDatabase)> {
    let database = common::PrivateDatabase::create(&server_url).await?;
    Ok((Sink::connect(&database.url, connections).await?, database))
}

/// The `created` event of order `n` of `sale`, under idempotency key `key`.
fn created_with_key(sale: &str, n: i64, key: &str) -> SourcedEvent {
    let mut e = event(sale, n, EventKind::Created);
    e.event.idempotency_key = key.to_owned();
    e
}

fn event(sale: &str, n: i64, kind: EventKind) -> SourcedEvent {
    SourcedEvent {
        event: OrderEvent {
            schema_version: SCHEMA_VERSION,
            kind,
            order_id: format!("{sale}-o{n}"),
            sale: sale.to_owned(),
            user_id: format!("u{}", n % 7),
            sku: "PHONE".into(),
            quantity: 1 + n % 2,
            amount_minor: 1000 * (1 + n % 2),
            idempotency_key: format!("{sale}-k{n}"),
            reservation_id: format!("r{n}"),
            created_at: jiff::Timestamp::now(),
        },
        partition: (n % 6) as i32,
        offset: n,
    }
}

async fn statuses(sink: &Sink, sale: &str) -> anyhow::Result<Vec<(String, String)>> {
    Ok(match sink {
        Sink::Postgres(pool) => {
            sqlx::query_as("SELECT order_id, status FROM orders WHERE sale = $1 ORDER BY order_id")
                .bind(sale)
                .fetch_all(pool)
                .await?
        }
        Sink::Mysql(pool) => {
            sqlx::query_as("SELECT order_id, status FROM orders WHERE sale = ? ORDER BY order_id")
                .bind(sale)
                .fetch_all(pool)
                .await?
        }
    })
}

async fn replays_are_no_ops_and_status_only_moves_forward(url: String) -> anyhow::Result<()> {
    let (sink, database) = private_sink(url, 4).await?;
    let sale = stack::unique_name("sink");
    let batch: Vec<SourcedEvent> = (0..50)
        .map(|n| event(&sale, n, EventKind::Created))
        .collect();

    assert_eq!(sink.write_batch(&batch).await?.inserted, 50);
    assert_eq!(
        sink.write_batch(&batch).await?.inserted,
        0,
        "a replayed batch inserts nothing"
    );
    let mut mixed = batch[40..].to_vec();
    mixed.extend((50..60).map(|n| event(&sale, n, EventKind::Created)));
    assert_eq!(
        sink.write_batch(&mixed).await?.inserted,
        10,
        "only the new half of a mixed batch"
    );
    assert_eq!(statuses(&sink, &sale).await?.len(), 60);

    let moves = vec![
        event(&sale, 1, EventKind::Paid),
        event(&sale, 1, EventKind::Expired), // too late: already paid
        event(&sale, 2, EventKind::Expired),
        event(&sale, 2, EventKind::Paid), // too late: already expired
        event(&sale, 3, EventKind::Paid),
    ];
    assert_eq!(sink.write_batch(&moves).await?.status_changes, 3);
    assert_eq!(
        sink.write_batch(&moves).await?.status_changes,
        0,
        "repeats are harmless"
    );
    let all = statuses(&sink, &sale).await?;
    let status_of = |n: i64| {
        let id = format!("{sale}-o{n}");
        all.iter()
            .find(|(o, _)| *o == id)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        (status_of(1), status_of(2), status_of(3), status_of(4)),
        (
            "paid".to_owned(),
            "expired".to_owned(),
            "paid".to_owned(),
            "pending_payment".to_owned()
        )
    );
    database.remove().await
}

#[tokio::test]
async fn postgres_batches_are_idempotent() -> anyhow::Result<()> {
    replays_are_no_ops_and_status_only_moves_forward(stack::postgres_url()?).await
}

#[tokio::test]
async fn mariadb_batches_are_idempotent() -> anyhow::Result<()> {
    replays_are_no_ops_and_status_only_moves_forward(stack::mysql_url()?).await
}

/// The largest batch the FlashSale CRD allows holds 120,000 column values,
/// beyond either protocol's 65,535 bind parameters per statement.
async fn the_largest_batch_is_stored_in_one_go(url: String) -> anyhow::Result<()> {
    let (sink, database) = private_sink(url, 1).await?;
    let sale = stack::unique_name("sink-large");
    let mut batch: Vec<SourcedEvent> = (0..10_000)
        .map(|n| event(&sale, n, EventKind::Created))
        .collect();
    assert_eq!(sink.write_batch(&batch[..4_000]).await?.inserted, 4_000);
    batch.push(event(&sale, 7, EventKind::Paid));
    let outcome = sink.write_batch(&batch).await?;
    assert_eq!((outcome.inserted, outcome.status_changes), (6_000, 1));
    assert_eq!(statuses(&sink, &sale).await?.len(), 10_000);
    database.remove().await
}

#[tokio::test]
async fn postgres_takes_the_largest_batch() -> anyhow::Result<()> {
    the_largest_batch_is_stored_in_one_go(stack::postgres_url()?).await
}

#[tokio::test]
async fn mariadb_takes_the_largest_batch() -> anyhow::Result<()> {
    the_largest_batch_is_stored_in_one_go(stack::mysql_url()?).await
}

/// A status event whose order is not stored changes nothing and is
/// reported; one whose order a `created` event of the same batch inserts
/// applies at once; one for an order already moved is a no-op, not missing.
async fn status_events_without_their_order_are_reported(url: String) -> anyhow::Result<()> {
    let (sink, database) = private_sink(url, 2).await?;
    let sale = stack::unique_name("sink-missing");
    let batch = vec![
        event(&sale, 0, EventKind::Created),
        event(&sale, 0, EventKind::Paid),
        event(&sale, 1, EventKind::Expired), // order 1 is not stored (yet)
        event(&sale, 2, EventKind::Created),
        event(&sale, 3, EventKind::Paid), // nor is order 3
    ];
    assert_eq!(
        sink.write_batch(&batch).await?,
        BatchOutcome {
            inserted: 2,
            status_changes: 1,
            missing_orders: vec![2, 4],
            conflicts: vec![],
        }
    );
    let late = sink
        .write_batch(&[event(&sale, 0, EventKind::Expired)])
        .await?;
    assert_eq!(
        (late.status_changes, late.missing_orders),
        (0, vec![]),
        "an order already paid is there: a late event is a no-op, not missing"
    );
    sink.write_batch(&[event(&sale, 1, EventKind::Created)])
        .await?;
    let retried = sink
        .write_batch(&[event(&sale, 1, EventKind::Expired)])
        .await?;
    assert_eq!(
        (retried.status_changes, retried.missing_orders),
        (1, vec![])
    );
    assert_eq!(
        statuses(&sink, &sale).await?,
        vec![
            (format!("{sale}-o0"), "paid".to_owned()),
            (format!("{sale}-o1"), "expired".to_owned()),
            (format!("{sale}-o2"), "pending_payment".to_owned()),
        ]
    );
    database.remove().await
}

#[tokio::test]
async fn postgres_reports_status_events_without_their_order() -> anyhow::Result<()> {
    status_events_without_their_order_are_reported(stack::postgres_url()?).await
}

#[tokio::test]
async fn mariadb_reports_status_events_without_their_order() -> anyhow::Result<()> {
    status_events_without_their_order_are_reported(stack::mysql_url()?).await
}

/// A `created` event whose idempotency key is stored under another order
/// id, or whose order id is stored under another key, is reported and not
/// stored; the same order again is a silent no-op.
async fn identity_clashes_are_reported(url: String) -> anyhow::Result<()> {
    let (sink, database) = private_sink(url, 2).await?;
    let sale = stack::unique_name("sink-clash");
    let (k1, k4) = (format!("{sale}-k1"), format!("{sale}-k4"));
    let first = sink.write_batch(&[created_with_key(&sale, 1, &k1)]).await?;
    assert_eq!(first.inserted, 1);

    let batch = vec![
        created_with_key(&sale, 2, &k1), // k1 belongs to order 1
        created_with_key(&sale, 1, &k1), // order 1 again: a replay
        created_with_key(&sale, 3, &format!("{sale}-k3")), // new
        created_with_key(&sale, 1, &format!("{sale}-k9")), // order 1 under another key
        created_with_key(&sale, 4, &k4), // new
        created_with_key(&sale, 5, &k4), // k4 taken earlier in the batch
    ];
    let expected = BatchOutcome {
        inserted: 2,
        status_changes: 0,
        missing_orders: vec![],
        conflicts: vec![
            Conflict {
                index: 0,
                kind: ConflictKind::KeyTaken {
                    order_id: format!("{sale}-o1"),
                },
            },
            Conflict {
                index: 3,
                kind: ConflictKind::OrderIdTaken,
            },
            Conflict {
                index: 5,
                kind: ConflictKind::KeyTaken {
                    order_id: format!("{sale}-o4"),
                },
            },
        ],
    };
    assert_eq!(sink.write_batch(&batch).await?, expected);
    let stored: Vec<String> = statuses(&sink, &sale)
        .await?
        .into_iter()
        .map(|(order, _)| order)
        .collect();
    assert_eq!(
        stored,
        vec![
            format!("{sale}-o1"),
            format!("{sale}-o3"),
            format!("{sale}-o4")
        ]
    );
    // Replayed, the batch inserts nothing and reports the same clashes.
    let replayed = sink.write_batch(&batch).await?;
    assert_eq!(
        (replayed.inserted, replayed.conflicts),
        (0, expected.conflicts)
    );
    database.remove().await
}

#[tokio::test]
async fn postgres_reports_identity_clashes() -> anyhow::Result<()> {
    identity_clashes_are_reported(stack::postgres_url()?).await
}

#[tokio::test]
async fn mariadb_reports_identity_clashes() -> anyhow::Result<()> {
    identity_clashes_are_reported(stack::mysql_url()?).await
}

/// MariaDB's default collation ignores case, so its unique index takes two
/// keys that differ only in case for one. Such a key is a clash too: alone
/// it is reported at once; in a batch the insert fails, and the writer then
/// writes the batch's events one at a time, each alone.
#[tokio::test]
async fn mariadb_reports_keys_equal_only_by_collation() -> anyhow::Result<()> {
    let (sink, database) = private_sink(stack::mysql_url()?, 1).await?;
    let Sink::Mysql(pool) = &sink else {
        anyhow::bail!("not a MySQL-protocol sink")
    };
    let collation: String = sqlx::query_scalar(
        "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
         AND TABLE_NAME = 'orders' AND COLUMN_NAME = 'idempotency_key'",
    )
    .fetch_one(pool)
    .await?;
    anyhow::ensure!(
        collation.ends_with("_ci"),
        "this test needs a case-insensitive collation, found {collation}"
    );
    let sale = stack::unique_name("sink-collation");
    let stored = sink
        .write_batch(&[created_with_key(&sale, 1, &format!("{sale}-KEY"))])
        .await?;
    assert_eq!(stored.inserted, 1);

    let folded = created_with_key(&sale, 2, &format!("{sale}-key"));
    let alone = sink.write_batch(std::slice::from_ref(&folded)).await?;
    assert_eq!(
        (alone.inserted, alone.conflicts),
        (
            0,
            vec![Conflict {
                index: 0,
                kind: ConflictKind::CollationEqual {
                    order_id: format!("{sale}-o1")
                },
            }]
        )
    );
    let in_a_batch = sink
        .write_batch(&[folded, event(&sale, 3, EventKind::Created)])
        .await;
    let unique_violation = matches!(
        &in_a_batch,
        Err(order_writer::sink::SinkError::Database(sqlx::Error::Database(db)))
            if db.is_unique_violation()
    );
    assert!(unique_violation, "{in_a_batch:?}");
    assert_eq!(
        statuses(&sink, &sale).await?.len(),
        1,
        "nothing else stored"
    );
    database.remove().await
}

/// Sale ids are `<namespace>.<name>.<8 hex>`: up to 128 characters, stored
/// whole.
async fn a_sale_id_of_128_characters_is_stored(url: String) -> anyhow::Result<()> {
    let (sink, database) = private_sink(url, 1).await?;
    let prefix = stack::unique_name("sale");
    let sale = format!("{prefix}.{}.0123abcd", "n".repeat(118 - prefix.len()));
    assert_eq!(sale.len(), 128);
    let mut created = event(&prefix, 0, EventKind::Created);
    created.event.sale = sale.clone();
    assert_eq!(sink.write_batch(&[created]).await?.inserted, 1);
    assert_eq!(
        statuses(&sink, &sale).await?,
        vec![(format!("{prefix}-o0"), "pending_payment".to_owned())],
        "the row is found by its whole sale id"
    );
    database.remove().await
}

#[tokio::test]
async fn postgres_stores_a_sale_id_of_128_characters() -> anyhow::Result<()> {
    a_sale_id_of_128_characters_is_stored(stack::postgres_url()?).await
}

#[tokio::test]
async fn mariadb_stores_a_sale_id_of_128_characters() -> anyhow::Result<()> {
    a_sale_id_of_128_characters_is_stored(stack::mysql_url()?).await
}

#[tokio::test]
async fn an_unknown_database_url_is_refused() {
    let err = Sink::connect("oracle://db:1521/orders", 1)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("use postgres:// or mysql://"), "{err}");
}

/// What a failover drill reads back (`flashsale_observe::orders`): the ids
/// of one sale's orders whose buyer id starts with the run's prefix, in
/// either family. Another run's buyers (a longer run id), a look-alike whose
/// `:` are other characters, and another sale's rows are left out.
async fn a_drill_finds_its_runs_orders_by_buyer_prefix(url: String) -> anyhow::Result<()> {
    let (sink, database) = private_sink(url, 2).await?;
    let (sale, other_sale) = ("ns.sale.1234abcd", "ns.other.1234abcd");
    let rows = [
        (sale, 1, "drill:fo:r1:0"),
        (sale, 2, "drill:fo:r1:1"),
        (sale, 3, "drill:fo:r10:0"),
        (sale, 4, "drill_fo_r1_2"),
        (sale, 5, "buyer-7"),
        (other_sale, 6, "drill:fo:r1:3"),
    ];
    let batch: Vec<SourcedEvent> = rows
        .iter()
        .map(|(s, n, user)| {
            let mut e = event(s, *n, EventKind::Created);
            e.event.user_id = (*user).to_owned();
            e
        })
        .collect();
    assert_eq!(sink.write_batch(&batch).await?.inserted, 6);
    let found = flashsale_observe::orders::stored_orders(
        &database.url,
        sale,
        "drill:fo:r1:",
        std::time::Duration::from_secs(5),
    )
    .await?;
    let expected: std::collections::BTreeSet<String> =
        [format!("{sale}-o1"), format!("{sale}-o2")].into();
    assert_eq!(found, expected);
    database.remove().await
}

#[tokio::test]
async fn postgres_gives_a_drill_its_runs_orders() -> anyhow::Result<()> {
    a_drill_finds_its_runs_orders_by_buyer_prefix(stack::postgres_url()?).await
}

#[tokio::test]
async fn mariadb_gives_a_drill_its_runs_orders() -> anyhow::Result<()> {
    a_drill_finds_its_runs_orders_by_buyer_prefix(stack::mysql_url()?).await
}
