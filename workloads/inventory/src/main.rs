//! The flash-sale inventory service: atomic stock reservations in Redis that never oversell.

use clap::Parser;
use flashsale_runtime::{Process, Readiness, RuntimeArgs};

/// The flash-sale inventory service: atomic stock reservations in Redis that never oversell.
#[derive(Debug, Parser)]
#[command(name = "inventory", version)]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let process = Process::start("inventory", env!("CARGO_PKG_VERSION"), &args.runtime.log)?;
    process
        .serve_ops(&args.runtime.ops, Readiness::default())
        .await?;
    Ok(())
}
