//! Degradation switches: the operator's orders to run non-core features in a
//! cheaper mode while a sale is under load.
//!
//! The contract (the ConfigMap `<sale>-degradation`, its keys, switches and
//! generation rule) and its parse are the crate [`flashsale_degradation`],
//! shared with the operator, which writes it; its types are re-exported
//! here.
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
//! force. A gateway that restarts starts at generation 0 (tier 0) and takes
//! whatever is current.

mod config_map;
mod file;
mod state;

pub use config_map::watch_config_map;
pub use file::watch_file;
pub use flashsale_degradation::{
    Degradation, MiniGamesMode, OrderHistoryMode, ParseError, RecommendationsMode, ReviewsMode,
    ShopChatMode, Switches, VoucherPushMode,
};
pub use state::Switchboard;

/// Applies `next` from `source` and logs the outcome.
fn offer(board: &Switchboard, next: Degradation, source: &'static str) {
    let in_force = board.current().generation;
    let (generation, tier) = (next.generation, next.tier);
    let (switches, reason) = (next.switches.clone(), next.reason.clone());
    let now = jiff::Timestamp::now();
    if board.apply(next, now) {
        tracing::info!(source, generation, tier, ?switches, %reason, "degradation applied");
    } else if !flashsale_degradation::plausible(generation, now) {
        tracing::warn!(
            source,
            generation,
            in_force,
            "degradation ignored: its generation is more than a day ahead of the clock, so no \
             writer made it by the generation rule (a hand edit?)"
        );
    } else if generation < in_force {
        // Worth a warning: either a late event or a writer that broke the
        // generation rule (`flashsale_degradation::next_generation`), which
        // would hold the gateways at the old state.
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
