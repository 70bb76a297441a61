//! Sending what cannot be stored to the dead-letter topic.

use std::time::Duration;

use backon::BackoffBuilder;
use flashsale_runtime::Shutdown;
use rdkafka::{
    message::{Header, OwnedHeaders},
    producer::FutureRecord,
    util::Timeout,
};

use super::{MAX_BACKOFF, Received, UNREACHABLE_BACKOFF, Writer, WriterError};

impl Writer {
    /// Sends one message to the DLQ with its reason and origin, and waits
    /// for the acknowledgement (retrying), so its offset may be committed.
    pub(super) async fn dead_letter(
        &self,
        message: &Received,
        reason: &str,
        error: &str,
        shutdown: &Shutdown,
    ) -> Result<(), WriterError> {
        let (partition, offset) = (message.partition.to_string(), message.offset.to_string());
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "flashsale-dlq-reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "flashsale-dlq-error",
                value: Some(error),
            })
            .insert(Header {
                key: "flashsale-original-topic",
                value: Some(self.settings.topic.as_str()),
            })
            .insert(Header {
                key: "flashsale-original-partition",
                value: Some(partition.as_str()),
            })
            .insert(Header {
                key: "flashsale-original-offset",
                value: Some(offset.as_str()),
            });
        self.metrics.dead_letter(reason);
        // A loop rather than backon's retry: a pause that shutdown cuts short
        // ends with the error of the send before it, and backon's retry would
        // send once more instead.
        let mut pauses = UNREACHABLE_BACKOFF.build();
        loop {
            let mut record = FutureRecord::to(&self.settings.dlq_topic)
                .payload(&message.payload)
                .headers(headers.clone());
            if let Some(key) = &message.key {
                record = record.key(key);
            }
            match self
                .dlq
                .send(record, Timeout::After(Duration::from_secs(10)))
                .await
            {
                Ok(_) => return Ok(()),
                Err((err, _)) => {
                    tracing::warn!(error = %err, "DLQ send failed; retrying");
                    let pause = pauses.next().unwrap_or(MAX_BACKOFF);
                    tokio::select! {
                        _ = shutdown.wait() => return Err(WriterError::Kafka(err)),
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}
