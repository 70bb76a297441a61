//! The sale's internal Secret (`<sale>-internal`, see
//! [`build::internal_secret`]) at run time: created once with fresh random
//! tokens, then only read, for the API token the operator's own stock probe
//! sends. A Secret of that name that is not the sale's, or that lacks a
//! token, blocks the sale instead of being replaced: replacing it would lock
//! out the pods that hold the old tokens.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use super::{Ctx, build, build::ADMIN_TOKEN_KEY, build::API_TOKEN_KEY, build::InternalTokens};
use flashsale_api::{FlashSale, reasons::SaleReason};
use flashsale_kit::{Blocker, Failure as Error, Verb, apply};

/// Bytes of randomness per token (written as twice as many hex digits).
const TOKEN_BYTES: usize = 32;

/// Fresh tokens and drill key from the thread-local CSPRNG (seeded by the
/// OS).
pub fn generate() -> InternalTokens {
    InternalTokens {
        api: random_token(),
        admin: random_token(),
        drill: random_token(),
    }
}

fn random_token() -> String {
    let bytes: [u8; TOKEN_BYTES] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The API token of the sale's internal Secret, creating the Secret first
/// when it does not exist; a blocker when the Secret of that name cannot be
/// used.
pub async fn ensure(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
) -> Result<Result<String, Blocker<SaleReason>>, Error> {
    let name = build::names::internal_secret(sale);
    let uid = sale
        .uid()
        .ok_or(flashsale_kit::Error::MissingMetadata("metadata.uid"))?;
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let read = |source| flashsale_kit::Error::kube(Verb::Read, "Secret", &name)(source);
    let existing = match api.get_opt(&name).await.map_err(read)? {
        Some(secret) => secret,
        None => {
            let wanted = build::internal_secret(sale, &generate())?;
            match apply::create(ctx, &wanted).await? {
                Some(created) => created,
                // Created in between: read what is there.
                None => api.get(&name).await.map_err(read)?,
            }
        }
    };
    Ok(api_token(&existing, &uid, namespace))
}

/// The API token of `secret`, if it is the sale's (controlled by `sale_uid`)
/// and holds both tokens.
pub fn api_token(
    secret: &Secret,
    sale_uid: &str,
    namespace: &str,
) -> Result<String, Blocker<SaleReason>> {
    let name = secret.name_any();
    if !apply::controlled_by(secret, sale_uid) {
        return Err(Blocker {
            reason: SaleReason::SecretNotOwned,
            message: format!(
                "Secret {namespace}/{name} exists but this FlashSale does not own it (left by \
                 an earlier sale of the same name?); delete it and the operator creates a new one"
            ),
        });
    }
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    match (value(API_TOKEN_KEY), value(ADMIN_TOKEN_KEY)) {
        (Some(token), Some(_)) => Ok(token),
        (api, _) => {
            let key = if api.is_none() {
                API_TOKEN_KEY
            } else {
                ADMIN_TOKEN_KEY
            };
            Err(Blocker {
                reason: SaleReason::SecretKeyMissing,
                message: format!(
                    "Secret {namespace}/{name} has no usable key {key:?}; delete it and the \
                     operator creates a new one"
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use flashsale_api::FlashSale;

    fn sale() -> FlashSale {
        let mut sale: FlashSale = match serde_yaml_ng::from_str(include_str!(
            "../../../../crds/examples/flashsale-singles-day.yaml"
        )) {
            Ok(sale) => sale,
            Err(err) => panic!("example: {err}"),
        };
        sale.metadata.uid = Some("6f1c5b8e-0000-4000-8000-000000000001".to_owned());
        sale
    }

    #[test]
    fn tokens_are_32_random_bytes_in_hex_and_never_repeat() {
        let tokens: Vec<InternalTokens> = (0..50).map(|_| generate()).collect();
        let mut seen = BTreeSet::new();
        for t in &tokens {
            for token in [&t.api, &t.admin, &t.drill] {
                assert_eq!(token.len(), 64);
                assert!(
                    token
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_uppercase()),
                    "{token}"
                );
                assert!(seen.insert(token.clone()), "a token came twice");
            }
        }
        // The tokens never reach a log line.
        assert_eq!(format!("{:?}", tokens[0]), "InternalTokens { .. }");
    }

    #[test]
    fn the_sale_reads_its_own_secret_and_refuses_any_other() -> anyhow::Result<()> {
        let sale = sale();
        let uid = sale.metadata.uid.clone().unwrap_or_default();
        let tokens = generate();
        let secret = build::internal_secret(&sale, &tokens)?;
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("singles-day-internal")
        );
        assert_eq!(secret.immutable, Some(true));
        assert_eq!(api_token(&secret, &uid, "default"), Ok(tokens.api.clone()));

        // A Secret of the same name from an earlier sale of that name.
        let stale = api_token(&secret, "another-uid", "default");
        assert_eq!(
            stale.as_ref().map_err(|b| b.reason),
            Err(SaleReason::SecretNotOwned)
        );
        assert!(
            stale.is_err_and(|b| b.message.contains("Secret default/singles-day-internal")),
            "names the Secret"
        );

        // A token removed by hand.
        let mut broken = secret;
        if let Some(data) = broken.data.as_mut() {
            data.remove(ADMIN_TOKEN_KEY);
        }
        let missing = api_token(&broken, &uid, "default");
        assert!(
            missing
                .as_ref()
                .is_err_and(|b| b.reason == SaleReason::SecretKeyMissing
                    && b.message.contains("inventory-admin-token")),
            "{missing:?}"
        );
        Ok(())
    }
}
