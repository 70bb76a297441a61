//! One batch in one PostgreSQL transaction.

use flashsale_orders::{EventKind, OrderEvent};
use sqlx::{PgPool, Postgres, Transaction};

use super::{
    BatchOutcome, Insert, SinkError, SourcedEvent,
    identity::{self, StoredIdentity},
    quantity, status, time_of,
};

/// The new orders as one array per column. One statement text for every
/// batch size (a single prepared statement) and no bind-parameter limit;
/// measured a little faster than a multi-row VALUES list (see
/// docs/benchmarks.md). A plain insert: a key or order id already
/// stored fails it with a unique violation.
const INSERT: &str = "INSERT INTO orders (order_id, idempotency_key, sale, user_id, sku, \
     quantity, amount_minor, reservation_id, status, created_at, kafka_partition, kafka_offset) \
     SELECT * FROM UNNEST($1::varchar[], $2::varchar[], $3::varchar[], $4::varchar[], \
     $5::varchar[], $6::int4[], $7::int8[], $8::varchar[], $9::varchar[], \
     $10::timestamptz[], $11::int4[], $12::int8[])";

/// Stored orders sharing a key or an order id with the batch.
const LOOKUP: &str = "SELECT order_id, idempotency_key FROM orders \
     WHERE idempotency_key = ANY($1::varchar[]) OR order_id = ANY($2::varchar[])";

/// A forward-only status move.
const MOVE: &str = "UPDATE orders SET status = $1, updated_at = now() \
     WHERE order_id = $2 AND status = 'pending_payment'";

/// Whether an order is stored, for a move that changed nothing.
const STORED: &str = "SELECT COUNT(*) FROM orders WHERE order_id = $1";

/// Writes `batch`: its new orders, then its status moves, in one transaction.
pub(super) async fn write(
    pool: &PgPool,
    batch: &[SourcedEvent],
    insert: Insert,
) -> Result<BatchOutcome, SinkError> {
    let created = super::positions(batch, |k| k == EventKind::Created);
    let mut outcome = BatchOutcome::default();
    let mut tx = pool.begin().await?;
    let fresh = match insert {
        Insert::Blind => created,
        Insert::Checked => {
            let stored = lookup(&mut tx, batch, &created).await?;
            let plan = identity::plan(batch, &created, &stored);
            outcome.conflicts = plan.conflicts;
            plan.fresh
        }
    };
    outcome.inserted = insert_rows(&mut tx, batch, &fresh).await?;
    let (changed, missing) = apply_moves!(tx, batch, MOVE, STORED);
    outcome.status_changes = changed;
    outcome.missing_orders = missing;
    tx.commit().await?;
    Ok(outcome)
}

async fn lookup(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[SourcedEvent],
    created: &[usize],
) -> Result<Vec<StoredIdentity>, SinkError> {
    if created.is_empty() {
        return Ok(Vec::new());
    }
    let text = |f: fn(&OrderEvent) -> &String| -> Vec<&str> {
        created
            .iter()
            .map(|&i| f(&batch[i].event).as_str())
            .collect()
    };
    let rows: Vec<(String, String)> = sqlx::query_as(LOOKUP)
        .bind(text(|e| &e.idempotency_key))
        .bind(text(|e| &e.order_id))
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(order_id, idempotency_key)| StoredIdentity {
            order_id,
            idempotency_key,
        })
        .collect())
}

async fn insert_rows(
    tx: &mut Transaction<'_, Postgres>,
    batch: &[SourcedEvent],
    rows: &[usize],
) -> Result<u64, SinkError> {
    if rows.is_empty() {
        return Ok(0);
    }
    let rows: Vec<&SourcedEvent> = rows.iter().map(|&i| &batch[i]).collect();
    let text = |f: fn(&OrderEvent) -> &String| -> Vec<&str> {
        rows.iter().map(|e| f(&e.event).as_str()).collect()
    };
    let inserted = sqlx::query(INSERT)
        .bind(text(|e| &e.order_id))
        .bind(text(|e| &e.idempotency_key))
        .bind(text(|e| &e.sale))
        .bind(text(|e| &e.user_id))
        .bind(text(|e| &e.sku))
        .bind(rows.iter().map(|e| quantity(&e.event)).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|e| e.event.amount_minor)
                .collect::<Vec<_>>(),
        )
        .bind(text(|e| &e.reservation_id))
        .bind(vec![status(EventKind::Created); rows.len()])
        .bind(
            rows.iter()
                .map(|e| time_of(e.event.created_at))
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|e| e.partition).collect::<Vec<_>>())
        .bind(rows.iter().map(|e| e.offset).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?
        .rows_affected();
    Ok(inserted)
}
