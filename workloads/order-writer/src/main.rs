//! The flash-sale order-writer: drains order events from Kafka into SQL in idempotent batches.

use clap::Parser;
use flashsale_runtime::{Process, Readiness, RuntimeArgs};

/// The flash-sale order-writer: drains order events from Kafka into SQL in idempotent batches.
#[derive(Debug, Parser)]
#[command(name = "order-writer", version)]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let process = Process::start("order-writer", env!("CARGO_PKG_VERSION"), &args.runtime.log)?;
    process
        .serve_ops(&args.runtime.ops, Readiness::default())
        .await?;
    Ok(())
}
