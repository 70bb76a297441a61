//! Which container images a FlashSale may run. Whoever may write a FlashSale
//! in a namespace would otherwise choose the code that runs next to the
//! sale's Secrets (the inventory's admin token, the database URL); the
//! operator's flags say which images are trusted, and a sale naming any
//! other is refused before anything is applied.

use std::fmt;

use super::build::Images;
use flashsale_api::{FlashSaleSpec, validate::SpecProblem};

/// The images FlashSales may name: the operator's own defaults, plus the
/// entries of `--allowed-image`. An entry ending in `/` allows every image
/// under it (`registry.example.com/team/`); any other entry allows exactly
/// that reference (`registry.example.com/team/gateway:1.4`, or a digest).
/// Images are compared as written: `nginx` is not `docker.io/library/nginx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageAllowlist {
    /// From the flags, blanks dropped.
    configured: Vec<String>,
    /// The operator's default images, always allowed.
    defaults: Vec<String>,
}

impl ImageAllowlist {
    /// The allowlist of `entries` (blank ones ignored, so a trailing comma in
    /// the env variable is harmless) and the default images.
    pub fn new(entries: impl IntoIterator<Item = String>, defaults: &Images) -> Self {
        let configured = entries
            .into_iter()
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect();
        Self {
            configured,
            defaults: vec![
                defaults.gateway.clone(),
                defaults.inventory.clone(),
                defaults.order_writer.clone(),
            ],
        }
    }

    /// Whether `image` may run.
    pub fn allows(&self, image: &str) -> bool {
        self.defaults.iter().any(|d| d == image)
            || self.configured.iter().any(|entry| {
                if entry.ends_with('/') {
                    image.starts_with(entry.as_str())
                } else {
                    image == entry
                }
            })
    }

    /// Every image field of `spec` naming an image outside the list.
    pub fn refused(&self, spec: &FlashSaleSpec) -> Vec<SpecProblem> {
        [
            ("spec.gateway.image", &spec.gateway.workload.image),
            ("spec.inventory.image", &spec.inventory.workload.image),
            ("spec.orderWriter.image", &spec.order_writer.workload.image),
        ]
        .into_iter()
        .filter_map(|(field, image)| {
            let image = image.as_deref()?;
            (!self.allows(image)).then(|| SpecProblem {
                field: field.to_owned(),
                message: format!("{image:?} is not an allowed image ({self})"),
            })
        })
        .collect()
    }
}

/// What is allowed, for the refusal message.
impl fmt::Display for ImageAllowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.configured.is_empty() {
            f.write_str("allowed: the operator's default images only; see --allowed-image")
        } else {
            write!(
                f,
                "allowed: {} and the operator's default images",
                self.configured.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Images {
        Images {
            gateway: "ghcr.io/flashsale-dev/gateway:0.1.0".into(),
            inventory: "ghcr.io/flashsale-dev/inventory:0.1.0".into(),
            order_writer: "ghcr.io/flashsale-dev/order-writer:0.1.0".into(),
        }
    }

    #[test]
    fn prefixes_end_in_a_slash_and_anything_else_is_exact() {
        let list = ImageAllowlist::new(
            [
                "registry.example.com/team/".to_owned(),
                " mirror.example.com/gateway:1.4 ".to_owned(),
                String::new(),
            ],
            &defaults(),
        );
        for allowed in [
            "registry.example.com/team/gateway:2",
            "registry.example.com/team/sub/inventory@sha256:abcd",
            "mirror.example.com/gateway:1.4",
            "ghcr.io/flashsale-dev/order-writer:0.1.0",
        ] {
            assert!(list.allows(allowed), "{allowed}");
        }
        for refused in [
            // A look-alike repository next to the allowed folder.
            "registry.example.com/team-evil/gateway:2",
            "registry.example.com/teamgateway:2",
            "mirror.example.com/gateway:1.5",
            "mirror.example.com/gateway:1.4-debug",
            // Another version of a default is not the default.
            "ghcr.io/flashsale-dev/gateway:latest",
            "",
        ] {
            assert!(!list.allows(refused), "{refused}");
        }
    }

    #[test]
    fn no_flag_means_the_defaults_only_and_each_field_is_named() -> anyhow::Result<()> {
        let mut sale: flashsale_api::FlashSale = serde_yaml_ng::from_str(include_str!(
            "../../../../crds/examples/flashsale-singles-day.yaml"
        ))?;
        let list = ImageAllowlist::new(Vec::new(), &defaults());
        assert!(list.refused(&sale.spec).is_empty(), "no image set");
        sale.spec.gateway.workload.image = Some("ghcr.io/flashsale-dev/gateway:0.1.0".into());
        sale.spec.inventory.workload.image = Some("evil.example.com/inventory:1".into());
        sale.spec.order_writer.workload.image = Some("busybox".into());
        let problems = list.refused(&sale.spec);
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["spec.inventory.image", "spec.orderWriter.image"]);
        assert_eq!(
            problems[0].to_string(),
            "spec.inventory.image: \"evil.example.com/inventory:1\" is not an allowed image \
             (allowed: the operator's default images only; see --allowed-image)"
        );
        Ok(())
    }
}
