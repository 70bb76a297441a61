//! `kubectl flashsale`: on-call's commands for sales run by the flashsale
//! operator. Each command is one runbook action; each write carries a
//! reason, is recorded in an Event under the user's name, and is read back
//! from the status the operator wrote, never assumed.
//!
//! The binary is a thin shell around [`run`], which takes the arguments and
//! the two output streams, so the tests drive the same code in process.

pub mod args;
mod degrade;
mod drill;
mod failover;
pub mod failure;
pub mod funnel;
mod output;
pub mod render;
pub mod report;
mod session;
mod status;
pub mod style;
mod wait;

use std::{ffi::OsString, io::Write};

use clap::{CommandFactory, Parser};

pub use failure::Failure;
pub use session::FIELD_MANAGER;

use args::{Cli, Command, DrillCommand, FailoverCommand};
use output::Out;
use session::Session;

/// Runs the command line `argv` (the program name first), writing results
/// to `out` and problems to `err`; returns the exit code (`--help` lists
/// them: 0 done, 1 refused, 2 usage, 3 timed out).
pub async fn run<O, E>(argv: Vec<OsString>, out: O, mut err: E) -> u8
where
    O: Write + Send,
    E: Write + Send,
{
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(parse) => {
            let code = if parse.use_stderr() { 2 } else { 0 };
            let text = if code == 0 {
                parse.render().to_string()
            } else {
                parse.render().ansi().to_string()
            };
            let mut out = out;
            let sink: &mut dyn Write = if code == 0 { &mut out } else { &mut err };
            let _ = write!(sink, "{text}");
            return code;
        }
    };
    let mut out = Out::new(out, &cli.cluster);
    match dispatch(cli, &mut out, &mut err).await {
        Ok(()) => 0,
        Err(failure) => {
            let _ = writeln!(err, "error: {failure}");
            failure.code()
        }
    }
}

async fn dispatch<O: Write + Send, E: Write + Send>(
    cli: Cli,
    out: &mut Out<O>,
    err: &mut E,
) -> Result<(), Failure> {
    let Cli { cluster, command } = cli;
    let connect = || Session::connect(&cluster);
    match command {
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kubectl-flashsale", &mut script);
            out.raw(&script)
        }
        Command::Status(args) => status::run(&mut connect().await?, &args, out).await,
        Command::Degrade(args) => degrade::run(&mut connect().await?, &args, out, err).await,
        Command::Drill(DrillCommand::RunNow {
            drill,
            force,
            write,
        }) => drill::run_now(&mut connect().await?, &drill, force, &write, out, err).await,
        Command::Drill(DrillCommand::Abort { drill, write }) => {
            drill::abort(&mut connect().await?, &drill, &write, out, err).await
        }
        Command::Drill(DrillCommand::AbortAll { write }) => {
            drill::kill_switch(&mut connect().await?, true, &write, out, err).await
        }
        Command::Drill(DrillCommand::ResumeAll { write }) => {
            drill::kill_switch(&mut connect().await?, false, &write, out, err).await
        }
        Command::Drill(DrillCommand::History { drill }) => {
            drill::history(&connect().await?, &drill, out).await
        }
        Command::Failover(FailoverCommand::Check { drill, write }) => {
            failover::check(&mut connect().await?, &drill, &write, out, err).await
        }
    }
}
