//! The degradation state and its form as the ConfigMap's `data`.

use std::collections::BTreeMap;

use crate::{
    keys::{CHANGED_AT, GENERATION, OVERRIDE_EXPIRES, REASON, SWITCHES, TIER},
    switches::{FEATURES, Switches},
};

/// Longest excerpt of a bad value kept in a [`ParseError`], so a huge value
/// does not flood the logs.
const MAX_EXCERPT: usize = 256;

/// The degradation state the operator published for a sale.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Degradation {
    /// The tier, 0 = nothing degraded. The gateway acts on `switches`,
    /// which the operator derives from the tier; the tier itself sets the
    /// bot shield's difficulty, and is in metrics and logs.
    pub tier: u32,
    /// Increases on every change; orders the states.
    pub generation: u64,
    /// The mode of every non-core feature.
    pub switches: Switches,
    /// Why this tier, free text.
    pub reason: String,
    /// When the operator changed it (`None` when the key is absent).
    pub changed_at: Option<jiff::Timestamp>,
    /// When on-call's override that set this state lapses; `None` when the
    /// state is not an override's. The writer honours it whatever state
    /// the policy is in (see the operator's override expiry).
    pub override_expires: Option<jiff::Timestamp>,
}

impl Degradation {
    /// Parses the ConfigMap's `data`.
    ///
    /// `tier` and `generation` are required, because without them the state
    /// cannot be ordered or reported. `switches`, `reason` and `changedAt`
    /// may be absent (all normal, empty, `None`); when present they must be
    /// valid. Unknown features and modes are errors, so a typo never passes
    /// as "normal"; unknown keys are ignored, so an operator that adds a key
    /// does not freeze the gateways of the previous release during a rollout.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, ParseError> {
        let required = |key: &'static str| {
            data.get(key)
                .map(String::as_str)
                .ok_or(ParseError::Missing { key })
        };
        let tier = required(TIER)?;
        let generation = required(GENERATION)?;
        Ok(Self {
            tier: tier
                .parse()
                .map_err(|err| ParseError::invalid(TIER, tier, err))?,
            generation: generation
                .parse()
                .map_err(|err| ParseError::invalid(GENERATION, generation, err))?,
            switches: data
                .get(SWITCHES)
                .map(|raw| Switches::parse(raw))
                .transpose()?
                .unwrap_or_default(),
            reason: data.get(REASON).cloned().unwrap_or_default(),
            changed_at: timestamp(data, CHANGED_AT)?,
            override_expires: timestamp(data, OVERRIDE_EXPIRES)?,
        })
    }

    /// The ConfigMap's `data` for this state, which [`Self::from_data`]
    /// reads back as it is.
    ///
    /// `switches` lists only the features not in normal mode (`{}` when none
    /// is, as at tier 0), so a reader of an older release is not handed a
    /// feature it does not know merely to be told it runs normally. `reason`
    /// is always written, `changedAt` when set.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        // Serialising a struct of unit enums cannot fail; were it to, the
        // empty value is invalid `switches`, which readers reject and keep
        // the state in force, rather than a silent "all normal".
        let switches = serde_json::to_string(&self.switches.degraded()).unwrap_or_default();
        let mut data = BTreeMap::from([
            (TIER.to_owned(), self.tier.to_string()),
            (GENERATION.to_owned(), self.generation.to_string()),
            (SWITCHES.to_owned(), switches),
            (REASON.to_owned(), self.reason.clone()),
        ]);
        if let Some(changed_at) = self.changed_at {
            data.insert(CHANGED_AT.to_owned(), changed_at.to_string());
        }
        if let Some(expires) = self.override_expires {
            data.insert(OVERRIDE_EXPIRES.to_owned(), expires.to_string());
        }
        data
    }
}

/// The optional RFC 3339 instant under `key`.
fn timestamp(
    data: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<jiff::Timestamp>, ParseError> {
    data.get(key)
        .map(|raw| {
            raw.parse()
                .map_err(|err| ParseError::invalid(key, raw, err))
        })
        .transpose()
}

/// Why a ConfigMap's `data` is not a valid degradation state. Every variant
/// names the key (and the value) at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A required key is absent.
    #[error("key `{key}` is missing")]
    Missing {
        /// The key.
        key: &'static str,
    },
    /// A key's value does not parse.
    #[error("key `{key}` has an invalid value {value:?}: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// The value (cut to 256 bytes).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `switches` names a feature that has no switch.
    #[error("key `switches` names an unknown feature {feature:?} (known: {})", FEATURES.join(", "))]
    UnknownFeature {
        /// The feature as written.
        feature: String,
    },
    /// `switches` gives a feature a mode it does not have.
    #[error("key `switches` gives feature `{feature}` an unknown mode {mode:?}: {reason}")]
    UnknownMode {
        /// The feature.
        feature: String,
        /// The mode as written.
        mode: String,
        /// The modes the feature has.
        reason: String,
    },
}

impl ParseError {
    pub(crate) fn invalid(key: &'static str, value: &str, reason: impl ToString) -> Self {
        Self::Invalid {
            key,
            value: excerpt(value),
            reason: reason.to_string(),
        }
    }
}

/// `value` cut to [`MAX_EXCERPT`] characters.
pub(crate) fn excerpt(value: &str) -> String {
    match value.char_indices().nth(MAX_EXCERPT) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        MiniGamesMode, OrderHistoryMode, RecommendationsMode, ReviewsMode, ShopChatMode,
        VoucherPushMode,
    };

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn state(generation: u64, tier: u32) -> Degradation {
        Degradation {
            tier,
            generation,
            ..Degradation::default()
        }
    }

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
    fn a_full_data_map_parses() {
        let parsed = Degradation::from_data(&data(&[
            ("tier", "2"),
            ("generation", "17"),
            (
                "switches",
                r#"{"recommendations":"static","orderHistory":"last7Days","voucherPush":"deferred",
                "reviews":"queued","shopChat":"throttled","miniGames":"closed"}"#,
            ),
            ("reason", "checkout p99 at 1.4x budget"),
            ("changedAt", "2026-11-11T00:00:03Z"),
        ]));
        let expected = Degradation {
            tier: 2,
            generation: 17,
            switches: all_degraded(),
            reason: "checkout p99 at 1.4x budget".to_owned(),
            changed_at: "2026-11-11T00:00:03Z".parse().ok(),
            override_expires: None,
        };
        assert!(expected.changed_at.is_some());
        assert_eq!(parsed, Ok(expected));
    }

    #[test]
    fn features_left_out_run_normally_and_optional_keys_may_be_absent() {
        let partial = Degradation::from_data(&data(&[
            ("tier", "1"),
            ("generation", "3"),
            ("switches", r#"{"reviews":"queued","miniGames":"normal"}"#),
        ]));
        let expected = Switches {
            reviews: ReviewsMode::Queued,
            ..Switches::default()
        };
        assert_eq!(partial.map(|d| d.switches), Ok(expected));

        let bare = Degradation::from_data(&data(&[("tier", "0"), ("generation", "1")]));
        assert_eq!(bare, Ok(state(1, 0)));
        // Keys this release does not know are left for a newer reader.
        let newer = Degradation::from_data(&data(&[
            ("tier", "0"),
            ("generation", "1"),
            ("rolloutHint", "x"),
        ]));
        assert_eq!(newer, Ok(state(1, 0)));
    }

    #[test]
    fn tier_and_generation_are_required() {
        assert_eq!(
            Degradation::from_data(&data(&[("generation", "1")])),
            Err(ParseError::Missing { key: "tier" })
        );
        assert_eq!(
            Degradation::from_data(&data(&[("tier", "1")])),
            Err(ParseError::Missing { key: "generation" })
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("tier", "two", "`tier`"),
            ("tier", "-1", "`tier`"),
            ("generation", "1.5", "`generation`"),
            ("switches", "reviews=queued", "`switches`"),
            ("switches", r#"{"reviews":1}"#, "`switches`"),
            ("changedAt", "yesterday", "`changedAt`"),
            ("overrideExpires", "tomorrow", "`overrideExpires`"),
        ];
        for (key, value, named) in cases {
            let mut map = data(&[("tier", "1"), ("generation", "2")]);
            map.insert(key.to_owned(), value.to_owned());
            let err = Degradation::from_data(&map)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(named), "{key}={value}: {err}");
            assert!(err.contains(&format!("{value:?}")), "{key}={value}: {err}");
        }
    }

    #[test]
    fn an_unknown_feature_or_mode_is_an_error_not_normal() {
        let parse = |switches: &str| {
            Degradation::from_data(&data(&[
                ("tier", "1"),
                ("generation", "2"),
                ("switches", switches),
            ]))
        };
        let feature = parse(r#"{"checkout":"closed"}"#);
        assert_eq!(
            feature,
            Err(ParseError::UnknownFeature {
                feature: "checkout".to_owned()
            })
        );
        let text = feature.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("`switches`") && text.contains("miniGames"),
            "{text}"
        );

        let mode = parse(r#"{"reviews":"queud"}"#);
        let Err(ParseError::UnknownMode {
            feature,
            mode,
            reason,
        }) = &mode
        else {
            panic!("expected an unknown mode, got {mode:?}");
        };
        assert_eq!((feature.as_str(), mode.as_str()), ("reviews", "queud"));
        assert!(reason.contains("queued"), "names the valid modes: {reason}");
        // Modes are case-sensitive, as in the CRD.
        assert!(parse(r#"{"reviews":"Queued"}"#).is_err());
    }

    #[test]
    fn huge_values_are_cut_in_errors() {
        let huge = "9".repeat(10_000);
        let err = Degradation::from_data(&data(&[("tier", &huge), ("generation", "1")]));
        let text = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.len() < 1_000, "{} bytes", text.len());
    }

    #[test]
    fn tier_0_lists_no_switch_and_writes_every_key_but_an_unset_time() {
        let at0 = Degradation {
            reason: "load back below every tier".to_owned(),
            ..state(9, 0)
        };
        assert_eq!(
            at0.to_data(),
            data(&[
                ("tier", "0"),
                ("generation", "9"),
                ("switches", "{}"),
                ("reason", "load back below every tier"),
            ])
        );
    }

    #[test]
    fn switches_list_only_features_not_in_normal_mode() {
        let at1 = Degradation {
            switches: Switches {
                recommendations: RecommendationsMode::Static,
                shop_chat: ShopChatMode::Throttled,
                ..Switches::default()
            },
            changed_at: "2026-11-11T00:00:03Z".parse().ok(),
            ..state(10, 1)
        };
        let written = at1.to_data();
        assert_eq!(
            written.get("switches").map(String::as_str),
            Some(r#"{"recommendations":"static","shopChat":"throttled"}"#)
        );
        assert_eq!(
            written.get("changedAt").map(String::as_str),
            Some("2026-11-11T00:00:03Z")
        );
    }

    #[test]
    fn what_is_written_reads_back_as_it_was() {
        let states = [
            Degradation::default(),
            state(1, 0),
            Degradation {
                tier: 1,
                generation: 1_762_819_200_000,
                switches: Switches {
                    reviews: ReviewsMode::Queued,
                    ..Switches::default()
                },
                reason: "checkout p99 at 1.1x budget".to_owned(),
                changed_at: "2026-11-11T00:00:00Z".parse().ok(),
                override_expires: None,
            },
            Degradation {
                tier: 3,
                generation: u64::MAX,
                switches: all_degraded(),
                reason: "on-call override: \"hold\" {not json}\nsecond line".to_owned(),
                // Sub-second precision survives.
                changed_at: "2026-11-11T00:00:03.123456789Z".parse().ok(),
                override_expires: "2026-11-11T01:00:00Z".parse().ok(),
            },
        ];
        for written in states {
            assert_eq!(
                Degradation::from_data(&written.to_data()),
                Ok(written.clone())
            );
        }
    }
}
