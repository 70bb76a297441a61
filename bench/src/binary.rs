//! The release binaries a benchmark starts.

use std::path::{Path, PathBuf};

/// The binary `name` (of the package of that name) in the target folder of
/// this executable (`<target>/<profile>/`, an example running from
/// `<target>/<profile>/examples/`), or `given`; an error naming the build
/// command when it is not there.
pub fn release_binary(name: &str, given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_owned(),
        None => {
            let exe = std::env::current_exe()?;
            exe.parent()
                .and_then(Path::parent)
                .ok_or_else(|| {
                    anyhow::anyhow!("cannot locate the target folder from {}", exe.display())
                })?
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
