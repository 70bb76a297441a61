//! `flashsale-operator`: the Kubernetes operator that runs flash sales and
//! proves they survive failure.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use flashsale_operator::crdgen;
use flashsale_runtime::{Process, Readiness, RuntimeArgs};

/// Runs flash sales on Kubernetes: FlashSale, DegradationPolicy and ChaosDrill.
#[derive(Debug, Parser)]
#[command(name = "flashsale-operator", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the operator against the cluster of the current kubeconfig (or the
    /// in-cluster service account).
    Run {
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
    /// Print the CustomResourceDefinitions (install with `| kubectl apply --server-side -f -`),
    /// or write one file per CRD into a folder.
    Crd {
        /// Write `<group>_<plural>.yaml` files here instead of printing.
        #[arg(long)]
        output_dir: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run { runtime } => run(runtime).await,
        Command::Crd {
            output_dir: Some(dir),
        } => {
            for path in crdgen::write_all(&dir)? {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Command::Crd { output_dir: None } => {
            for (_, yaml) in crdgen::render_all()? {
                print!("---\n{yaml}");
            }
            Ok(())
        }
    }
}

async fn run(runtime: RuntimeArgs) -> anyhow::Result<()> {
    let process = Process::start(
        "flashsale-operator",
        env!("CARGO_PKG_VERSION"),
        &runtime.log,
    )?;
    let client = kube::Client::try_default().await.map_err(|err| {
        anyhow::anyhow!(
            "cannot build a Kubernetes client from the kubeconfig or service account: {err}"
        )
    })?;
    // Ready means the apiserver answers; controllers join this in later stages.
    let readiness = Readiness::default().with_check("apiserver", move || {
        let client = client.clone();
        async move {
            client
                .apiserver_version()
                .await
                .map(|_| ())
                .map_err(|err| format!("apiserver unreachable: {err}"))
        }
    });
    process.serve_ops(&runtime.ops, readiness).await?;
    Ok(())
}
