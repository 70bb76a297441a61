//! `DegradationPolicy`: tiers of non-core features switched off as load rises,
//! with hysteresis, a hold-down, a signal-loss rule and an on-call override.

// Each `printcolumn(...)` repeats the same keys, which this lint mistakes for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    common::{ObservedConditions, SaleRef},
    duration::{self, Duration},
};

/// Tiered degradation for one sale, driven by a Prometheus load ratio.
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "flashsale.dev",
    version = "v1alpha1",
    kind = "DegradationPolicy",
    plural = "degradationpolicies",
    shortname = "dp",
    category = "flashsale",
    namespaced,
    derive = "PartialEq",
    status = "DegradationPolicyStatus",
    doc = "Tiered degradation switches for a FlashSale, driven by a load signal.",
    printcolumn(name = "Sale", type_ = "string", json_path = ".spec.saleRef.name"),
    printcolumn(name = "Tier", type_ = "integer", json_path = ".status.tier"),
    printcolumn(name = "Source", type_ = "string", json_path = ".status.tierReason"),
    printcolumn(name = "Signal", type_ = "number", json_path = ".status.lastValue"),
    printcolumn(
        name = "Override",
        type_ = "integer",
        json_path = ".spec.override.tier"
    ),
    printcolumn(
        name = "Applied",
        type_ = "integer",
        json_path = ".status.propagation.appliedReplicas",
        priority = 1
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.tierMessage",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!has(self.override) || self.override.tier == 0 || self.tiers.exists(t, t.tier == self.override.tier)"
).message("override.tier must be 0 or a tier defined in spec.tiers")
    .field_path(".override.tier")
    .reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new(
    "!has(self.onSignalLoss) || !has(self.onSignalLoss.tier) || self.onSignalLoss.tier == 0 || \
     self.tiers.exists(t, t.tier == self.onSignalLoss.tier)"
).message("onSignalLoss.tier must be 0 (lift everything) or a tier defined in spec.tiers")
    .field_path(".onSignalLoss.tier")
    .reason(Reason::FieldValueInvalid))]
pub struct DegradationPolicySpec {
    /// The sale whose gateways this policy switches.
    pub sale_ref: SaleRef,
    /// The load signal.
    pub signal: LoadSignal,
    /// Tiers above 0, numbered 1, 2, … without gaps, each entered above its
    /// threshold. Higher tiers need higher thresholds.
    #[schemars(length(min = 1, max = 8))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["tier".into()]))]
    // Unique (list-map key) and each at most the count: exactly 1..N, so
    // every tier the policy can enter is one the gateways know.
    #[x_kube(validation = Rule::new("self.all(t, t.tier <= size(self))")
        .message("tiers must be numbered 1, 2, … without gaps"))]
    #[x_kube(validation = Rule::new(
        "self.all(a, self.all(b, a.tier < b.tier ? a.enterAbove < b.enterAbove : true))"
    ).message("a higher tier must have a higher enterAbove than every lower tier"))]
    pub tiers: Vec<Tier>,
    /// How long the signal must stay below a tier's `exitBelow` before the
    /// policy steps down, so a dip does not flap the switches.
    #[serde(default = "default_hold_down")]
    pub hold_down: Duration,
    /// What to do when the signal cannot be read.
    #[serde(default)]
    pub on_signal_loss: SignalLoss,
    /// On-call's manual tier; wins over the signal until it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#override: Option<Override>,
}

fn default_hold_down() -> Duration {
    Duration::from_secs(120)
}

/// A PromQL expression returning the load as a ratio (1.0 = capacity).
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = duration::rule(
    &["self.staleAfter", "self.interval"],
    "duration(self.staleAfter) >= duration(self.interval)",
).message("signal.staleAfter must be at least signal.interval")
    .field_path(".staleAfter")
    .reason(Reason::FieldValueInvalid))]
pub struct LoadSignal {
    /// Instant query returning one sample, e.g. the gateways' in-flight
    /// requests over their concurrency limit.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,
    /// Prometheus base URL; the operator's `--prometheus-url` when unset.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "prometheusURL"
    )]
    #[schemars(regex(pattern = r"^https?://"), length(max = 512))]
    pub prometheus_url: Option<String>,
    /// How often the query is evaluated.
    #[serde(default = "default_interval")]
    #[x_kube(validation = duration::positive().message("signal.interval must be positive"))]
    pub interval: Duration,
    /// Each query is bounded by this; one that takes longer counts as a
    /// failed reading.
    #[serde(default = "default_timeout")]
    #[x_kube(validation = duration::positive().message("signal.timeout must be positive"))]
    pub timeout: Duration,
    /// A sample older than this counts as a lost signal; at least
    /// `interval`.
    #[serde(default = "default_stale_after")]
    pub stale_after: Duration,
}

fn default_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_timeout() -> Duration {
    Duration::from_secs(2)
}

fn default_stale_after() -> Duration {
    Duration::from_secs(60)
}

/// One degradation tier.
#[derive(KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.exitBelow < self.enterAbove").message("exitBelow must be below enterAbove (hysteresis)"))]
pub struct Tier {
    /// Tier number, 1 and up; tier 0 means "nothing degraded".
    #[schemars(range(min = 1, max = 9))]
    pub tier: i32,
    /// Enter this tier when the signal rises above this ratio.
    #[schemars(range(min = 0.0, max = 100.0))]
    pub enter_above: f64,
    /// Leave it when the signal falls below this ratio (after the hold-down).
    #[schemars(range(min = 0.0, max = 100.0))]
    pub exit_below: f64,
    /// Features this tier switches, with their degraded mode. Tier-0 features
    /// (checkout, stock reservation, payment callbacks) have no switch.
    // `dyn` lets `size` count the keys of an object whatever its fields: a
    // tier that switches nothing changes nothing on a gateway.
    #[x_kube(validation = Rule::new("size(dyn(self)) > 0")
        .message("switches must switch at least one feature")
        .reason(Reason::FieldValueRequired))]
    pub switches: Switches,
}

/// Degraded modes of the non-core features, as the switches contract
/// shared with the gateways defines them. A feature left out keeps the mode
/// of the tier below (or runs normally at tier 0).
pub use flashsale_degradation::{
    MiniGamesMode, OrderHistoryMode, RecommendationsMode, ReviewsMode, ShopChatMode,
    SwitchChanges as Switches, VoucherPushMode,
};

/// What to do when the signal cannot be read (Prometheus down, empty result).
#[derive(KubeSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.action != 'EnterTier' || has(self.tier)").message("onSignalLoss.tier is required when action is EnterTier"))]
pub struct SignalLoss {
    /// Keep the current tier, or enter `tier`.
    pub action: SignalLossAction,
    /// The tier to enter with `EnterTier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 9))]
    pub tier: Option<i32>,
    /// How long the signal must be missing before this applies.
    #[serde(default = "default_loss_after")]
    pub after: Duration,
}

fn default_loss_after() -> Duration {
    Duration::from_secs(30)
}

impl Default for SignalLoss {
    fn default() -> Self {
        Self {
            action: SignalLossAction::Hold,
            tier: None,
            after: default_loss_after(),
        }
    }
}

/// Reaction to a lost signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SignalLossAction {
    /// Keep the current tier.
    Hold,
    /// Enter the given tier (fail safe: degrade more).
    EnterTier,
}

/// On-call's manual tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Override {
    /// The tier to force (0 forces "nothing degraded").
    #[schemars(range(min = 0, max = 9))]
    pub tier: i32,
    /// Why, for the audit trail and the status.
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
    /// When the override lapses and the signal takes over again (RFC 3339).
    pub expires: Time,
}

/// Why the policy is at its tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TierReason {
    /// The load signal.
    Signal,
    /// A manual override.
    Override,
    /// The signal is missing and `onSignalLoss` applies.
    SignalLost,
}

/// Observed state of a DegradationPolicy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DegradationPolicyStatus {
    /// The tier in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<i32>,
    /// What decided that tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_reason: Option<TierReason>,
    /// Why that tier, in one sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_message: Option<String>,
    /// When the tier in force was entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<MicroTime>,
    /// The last good value of the signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_value: Option<f64>,
    /// The sample time of `lastValue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sample_time: Option<MicroTime>,
    /// When the signal was last evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_evaluation_time: Option<Time>,
    /// Start of the hold-down: since when the signal has stayed below the
    /// `exitBelow` of the tier in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_exit_since: Option<MicroTime>,
    /// Since when the signal has been missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_lost_since: Option<MicroTime>,
    /// The override in force, with who set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_override: Option<ActiveOverride>,
    /// How far the current switches have reached the gateways.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propagation: Option<Propagation>,
    /// observedGeneration and conditions.
    #[serde(flatten)]
    pub observed: ObservedConditions,
}

/// An override the policy is obeying.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveOverride {
    /// The forced tier.
    pub tier: i32,
    /// Why, as `spec.override.reason` says.
    pub reason: String,
    /// When it lapses.
    pub expires: Time,
    /// The field manager that set `spec.override`, for the audit trail.
    pub set_by: String,
}

/// Propagation of the switches ConfigMap to the gateways.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Propagation {
    /// `generation` of the `<sale>-degradation` ConfigMap.
    pub generation: i64,
    /// Ready gateway replicas that report this generation.
    pub applied_replicas: i32,
    /// Gateway replicas in total.
    pub desired_replicas: i32,
    /// Seconds from writing this generation to every ready gateway applying
    /// it; unset until they all have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Gateways that have not applied it, as `pod: why`; at most 10.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub laggards: Vec<String>,
}
