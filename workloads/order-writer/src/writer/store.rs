//! Writing a round to the database: concurrent transactions by partition,
//! rejected rows isolated and dead-lettered, clashes dead-lettered, status
//! events without their order handed back for parking.

use std::{collections::HashSet, time::Duration};

use flashsale_runtime::Shutdown;

use super::{MAX_BACKOFF, Pending, Writer, WriterError};
use crate::sink::{BatchOutcome, SinkError, SourcedEvent};

/// Attempts at a row the database rejects before it goes to the DLQ.
const MAX_ATTEMPTS: u32 = 3;

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
            None => return Ok(None),
            Some(Ok(outcome)) => {
                self.settle(round, lane, outcome, &mut done, shutdown)
                    .await?;
                return Ok(Some(done));
            }
            Some(Err(err)) => {
                tracing::warn!(error = %err, size = events.len(), "batch rejected; isolating the bad rows")
            }
        }
        for (&i, event) in lane.iter().zip(&events) {
            let mut attempt = 1;
            loop {
                match self
                    .write_until_reachable(std::slice::from_ref(event), shutdown)
                    .await
                {
                    None => return Ok(None),
                    Some(Ok(outcome)) => {
                        self.settle(round, &[i], outcome, &mut done, shutdown)
                            .await?;
                        break;
                    }
                    Some(Err(err)) if attempt < MAX_ATTEMPTS => {
                        tracing::warn!(error = %err, attempt, order = event.event.order_id, "row rejected; retrying");
                        attempt += 1;
                    }
                    Some(Err(err)) => {
                        self.dead_letter(
                            &round[i].message,
                            "db_rejected",
                            &err.to_string(),
                            shutdown,
                        )
                        .await?;
                        done.dead_lettered += 1;
                        break;
                    }
                }
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

    /// `Some(Ok)` stored, `Some(Err)` the database refused the data, `None`
    /// shutdown while it was unreachable.
    async fn write_until_reachable(
        &self,
        events: &[SourcedEvent],
        shutdown: &Shutdown,
    ) -> Option<Result<BatchOutcome, SinkError>> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.sink.write_batch(events).await {
                Ok(outcome) => return Some(Ok(outcome)),
                Err(err) if is_rejection(&err) => return Some(Err(err)),
                Err(err) => {
                    tracing::warn!(error = %err, retry_in_ms = backoff.as_millis() as u64, "database unavailable; holding the batch");
                    tokio::select! {
                        _ = shutdown.wait() => return None,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
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
