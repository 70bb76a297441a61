//! `crds/` must be exactly what the Rust types generate.

use std::collections::BTreeSet;

use flashsale_operator::crdgen;

#[test]
fn crds_folder_matches_the_code() -> anyhow::Result<()> {
    let dir = flashsale_e2e::checkout::path("crds")?;
    let fix = "regenerate with `cargo run -p flashsale-operator -- crd --output-dir crds`";
    let generated = crdgen::render_all()?;
    for (name, yaml) in &generated {
        let on_disk = std::fs::read_to_string(dir.join(name))
            .map_err(|e| anyhow::anyhow!("crds/{name} missing ({e}); {fix}"))?;
        assert!(on_disk == *yaml, "crds/{name} differs from the code; {fix}");
    }
    let expected: BTreeSet<_> = generated.iter().map(|(name, _)| name.clone()).collect();
    let present: BTreeSet<_> = std::fs::read_dir(&dir)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    assert_eq!(
        present, expected,
        "crds/ holds a CRD the code no longer generates; {fix}"
    );
    Ok(())
}
