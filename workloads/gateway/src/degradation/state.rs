//! The switches, their parse from the ConfigMap's `data`, and the board that
//! holds the state in force.

use std::{collections::BTreeMap, sync::Arc};

use serde::{
    Deserialize, Serialize,
    de::{DeserializeOwned, IntoDeserializer, value::StrDeserializer},
};
use tokio::sync::watch;

/// The feature names of the `switches` key, as the CRD spells them.
const FEATURES: [&str; 6] = [
    "recommendations",
    "orderHistory",
    "voucherPush",
    "reviews",
    "shopChat",
    "miniGames",
];

/// Longest excerpt of a bad value kept in a [`ParseError`], so a huge value
/// does not flood the logs.
const MAX_EXCERPT: usize = 256;

/// Recommendations under load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

impl Switches {
    /// Parses the `switches` value: a JSON object feature → mode; a feature
    /// left out runs normally.
    fn parse(raw: &str) -> Result<Self, ParseError> {
        let modes: BTreeMap<String, String> =
            serde_json::from_str(raw).map_err(|err| ParseError::invalid("switches", raw, err))?;
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

/// A mode by its serde name, so the names live in one place (the enums).
fn parse_mode<M: DeserializeOwned>(feature: &str, mode: &str) -> Result<M, ParseError> {
    let deserializer: StrDeserializer<'_, serde::de::value::Error> = mode.into_deserializer();
    M::deserialize(deserializer).map_err(|err| ParseError::UnknownMode {
        feature: feature.to_owned(),
        mode: excerpt(mode),
        reason: err.to_string(),
    })
}

/// The degradation state the operator published for a sale.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Degradation {
    /// The tier, 0 = nothing degraded. Informational (metrics, logs): the
    /// gateway acts on `switches`, which the operator derives from the tier.
    pub tier: u32,
    /// Increases on every change; orders the states.
    pub generation: u64,
    /// The mode of every non-core feature.
    pub switches: Switches,
    /// Why this tier, free text.
    pub reason: String,
    /// When the operator changed it (`None` when the key is absent).
    pub changed_at: Option<jiff::Timestamp>,
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
        let tier = required("tier")?;
        let generation = required("generation")?;
        Ok(Self {
            tier: tier
                .parse()
                .map_err(|err| ParseError::invalid("tier", tier, err))?,
            generation: generation
                .parse()
                .map_err(|err| ParseError::invalid("generation", generation, err))?,
            switches: data
                .get("switches")
                .map(|raw| Switches::parse(raw))
                .transpose()?
                .unwrap_or_default(),
            reason: data.get("reason").cloned().unwrap_or_default(),
            changed_at: data
                .get("changedAt")
                .map(|raw| {
                    raw.parse()
                        .map_err(|err| ParseError::invalid("changedAt", raw, err))
                })
                .transpose()?,
        })
    }
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
    fn invalid(key: &'static str, value: &str, reason: impl ToString) -> Self {
        Self::Invalid {
            key,
            value: excerpt(value),
            reason: reason.to_string(),
        }
    }
}

fn excerpt(value: &str) -> String {
    match value.char_indices().nth(MAX_EXCERPT) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

/// Holds the state in force; cheap to clone; readers never block writers.
///
/// A reader holds the lock only to clone an `Arc`, so a writer waits for at
/// most that, never for a request that is still using an old state.
#[derive(Debug, Clone)]
pub struct Switchboard {
    state: watch::Sender<Arc<Degradation>>,
}

impl Default for Switchboard {
    fn default() -> Self {
        Self::new()
    }
}

impl Switchboard {
    /// A board at tier 0, generation 0: nothing degraded until a source says
    /// otherwise.
    pub fn new() -> Self {
        Self {
            state: watch::Sender::new(Arc::new(Degradation::default())),
        }
    }

    /// The state in force; cheap enough for every request.
    pub fn current(&self) -> Arc<Degradation> {
        Arc::clone(&self.state.borrow())
    }

    /// A receiver notified of every state applied from now on (for metrics
    /// and for features that keep their own copy).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Degradation>> {
        self.state.subscribe()
    }

    /// Puts `next` in force if its generation is above the one in force and
    /// returns whether it did. A lower generation is a stale event (a replayed
    /// list, a second source lagging behind), an equal one a repeat; both are
    /// ignored. The comparison and the swap are one step, so two sources
    /// applying at once cannot move the board backwards.
    pub fn apply(&self, next: Degradation) -> bool {
        self.state.send_if_modified(|current| {
            if next.generation <= current.generation {
                return false;
            }
            *current = Arc::new(next);
            true
        })
    }
}
