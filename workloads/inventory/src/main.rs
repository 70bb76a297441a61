//! The flash-sale inventory service: atomic stock reservations in Redis that never oversell.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::Parser;
use flashsale_runtime::{Process, Readiness, RuntimeArgs};
use inventory::{
    api::{self, AppState},
    metrics::Metrics,
    store::{SaleDefinition, Store},
    sweeper,
};

/// The flash-sale inventory service: atomic stock reservations in Redis that never oversell.
#[derive(Debug, Parser)]
#[command(name = "inventory", version)]
struct Args {
    /// Address of the reservation API.
    #[arg(long, env = "INVENTORY_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Redis holding the stock.
    #[arg(long, env = "REDIS_URL")]
    redis_url: String,
    /// A sale definition (JSON) to load at start; loading never resets counts.
    #[arg(long, env = "INVENTORY_SALE_FILE")]
    sale_file: Option<PathBuf>,
    /// How often unpaid reservations are looked for.
    #[arg(long, env = "INVENTORY_SWEEP_INTERVAL_MS", default_value_t = 250)]
    sweep_interval_ms: u64,
    /// How long a replica answers "sold out" from memory before asking Redis again.
    #[arg(long, env = "INVENTORY_SOLD_OUT_STALENESS_MS", default_value_t = 200)]
    sold_out_staleness_ms: u64,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut process = Process::start("inventory", env!("CARGO_PKG_VERSION"), &args.runtime.log)?;
    let metrics = Metrics::register(process.registry_mut());
    let store = Store::connect(&args.redis_url)
        .await
        .context("connecting to Redis")?;
    if let Some(path) = &args.sale_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let def: SaleDefinition =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let loaded = store.load(&def).await.context("loading the sale")?;
        tracing::info!(sale = def.sale, ?loaded, "sale loaded");
    }
    let state = AppState::new(
        store.clone(),
        metrics.clone(),
        Duration::from_millis(args.sold_out_staleness_ms),
    );
    let shutdown = process.shutdown();
    tokio::spawn(sweeper::run(
        store.clone(),
        state.clone(),
        metrics,
        Duration::from_millis(args.sweep_interval_ms.max(10)),
        shutdown.clone(),
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(addr = %args.listen, "reservation API listening");
    let api = axum::serve(listener, api::router(state))
        .with_graceful_shutdown(async move { shutdown.wait().await });
    let readiness = Readiness::default().with_check("redis", move || {
        let store = store.clone();
        async move { store.ping().await.map_err(|e| e.to_string()) }
    });
    let (api, ops) = tokio::join!(api, process.serve_ops(&args.runtime.ops, readiness));
    api.context("reservation API failed")?;
    ops?;
    Ok(())
}
