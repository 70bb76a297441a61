//! What the order-writer tests share: a database of their own, the
//! writer's settings and what the database holds; topics and events come
//! from the test kit (`flashsale_e2e::orders`), which the benchmark shares.

#![allow(dead_code)] // each test binary uses its own subset

use std::{collections::BTreeSet, time::Duration};

#[allow(unused_imports)] // each test binary uses its own subset
pub use flashsale_e2e::orders::{Topics, difference, event, order_id, order_ids, produce};
use flashsale_e2e::{stack, wait::poll_until};
use flashsale_runtime::Shutdown;
use order_writer::{
    sink::Sink,
    writer::{Writer, WriterError, WriterSettings, WriterStats},
};
use sqlx::Connection;
use tokio::task::JoinHandle;

/// A database of one test's own on the stack's PostgreSQL or MariaDB server:
/// the writer migrates it from scratch, and no other test, branch or
/// workload sees its schema or its rows. [`PrivateDatabase::remove`] drops
/// it once the test passed; a failed test leaves it to be looked at.
pub struct PrivateDatabase {
    /// Its URL.
    pub url: String,
    server_url: String,
    name: String,
}

impl PrivateDatabase {
    /// Creates a fresh database on the server of `server_url`.
    pub async fn create(server_url: &str) -> anyhow::Result<Self> {
        // Lowercase letters, digits and underscores only: safe as an identifier.
        let name = stack::unique_name("orders").replace('-', "_");
        run(server_url, format!("CREATE DATABASE {name}")).await?;
        let (server, _) = server_url
            .rsplit_once('/')
            .ok_or_else(|| anyhow::anyhow!("no database in {server_url}"))?;
        Ok(Self {
            url: format!("{server}/{name}"),
            server_url: server_url.to_owned(),
            name,
        })
    }

    /// Drops the database, ending the connections still open to it.
    pub async fn remove(self) -> anyhow::Result<()> {
        let drop = if self.server_url.starts_with("mysql://") {
            format!("DROP DATABASE {}", self.name)
        } else {
            format!("DROP DATABASE {} WITH (FORCE)", self.name)
        };
        run(&self.server_url, drop).await
    }
}

/// Runs one statement built from trusted parts on the server of `url`.
async fn run(url: &str, statement: String) -> anyhow::Result<()> {
    let statement = sqlx::AssertSqlSafe(statement);
    if url.starts_with("mysql://") {
        let mut conn = sqlx::MySqlConnection::connect(url).await?;
        sqlx::query(statement).execute(&mut conn).await?;
        conn.close().await?;
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        sqlx::query(statement).execute(&mut conn).await?;
        conn.close().await?;
    }
    Ok(())
}

/// Rows stored for `sale`: a progress measure only. Whether the right
/// orders are stored, each once, is [`stored_ids`] against what was produced.
pub async fn count_rows(sink: &Sink, sale: &str) -> Result<i64, String> {
    let result = match sink {
        Sink::Postgres(pool) => {
            sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE sale = $1")
                .bind(sale)
                .fetch_one(pool)
                .await
        }
        Sink::Mysql(pool) => {
            sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE sale = ?")
                .bind(sale)
                .fetch_one(pool)
                .await
        }
    };
    result.map_err(|e| e.to_string())
}

/// The order ids stored for `sale`.
pub async fn stored_ids(sink: &Sink, sale: &str) -> Result<BTreeSet<String>, String> {
    let ids: Result<Vec<String>, _> = match sink {
        Sink::Postgres(pool) => {
            sqlx::query_scalar("SELECT order_id FROM orders WHERE sale = $1")
                .bind(sale)
                .fetch_all(pool)
                .await
        }
        Sink::Mysql(pool) => {
            sqlx::query_scalar("SELECT order_id FROM orders WHERE sale = ?")
                .bind(sale)
                .fetch_all(pool)
                .await
        }
    };
    let ids = ids.map_err(|e| e.to_string())?;
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    if unique.len() == ids.len() {
        Ok(unique)
    } else {
        Err(format!(
            "{} rows hold {} order ids",
            ids.len(),
            unique.len()
        ))
    }
}

/// Polls until `sale` holds exactly the orders `expected`: none missing,
/// none the test did not produce.
pub async fn wait_stored_exactly(
    sink: &Sink,
    sale: &str,
    expected: &BTreeSet<String>,
    within: Duration,
) -> anyhow::Result<()> {
    poll_until(
        "exactly the produced orders stored",
        within,
        Duration::from_millis(200),
        || async {
            // Counting is cheap; the ids are read once there are enough rows.
            let rows = count_rows(sink, sale).await?;
            if rows < expected.len() as i64 {
                return Err(format!("{rows} of {} rows", expected.len()));
            }
            let stored = stored_ids(sink, sale).await?;
            match difference(&stored, expected) {
                None => Ok(()),
                Some(diff) => Err(diff),
            }
        },
    )
    .await
    .map_err(Into::into)
}

/// The value of the unlabelled sample `name` in the registry's exposition,
/// `None` when the registry has no such sample.
pub fn sample(
    registry: &prometheus_client::registry::Registry,
    name: &str,
) -> anyhow::Result<Option<i64>> {
    let text = flashsale_runtime::metrics::render(registry)?;
    Ok(flashsale_e2e::metrics::sample(&text, name).map(|value| value as i64))
}

/// The writer settings the tests run with, for `group` on these topics.
pub fn writer_settings(brokers: &str, topic: &str, dlq: &str, group: &str) -> WriterSettings {
    WriterSettings {
        brokers: brokers.to_owned(),
        group_id: group.to_owned(),
        topic: topic.to_owned(),
        dlq_topic: dlq.to_owned(),
        batch_size: 200,
        flush_interval: Duration::from_millis(100),
        write_concurrency: 2,
        // Short, so tests that stop a writer see its partitions move soon;
        // the broker failover test uses the production default.
        session_timeout: Duration::from_secs(10),
    }
}

/// A running writer's end: what `run` returned, and whether it left its
/// consumer group within 10 s of stopping.
pub type WriterEnd = (Result<WriterStats, WriterError>, bool);

/// Runs `writer` on its own task until `shutdown` triggers, then closes it.
pub fn spawn_writer(writer: Writer, shutdown: &Shutdown) -> JoinHandle<WriterEnd> {
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let stats = writer.run(shutdown).await;
        (stats, writer.close(Duration::from_secs(10)).await)
    })
}
