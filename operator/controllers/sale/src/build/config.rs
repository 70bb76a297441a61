//! Workload configuration ConfigMaps: the gateway's `gateway.json`, the
//! inventory's `sale.json`, the degradation switches (written by the
//! DegradationPolicy controller), and the hash that rolls pods when a
//! configuration changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{BuildError, Owner, names, names::Component};
use flashsale_api::{BotShield, FlashSale};
use flashsale_inventory_api::{ItemDefinition, SaleDefinition};

/// Key of the gateway's configuration in its ConfigMap.
pub const GATEWAY_CONFIG_KEY: &str = "gateway.json";
/// Key of the inventory's sale definition in its ConfigMap.
pub const INVENTORY_CONFIG_KEY: &str = "sale.json";
/// Pod-template annotation holding a hash of the workload's configuration:
/// ConfigMap content is not part of the pod template, so without it a
/// changed price or stock would never reach running pods.
pub const CONFIG_HASH_ANNOTATION: &str = "flashsale.dev/config-hash";

/// Mirror of the gateway's `GatewayConfig` (workloads/gateway/src/config.rs).
/// The gateway refuses unknown fields, so only its fields appear here; field
/// order is declaration order, which keeps the JSON (and its hash) stable.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GatewayConfig<'a> {
    sale: &'a str,
    items: Vec<ItemPrice<'a>>,
    /// ISO 4217 code of every price, checked against payment callbacks.
    currency: &'a str,
    rate_limit: RateLimitConfig,
    waiting_room: WaitingRoomConfig,
    concurrency: ConcurrencyConfig,
    opens_at: String,
    closes_at: String,
    /// Stamped on every answer, so a client behind a global endpoint sees
    /// which region served it.
    region: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ItemPrice<'a> {
    sku: &'a str,
    price_minor: i64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RateLimitConfig {
    per_user_per_second: u32,
    burst: u32,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WaitingRoomConfig {
    enabled: bool,
    admit_per_second: u32,
    pass_ttl_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    bot_shield: Option<BotShieldConfig>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct BotShieldConfig {
    difficulty_bits: Vec<u8>,
    challenge_ttl_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    per_source: Option<PerSourceConfig>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PerSourceConfig {
    joins_per_second: u32,
    burst: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    trusted_proxies: Vec<String>,
}

/// The gateway's bot shield, from the spec's.
fn bot_shield(shield: &BotShield) -> Result<BotShieldConfig, BuildError> {
    let difficulty_bits = shield
        .difficulty_bits
        .iter()
        .map(|&bits| fit("spec.gateway.waitingRoom.botShield.difficultyBits", bits))
        .collect::<Result<_, _>>()?;
    let per_source = shield
        .per_source
        .as_ref()
        .map(|budget| {
            if let Some(bad) = budget.trusted_proxies.iter().find(|net| {
                net.parse::<ipnet::IpNet>().is_err() && net.parse::<std::net::IpAddr>().is_err()
            }) {
                return Err(BuildError::OutOfRange {
                    field: "spec.gateway.waitingRoom.botShield.perSource.trustedProxies",
                    value: bad.clone(),
                });
            }
            Ok(PerSourceConfig {
                joins_per_second: fit(
                    "spec.gateway.waitingRoom.botShield.perSource.joinsPerSecond",
                    budget.joins_per_second,
                )?,
                burst: fit(
                    "spec.gateway.waitingRoom.botShield.perSource.burst",
                    budget.burst,
                )?,
                header: budget.header.clone(),
                trusted_proxies: budget.trusted_proxies.clone(),
            })
        })
        .transpose()?;
    Ok(BotShieldConfig {
        difficulty_bits,
        challenge_ttl_seconds: ceil_secs(shield.challenge_ttl.0),
        per_source,
    })
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ConcurrencyConfig {
    min_limit: u32,
    max_limit: u32,
    tier0_reserved_percent: u32,
}

/// A rendered configuration document and its hash.
#[derive(Debug, Clone)]
pub(super) struct Rendered {
    /// The document.
    pub text: String,
    /// [`config_hash`] of the document.
    pub hash: String,
}

impl Rendered {
    pub(super) fn new(text: String) -> Self {
        let hash = config_hash(&text);
        Self { text, hash }
    }
}

/// First 16 hex characters of the SHA-256 of `text`: enough to tell
/// configurations apart, short enough to read in `kubectl describe`.
pub(super) fn config_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Converts a spec integer to the type the workload reads, naming the field
/// when it does not fit instead of wrapping around.
fn fit<T, S>(field: &'static str, value: S) -> Result<T, BuildError>
where
    T: TryFrom<S>,
    S: Copy + ToString,
{
    T::try_from(value).map_err(|_| BuildError::OutOfRange {
        field,
        value: value.to_string(),
    })
}

/// The gateway takes whole requests per second; rounding up never makes the
/// limit stricter than the spec asked.
fn whole_rate(per_second: f64) -> u32 {
    // `as` saturates (and maps NaN to 0), and the gateway refuses 0.
    (per_second.ceil() as u32).max(1)
}

/// Whole seconds, rounded up so a pass never expires before the spec says.
fn ceil_secs(duration: std::time::Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// The gateway's `gateway.json`; `sale_id` is [`super::names::sale_id`].
pub(super) fn gateway_json(sale: &FlashSale, sale_id: &str) -> Result<Rendered, BuildError> {
    let spec = &sale.spec;
    let gateway = &spec.gateway;
    let config = GatewayConfig {
        sale: sale_id,
        items: spec
            .items
            .iter()
            .map(|item| ItemPrice {
                sku: &item.sku,
                price_minor: item.price_minor,
            })
            .collect(),
        currency: &spec.currency,
        rate_limit: RateLimitConfig {
            per_user_per_second: whole_rate(gateway.rate_limit.per_user_per_second),
            burst: fit("spec.gateway.rateLimit.burst", gateway.rate_limit.burst)?,
        },
        waiting_room: WaitingRoomConfig {
            enabled: gateway.waiting_room.enabled,
            admit_per_second: fit(
                "spec.gateway.waitingRoom.admitPerSecond",
                gateway.waiting_room.admit_per_second,
            )?,
            pass_ttl_seconds: ceil_secs(gateway.waiting_room.pass_ttl.0),
            bot_shield: gateway
                .waiting_room
                .bot_shield
                .as_ref()
                .map(bot_shield)
                .transpose()?,
        },
        concurrency: ConcurrencyConfig {
            min_limit: fit(
                "spec.gateway.concurrency.minLimit",
                gateway.concurrency.min_limit,
            )?,
            max_limit: fit(
                "spec.gateway.concurrency.maxLimit",
                gateway.concurrency.max_limit,
            )?,
            tier0_reserved_percent: fit(
                "spec.gateway.concurrency.tier0ReservedPercent",
                gateway.concurrency.tier0_reserved_percent,
            )?,
        },
        // jiff prints a Timestamp as RFC 3339 in UTC ("…Z").
        opens_at: spec.schedule.start.0.to_string(),
        closes_at: spec.schedule.end.0.to_string(),
        region: &spec.region,
    };
    Ok(Rendered::new(serde_json::to_string_pretty(&config)?))
}

/// The inventory's `sale.json`; `sale_id` is [`super::names::sale_id`].
pub(super) fn sale_json(sale: &FlashSale, sale_id: &str) -> Result<Rendered, BuildError> {
    let spec = &sale.spec;
    let items = spec
        .items
        .iter()
        .map(|item| {
            Ok(ItemDefinition {
                sku: item.sku.clone(),
                stock: fit("spec.items[].stock", item.stock)?,
                per_user_limit: fit("spec.items[].perUserLimit", item.per_user_limit)?,
                shards: fit("spec.items[].shards", item.shards)?,
            })
        })
        // The drill buyer's stock, beside the sale's and never part of it.
        .chain([Ok(ItemDefinition::drill())])
        .collect::<Result<_, BuildError>>()?;
    let mut definition = SaleDefinition {
        sale: sale_id.to_owned(),
        reservation_ttl_ms: fit("spec.reservationTTL", spec.reservation_ttl.0.as_millis())?,
        items,
        opens_at_ms: None,
    };
    // The pods' config hash leaves the load fence out: setting it must not
    // restart a running inventory. The mounted file follows the ConfigMap,
    // and the fence matters only to an inventory that starts later.
    let hash = config_hash(&serde_json::to_string_pretty(&definition)?);
    definition.opens_at_ms = sale
        .status
        .as_ref()
        .and_then(|status| status.stock_loaded_at.as_ref())
        .and_then(|loaded| u64::try_from(loaded.0.as_millisecond()).ok());
    Ok(Rendered {
        text: serde_json::to_string_pretty(&definition)?,
        hash,
    })
}

/// `<sale>-gateway` with `gateway.json`.
pub(super) fn gateway_config_map(owner: &Owner<'_>, rendered: &Rendered) -> ConfigMap {
    ConfigMap {
        metadata: owner.object_meta(names::gateway_config(owner.sale), Component::Gateway),
        data: Some(BTreeMap::from([(
            GATEWAY_CONFIG_KEY.to_owned(),
            rendered.text.clone(),
        )])),
        ..ConfigMap::default()
    }
}

/// `<sale>-inventory` with `sale.json`.
pub(super) fn inventory_config_map(owner: &Owner<'_>, rendered: &Rendered) -> ConfigMap {
    ConfigMap {
        metadata: owner.object_meta(names::inventory_config(owner.sale), Component::Inventory),
        data: Some(BTreeMap::from([(
            INVENTORY_CONFIG_KEY.to_owned(),
            rendered.text.clone(),
        )])),
        ..ConfigMap::default()
    }
}
