//! What a pod on the real node sees, measured from inside its namespaces
//! rather than read from Chaos Mesh's status: the queueing disciplines on
//! its interfaces, how long a TCP connect from it takes, and what chaos
//! left behind. The tests run as root on the node's host, so they enter a
//! pod's network namespace through its first container's process.

use std::{
    net::{SocketAddr, TcpStream},
    os::fd::AsFd,
    process::Command,
    time::Duration,
};

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
    /// A thread could not enter a process's network namespace.
    #[error("entering the network namespace of process {pid}: {source}")]
    Enter {
        /// The process.
        pid: u32,
        /// Why.
        source: std::io::Error,
    },
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
    let address = stack::containerd_address()?;
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

/// Whether a TCP connect from process `pid`'s network namespace to `to`
/// succeeds within `timeout`. A thread of this process enters the namespace
/// for the one connect, so a probe costs a connect rather than a process
/// started with `nsenter`, and the end of a partition is seen within the
/// probe's own timeout.
pub fn connects_from(pid: u32, to: SocketAddr, timeout: Duration) -> Result<bool, InsideError> {
    let enter = |source: std::io::Error| InsideError::Enter { pid, source };
    let namespace = std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(enter)?;
    // The thread ends with the connect, and its namespace with it.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                rustix::thread::move_into_link_name_space(
                    namespace.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| enter(e.into()))?;
                Ok(TcpStream::connect_timeout(&to, timeout).is_ok())
            })
            .join()
            .unwrap_or_else(|_| Err(enter(std::io::Error::other("the probing thread panicked"))))
    })
}

/// CPU time used so far by the container of process `pid`: its cgroup's
/// `cpuacct.usage` (cgroup v1) or `cpu.stat` `usage_usec` (v2), which
/// counts every process in it, stressors that chaos-daemon put there too.
pub fn cgroup_cpu(pid: u32) -> Result<Duration, InsideError> {
    match cgroup_dir(pid, "cpuacct")? {
        Cgroup::V1(dir) => {
            let nanos = read_number(&format!("{dir}/cpuacct.usage"), None)?;
            Ok(Duration::from_nanos(nanos))
        }
        Cgroup::V2(dir) => {
            let micros = read_number(&format!("{dir}/cpu.stat"), Some("usage_usec"))?;
            Ok(Duration::from_micros(micros))
        }
    }
}

/// Memory charged to the container of process `pid`: its cgroup's
/// `memory.usage_in_bytes` (v1) or `memory.current` (v2).
pub fn cgroup_memory(pid: u32) -> Result<u64, InsideError> {
    match cgroup_dir(pid, "memory")? {
        Cgroup::V1(dir) => read_number(&format!("{dir}/memory.usage_in_bytes"), None),
        Cgroup::V2(dir) => read_number(&format!("{dir}/memory.current"), None),
    }
}

/// The processes named one of `names` that run in the same CPU cgroup as
/// process `pid`: (pid, name).
pub fn processes_beside(pid: u32, names: &[&str]) -> Result<Vec<(u32, String)>, InsideError> {
    let own = cgroup_dir(pid, "cpuacct")?;
    let mut found = Vec::new();
    let entries = std::fs::read_dir("/proc").map_err(|source| InsideError::Spawn {
        command: "reading /proc".to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let Some(other) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{other}/comm")) else {
            continue;
        };
        let comm = comm.trim();
        // A process may end between the listing and the read.
        if names.contains(&comm) && cgroup_dir(other, "cpuacct").is_ok_and(|c| c == own) {
            found.push((other, comm.to_owned()));
        }
    }
    Ok(found)
}

/// Where a process's cgroup of one controller lives.
#[derive(Debug, PartialEq, Eq)]
enum Cgroup {
    V1(String),
    V2(String),
}

fn cgroup_dir(pid: u32, controller: &str) -> Result<Cgroup, InsideError> {
    let path = format!("/proc/{pid}/cgroup");
    let text = std::fs::read_to_string(&path).map_err(|source| InsideError::Spawn {
        command: format!("reading {path}"),
        source,
    })?;
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(dir)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == controller) {
            return Ok(Cgroup::V1(format!("/sys/fs/cgroup/{controller}{dir}")));
        }
        if controllers.is_empty() {
            unified = Some(Cgroup::V2(format!("/sys/fs/cgroup{dir}")));
        }
    }
    unified.ok_or_else(|| InsideError::Failed {
        command: format!("reading {path}"),
        message: format!("no {controller} cgroup"),
    })
}

/// The number in file `path`, or on its line starting with `key`.
fn read_number(path: &str, key: Option<&str>) -> Result<u64, InsideError> {
    let failed = |message: String| InsideError::Failed {
        command: format!("reading {path}"),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    let value = match key {
        None => Some(text.trim()),
        Some(key) => text
            .lines()
            .find_map(|l| l.strip_prefix(key).map(str::trim)),
    };
    value
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| failed(format!("no number in {text:?}")))
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

/// What chaos still does to `pods` ([`residue`], kept to the lines about
/// their network namespaces and the processes in their cgroups), so that a
/// test is not misled by another's injection running at the same time.
pub fn residue_of(pods: &[Pod]) -> Result<Vec<String>, InsideError> {
    let pids: Vec<u32> = pods.iter().filter_map(|p| pid_of(p).ok()).collect();
    let netns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let ours_net: Vec<_> = pids.iter().filter_map(|&p| netns(p)).collect();
    let ours_cgroup: Vec<_> = pids
        .iter()
        .filter_map(|&p| cgroup_dir(p, "cpuacct").ok())
        .collect();
    let lead_pid = |line: &str, prefix: &str| -> Option<u32> {
        line.strip_prefix(prefix)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Ok(residue()?
        .into_iter()
        .filter(|line| {
            if let Some(pid) = lead_pid(line, "netns of ") {
                netns(pid).is_some_and(|n| ours_net.contains(&n))
            } else if let Some(pid) = lead_pid(line, "process ") {
                // A zombie has left its cgroup but not its parent.
                cgroup_dir(pid, "cpuacct").is_ok_and(|c| ours_cgroup.contains(&c))
                    || parent(pid).is_some_and(|p| pids.contains(&p))
            } else {
                true
            }
        })
        .collect())
}

/// The parent of process `pid`, if it still exists.
fn parent(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
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
