//! A Redis server of one test's own, on a free loopback port, for tests that
//! stop, pause or reconfigure Redis without disturbing the shared stack.

use std::{process::Stdio, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::{Child, Command},
};

use crate::{
    clusters::Paused,
    wait::{Timeout, poll_until},
};

/// Starting or pausing the server failed.
#[derive(Debug, thiserror::Error)]
pub enum PrivateRedisError {
    /// No free port, or `redis-server` (or `kill`) could not be run.
    #[error("running redis-server: {0}")]
    Spawn(#[from] std::io::Error),
    /// It did not answer PING (or stop) in time.
    #[error(transparent)]
    NotReady(#[from] Timeout),
}

/// A running `redis-server`, killed when dropped.
#[derive(Debug)]
pub struct PrivateRedis {
    /// `redis://127.0.0.1:<port>`.
    pub url: String,
    child: Child,
}

impl PrivateRedis {
    /// Starts `redis-server` without persistence, with `extra` arguments
    /// (for example `["--enable-debug-command", "yes"]`), and waits until it
    /// answers PING.
    pub async fn start(extra: &[&str]) -> Result<Self, PrivateRedisError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            // A replica still writes the snapshot its primary sends: into
            // the temp folder, not the caller's working directory.
            .arg("--dir")
            .arg(std::env::temp_dir())
            .args(["--dbfilename", &format!("private-redis-{port}.rdb")])
            .args(extra)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let address = format!("127.0.0.1:{port}");
        poll_until(
            "the private Redis to answer PING",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || ping(&address),
        )
        .await?;
        Ok(Self {
            url: format!("redis://{address}"),
            child,
        })
    }

    /// Freezes the server (SIGSTOP) and returns once it is stopped: it holds
    /// its connections but answers and replicates nothing until the guard
    /// resumes it or is dropped (SIGCONT).
    pub async fn pause(&self) -> Result<Paused, PrivateRedisError> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| std::io::Error::other("the private Redis has exited"))?;
        Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .await?;
        let paused = Paused::of(pid);
        poll_until(
            "the private Redis to be stopped",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || async move {
                let stat = tokio::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .await
                    .map_err(|e| e.to_string())?;
                // The state follows the command name's closing parenthesis.
                match stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()) {
                    Some(rest) if rest.starts_with('T') => Ok(()),
                    _ => Err("still running".to_owned()),
                }
            },
        )
        .await?;
        Ok(paused)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub async fn kill(&mut self) -> Result<(), std::io::Error> {
        self.child.kill().await
    }
}

async fn ping(address: &str) -> Result<(), String> {
    let mut stream = TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"PING\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut reply = [0u8; 7];
    stream
        .read_exact(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    if &reply == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(format!(
            "unexpected reply {:?}",
            String::from_utf8_lossy(&reply)
        ))
    }
}
