//! The flash-sale gateway: the only public entry, shedding load cheaply before it reaches stock or orders.

use clap::Parser;
use flashsale_runtime::{Process, Readiness, RuntimeArgs};

/// The flash-sale gateway: the only public entry, shedding load cheaply before it reaches stock or orders.
#[derive(Debug, Parser)]
#[command(name = "gateway", version)]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let process = Process::start("gateway", env!("CARGO_PKG_VERSION"), &args.runtime.log)?;
    process
        .serve_ops(&args.runtime.ops, Readiness::default())
        .await?;
    Ok(())
}
