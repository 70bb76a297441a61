//! What the gateway acknowledged, per buyer: the evidence the checks
//! compare with what the sale's services recorded.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// An order the gateway acknowledged (201, or 200 for one already paid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderRecord {
    /// The gateway's order id.
    pub order_id: String,
    /// The idempotency key of the purchase.
    pub idempotency_key: String,
    /// The SKU.
    pub sku: String,
    /// Units ordered.
    pub quantity: u64,
    /// The amount the gateway named, in minor units.
    pub amount_minor: u64,
    /// When it was acknowledged (Unix milliseconds).
    pub acknowledged_at_ms: i64,
    /// Whether the payment callback was answered 2xx.
    pub paid: bool,
}

/// A purchase whose outcome stayed unknown: a request may have gone
/// through, and no answer for its key said whether it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unresolved {
    /// The idempotency key.
    pub idempotency_key: String,
    /// The SKU.
    pub sku: String,
    /// Units asked for.
    pub quantity: u64,
    /// When the purchase was given up (Unix milliseconds).
    pub given_up_at_ms: i64,
    /// The last thing seen: a status code, an error code or a transport error.
    pub last: String,
}

/// One buyer's part of the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuyerLedger {
    /// The user, `buyer-<i>`.
    pub user: String,
    /// Acknowledged orders, in order.
    pub orders: Vec<OrderRecord>,
    /// Purchases with unknown outcome.
    pub unresolved: Vec<Unresolved>,
}

/// Every buyer that arrived, by buyer number.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ledger {
    /// The buyers' parts.
    pub buyers: Vec<BuyerLedger>,
}

impl Ledger {
    /// Every acknowledged order with its user.
    pub fn orders(&self) -> impl Iterator<Item = (&str, &OrderRecord)> {
        self.buyers
            .iter()
            .flat_map(|b| b.orders.iter().map(move |o| (b.user.as_str(), o)))
    }

    /// The ids of every acknowledged order.
    pub fn order_ids(&self) -> BTreeSet<String> {
        self.orders().map(|(_, o)| o.order_id.clone()).collect()
    }

    /// The ids of every paid order.
    pub fn paid_order_ids(&self) -> BTreeSet<String> {
        self.orders()
            .filter(|(_, o)| o.paid)
            .map(|(_, o)| o.order_id.clone())
            .collect()
    }

    /// Units acknowledged per SKU.
    pub fn units_acknowledged(&self) -> BTreeMap<String, u64> {
        self.units(|_| true)
    }

    /// Units paid per SKU.
    pub fn units_paid(&self) -> BTreeMap<String, u64> {
        self.units(|o| o.paid)
    }

    /// Every purchase with unknown outcome, with its user.
    pub fn unresolved(&self) -> impl Iterator<Item = (&str, &Unresolved)> {
        self.buyers
            .iter()
            .flat_map(|b| b.unresolved.iter().map(move |u| (b.user.as_str(), u)))
    }

    /// The ledger as pretty JSON.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    fn units(&self, keep: impl Fn(&OrderRecord) -> bool) -> BTreeMap<String, u64> {
        let mut units = BTreeMap::new();
        for (_, order) in self.orders().filter(|(_, o)| keep(o)) {
            *units.entry(order.sku.clone()).or_default() += order.quantity;
        }
        units
    }
}
