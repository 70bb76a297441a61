//! A redeemed pass held for one order, so that only the buyer's own failures
//! spend it: [`PassLease::commit`] once the order succeeded,
//! [`PassLease::give_back`] when it failed for another reason, and a lease
//! dropped undecided (the client went away and the request was dropped)
//! gives the pass back on a task of its own. If even that does not happen
//! (the gateway died), the mark lapses with the lease.

use super::{Error, Redeemed, WaitingRoom};

/// A pass redeemed on lease for one order (see [`WaitingRoom::lease`]).
#[must_use = "commit the lease once the order succeeded; dropping it gives the pass back"]
pub struct PassLease {
    room: WaitingRoom,
    position: u64,
    /// Taken by `commit` or `give_back`; still here on drop means undecided.
    redeemed: Option<Redeemed>,
}

impl std::fmt::Debug for PassLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassLease")
            .field("position", &self.position)
            .field("decided", &self.redeemed.is_none())
            .finish()
    }
}

impl PassLease {
    pub(super) fn new(room: WaitingRoom, redeemed: Redeemed) -> Self {
        Self {
            room,
            position: redeemed.position,
            redeemed: Some(redeemed),
        }
    }

    /// The queue position the pass was for.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The order succeeded: the pass is spent for good
    /// ([`WaitingRoom::commit`]). The call runs on a task of its own, so it
    /// completes even if the request is dropped while it runs.
    pub async fn commit(mut self) -> Result<(), Error> {
        let Some(redeemed) = self.redeemed.take() else {
            return Ok(());
        };
        let room = self.room.clone();
        match tokio::spawn(async move { room.commit(&redeemed).await }).await {
            Ok(committed) => committed,
            Err(_) => Err(Error::Interrupted),
        }
    }

    /// The order failed for a reason that is not the buyer's: the pass is
    /// usable again now ([`WaitingRoom::give_back`]).
    pub async fn give_back(mut self) -> Result<(), Error> {
        match self.redeemed.take() {
            Some(redeemed) => self.room.give_back(&redeemed).await,
            None => Ok(()),
        }
    }
}

impl Drop for PassLease {
    fn drop(&mut self) {
        let Some(redeemed) = self.redeemed.take() else {
            return;
        };
        // Outside a runtime (never in the gateway) the lease lapses instead.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let room = self.room.clone();
        runtime.spawn(async move {
            if let Err(err) = room.give_back(&redeemed).await {
                tracing::warn!(error = %err, position = redeemed.position, "waiting room: an undecided pass was not given back; its lease will lapse");
            }
        });
    }
}
