//! The command line: every command, flag and example `--help` shows.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

use flashsale_api::Duration;

const EXIT_CODES: &str = "\
Exit codes:
  0  done (for `failover check`: the standby is ready)
  1  refused: by the apiserver (permission, not found), by the plugin (no run
     in progress, a tier the policy does not define) or by the operator (a
     run-now request it skipped; a standby that is not ready)
  2  usage: a missing or invalid flag
  3  timed out waiting for the operator or the gateways to act";

/// On-call's commands for flash sales run by the flashsale operator: one
/// command per runbook action, each read back from the status the operator
/// wrote.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-flashsale",
    bin_name = "kubectl flashsale",
    version,
    after_help = EXIT_CODES,
    after_long_help = EXIT_CODES
)]
pub struct Cli {
    /// The cluster to talk to.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Where and as whom: the same flags as kubectl's.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The namespace; the kubeconfig context's when unset.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Every namespace (status, abort-all).
    #[arg(short = 'A', long, global = true, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// The kubeconfig file; $KUBECONFIG or ~/.kube/config when unset.
    #[arg(long, global = true, env = "KUBECONFIG", hide_env_values = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Act as this user (impersonation), as `kubectl --as`.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub impersonate: Option<String>,
    /// Act as this group too (repeatable), as `kubectl --as-group`.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub impersonate_groups: Vec<String>,
    /// Output format: text for people, json or yaml for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Colour in text output: auto colours a terminal unless NO_COLOR is set.
    #[arg(long, global = true, value_enum, default_value_t = Colour::Auto)]
    pub color: Colour,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Compact text.
    Text,
    /// JSON, one document (one per redraw with --watch).
    Json,
    /// YAML, one document (one per redraw with --watch).
    Yaml,
}

/// When to colour text output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Colour {
    /// On a terminal, unless NO_COLOR is set.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Each sale at a glance: phase, stock, funnel, tier, drills, failover.
    #[command(after_help = "\
Examples:
  kubectl flashsale status                      # every sale of the namespace
  kubectl flashsale status singles-day --watch  # redraw on every change
  kubectl flashsale status -A -o json           # for scripts")]
    Status(StatusArgs),
    /// Force a degradation tier (the policy's override), or clear it.
    #[command(after_help = "\
Examples:
  kubectl flashsale degrade singles-day --tier 2 --for 30m --reason 'payments slow, INC-4211'
  kubectl flashsale degrade singles-day --clear --reason 'payments recovered'
  kubectl flashsale degrade singles-day --tier 1 --for 10m --reason test --dry-run")]
    Degrade(DegradeArgs),
    /// Start, stop and read chaos drills.
    #[command(subcommand)]
    Drill(DrillCommand),
    /// Failover readiness of a drill's standby.
    #[command(subcommand)]
    Failover(FailoverCommand),
    /// Print a shell completion script.
    #[command(after_help = "\
Examples:
  source <(kubectl-flashsale completion bash)
  kubectl-flashsale completion zsh > \"${fpath[1]}/_kubectl-flashsale\"
  kubectl-flashsale completion fish > ~/.config/fish/completions/kubectl-flashsale.fish")]
    Completion {
        /// The shell.
        shell: Shell,
    },
}

/// `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One sale; every sale of the namespace when unset.
    pub sale: Option<String>,
    /// Redraw whenever a sale, policy or drill changes (watches, no polling);
    /// Ctrl-C ends it.
    #[arg(short, long)]
    pub watch: bool,
    /// Prometheus for the funnel, an http:// URL (`kubectl port-forward`
    /// gives one); the funnel is left out when unset or unreachable.
    #[arg(long, env = "PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
}

/// `degrade`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("change").required(true).args(["tier", "clear"])))]
pub struct DegradeArgs {
    /// The sale whose policy to override.
    pub sale: String,
    /// The tier to force (0 forces "nothing degraded").
    #[arg(long, requires = "for_")]
    pub tier: Option<i32>,
    /// Remove the override: the signal decides again.
    #[arg(long)]
    pub clear: bool,
    /// How long the override lasts, e.g. 30m or 1h30m.
    #[arg(long = "for", id = "for_", value_name = "DURATION")]
    pub for_: Option<Duration>,
    /// Why: kept in the override and in the Event.
    #[command(flatten)]
    pub write: WriteArgs,
    /// The policy, when more than one names the sale.
    #[arg(long)]
    pub policy: Option<String>,
}

/// What every write takes.
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Why: recorded in an Event under your name.
    #[arg(long, value_parser = non_empty)]
    pub reason: String,
    /// Show the change the apiserver would make, and make none.
    #[arg(long)]
    pub dry_run: bool,
    /// How long to wait for the operator to act.
    #[arg(long, default_value = "2m")]
    pub timeout: Duration,
}

/// `drill …`.
#[derive(Debug, Subcommand)]
pub enum DrillCommand {
    /// Ask for a run now (inside the windows, unless --force).
    #[command(after_help = "\
Examples:
  kubectl flashsale drill run-now gateway-pod-kill --reason 'pre-sale rehearsal'
  kubectl flashsale drill run-now gateway-pod-kill --force --reason 'approved by SRE lead, CHG-118'")]
    RunNow {
        /// The drill.
        drill: String,
        /// Lift the windows and blackouts for this one run.
        #[arg(long)]
        force: bool,
        /// Why.
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Abort the drill's run in progress: its faults go at once.
    #[command(after_help = "\
Example:
  kubectl flashsale drill abort gateway-pod-kill --reason 'checkout errors rising'")]
    Abort {
        /// The drill.
        drill: String,
        /// Why.
        #[command(flatten)]
        write: WriteArgs,
    },
    /// The kill switch: abort every run of the namespace (or of every
    /// namespace with -A) and start none until `resume-all`.
    #[command(after_help = "\
Examples:
  kubectl flashsale drill abort-all -n shop --reason 'sale traffic above plan'
  kubectl flashsale drill abort-all -A --reason 'incident INC-4211'")]
    AbortAll {
        /// Why.
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Lift the kill switch of the namespace (or of every namespace with -A).
    #[command(after_help = "\
Example:
  kubectl flashsale drill resume-all -n shop --reason 'incident closed'")]
    ResumeAll {
        /// Why.
        #[command(flatten)]
        write: WriteArgs,
    },
    /// The drill's finished runs, newest first.
    #[command(after_help = "\
Examples:
  kubectl flashsale drill history gateway-pod-kill
  kubectl flashsale drill history gateway-pod-kill -o yaml   # every field of every run")]
    History {
        /// The drill.
        drill: String,
    },
}

/// `failover …`.
#[derive(Debug, Subcommand)]
pub enum FailoverCommand {
    /// Check the standby now and print each check with its numbers.
    #[command(after_help = "\
Example:
  kubectl flashsale failover check region-failover --reason 'pre-sale check'")]
    Check {
        /// The drill whose spec.failover to check.
        drill: String,
        /// Why.
        #[command(flatten)]
        write: WriteArgs,
    },
}

fn non_empty(value: &str) -> Result<String, String> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err("a reason must say something".to_owned());
    }
    if trimmed.len() > 200 {
        return Err("a reason is at most 200 bytes".to_owned());
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn degrade_needs_a_duration_with_a_tier_and_a_reason_always() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|_| ()).map_err(|e| e.kind());
        let base = ["kubectl-flashsale", "degrade", "s"];
        let with = |extra: &[&'static str]| [&base[..], extra].concat();
        assert_eq!(
            parse(&with(&["--tier", "2", "--reason", "r"])),
            Err(clap::error::ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            parse(&with(&["--tier", "2", "--for", "30m"])),
            Err(clap::error::ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            parse(&with(&["--reason", "r"])),
            Err(clap::error::ErrorKind::MissingRequiredArgument)
        );
        assert_eq!(
            parse(&with(&["--tier", "2", "--for", "soon", "--reason", "r"])),
            Err(clap::error::ErrorKind::ValueValidation)
        );
        assert_eq!(
            parse(&with(&[
                "--clear", "--tier", "1", "--for", "1m", "--reason", "r"
            ])),
            Err(clap::error::ErrorKind::ArgumentConflict)
        );
        assert_eq!(
            parse(&with(&["--tier", "2", "--for", "30m", "--reason", "r"])),
            Ok(())
        );
        assert_eq!(parse(&with(&["--clear", "--reason", "r"])), Ok(()));
        assert_eq!(
            parse(&with(&["--clear", "--reason", "  "])),
            Err(clap::error::ErrorKind::ValueValidation)
        );
    }
}
