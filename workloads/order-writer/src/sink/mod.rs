//! Writing a batch of order events in one transaction, idempotently, to
//! PostgreSQL or a MySQL-protocol database (MySQL, MariaDB, TiDB).
//!
//! New orders go in with a plain insert: the common case, and the fastest.
//! A unique violation means the batch holds an order seen before; the
//! transaction is then run again *checked*: the stored orders sharing an
//! idempotency key or an order id with the batch are read first, a replay of
//! the same order is skipped and a clash (the key under another order id, the
//! order id under another key) is reported as a [`Conflict`]. Status events
//! only move an order forward; one whose order is not stored is reported in
//! [`BatchOutcome::missing_orders`]. Nothing is dropped without a report.

/// Applies the batch's status moves in order with the database's forward-only
/// UPDATE `$move` (`status`, `order_id` placeholders); one that changed nothing is
/// checked with the count query `$stored` (`order_id` placeholder). Evaluates to the rows
/// changed and the positions of moves whose order is not stored.
macro_rules! apply_moves {
    ($tx:ident, $batch:expr, $move:expr, $stored:expr) => {{
        let (mut changed, mut missing) = (0, Vec::new());
        for index in $crate::sink::positions($batch, |k| k != flashsale_orders::EventKind::Created)
        {
            let event = &$batch[index].event;
            let moved = sqlx::query($move)
                .bind($crate::sink::status(event.kind))
                .bind(&event.order_id)
                .execute(&mut *$tx)
                .await?
                .rows_affected();
            changed += moved;
            // Zero rows: already moved (a replay or a late event), or no such order.
            if moved == 0 {
                let stored: i64 = sqlx::query_scalar($stored)
                    .bind(&event.order_id)
                    .fetch_one(&mut *$tx)
                    .await?;
                if stored == 0 {
                    missing.push(index);
                }
            }
        }
        (changed, missing)
    }};
}

mod identity;
mod mysql;
mod postgres;

use flashsale_orders::{EventKind, OrderEvent};
use sqlx::{MySqlPool, PgPool};

pub use identity::{Conflict, ConflictKind};

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Orders inserted (events seen for the first time).
    pub inserted: u64,
    /// Status changes applied (forward moves only).
    pub status_changes: u64,
    /// Positions in the batch of `paid` or `expired` events whose order is
    /// not stored: nothing was changed for them.
    pub missing_orders: Vec<usize>,
    /// `created` events not stored because they clash with a stored order.
    pub conflicts: Vec<Conflict>,
}

/// The order database.
#[derive(Debug, Clone)]
pub enum Sink {
    /// PostgreSQL.
    Postgres(PgPool),
    /// MySQL protocol.
    Mysql(MySqlPool),
}

/// How a transaction inserts its new orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Insert {
    /// Every `created` event, without looking: a replayed one fails the
    /// insert with a unique violation.
    Blind,
    /// Only those that the stored orders show to be new.
    Checked,
}

/// Checked transactions after a blind one met a unique violation: the
/// second covers a writer that stored one of the keys between our look-up
/// and our insert (a rebalance replaying a batch its old owner is still
/// writing). A third violation is returned, and the writer retries the
/// events one at a time.
const CHECKED_ATTEMPTS: usize = 2;

fn status(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "pending_payment",
        EventKind::Paid => "paid",
        EventKind::Expired => "expired",
    }
}

/// Positions in `batch` of the events whose kind passes `keep`.
fn positions(batch: &[SourcedEvent], keep: impl Fn(EventKind) -> bool) -> Vec<usize> {
    (0..batch.len())
        .filter(|&i| keep(batch[i].event.kind))
        .collect()
}

/// The quantity as the schema's INTEGER; validation bounds it far lower.
fn quantity(event: &OrderEvent) -> i32 {
    i32::try_from(event.quantity).unwrap_or(i32::MAX)
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

    /// Writes a batch in one transaction: the new orders, then the status
    /// moves, which only go forward (pending_payment → paid or expired).
    /// Replaying a batch changes nothing; what could not be applied is in
    /// the outcome (see the module documentation).
    pub async fn write_batch(&self, batch: &[SourcedEvent]) -> Result<BatchOutcome, SinkError> {
        let mut insert = Insert::Blind;
        let mut checked = 0;
        loop {
            let written = match self {
                Self::Postgres(pool) => postgres::write(pool, batch, insert).await,
                Self::Mysql(pool) => mysql::write(pool, batch, insert).await,
            };
            match written {
                Err(SinkError::Database(sqlx::Error::Database(db)))
                    if db.is_unique_violation() && checked < CHECKED_ATTEMPTS =>
                {
                    insert = Insert::Checked;
                    checked += 1;
                }
                other => return other,
            }
        }
    }
}
