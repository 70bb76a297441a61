//! The sale's internal Secret `<sale>-internal`: the bearer tokens of the
//! inventory API, which only the sale's own parts know, and the drill key.
//! The gateway and the operator send the API token; loading a sale and
//! adjusting stock need the admin token, which only the inventory pods hold;
//! the operator signs drill buyer tokens with the drill key, which the
//! gateways check them with.
//!
//! The operator creates the Secret once with random tokens and never
//! rewrites it (rewriting would lock out every pod still holding the old
//! tokens), so its content is an input here, not something built.

use std::{collections::BTreeMap, fmt};

use k8s_openapi::{
    ByteString,
    api::core::v1::{Secret, Volume, VolumeMount},
};

use super::{
    BuildError, Owner,
    names::{self, Component},
    pod,
};
use flashsale_api::FlashSale;

/// Where the internal Secret's keys are mounted, one file per key.
pub const INTERNAL_DIR: &str = "/etc/flashsale/internal";
/// Key of the inventory API token (reserve, confirm, cancel, reads).
pub const API_TOKEN_KEY: &str = "inventory-token";
/// Key of the inventory admin token (loading a sale, stock adjustments).
pub const ADMIN_TOKEN_KEY: &str = "inventory-admin-token";

pub use flashsale_api::children::names::DRILL_KEY;
/// Where the gateway finds the drill key.
pub const DRILL_DIR: &str = "/etc/flashsale/drill";

/// The secrets of a sale's internal Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct InternalTokens {
    /// Sent by the gateway and the operator.
    pub api: String,
    /// Held by the inventory pods only.
    pub admin: String,
    /// Signs drill buyer tokens.
    pub drill: String,
}

/// Never prints the tokens: they end up in logs otherwise.
impl fmt::Debug for InternalTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InternalTokens { .. }")
    }
}

/// The Secret `<sale>-internal` holding `tokens`, owned by the sale so it goes
/// with it. Immutable: nobody (the operator included) can change a token
/// under running pods; rotating means deleting the Secret, and the operator
/// creates a new one.
pub fn internal_secret(sale: &FlashSale, tokens: &InternalTokens) -> Result<Secret, BuildError> {
    let owner = Owner::new(sale)?;
    let data = BTreeMap::from([
        (
            API_TOKEN_KEY.to_owned(),
            ByteString(tokens.api.clone().into_bytes()),
        ),
        (
            ADMIN_TOKEN_KEY.to_owned(),
            ByteString(tokens.admin.clone().into_bytes()),
        ),
        (
            DRILL_KEY.to_owned(),
            ByteString(tokens.drill.clone().into_bytes()),
        ),
    ]);
    Ok(Secret {
        metadata: owner.object_meta(names::internal_secret(sale), Component::Inventory),
        type_: Some("Opaque".to_owned()),
        immutable: Some(true),
        data: Some(data),
        ..Secret::default()
    })
}

/// The internal Secret's `keys` mounted as `<INTERNAL_DIR>/<key>`.
pub(super) fn internal_volume(owner: &Owner<'_>, keys: &[&str]) -> (Volume, VolumeMount) {
    let files: Vec<(&str, &str)> = keys.iter().map(|&key| (key, key)).collect();
    pod::secret_files(
        "internal",
        INTERNAL_DIR,
        &names::internal_secret(owner.sale),
        &files,
    )
}

/// The path of a mounted internal key, for the env variable naming it.
pub(super) fn internal_file(key: &str) -> String {
    format!("{INTERNAL_DIR}/{key}")
}

/// The drill key mounted in [`DRILL_DIR`], and the path of its file:
/// `spec.gateway.drillKeySecretRef`'s, or else the internal Secret's,
/// optionally: a Secret made before drill keys existed has none (it is
/// never rewritten), and its gateways then take no drill orders rather than
/// not starting.
pub(super) fn drill_volume(owner: &Owner<'_>) -> ((Volume, VolumeMount), String) {
    if let Some(secret) = &owner.sale.spec.gateway.drill_key_secret_ref {
        let file = format!("{DRILL_DIR}/{}", pod::SECRET_FILE);
        return (pod::secret_volume("drill", DRILL_DIR, secret), file);
    }
    let (mut volume, mount) = pod::secret_files(
        "drill",
        DRILL_DIR,
        &names::internal_secret(owner.sale),
        &[(DRILL_KEY, DRILL_KEY)],
    );
    if let Some(secret) = volume.secret.as_mut() {
        secret.optional = Some(true);
    }
    ((volume, mount), format!("{DRILL_DIR}/{DRILL_KEY}"))
}
