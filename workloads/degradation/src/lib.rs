//! The degradation ConfigMap: the contract between the operator, which
//! orders a sale's non-core features into a cheaper mode while the sale is
//! under load, and the gateways, which obey.
//!
//! Contract: the ConfigMap `<sale>-degradation` in the sale's namespace,
//! written only by the operator's DegradationPolicy controller (a sale
//! without a DegradationPolicy has no such ConfigMap, and its gateways run
//! at tier 0), with `data` keys ([`keys`])
//! - `tier`: "0", "1", "2", … (0 = nothing degraded);
//! - `generation`: an integer that increases on every change;
//! - `switches`: a JSON object feature → mode, e.g.
//!   `{"recommendations":"static","reviews":"queued"}`; a feature left out
//!   runs normally; features and modes are those of the DegradationPolicy's
//!   switches ([`SwitchChanges`]: recommendations normal|static, orderHistory
//!   normal|last7Days, voucherPush normal|deferred, reviews normal|queued,
//!   shopChat normal|throttled, miniGames normal|closed);
//! - `reason`: free text; `changedAt`: RFC 3339;
//! - `overrideExpires`: RFC 3339, only while the state is on-call's
//!   override: when it lapses. The writer lifts a lapsed override whatever
//!   state the policy that set it is in; readers need not look at it.
//!
//! The ConfigMap carries the label `app.kubernetes.io/managed-by:
//! flashsale-operator` ([`MANAGED_BY_KEY`], [`MANAGED_BY`]) and a controller
//! reference to its sale; readers ignore a ConfigMap of that name without
//! the label (someone else's object, not switches).
//!
//! `tier` and `generation` are required, the rest optional; an unknown
//! feature or mode makes the whole update invalid (see
//! [`Degradation::from_data`]). Tier-0 features (checkout, stock
//! reservation, payment callbacks) have no switch at all.
//!
//! Stale-generation rule: a reader takes a state only if its generation is
//! above the one in force. Events replayed by a re-list, reordered, or
//! repeated are ignored, and invalid updates leave the last good state in
//! force; a reader that restarts starts at generation 0 and takes whatever
//! is current. The writer must therefore keep `generation` increasing even
//! when it lost its count (the ConfigMap or the policy recreated, a new
//! operator): it takes every generation from [`next_generation`]. A
//! generation more than a day ahead of the clock ([`plausible`]) cannot have
//! come from that rule (a hand edit to `u64::MAX`): readers refuse it, and
//! a reader holding one takes the next plausible state ([`supersedes`]), so
//! one bad edit never freezes the gateways.
//!
//! Writer: each tier of a DegradationPolicy lists the [`SwitchChanges`] it
//! makes; the [`Switches`] of the tier in force are tier 1's changes applied
//! to all-normal, then tier 2's, … up to that tier ([`Switches::with`]);
//! [`Degradation::to_data`] renders the state. Reader:
//! [`Degradation::from_data`].
//!
//! Feature `schema` derives `schemars::JsonSchema` for [`SwitchChanges`] and
//! the mode enums, so the CRD embeds them as they are.

mod generation;
mod state;
mod switches;

pub use generation::{HORIZON_MS, next_generation, plausible, supersedes};
pub use state::{Degradation, ParseError};
pub use switches::{
    MiniGamesMode, OrderHistoryMode, RecommendationsMode, ReviewsMode, ShopChatMode, SwitchChanges,
    Switches, VoucherPushMode,
};

/// `app.kubernetes.io/managed-by`, the label that marks what the operator made.
pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_KEY`] on everything the operator creates.
pub const MANAGED_BY: &str = "flashsale-operator";

/// The keys of the ConfigMap's `data`.
pub mod keys {
    /// The tier, "0" = nothing degraded. Required.
    pub const TIER: &str = "tier";
    /// The generation, increasing on every change. Required.
    pub const GENERATION: &str = "generation";
    /// A JSON object feature → mode of the features not in normal mode.
    pub const SWITCHES: &str = "switches";
    /// Why this tier, free text.
    pub const REASON: &str = "reason";
    /// When the writer changed the state, RFC 3339.
    pub const CHANGED_AT: &str = "changedAt";
    /// When the override that set the state lapses, RFC 3339; absent when
    /// the state is not an override's.
    pub const OVERRIDE_EXPIRES: &str = "overrideExpires";
}
