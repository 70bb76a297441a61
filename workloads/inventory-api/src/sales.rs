//! Loading a sale: its definition and what the load did.

use serde::{Deserialize, Serialize};

/// A sale as the inventory needs it: the body of [`crate::paths::SALES`],
/// and the file the inventory may load at start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SaleDefinition {
    /// Sale id.
    pub sale: String,
    /// How long a reservation may stay unpaid, in milliseconds.
    pub reservation_ttl_ms: u64,
    /// Items on sale.
    pub items: Vec<ItemDefinition>,
    /// When the sale opens (Unix ms). Stock is created only before then:
    /// stock missing after the opening was lost, not new. Without it any
    /// load may create stock. Last on the wire: the operator hashes the
    /// definition without it, and a reordering would change every running
    /// sale's hash (and restart its inventory) on upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opens_at_ms: Option<u64>,
}

impl SaleDefinition {
    /// When the sale opens, Unix ms, if the definition says (`opensAtMs`).
    pub fn opening(&self) -> u64 {
        self.opens_at_ms.unwrap_or(0)
    }
}

/// One SKU of a sale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemDefinition {
    /// The SKU.
    pub sku: String,
    /// Units for sale.
    pub stock: u64,
    /// Most units one user may hold.
    pub per_user_limit: u64,
    /// Redis keys (slots) the stock is split over.
    pub shards: u32,
}

impl ItemDefinition {
    /// The drill buyer's SKU ([`flashsale_drill_buyer::SKU`]) as every sale
    /// stocks it: one unit per drill order, one shard (its orders are few).
    pub fn drill() -> Self {
        Self {
            sku: flashsale_drill_buyer::SKU.to_owned(),
            stock: flashsale_drill_buyer::STOCK,
            per_user_limit: 1,
            shards: 1,
        }
    }
}

/// Whether a load created a SKU or found it. The fields are in their order
/// on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedItem {
    /// `true` if this load created it; `false` if its counts were kept.
    pub created: bool,
    /// The SKU.
    pub sku: String,
}

/// The answer to loading a sale. The fields are in their order on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedSale {
    /// Each SKU of the definition, in its order.
    pub items: Vec<LoadedItem>,
    /// The sale id.
    pub sale: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), serde_json::Error>;

    fn definition(opens_at_ms: Option<u64>) -> SaleDefinition {
        SaleDefinition {
            sale: "shop.spring.1a2b3c4d".into(),
            reservation_ttl_ms: 600_000,
            opens_at_ms,
            items: vec![ItemDefinition {
                sku: "PHONE".into(),
                stock: 100,
                per_user_limit: 2,
                shards: 4,
            }],
        }
    }

    #[test]
    fn a_sale_definition_is_camel_case() -> Result {
        // The opening last: the operator's config hash was taken over this order.
        let wire = r#"{"sale":"shop.spring.1a2b3c4d","reservationTtlMs":600000,"items":[{"sku":"PHONE","stock":100,"perUserLimit":2,"shards":4}],"opensAtMs":1700000000000}"#;
        let def = definition(Some(1_700_000_000_000));
        assert_eq!(serde_json::to_string(&def)?, wire);
        assert_eq!(serde_json::from_str::<SaleDefinition>(wire)?, def);
        // Read in any order, as an older writer sent it.
        let earlier = r#"{"sale":"shop.spring.1a2b3c4d","reservationTtlMs":600000,"opensAtMs":1700000000000,"items":[{"sku":"PHONE","stock":100,"perUserLimit":2,"shards":4}]}"#;
        assert_eq!(serde_json::from_str::<SaleDefinition>(earlier)?, def);
        assert_eq!(def.opening(), 1_700_000_000_000);
        Ok(())
    }

    #[test]
    fn a_sale_without_an_opening_leaves_it_out() -> Result {
        let wire = r#"{"sale":"shop.spring.1a2b3c4d","reservationTtlMs":600000,"items":[{"sku":"PHONE","stock":100,"perUserLimit":2,"shards":4}]}"#;
        let def = definition(None);
        assert_eq!(serde_json::to_string(&def)?, wire);
        assert_eq!(serde_json::from_str::<SaleDefinition>(wire)?, def);
        assert_eq!(def.opening(), 0);
        Ok(())
    }

    #[test]
    fn a_load_answers_each_sku() -> Result {
        let wire = r#"{"items":[{"created":true,"sku":"PHONE"},{"created":false,"sku":"CASE"}],"sale":"shop.spring.1a2b3c4d"}"#;
        let loaded = LoadedSale {
            items: vec![
                LoadedItem {
                    created: true,
                    sku: "PHONE".into(),
                },
                LoadedItem {
                    created: false,
                    sku: "CASE".into(),
                },
            ],
            sale: "shop.spring.1a2b3c4d".into(),
        };
        assert_eq!(serde_json::to_string(&loaded)?, wire);
        assert_eq!(serde_json::from_str::<LoadedSale>(wire)?, loaded);
        Ok(())
    }
}
