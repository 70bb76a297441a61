//! The krew manifest installs the plugin: `cli/krew/package` packs the
//! built binary and renders the manifest for this platform, and krew itself
//! (pinned, from the Go module proxy) validates and installs it into a
//! scratch krew root, from which it runs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

const KREW: &str = "sigs.k8s.io/krew/cmd/krew@v0.4.3";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// krew, built once per machine into the cache beside the other pinned
/// tools.
fn krew() -> anyhow::Result<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
        .context("no cache folder: set HOME")?;
    let bin = cache.join("flashsale/bin/krew-v0.4.3");
    let krew = bin.join("krew");
    if !krew.exists() {
        run(Command::new("go")
            .args(["install", KREW])
            .env("GOBIN", &bin))?;
    }
    Ok(krew)
}

#[test]
fn krew_installs_the_packed_plugin_from_the_manifest() -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let out = scratch.path().join("out");
    let packed = run(Command::new(root().join("cli/krew/package"))
        .arg(env!("CARGO_BIN_EXE_kubectl-flashsale"))
        .arg(&out))?;
    let mut paths = packed.lines();
    let (archive, manifest) = (
        paths.next().context("no archive")?,
        paths.next().context("no manifest")?,
    );
    let rendered = std::fs::read_to_string(manifest)?;
    assert!(
        !rendered.contains("{{"),
        "a template is left in the manifest:\n{rendered}"
    );
    assert!(
        rendered.contains(&format!("version: v{}", env!("CARGO_PKG_VERSION"))),
        "{rendered}"
    );

    let krew_root = scratch.path().join("krew");
    run(Command::new(krew()?)
        .args([
            "install",
            &format!("--manifest={manifest}"),
            &format!("--archive={archive}"),
        ])
        .env("KREW_ROOT", &krew_root))?;
    let installed = run(Command::new(krew_root.join("bin/kubectl-flashsale")).arg("--version"))?;
    assert_eq!(
        installed.trim(),
        format!("kubectl-flashsale {}", env!("CARGO_PKG_VERSION"))
    );
    Ok(())
}
