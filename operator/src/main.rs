//! `flashsale-operator`: the Kubernetes operator that runs flash sales and
//! proves they survive failure.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use flashsale_operator::{
    crdgen,
    run::{RunArgs, run},
};

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
    Run(Box<RunArgs>),
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
        Command::Run(args) => run(*args).await,
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
