//! Writing a round to the database: concurrent transactions by partition,
//! rejected rows isolated and dead-lettered, clashes dead-lettered, status
//! events without their order handed back for parking.

use std::{collections::HashSet, future, time::Duration};

use backon::{ConstantBuilder, Retryable};
use flashsale_runtime::Shutdown;

use super::{Pending, UNREACHABLE_BACKOFF, Writer, WriterError};
use crate::sink::{BatchOutcome, SinkError, SourcedEvent};

/// Attempts at a row the database rejects before it goes to the DLQ.
const MAX_ATTEMPTS: usize = 3;

/// The tries of a rejected row, one right after the other.
const ROW_RETRIES: ConstantBuilder = ConstantBuilder::new()
    .with_delay(Duration::ZERO)
    .with_max_times(MAX_ATTEMPTS - 1);

/// Why a write stored nothing.
#[derive(Debug, thiserror::Error)]
enum Unwritten {
    /// The database refused the data: writing the same rows again cannot help.
    #[error(transparent)]
    Rejected(SinkError),
    /// The database could not be reached: waiting can help.
    #[error(transparent)]
    Unreachable(SinkError),
    /// Shutdown came while the database was unreachable.
    #[error("shutdown while the database was unreachable")]
    Shutdown,
}

impl From<SinkError> for Unwritten {
    fn from(err: SinkError) -> Self {
        if is_rejection(&err) {
            Self::Rejected(err)
        } else {
            Self::Unreachable(err)
        }
    }
}

/// What the transactions of one lane, or of a whole round, did.
#[derive(Debug, Default)]
pub(super) struct LaneOutcome {
    /// Orders inserted.
    pub inserted: u64,
    /// Events sent to the DLQ.
    pub dead_lettered: u64,
    /// Creation times of the events stored, for the commit latency.
    pub stored: Vec<jiff::Timestamp>,
    /// Round positions of status events whose order is not stored.
    pub missing: Vec<usize>,
}

impl LaneOutcome {
    fn add(&mut self, other: Self) {
        self.inserted += other.inserted;
        self.dead_lettered += other.dead_lettered;
        self.stored.extend(other.stored);
        self.missing.extend(other.missing);
    }
}

impl Writer {
    /// Writes a round in concurrent transactions, one per group of
    /// partitions. Partitions are independent (a user's events share one),
    /// so a slow or parked event of one lane holds up no other. `None`
    /// means shutdown came while the database was unreachable.
    pub(super) async fn store_round(
        &self,
        round: &[Pending],
        shutdown: &Shutdown,
    ) -> Result<Option<LaneOutcome>, WriterError> {
        let lanes = self.settings.write_concurrency.max(1);
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); lanes];
        for (i, pending) in round.iter().enumerate() {
            groups[pending.event.partition.unsigned_abs() as usize % lanes].push(i);
        }
        let outcomes =
            futures::future::join_all(groups.iter().map(|lane| self.store(round, lane, shutdown)))
                .await;
        let mut total = LaneOutcome::default();
        for outcome in outcomes {
            match outcome? {
                Some(outcome) => total.add(outcome),
                None => return Ok(None),
            }
        }
        Ok(Some(total))
    }

    /// Writes the events of `round` at `lane`; on a rejected row, isolates
    /// it by writing rows one at a time, retrying each rejected row before
    /// dead-lettering it. While the database is unreachable it waits with
    /// backoff and does not move on. `None` means shutdown came first.
    async fn store(
        &self,
        round: &[Pending],
        lane: &[usize],
        shutdown: &Shutdown,
    ) -> Result<Option<LaneOutcome>, WriterError> {
        let mut done = LaneOutcome::default();
        if lane.is_empty() {
            return Ok(Some(done));
        }
        let events: Vec<SourcedEvent> = lane.iter().map(|&i| round[i].event.clone()).collect();
        match self.write_until_reachable(&events, shutdown).await {
            Ok(outcome) => {
                self.settle(round, lane, outcome, &mut done, shutdown)
                    .await?;
                return Ok(Some(done));
            }
            Err(Unwritten::Rejected(err)) => {
                tracing::warn!(error = %err, size = events.len(), "batch rejected; isolating the bad rows")
            }
            // Shutdown while the database was unreachable.
            Err(_) => return Ok(None),
        }
        for (&i, event) in lane.iter().zip(&events) {
            let mut attempt = 0_u32;
            let written = (|| self.write_until_reachable(std::slice::from_ref(event), shutdown))
                .retry(ROW_RETRIES)
                // No pause to wait out, not even a timer tick.
                .sleep(|_: Duration| future::ready(()))
                .when(|err| matches!(err, Unwritten::Rejected(_)))
                .notify(|err, _| {
                    attempt += 1;
                    tracing::warn!(error = %err, attempt, order = event.event.order_id, "row rejected; retrying");
                })
                .await;
            match written {
                Ok(outcome) => {
                    self.settle(round, &[i], outcome, &mut done, shutdown)
                        .await?;
                }
                Err(Unwritten::Rejected(err)) => {
                    self.dead_letter(&round[i].message, "db_rejected", &err.to_string(), shutdown)
                        .await?;
                    done.dead_lettered += 1;
                }
                // Shutdown while the database was unreachable.
                Err(_) => return Ok(None),
            }
        }
        Ok(Some(done))
    }

    /// Accounts for a committed transaction of the events of `round` at
    /// `lane`: clashing `created` events go to the DLQ, status events
    /// without their order are kept for parking, the rest were stored.
    async fn settle(
        &self,
        round: &[Pending],
        lane: &[usize],
        outcome: BatchOutcome,
        done: &mut LaneOutcome,
        shutdown: &Shutdown,
    ) -> Result<(), WriterError> {
        done.inserted += outcome.inserted;
        let mut unstored: HashSet<usize> = outcome.missing_orders.iter().copied().collect();
        for conflict in &outcome.conflicts {
            unstored.insert(conflict.index);
            let message = &round[lane[conflict.index]].message;
            self.dead_letter(
                message,
                "idempotency_conflict",
                &conflict.kind.to_string(),
                shutdown,
            )
            .await?;
            done.dead_lettered += 1;
        }
        done.missing
            .extend(outcome.missing_orders.iter().map(|&k| lane[k]));
        done.stored.extend(
            lane.iter()
                .enumerate()
                .filter(|(k, _)| !unstored.contains(k))
                .map(|(_, &i)| round[i].event.event.created_at),
        );
        Ok(())
    }

    /// Writes `events` in one transaction, waiting with backoff while the
    /// database is unreachable: fails only as [`Unwritten::Rejected`], or as
    /// [`Unwritten::Shutdown`] once shutdown came during a wait.
    async fn write_until_reachable(
        &self,
        events: &[SourcedEvent],
        shutdown: &Shutdown,
    ) -> Result<BatchOutcome, Unwritten> {
        let mut writes = 0_u32;
        let interrupt = shutdown.clone();
        (|| {
            writes += 1;
            // Nothing is written again once shutdown came: the batch is left
            // to the next owner of its partitions.
            let stopped = writes > 1 && shutdown.is_triggered();
            async move {
                if stopped {
                    return Err(Unwritten::Shutdown);
                }
                Ok(self.sink.write_batch(events).await?)
            }
        })
        .retry(UNREACHABLE_BACKOFF)
        .sleep(move |pause| pause_until_shutdown(interrupt.clone(), pause))
        .when(|err| matches!(err, Unwritten::Unreachable(_)))
        .notify(|err, pause| {
            tracing::warn!(error = %err, retry_in_ms = pause.as_millis() as u64, "database unavailable; holding the batch");
        })
        .await
    }
}

/// Sleeps for `pause`, or until shutdown if that comes first.
async fn pause_until_shutdown(shutdown: Shutdown, pause: Duration) {
    tokio::select! {
        _ = shutdown.wait() => {}
        _ = tokio::time::sleep(pause) => {}
    }
}

/// Whether the database refused the data (retrying the same rows cannot
/// help) rather than being unreachable (waiting can).
fn is_rejection(err: &SinkError) -> bool {
    match err {
        SinkError::Database(sqlx::Error::Database(db)) => {
            db.kind() != sqlx::error::ErrorKind::Other
                || db.code().is_some_and(|c| c.starts_with("22"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use backon::BackoffBuilder;

    use super::*;

    #[test]
    fn an_unreachable_database_is_waited_for_from_100_ms_doubling_to_2_s() {
        // As logged (`retry_in_ms`).
        let pauses: Vec<u128> = UNREACHABLE_BACKOFF
            .build()
            .take(8)
            .map(|pause| pause.as_millis())
            .collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }

    #[test]
    fn a_rejected_row_is_tried_three_times_in_a_row() {
        let pauses: Vec<Duration> = ROW_RETRIES.build().collect();
        assert_eq!(pauses, [Duration::ZERO; MAX_ATTEMPTS - 1]);
    }
}
