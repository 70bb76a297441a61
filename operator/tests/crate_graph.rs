//! The walls between the operator's crates (`docs/architecture.md`, "The
//! operator's crates"), read from the workspace's manifests: the compiler
//! keeps a crate from using what its manifest does not name, and this test
//! keeps the manifests from naming what the layering forbids.

use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

const API: &str = "flashsale-api";
const KIT: &str = "flashsale-kit";
const OBSERVE: &str = "flashsale-observe";
const CONTROLLERS: [&str; 3] = [
    "flashsale-controller-sale",
    "flashsale-controller-degradation",
    "flashsale-controller-drill",
];

/// A dependency's name and the features asked of it.
type Dependency = (String, Vec<String>);
/// A package's name and its dependencies (normal, dev and build alike).
type Package = (String, Vec<Dependency>);

/// Every workspace package with its dependencies.
fn packages() -> anyhow::Result<Vec<Package>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(flashsale_e2e::checkout::root()?)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)?;
    let packages = metadata["packages"]
        .as_array()
        .context("metadata has no packages")?;
    Ok(packages
        .iter()
        .map(|package| {
            let deps = package["dependencies"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|dep| {
                    let features = dep["features"]
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|f| f.as_str().map(str::to_owned))
                        .collect();
                    (
                        dep["name"].as_str().unwrap_or_default().to_owned(),
                        features,
                    )
                })
                .collect();
            (
                package["name"].as_str().unwrap_or_default().to_owned(),
                deps,
            )
        })
        .collect())
}

fn deps_of<'a>(packages: &'a [Package], name: &str) -> anyhow::Result<&'a [Dependency]> {
    packages
        .iter()
        .find(|(package, _)| package == name)
        .map(|(_, deps)| deps.as_slice())
        .with_context(|| format!("{name} is not in the workspace"))
}

#[test]
fn no_controller_depends_on_another_and_the_layers_below_know_no_controller() -> anyhow::Result<()>
{
    let packages = packages()?;
    for controller in CONTROLLERS {
        let deps = deps_of(&packages, controller)?;
        for (dep, _) in deps {
            assert!(
                !CONTROLLERS.contains(&dep.as_str()),
                "{controller} depends on {dep}: controllers share code through {API}, {KIT} or {OBSERVE}"
            );
        }
        for layer in [API, KIT, OBSERVE] {
            assert!(
                deps.iter().any(|(dep, _)| dep == layer),
                "{controller} does not build on {layer}"
            );
        }
    }
    for layer in [API, KIT, OBSERVE] {
        for (dep, _) in deps_of(&packages, layer)? {
            assert!(
                !CONTROLLERS.contains(&dep.as_str()) && dep != "flashsale-operator",
                "{layer} depends on {dep}: a lower layer must not know a controller"
            );
        }
    }
    for (dep, _) in deps_of(&packages, API)? {
        assert!(
            dep != KIT && dep != OBSERVE,
            "{API} depends on {dep}: it is the bottom layer"
        );
    }
    Ok(())
}

#[test]
fn the_api_crate_builds_without_a_client_or_the_controller_runtime() -> anyhow::Result<()> {
    let packages = packages()?;
    let deps = deps_of(&packages, API)?;
    for (dep, features) in deps {
        assert!(
            !matches!(dep.as_str(), "kube-runtime" | "kube-client" | "tokio"),
            "{API} depends on {dep}"
        );
        if dep == "kube" {
            assert!(
                features.iter().all(|f| f == "derive"),
                "{API} asks kube for {features:?}; only `derive` keeps it free of a client"
            );
        }
    }
    // The workspace's kube entry is what the API crate inherits.
    let manifest = std::fs::read_to_string(flashsale_e2e::checkout::path("Cargo.toml")?)?;
    let kube = manifest
        .lines()
        .find(|line| line.starts_with("kube = "))
        .context("the workspace names no kube")?;
    assert!(
        kube.contains("default-features = false") && kube.contains(r#"features = ["derive"]"#),
        "the workspace's kube entry must be derive-only: {kube}"
    );
    Ok(())
}

#[test]
fn the_kubectl_plugin_builds_on_the_api_crate_alone() -> anyhow::Result<()> {
    let packages = packages()?;
    let workspace: Vec<&str> = packages.iter().map(|(name, _)| name.as_str()).collect();
    let ours: Vec<&str> = deps_of(&packages, "kubectl-flashsale")?
        .iter()
        .map(|(dep, _)| dep.as_str())
        .filter(|dep| workspace.contains(dep))
        .collect();
    // What `cargo install` builds: the objects' types, not the operator.
    assert_eq!(ours, [API], "kubectl-flashsale depends on {ours:?}");
    Ok(())
}
