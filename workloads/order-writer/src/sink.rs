//! Writing a batch of order events in one transaction, idempotently, to
//! PostgreSQL or a MySQL-protocol database (MySQL, MariaDB, TiDB).

use flashsale_orders::{EventKind, OrderEvent};
use sqlx::{MySqlPool, PgPool, QueryBuilder};

/// Errors from the database.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The database failed or refused the batch.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("migrating the orders schema: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The URL names no supported database.
    #[error("unsupported database URL {0:?}: use postgres:// or mysql://")]
    UnsupportedUrl(String),
}

/// An event with where it came from in Kafka.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedEvent {
    /// The event.
    pub event: OrderEvent,
    /// Partition it was read from.
    pub partition: i32,
    /// Offset it was read at.
    pub offset: i64,
}

/// What a batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Orders inserted (events seen for the first time).
    pub inserted: u64,
    /// Status changes applied (forward moves only).
    pub status_changes: u64,
}

/// The order database.
#[derive(Debug, Clone)]
pub enum Sink {
    /// PostgreSQL.
    Postgres(PgPool),
    /// MySQL protocol.
    Mysql(MySqlPool),
}

fn status(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "pending_payment",
        EventKind::Paid => "paid",
        EventKind::Expired => "expired",
    }
}

/// PostgreSQL: the batch as one array per column. One statement text for
/// every batch size (a single prepared statement) and no bind-parameter
/// limit; measured a little faster than a multi-row VALUES list (see
/// docs/benchmarks.md).
macro_rules! pg_insert {
    () => {
        "INSERT INTO orders (order_id, idempotency_key, sale, user_id, sku, quantity, \
         amount_minor, reservation_id, status, created_at, kafka_partition, kafka_offset) \
         SELECT * FROM UNNEST($1::varchar[], $2::varchar[], $3::varchar[], $4::varchar[], \
         $5::varchar[], $6::int4[], $7::int8[], $8::varchar[], $9::varchar[], \
         $10::timestamptz[], $11::int4[], $12::int8[])"
    };
}

/// How a PostgreSQL batch inserts its new orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PgInsert {
    /// A plain insert: the common case, about 1.4× faster than skipping
    /// conflicts; a replayed key fails it with a unique violation.
    AllNew,
    /// Skips keys already stored: the retry after a replay was detected.
    SkipKnown,
}

impl PgInsert {
    fn sql(self) -> &'static str {
        match self {
            Self::AllNew => pg_insert!(),
            Self::SkipKnown => concat!(pg_insert!(), " ON CONFLICT DO NOTHING"),
        }
    }
}

/// Rows per MySQL statement: 12 placeholders each stays far below the
/// protocol's 65,535, whatever the batch size.
const MYSQL_ROWS_PER_STATEMENT: usize = 1_000;

/// A MySQL multi-row insert of `rows`; a duplicate key is a no-op.
fn mysql_insert(rows: &[&SourcedEvent]) -> QueryBuilder<sqlx::MySql> {
    let mut insert = QueryBuilder::new(
        "INSERT INTO orders (order_id, idempotency_key, sale, user_id, sku, quantity, \
         amount_minor, reservation_id, status, created_at, kafka_partition, kafka_offset) ",
    );
    insert.push_values(rows, |mut row, e| {
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
    insert.push(" ON DUPLICATE KEY UPDATE order_id = order_id");
    insert
}

/// The quantity as the schema's INTEGER; validation bounds it far lower.
fn quantity(event: &OrderEvent) -> i32 {
    i32::try_from(event.quantity).unwrap_or(i32::MAX)
}

/// Applies forward-only status moves with the database's UPDATE statement
/// (`status`, `order_id` placeholders); evaluates to the rows changed.
macro_rules! move_status {
    ($tx:ident, $moves:expr, $sql:literal) => {{
        let mut changed = 0;
        for e in $moves {
            let done = sqlx::query($sql)
                .bind(status(e.event.kind))
                .bind(&e.event.order_id)
                .execute(&mut *$tx)
                .await?;
            changed += done.rows_affected();
        }
        changed
    }};
}

/// The event time as a UTC date-time both drivers bind.
fn time_of(ts: jiff::Timestamp) -> sqlx::types::chrono::DateTime<sqlx::types::chrono::Utc> {
    sqlx::types::chrono::DateTime::from_timestamp_micros(ts.as_microsecond()).unwrap_or_default()
}

impl Sink {
    /// Connects by URL scheme and applies the migrations of that family.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, SinkError> {
        let sink = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(max_connections)
                .connect(url)
                .await?;
            Self::Postgres(pool)
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(max_connections)
                .connect(url)
                .await?;
            Self::Mysql(pool)
        } else {
            return Err(SinkError::UnsupportedUrl(url.to_owned()));
        };
        sink.migrate().await?;
        Ok(sink)
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), SinkError> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query("SELECT 1").execute(pool).await?;
            }
            Self::Mysql(pool) => {
                sqlx::query("SELECT 1").execute(pool).await?;
            }
        }
        Ok(())
    }

    async fn migrate(&self) -> Result<(), SinkError> {
        match self {
            Self::Postgres(pool) => sqlx::migrate!("./migrations/postgres").run(pool).await?,
            Self::Mysql(pool) => sqlx::migrate!("./migrations/mysql").run(pool).await?,
        }
        Ok(())
    }

    /// Writes a batch in one transaction: new orders in one multi-row insert
    /// that ignores idempotency keys already stored, then status moves that
    /// only go forward (pending_payment → paid or expired). Replaying a batch
    /// changes nothing.
    pub async fn write_batch(&self, batch: &[SourcedEvent]) -> Result<BatchOutcome, SinkError> {
        let created: Vec<&SourcedEvent> = batch
            .iter()
            .filter(|e| e.event.kind == EventKind::Created)
            .collect();
        let moves: Vec<&SourcedEvent> = batch
            .iter()
            .filter(|e| e.event.kind != EventKind::Created)
            .collect();
        let mut outcome = BatchOutcome::default();
        match self {
            Self::Postgres(pool) => {
                outcome = match pg_write(pool, &created, &moves, PgInsert::AllNew).await {
                    Err(SinkError::Database(sqlx::Error::Database(db)))
                        if db.is_unique_violation() =>
                    {
                        pg_write(pool, &created, &moves, PgInsert::SkipKnown).await?
                    }
                    other => other?,
                };
            }
            Self::Mysql(pool) => {
                let mut tx = pool.begin().await?;
                // The MySQL protocol reports a skipped duplicate as a found
                // row, so count the new ones by looking first.
                for rows in created.chunks(MYSQL_ROWS_PER_STATEMENT) {
                    let mut known = QueryBuilder::new(
                        "SELECT idempotency_key FROM orders WHERE idempotency_key IN ",
                    );
                    known.push_tuples(rows, |mut t, e| {
                        t.push_bind(e.event.idempotency_key.clone());
                    });
                    let existing: std::collections::HashSet<String> = known
                        .build_query_scalar()
                        .fetch_all(&mut *tx)
                        .await?
                        .into_iter()
                        .collect();
                    let fresh: Vec<&SourcedEvent> = rows
                        .iter()
                        .copied()
                        .filter(|e| !existing.contains(&e.event.idempotency_key))
                        .collect();
                    if !fresh.is_empty() {
                        // Still safe if another writer raced us: a duplicate is a no-op.
                        mysql_insert(&fresh).build().execute(&mut *tx).await?;
                        outcome.inserted += fresh.len() as u64;
                    }
                }
                outcome.status_changes = move_status!(
                    tx,
                    &moves,
                    "UPDATE orders SET status = ?, updated_at = CURRENT_TIMESTAMP(6) WHERE order_id = ? AND status = 'pending_payment'"
                );
                tx.commit().await?;
            }
        }
        Ok(outcome)
    }
}

/// One PostgreSQL transaction: the new orders, then the status moves.
async fn pg_write(
    pool: &PgPool,
    created: &[&SourcedEvent],
    moves: &[&SourcedEvent],
    insert: PgInsert,
) -> Result<BatchOutcome, SinkError> {
    let mut outcome = BatchOutcome::default();
    let mut tx = pool.begin().await?;
    if !created.is_empty() {
        let text = |f: fn(&OrderEvent) -> &String| -> Vec<&str> {
            created.iter().map(|e| f(&e.event).as_str()).collect()
        };
        outcome.inserted = sqlx::query(insert.sql())
            .bind(text(|e| &e.order_id))
            .bind(text(|e| &e.idempotency_key))
            .bind(text(|e| &e.sale))
            .bind(text(|e| &e.user_id))
            .bind(text(|e| &e.sku))
            .bind(
                created
                    .iter()
                    .map(|e| quantity(&e.event))
                    .collect::<Vec<_>>(),
            )
            .bind(
                created
                    .iter()
                    .map(|e| e.event.amount_minor)
                    .collect::<Vec<_>>(),
            )
            .bind(text(|e| &e.reservation_id))
            .bind(vec![status(EventKind::Created); created.len()])
            .bind(
                created
                    .iter()
                    .map(|e| time_of(e.event.created_at))
                    .collect::<Vec<_>>(),
            )
            .bind(created.iter().map(|e| e.partition).collect::<Vec<_>>())
            .bind(created.iter().map(|e| e.offset).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    outcome.status_changes = move_status!(
        tx,
        moves,
        "UPDATE orders SET status = $1, updated_at = now() WHERE order_id = $2 AND status = 'pending_payment'"
    );
    tx.commit().await?;
    Ok(outcome)
}
