//! Real outages of stack components for fault tests: a component is stopped
//! with `e2e/local/stack down` (or crashed with `kill`) and started again
//! with `up`, exactly as an operator would see a crashed database or broker
//! come back.

use std::process::Command;

use tokio::sync::{Mutex, MutexGuard};

use crate::stack::{self, MissingComponent};

/// An outage could not be started or ended.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The stack script is unknown.
    #[error(transparent)]
    Missing(#[from] MissingComponent),
    /// The script could not be run.
    #[error("running `stack {command} {component}`: {source}")]
    Spawn {
        /// The stack command (`up`, `down`, `kill`, `pause`, …).
        command: &'static str,
        /// The component, or the command's arguments.
        component: String,
        /// Why.
        source: std::io::Error,
    },
    /// The script failed.
    #[error("`stack {command} {component}` failed: {stderr}")]
    Failed {
        /// The stack command (`up`, `down`, `kill`, `pause`, …).
        command: &'static str,
        /// The component, or the command's arguments.
        component: String,
        /// The script's error output.
        stderr: String,
    },
}

static EXCLUSIVE: Mutex<()> = Mutex::const_new(());

/// Holds the stack for one fault test at a time within a test binary, so
/// one test's outage never lands in another's measurements. Keep the guard
/// for the whole test.
pub async fn exclusive() -> MutexGuard<'static, ()> {
    EXCLUSIVE.lock().await
}

/// A stopped, crashed or paused component; [`Outage::end`] starts (or
/// resumes) it again and waits until it is ready. Dropped without `end` (a
/// failed test), it does so anyway so later tests find the stack whole.
#[derive(Debug)]
pub struct Outage {
    component: String,
    /// The stack command that ends it: `up`, or `resume` for a pause.
    undo: &'static str,
    ended: bool,
}

impl Outage {
    /// Stops `component` (for example `postgres` or `kafka`).
    pub async fn begin(component: &str) -> Result<Self, FaultError> {
        Self::by("down", "up", component).await
    }

    /// Crashes `component`: its process SIGKILLed, nothing it did undone.
    pub async fn crash(component: &str) -> Result<Self, FaultError> {
        Self::by("kill", "up", component).await
    }

    /// Pauses `component` (SIGSTOP): it keeps its connections and answers
    /// nothing, as a hung server; `end` resumes it (SIGCONT).
    pub async fn pause(component: &str) -> Result<Self, FaultError> {
        Self::by("pause", "resume", component).await
    }

    async fn by(
        command: &'static str,
        undo: &'static str,
        component: &str,
    ) -> Result<Self, FaultError> {
        run(command, &[component]).await?;
        Ok(Self {
            component: component.to_owned(),
            undo,
            ended: false,
        })
    }

    /// Starts (or resumes) the component and returns once it is ready.
    pub async fn end(mut self) -> Result<(), FaultError> {
        self.ended = true;
        run(self.undo, &[&self.component]).await
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        if !self.ended
            && let Ok(script) = stack::script()
        {
            let _ = Command::new(script)
                .args([self.undo, &self.component])
                .status();
        }
    }
}

/// Runs `e2e/local/stack COMMAND ARGS...` and waits for it.
pub(crate) async fn run(command: &'static str, args: &[&str]) -> Result<(), FaultError> {
    let component = args.join(" ");
    let output = tokio::process::Command::new(stack::script()?)
        .arg(command)
        .args(args)
        .output()
        .await
        .map_err(|source| FaultError::Spawn {
            command,
            component: component.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(FaultError::Failed {
            command,
            component,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}
