//! The flash-sale order-writer: drains order events from Kafka into SQL in idempotent batches.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use flashsale_runtime::{Process, RuntimeArgs};
use order_writer::{
    metrics::WriterMetrics,
    sink::Sink,
    writer::{DEFAULT_SESSION_TIMEOUT, Writer, WriterSettings},
};

/// The flash-sale order-writer: drains order events from Kafka into SQL in idempotent batches.
#[derive(Debug, Parser)]
#[command(name = "order-writer", version)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS")]
    brokers: String,
    /// Consumer group shared by every replica.
    #[arg(
        long,
        env = "ORDER_WRITER_GROUP",
        default_value = "flashsale-order-writer"
    )]
    group: String,
    /// Topic of order events.
    #[arg(long, env = "ORDER_TOPIC", default_value = "flashsale.orders")]
    topic: String,
    /// Dead-letter topic.
    #[arg(long, env = "ORDER_DLQ_TOPIC", default_value = "flashsale.orders.dlq")]
    dlq_topic: String,
    /// Database URL: postgres://… or mysql://… (MySQL, MariaDB, TiDB).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Events per database transaction, at most.
    #[arg(long, env = "ORDER_WRITER_BATCH_SIZE", default_value_t = 200)]
    batch_size: usize,
    /// Longest wait before a partial batch is written, in milliseconds.
    #[arg(long, env = "ORDER_WRITER_FLUSH_INTERVAL_MS", default_value_t = 100)]
    flush_interval_ms: u64,
    /// Transactions written at once, each for its own partitions.
    #[arg(long, env = "ORDER_WRITER_WRITE_CONCURRENCY", default_value_t = 2)]
    write_concurrency: usize,
    /// How long the consumer group waits for a silent replica before its
    /// partitions move to the others, in milliseconds (the broker bounds it,
    /// 6000 at least by default). Keep it above a broker failover's length,
    /// or every broker loss costs a rebalance.
    #[arg(
        long,
        env = "ORDER_WRITER_SESSION_TIMEOUT_MS",
        default_value_t = DEFAULT_SESSION_TIMEOUT.as_millis() as u64
    )]
    session_timeout_ms: u64,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut process = Process::start("order-writer", env!("CARGO_PKG_VERSION"), &args.runtime.log)?;
    let metrics = WriterMetrics::register(process.registry_mut());
    let sink = Sink::connect(&args.database_url, 4)
        .await
        .context("connecting to the database")?;
    let writer = Writer::new(
        WriterSettings {
            brokers: args.brokers.clone(),
            group_id: args.group.clone(),
            topic: args.topic.clone(),
            dlq_topic: args.dlq_topic.clone(),
            batch_size: args.batch_size.clamp(1, 10_000),
            flush_interval: Duration::from_millis(args.flush_interval_ms.max(1)),
            session_timeout: Duration::from_millis(args.session_timeout_ms),
            write_concurrency: args.write_concurrency.clamp(1, 16),
        },
        sink,
        metrics,
    )?;
    let readiness = writer.readiness();
    let shutdown = process.shutdown();
    let (stats, ops) = tokio::join!(
        writer.run(shutdown),
        process.serve_ops(&args.runtime.ops, readiness)
    );
    let stats = stats.context("order-writer stopped")?;
    tracing::info!(?stats, "stopped after committing what it stored");
    if !writer.close(Duration::from_secs(5)).await {
        tracing::warn!(
            "leaving the consumer group timed out; the group reassigns after the session timeout"
        );
    }
    ops?;
    Ok(())
}
