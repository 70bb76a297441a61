//! One batch in one transaction on a MySQL-protocol database (MySQL,
//! MariaDB, TiDB).

use flashsale_orders::EventKind;
use sqlx::{MySql, MySqlPool, QueryBuilder, Transaction};

use super::{
    BatchOutcome, Insert, SinkError, SourcedEvent,
    identity::{self, StoredIdentity},
    quantity, status, time_of,
};

/// Rows per statement: 12 placeholders each stays far below the protocol's
/// 65,535, whatever the batch size.
const ROWS_PER_STATEMENT: usize = 1_000;

/// A forward-only status move.
const MOVE: &str = "UPDATE orders SET status = ?, updated_at = CURRENT_TIMESTAMP(6) \
     WHERE order_id = ? AND status = 'pending_payment'";

/// Whether an order is stored, for a move that changed nothing.
const STORED: &str = "SELECT COUNT(*) FROM orders WHERE order_id = ?";

/// Writes `batch`: its new orders, then its status moves, in one transaction.
pub(super) async fn write(
    pool: &MySqlPool,
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
    for rows in fresh.chunks(ROWS_PER_STATEMENT) {
        // A plain insert: a key or order id already stored fails it with a
        // unique violation, which is what tells a replay apart (the protocol
        // counts a row skipped by ON DUPLICATE KEY as found).
        let mut insert = QueryBuilder::<MySql>::new(
            "INSERT INTO orders (order_id, idempotency_key, sale, user_id, sku, quantity, \
             amount_minor, reservation_id, status, created_at, kafka_partition, kafka_offset) ",
        );
        insert.push_values(rows, |mut row, &i| {
            let e = &batch[i];
            row.push_bind(e.event.order_id.clone())
                .push_bind(e.event.idempotency_key.clone())
                .push_bind(e.event.sale.clone())
                .push_bind(e.event.user_id.clone())
                .push_bind(e.event.sku.clone())
                .push_bind(quantity(&e.event))
                .push_bind(e.event.amount_minor)
                .push_bind(e.event.reservation_id.clone())
                .push_bind(status(EventKind::Created))
                .push_bind(time_of(e.event.created_at))
                .push_bind(e.partition)
                .push_bind(e.offset);
        });
        outcome.inserted += insert.build().execute(&mut *tx).await?.rows_affected();
    }
    let (changed, missing) = apply_moves!(tx, batch, MOVE, STORED);
    outcome.status_changes = changed;
    outcome.missing_orders = missing;
    tx.commit().await?;
    Ok(outcome)
}

/// Stored orders sharing a key or an order id with the `created` events,
/// as the database's collation compares them.
async fn lookup(
    tx: &mut Transaction<'_, MySql>,
    batch: &[SourcedEvent],
    created: &[usize],
) -> Result<Vec<StoredIdentity>, SinkError> {
    let mut stored = Vec::new();
    for rows in created.chunks(ROWS_PER_STATEMENT) {
        let mut query = QueryBuilder::<MySql>::new(
            "SELECT order_id, idempotency_key FROM orders WHERE idempotency_key IN ",
        );
        query.push_tuples(rows, |mut t, &i| {
            t.push_bind(batch[i].event.idempotency_key.clone());
        });
        query.push(" OR order_id IN ");
        query.push_tuples(rows, |mut t, &i| {
            t.push_bind(batch[i].event.order_id.clone());
        });
        let found: Vec<(String, String)> = query.build_query_as().fetch_all(&mut **tx).await?;
        stored.extend(
            found
                .into_iter()
                .map(|(order_id, idempotency_key)| StoredIdentity {
                    order_id,
                    idempotency_key,
                }),
        );
    }
    Ok(stored)
}
