//! Stock levels and stock adjustments.

use serde::{Deserialize, Serialize};

/// Stock of one SKU ([`crate::paths::STOCK`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockLevel {
    /// Units for sale in total.
    pub stock: u64,
    /// Units that can still be reserved.
    pub available: u64,
    /// Units reserved, not yet paid.
    pub reserved: u64,
    /// Units paid.
    pub sold: u64,
}

/// Body of a stock adjustment ([`crate::paths::ADJUSTMENTS`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdjustBody {
    /// Units to add (negative removes), non-zero, at most 1e9 in size.
    pub delta: i64,
    /// Why, 1 to 512 characters: adjustments are audited.
    pub reason: String,
}

/// What a stock adjustment did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Adjustment {
    /// The SKU.
    pub sku: String,
    /// Units asked for (negative removes).
    pub requested: i64,
    /// Units actually moved: a decrease takes only available units.
    pub applied: i64,
    /// Why, as given.
    pub reason: String,
    /// Stock before.
    pub before: StockLevel,
    /// Stock after.
    pub after: StockLevel,
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), serde_json::Error>;

    #[test]
    fn a_stock_level_names_every_count() -> Result {
        let wire = r#"{"stock":100,"available":97,"reserved":2,"sold":1}"#;
        let level = StockLevel {
            stock: 100,
            available: 97,
            reserved: 2,
            sold: 1,
        };
        assert_eq!(serde_json::to_string(&level)?, wire);
        assert_eq!(serde_json::from_str::<StockLevel>(wire)?, level);
        Ok(())
    }

    #[test]
    fn an_adjustment_is_asked_and_answered() -> Result {
        let wire = r#"{"delta":-5,"reason":"damaged in the warehouse"}"#;
        let body = AdjustBody {
            delta: -5,
            reason: "damaged in the warehouse".into(),
        };
        assert_eq!(serde_json::to_string(&body)?, wire);
        assert_eq!(serde_json::from_str::<AdjustBody>(wire)?, body);
        assert!(
            serde_json::from_str::<AdjustBody>(r#"{"delta":1,"reason":"x","by":"me"}"#).is_err()
        );

        let wire = r#"{"sku":"A","requested":-5,"applied":-3,"reason":"damaged in the warehouse","before":{"stock":10,"available":3,"reserved":5,"sold":2},"after":{"stock":7,"available":0,"reserved":5,"sold":2}}"#;
        let report = Adjustment {
            sku: "A".into(),
            requested: -5,
            applied: -3,
            reason: "damaged in the warehouse".into(),
            before: StockLevel {
                stock: 10,
                available: 3,
                reserved: 5,
                sold: 2,
            },
            after: StockLevel {
                stock: 7,
                available: 0,
                reserved: 5,
                sold: 2,
            },
        };
        assert_eq!(serde_json::to_string(&report)?, wire);
        assert_eq!(serde_json::from_str::<Adjustment>(wire)?, report);
        Ok(())
    }
}
