//! The board that holds the state in force.

use std::sync::Arc;

use tokio::sync::watch;

use super::Degradation;

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

    /// Puts `next` in force if its generation supersedes the one in force at
    /// `now` ([`flashsale_degradation::supersedes`]) and returns whether it
    /// did. A lower generation is a stale event (a replayed list, a second
    /// source lagging behind), an equal one a repeat, one beyond belief a
    /// hand edit; all are ignored. The comparison and the swap are one
    /// step, so two sources applying at once cannot move the board
    /// backwards.
    pub fn apply(&self, next: Degradation, now: jiff::Timestamp) -> bool {
        self.state.send_if_modified(|current| {
            if !flashsale_degradation::supersedes(next.generation, current.generation, now) {
                return false;
            }
            *current = Arc::new(next);
            true
        })
    }
}
