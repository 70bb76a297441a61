//! The consumer group's lag over every partition of the topic, whichever
//! member owns it: per partition, the high watermark minus the group's
//! committed offset (the low watermark where nothing is committed). Every
//! replica measures the same whole, so one without partitions does not
//! report 0 while the others still have events to store.

use std::time::Duration;

use rdkafka::{
    Offset, TopicPartitionList,
    consumer::{Consumer, StreamConsumer},
    error::KafkaError,
};

/// Why the lag could not be measured.
#[derive(Debug, thiserror::Error)]
pub(super) enum LagError {
    /// A broker call failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The broker does not know the topic, or it has no partitions.
    #[error("topic {0} not found")]
    NoTopic(String),
}

/// Measures the lag of `consumer`'s group on `topic`; each broker call
/// waits at most `timeout`. Blocking.
pub(super) fn group_lag(
    consumer: &StreamConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<i64, LagError> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err(LagError::NoTopic(topic.to_owned()));
    }
    let mut wanted = TopicPartitionList::new();
    for &partition in &partitions {
        wanted.add_partition(topic, partition);
    }
    let committed = consumer.committed_offsets(wanted, timeout)?;
    let mut lag = 0;
    for element in committed.elements_for_topic(topic) {
        element.error()?;
        let (low, high) = consumer.fetch_watermarks(topic, element.partition(), timeout)?;
        let done = match element.offset() {
            Offset::Offset(n) => Some(n),
            _ => None,
        };
        lag += partition_lag(done, low, high);
    }
    Ok(lag)
}

/// Events of one partition not committed: from the committed offset (or
/// the low watermark where there is none, or where retention already
/// dropped what the commit points at) to the high watermark.
fn partition_lag(committed: Option<i64>, low: i64, high: i64) -> i64 {
    (high - committed.unwrap_or(low).max(low)).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_runs_from_the_commit_or_the_low_watermark_to_the_high_one() {
        assert_eq!(partition_lag(Some(40), 0, 100), 60);
        assert_eq!(partition_lag(None, 0, 100), 100, "nothing committed");
        assert_eq!(partition_lag(None, 30, 100), 70, "retention dropped 30");
        assert_eq!(
            partition_lag(Some(10), 30, 100),
            70,
            "commit below retention"
        );
        assert_eq!(partition_lag(Some(100), 0, 100), 0);
        assert_eq!(partition_lag(None, 0, 0), 0, "empty partition");
    }
}
