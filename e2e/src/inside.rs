//! What a pod on the real node sees, measured from inside its namespaces
//! rather than read from Chaos Mesh's status: the queueing disciplines on
//! its interfaces, how long a TCP connect from it takes, and what chaos
//! left behind. The tests run as root on the node's host, so they enter a
//! pod's network namespace through its first container's process.

use std::{process::Command, time::Duration};

use k8s_openapi::api::core::v1::Pod;

use crate::stack::{self, MissingComponent};

/// Looking inside a pod failed.
#[derive(Debug, thiserror::Error)]
pub enum InsideError {
    /// The stack does not say where containerd is.
    #[error(transparent)]
    Missing(#[from] MissingComponent),
    /// The pod has no running container yet.
    #[error("pod {0} has no running container")]
    NoContainer(String),
    /// A command could not be run.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// A command failed or answered something else than expected.
    #[error("{command}: {message}")]
    Failed {
        /// The command.
        command: String,
        /// Its error output, or what was wrong with its answer.
        message: String,
    },
}

/// The host process id of `pod`'s first running container, through which
/// its namespaces are entered.
pub fn pid_of(pod: &Pod) -> Result<u32, InsideError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find_map(|c| c.container_id.clone()))
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_owned))
        .ok_or_else(|| InsideError::NoContainer(name.clone()))?;
    let address = containerd_address()?;
    let tasks =
        run(Command::new("ctr").args(["--address", &address, "-n", "k8s.io", "task", "ls"]))?;
    tasks
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some((words.next()?, words.next()?, words.next()?))
        })
        .find(|(task, _, status)| *task == id && *status == "RUNNING")
        .and_then(|(_, pid, _)| pid.parse().ok())
        .ok_or(InsideError::NoContainer(name))
}

/// `tc qdisc show` in the network namespace of process `pid`.
pub fn qdiscs(pid: u32) -> Result<String, InsideError> {
    run(in_net(pid).args(["tc", "qdisc", "show"]))
}

/// `iptables -S` in the network namespace of process `pid`: the chains
/// and rules a partition adds.
pub fn iptables(pid: u32) -> Result<String, InsideError> {
    run(in_net(pid).args(["iptables", "-S"]))
}

/// How long a TCP connect from process `pid`'s network namespace to
/// `host:port` takes (curl's `time_connect`), failing if it does not
/// connect within `timeout`.
pub fn connect_time(
    pid: u32,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Duration, InsideError> {
    let url = format!("http://{host}:{port}/");
    let limit = format!("{:.3}", timeout.as_secs_f64());
    let mut command = in_net(pid);
    command.args([
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "--connect-timeout",
        &limit,
        "--max-time",
        &limit,
        "-w",
        "%{time_connect}",
        &url,
    ]);
    // curl fails when the server answers nothing useful; the connect time
    // it prints is what is measured, so only an empty answer is a failure.
    let output = command
        .output()
        .map_err(|source| spawn_error(&command, source))?;
    let text = String::from_utf8_lossy(&output.stdout);
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds > 0.0 => Ok(Duration::from_secs_f64(seconds)),
        _ => Err(InsideError::Failed {
            command: describe(&command),
            message: format!("no connection to {host}:{port} within {limit} s"),
        }),
    }
}

/// Whether this host's kernel has the netem queueing discipline that
/// Chaos Mesh's delay and loss need, tried in a network namespace of its
/// own (some kernels are built without it and cannot load modules).
pub fn kernel_has_netem() -> Result<bool, InsideError> {
    let mut command = Command::new("unshare");
    command.args([
        "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
    ]);
    let output = command
        .output()
        .map_err(|source| spawn_error(&command, source))?;
    Ok(output.status.success())
}

/// What chaos still does on the real node: `e2e/local/stack residue`, one
/// line per leftover (stress processes, and root qdiscs and iptables jumps
/// into a fault's chain in pods' network namespaces); empty when the node
/// is clean.
pub fn residue() -> Result<Vec<String>, InsideError> {
    stack_residue(&[])
}

/// What Chaos Mesh's recoveries left inert on the real node: the chains
/// and ipsets nothing jumps to or matches any more.
pub fn inert() -> Result<Vec<String>, InsideError> {
    Ok(stack_residue(&["--all"])?
        .into_iter()
        .filter(|line| line.contains("inert"))
        .collect())
}

fn stack_residue(args: &[&str]) -> Result<Vec<String>, InsideError> {
    let script = stack::script()?;
    let out = run(Command::new(script).arg("residue").args(args))?;
    Ok(out.lines().map(str::to_owned).collect())
}

fn containerd_address() -> Result<String, MissingComponent> {
    std::env::var("CONTAINERD_ADDRESS")
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or(MissingComponent {
            var: "CONTAINERD_ADDRESS",
            component: "real node's containerd",
        })
}

fn in_net(pid: u32) -> Command {
    let mut command = Command::new("nsenter");
    command.arg(format!("--net=/proc/{pid}/ns/net")).arg("--");
    command
}

fn run(command: &mut Command) -> Result<String, InsideError> {
    let output = command
        .output()
        .map_err(|source| spawn_error(command, source))?;
    if !output.status.success() {
        return Err(InsideError::Failed {
            command: describe(command),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn spawn_error(command: &Command, source: std::io::Error) -> InsideError {
    InsideError::Spawn {
        command: describe(command),
        source,
    }
}

fn describe(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}
