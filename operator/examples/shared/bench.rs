//! What every benchmark of the operator uses: the release binaries it
//! starts, and the numbers it prints.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

/// The binary `name` (of the package of that name) next to this example's
/// folder (`<target>/<profile>/`), or `given`.
pub fn release_binary(name: &str, given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_owned(),
        None => {
            let exe = std::env::current_exe()?;
            exe.parent()
                .and_then(Path::parent)
                .context("cannot locate the target folder from this example's path")?
                .join(name)
        }
    };
    anyhow::ensure!(
        path.is_file(),
        "{} not found: build it first with `cargo build --release -p {name} --bin {name}` \
         (same CARGO_TARGET_DIR), or pass its path",
        path.display()
    );
    Ok(path)
}

/// Nearest-rank percentile `q` (0–1) of `values`; NaN when there are none.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.max(1) - 1).copied().unwrap_or(f64::NAN)
}

/// Milliseconds of `duration`.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
