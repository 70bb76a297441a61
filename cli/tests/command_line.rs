//! The built `kubectl-flashsale` binary as a shell runs it, without a
//! cluster: help, usage errors and their exit codes, completion scripts.

use std::process::{Command, Output};

fn plugin(args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_kubectl-flashsale"))
        .args(args)
        // No cluster: a test must not reach the stack's by accident.
        .env("KUBECONFIG", "/dev/null")
        .env_remove("PROMETHEUS_URL")
        .output()?)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_lists_every_command_and_the_exit_codes() -> anyhow::Result<()> {
    let help = plugin(&["--help"])?;
    assert_eq!(help.status.code(), Some(0));
    let out = text(&help.stdout);
    for expected in [
        "status",
        "degrade",
        "drill",
        "failover",
        "completion",
        "Exit codes:",
        "3  timed out",
    ] {
        assert!(out.contains(expected), "--help lacks {expected:?}:\n{out}");
    }
    let drill = text(&plugin(&["drill", "--help"])?.stdout);
    for command in ["run-now", "abort", "abort-all", "resume-all", "history"] {
        assert!(
            drill.contains(command),
            "drill --help lacks {command}:\n{drill}"
        );
    }
    let degrade = text(&plugin(&["degrade", "--help"])?.stdout);
    assert!(
        degrade.contains("Examples:") && degrade.contains("--for 30m"),
        "{degrade}"
    );
    Ok(())
}

#[test]
fn a_write_without_a_reason_is_a_usage_error() -> anyhow::Result<()> {
    for args in [
        &["degrade", "singles-day", "--tier", "2", "--for", "30m"][..],
        &[
            "degrade",
            "singles-day",
            "--tier",
            "2",
            "--reason",
            "no duration",
        ],
        &["drill", "abort", "gateway-pod-kill"],
        &["drill", "abort-all", "-n", "shop"],
        &["drill", "run-now", "gateway-pod-kill", "--force"],
        &["failover", "check", "region-failover"],
    ] {
        let run = plugin(args)?;
        assert_eq!(
            run.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&run.stderr)
        );
        let err = text(&run.stderr);
        assert!(
            err.contains("required") || err.contains("--for"),
            "{args:?}: {err}"
        );
        assert!(run.stdout.is_empty(), "{args:?} printed results");
    }
    Ok(())
}

#[test]
fn an_unreadable_kubeconfig_is_a_usage_error_that_names_it() -> anyhow::Result<()> {
    let run = plugin(&["status", "--kubeconfig", "/nonexistent/kubeconfig"])?;
    assert_eq!(run.status.code(), Some(2));
    assert!(
        text(&run.stderr).contains("/nonexistent/kubeconfig"),
        "{}",
        text(&run.stderr)
    );
    Ok(())
}

#[test]
fn completion_scripts_name_every_command() -> anyhow::Result<()> {
    for shell in ["bash", "zsh", "fish"] {
        let run = plugin(&["completion", shell])?;
        assert_eq!(run.status.code(), Some(0), "{shell}: {}", text(&run.stderr));
        let script = text(&run.stdout);
        for command in ["degrade", "abort-all", "run-now", "failover"] {
            assert!(
                script.contains(command),
                "{shell} completion lacks {command}"
            );
        }
    }
    let unknown = plugin(&["completion", "tcsh"])?;
    assert_eq!(unknown.status.code(), Some(2));
    Ok(())
}
