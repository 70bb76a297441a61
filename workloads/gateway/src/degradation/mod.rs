//! Degradation switches: the operator's orders to run non-core features in a
//! cheaper mode while a sale is under load.
//!
//! Contract: the ConfigMap `<sale>-degradation` in the sale's namespace,
//! written only by the operator, with `data` keys
//! - `tier`: "0", "1", "2", … (0 = nothing degraded);
//! - `generation`: an integer that increases on every change;
//! - `switches`: a JSON object feature → mode, e.g.
//!   `{"recommendations":"static","reviews":"queued"}`; a feature left out
//!   runs normally; features and modes are those of the DegradationPolicy's
//!   `Switches` (recommendations normal|static, orderHistory
//!   normal|last7Days, voucherPush normal|deferred, reviews normal|queued,
//!   shopChat normal|throttled, miniGames normal|closed);
//! - `reason`: free text; `changedAt`: RFC 3339.
//!
//! `tier` and `generation` are required, the rest optional; an unknown
//! feature or mode makes the whole update invalid (see
//! [`Degradation::from_data`]). Tier-0 features (checkout, stock
//! reservation, payment callbacks) have no switch at all.
//!
//! Sources: [`watch_config_map`] through the Kubernetes API, or
//! [`watch_file`] outside a cluster. Either must put a change in force
//! within 100 ms: a watch event arrives in milliseconds; the file is polled
//! every 50 ms. Both write to a [`Switchboard`], which requests read
//! lock-free in effect (an `Arc` clone).
//!
//! Stale-generation rule: the board takes a state only if its generation is
//! above the one in force. Events replayed by a re-list, reordered, or
//! repeated are ignored, and invalid updates leave the last good state in
//! force. The operator must therefore keep `generation` increasing even when
//! it recreates the ConfigMap; a gateway that restarts starts at generation 0
//! and takes whatever is current.

mod config_map;
mod file;
mod state;

pub use config_map::watch_config_map;
pub use file::watch_file;
pub use state::{
    Degradation, MiniGamesMode, OrderHistoryMode, ParseError, RecommendationsMode, ReviewsMode,
    ShopChatMode, Switchboard, Switches, VoucherPushMode,
};

/// Applies `next` from `source` and logs the outcome.
fn offer(board: &Switchboard, next: Degradation, source: &'static str) {
    let in_force = board.current().generation;
    let (generation, tier) = (next.generation, next.tier);
    let (switches, reason) = (next.switches.clone(), next.reason.clone());
    if board.apply(next) {
        tracing::info!(source, generation, tier, ?switches, %reason, "degradation applied");
    } else if generation < in_force {
        // Worth a warning: either a late event or an operator that restarted
        // its count, which would hold the gateways at the old state.
        tracing::warn!(
            source,
            generation,
            in_force,
            "degradation ignored: generation below the one in force"
        );
    } else {
        tracing::debug!(source, generation, "degradation unchanged");
    }
}

#[cfg(test)]
mod tests;
