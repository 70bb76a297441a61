//! Whether an address leads to a given store, by what the store says of
//! itself (Redis's run id, PostgreSQL's system identifier) or what a run
//! writes through one address and finds through the other (a Kafka topic).
//! For checks that a Secret or a Service names the store it should.

use anyhow::ensure;
use sqlx::{Connection, PgConnection};

use crate::{kafka, stack};

/// Redis at `url` is the server at `reference`: the same `run_id` (a
/// replica, which refuses writes, is told apart from its primary too).
pub async fn redis(url: &str, reference: &str) -> anyhow::Result<()> {
    let (theirs, ours) = (run_id(url).await?, run_id(reference).await?);
    ensure!(
        theirs == ours,
        "Redis at {url} (run {theirs}) is not the one at {reference} (run {ours})"
    );
    Ok(())
}

async fn run_id(url: &str) -> anyhow::Result<String> {
    redis_info(url, "server", "run_id").await
}

/// One field of the `INFO section` answer of the Redis at `url`.
pub async fn redis_info(url: &str, section: &str, field: &str) -> anyhow::Result<String> {
    let mut connection = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut connection)
        .await?;
    info.lines()
        .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("Redis at {url} reports no {field}"))
}

/// PostgreSQL at `url` is the one at `reference`: the same cluster (its
/// system identifier) and the same database.
pub async fn database(url: &str, reference: &str) -> anyhow::Result<()> {
    let identity = "SELECT system_identifier::text || '/' || current_database() \
                    FROM pg_control_system()";
    let mut there = PgConnection::connect(url).await?;
    let mut known = PgConnection::connect(reference).await?;
    let theirs: String = sqlx::query_scalar(identity).fetch_one(&mut there).await?;
    let ours: String = sqlx::query_scalar(identity).fetch_one(&mut known).await?;
    ensure!(
        theirs == ours,
        "PostgreSQL at {url} ({theirs}) is not the one at {reference} ({ours})"
    );
    Ok(())
}

/// Kafka at `brokers` is the cluster at `reference`: a topic created
/// through `brokers` already exists there.
pub async fn kafka(brokers: &str, reference: &str) -> anyhow::Result<()> {
    let topic = stack::unique_name("same");
    kafka::create_topic(brokers, &topic, 1).await?;
    let again = kafka::create_topic(reference, &topic, 1).await;
    let refused = again.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(
        refused.to_lowercase().contains("already exists"),
        "Kafka at {brokers} is not the cluster at {reference}: it does not know {topic}: {refused:?}"
    );
    Ok(())
}
