//! Where this checkout is, found when the code runs. Not `env!`: a target
//! folder shared by two checkouts keeps the path of whichever compiled an
//! unchanged crate first, and its files may be gone.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The workspace's root: the first folder holding `Cargo.lock` above the
/// running package (cargo names it in `CARGO_MANIFEST_DIR` when it runs a
/// test or a binary) or above the current folder.
pub fn root() -> anyhow::Result<PathBuf> {
    let start = match std::env::var_os("CARGO_MANIFEST_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_dir().context("reading the current folder")?,
    };
    start
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .map(Path::to_path_buf)
        .with_context(|| format!("no Cargo.lock in {} or above", start.display()))
}

/// `relative` (`chaos/zone-partition.yaml`) in this checkout.
pub fn path(relative: &str) -> anyhow::Result<PathBuf> {
    Ok(root()?.join(relative))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_root_holds_the_workspace_and_its_chart() -> anyhow::Result<()> {
        let root = super::root()?;
        let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
        assert!(manifest.contains("[workspace]"), "{}", root.display());
        assert!(super::path("charts/flashsale-operator/Chart.yaml")?.is_file());
        Ok(())
    }
}
