//! The features' modes: in full ([`Switches`], what a reader acts on) and as
//! the changes a tier makes ([`SwitchChanges`], what the CRD holds).

use std::collections::BTreeMap;

use serde::{
    Deserialize, Serialize,
    de::{DeserializeOwned, IntoDeserializer, value::StrDeserializer},
};

use crate::state::{ParseError, excerpt};

/// The feature names of the `switches` key, as the CRD spells them.
pub(crate) const FEATURES: [&str; 6] = [
    "recommendations",
    "orderHistory",
    "voucherPush",
    "reviews",
    "shopChat",
    "miniGames",
];

/// Recommendations under load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum RecommendationsMode {
    /// Computed per user.
    #[default]
    Normal,
    /// A static list, no per-user work.
    Static,
}

/// Order history under load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum OrderHistoryMode {
    /// Full history.
    #[default]
    Normal,
    /// The last 7 days only.
    Last7Days,
}

/// Voucher push under load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum VoucherPushMode {
    /// Sent at once.
    #[default]
    Normal,
    /// Accepted (202) and sent later.
    Deferred,
}

/// Reviews under load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ReviewsMode {
    /// Written at once.
    #[default]
    Normal,
    /// Queued and written later.
    Queued,
}

/// Shop chat under load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ShopChatMode {
    /// Unthrottled.
    #[default]
    Normal,
    /// One message per 5 s per user.
    Throttled,
}

/// Mini-games under load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum MiniGamesMode {
    /// Open.
    #[default]
    Normal,
    /// Closed with a maintenance notice (HTTP 200).
    Closed,
}

/// The mode of every non-core feature. Tier-0 features (checkout, stock
/// reservation, payment callbacks) have no switch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Switches {
    /// Recommendations.
    pub recommendations: RecommendationsMode,
    /// Order-history search.
    pub order_history: OrderHistoryMode,
    /// Voucher push notifications.
    pub voucher_push: VoucherPushMode,
    /// Product reviews.
    pub reviews: ReviewsMode,
    /// Shop chat.
    pub shop_chat: ShopChatMode,
    /// Mini-games.
    pub mini_games: MiniGamesMode,
}

/// Degraded modes of the non-core features. A feature left out keeps the
/// mode of the tier below (or runs normally at tier 0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SwitchChanges {
    /// Recommendations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommendations: Option<RecommendationsMode>,
    /// Order-history search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_history: Option<OrderHistoryMode>,
    /// Voucher push notifications.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voucher_push: Option<VoucherPushMode>,
    /// Product reviews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reviews: Option<ReviewsMode>,
    /// Shop chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shop_chat: Option<ShopChatMode>,
    /// Mini-games.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mini_games: Option<MiniGamesMode>,
}

impl Switches {
    /// These switches with `changes` applied: a feature `changes` leaves out
    /// keeps the mode it has here. The switches of tier n are
    /// `Switches::default()` with tier 1's changes, then tier 2's, … up to
    /// tier n's.
    pub fn with(&self, changes: &SwitchChanges) -> Self {
        Self {
            recommendations: changes.recommendations.unwrap_or(self.recommendations),
            order_history: changes.order_history.unwrap_or(self.order_history),
            voucher_push: changes.voucher_push.unwrap_or(self.voucher_push),
            reviews: changes.reviews.unwrap_or(self.reviews),
            shop_chat: changes.shop_chat.unwrap_or(self.shop_chat),
            mini_games: changes.mini_games.unwrap_or(self.mini_games),
        }
    }

    /// The features not in normal mode, which is what the `switches` key
    /// lists: a reader takes a feature left out as normal.
    pub(crate) fn degraded(&self) -> SwitchChanges {
        SwitchChanges {
            recommendations: unless_normal(self.recommendations),
            order_history: unless_normal(self.order_history),
            voucher_push: unless_normal(self.voucher_push),
            reviews: unless_normal(self.reviews),
            shop_chat: unless_normal(self.shop_chat),
            mini_games: unless_normal(self.mini_games),
        }
    }

    /// Parses the `switches` value: a JSON object feature → mode; a feature
    /// left out runs normally.
    pub(crate) fn parse(raw: &str) -> Result<Self, ParseError> {
        let modes: BTreeMap<String, String> = serde_json::from_str(raw)
            .map_err(|err| ParseError::invalid(crate::keys::SWITCHES, raw, err))?;
        let mut switches = Self::default();
        for (feature, mode) in &modes {
            match feature.as_str() {
                "recommendations" => switches.recommendations = parse_mode(feature, mode)?,
                "orderHistory" => switches.order_history = parse_mode(feature, mode)?,
                "voucherPush" => switches.voucher_push = parse_mode(feature, mode)?,
                "reviews" => switches.reviews = parse_mode(feature, mode)?,
                "shopChat" => switches.shop_chat = parse_mode(feature, mode)?,
                "miniGames" => switches.mini_games = parse_mode(feature, mode)?,
                _ => {
                    return Err(ParseError::UnknownFeature {
                        feature: excerpt(feature),
                    });
                }
            }
        }
        Ok(switches)
    }
}

/// `Some(mode)` unless it is the normal one (each mode's default).
fn unless_normal<M: Default + PartialEq>(mode: M) -> Option<M> {
    (mode != M::default()).then_some(mode)
}

/// A mode by its serde name, so the names live in one place (the enums).
fn parse_mode<M: DeserializeOwned>(feature: &str, mode: &str) -> Result<M, ParseError> {
    let deserializer: StrDeserializer<'_, serde::de::value::Error> = mode.into_deserializer();
    M::deserialize(deserializer).map_err(|err| ParseError::UnknownMode {
        feature: feature.to_owned(),
        mode: excerpt(mode),
        reason: err.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_degraded() -> Switches {
        Switches {
            recommendations: RecommendationsMode::Static,
            order_history: OrderHistoryMode::Last7Days,
            voucher_push: VoucherPushMode::Deferred,
            reviews: ReviewsMode::Queued,
            shop_chat: ShopChatMode::Throttled,
            mini_games: MiniGamesMode::Closed,
        }
    }

    #[test]
    fn a_feature_left_out_keeps_its_mode() {
        let tier1 = SwitchChanges {
            recommendations: Some(RecommendationsMode::Static),
            reviews: Some(ReviewsMode::Queued),
            ..SwitchChanges::default()
        };
        // Tier 2 degrades more and lifts one of tier 1's switches.
        let tier2 = SwitchChanges {
            reviews: Some(ReviewsMode::Normal),
            mini_games: Some(MiniGamesMode::Closed),
            ..SwitchChanges::default()
        };
        let at1 = Switches::default().with(&tier1);
        let at2 = at1.with(&tier2);
        assert_eq!(
            at1,
            Switches {
                recommendations: RecommendationsMode::Static,
                reviews: ReviewsMode::Queued,
                ..Switches::default()
            }
        );
        assert_eq!(
            at2,
            Switches {
                recommendations: RecommendationsMode::Static,
                mini_games: MiniGamesMode::Closed,
                ..Switches::default()
            }
        );
        assert_eq!(at2.with(&SwitchChanges::default()), at2, "no changes");
    }

    #[test]
    fn degraded_lists_exactly_the_features_not_in_normal_mode() {
        assert_eq!(Switches::default().degraded(), SwitchChanges::default());
        let all = all_degraded();
        assert_eq!(Switches::default().with(&all.degraded()), all);
        // The feature names the CRD writes are the ones the parser knows.
        let json = serde_json::to_value(all.degraded()).unwrap_or_default();
        let names: Vec<&str> = json
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut known = FEATURES.to_vec();
        known.sort_unstable();
        assert_eq!(names, known);
    }

    #[test]
    fn changes_read_and_write_as_the_crd_spells_them() {
        let json =
            r#"{"orderHistory":"last7Days","voucherPush":"deferred","shopChat":"throttled"}"#;
        let changes: Result<SwitchChanges, _> = serde_json::from_str(json);
        let expected = SwitchChanges {
            order_history: Some(OrderHistoryMode::Last7Days),
            voucher_push: Some(VoucherPushMode::Deferred),
            shop_chat: Some(ShopChatMode::Throttled),
            ..SwitchChanges::default()
        };
        assert_eq!(changes.ok(), Some(expected.clone()));
        // Features left out are not written, not even as null.
        assert_eq!(serde_json::to_string(&expected).ok().as_deref(), Some(json));
        let empty: Result<SwitchChanges, _> = serde_json::from_str("{}");
        assert_eq!(empty.ok(), Some(SwitchChanges::default()));
    }

    #[cfg(feature = "schema")]
    #[test]
    fn the_schema_spells_features_and_modes_in_camel_case() {
        let schema = serde_json::to_value(schemars::schema_for!(SwitchChanges)).unwrap_or_default();
        let properties: Vec<&str> = schema["properties"]
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut known = FEATURES.to_vec();
        known.sort_unstable();
        assert_eq!(properties, known);
        assert_eq!(schema.get("required"), None, "every feature is optional");
        assert_eq!(
            schema["properties"]["reviews"]["description"],
            "Product reviews."
        );
        let text = schema.to_string();
        for mode in [
            "normal",
            "static",
            "last7Days",
            "deferred",
            "queued",
            "throttled",
            "closed",
        ] {
            assert!(text.contains(&format!("\"{mode}\"")), "{mode}: {text}");
        }
    }
}
