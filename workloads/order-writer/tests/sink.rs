//! Idempotent batches on the real PostgreSQL and MariaDB of the local stack,
//! each test in a database of its own.

mod common;

use flashsale_e2e::stack;
use flashsale_orders::{EventKind, OrderEvent, SCHEMA_VERSION};
use order_writer::sink::{Sink, SourcedEvent};

/// A sink on a fresh database of the server at `server_url`.
async fn private_sink(server_url: String, connections: u32) -> anyhow::Result<Sink> {
    let url = common::private_database(&server_url).await?;
    Ok(Sink::connect(&url, connections).await?)
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
    let sink = private_sink(url, 4).await?;
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
    Ok(())
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
    let sink = private_sink(url, 1).await?;
    let sale = stack::unique_name("sink-large");
    let mut batch: Vec<SourcedEvent> = (0..10_000)
        .map(|n| event(&sale, n, EventKind::Created))
        .collect();
    assert_eq!(sink.write_batch(&batch[..4_000]).await?.inserted, 4_000);
    batch.push(event(&sale, 7, EventKind::Paid));
    let outcome = sink.write_batch(&batch).await?;
    assert_eq!((outcome.inserted, outcome.status_changes), (6_000, 1));
    assert_eq!(statuses(&sink, &sale).await?.len(), 10_000);
    Ok(())
}

#[tokio::test]
async fn postgres_takes_the_largest_batch() -> anyhow::Result<()> {
    the_largest_batch_is_stored_in_one_go(stack::postgres_url()?).await
}

#[tokio::test]
async fn mariadb_takes_the_largest_batch() -> anyhow::Result<()> {
    the_largest_batch_is_stored_in_one_go(stack::mysql_url()?).await
}

/// Sale ids are `<namespace>.<name>.<8 hex>`: up to 128 characters, stored
/// whole.
async fn a_sale_id_of_128_characters_is_stored(url: String) -> anyhow::Result<()> {
    let sink = private_sink(url, 1).await?;
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
    Ok(())
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
