//! What the order-writer tests share: topics, events, and the two checks
//! every run ends with (rows stored, offsets committed to the end).

#![allow(dead_code)] // each test binary uses its own subset

use std::{collections::HashSet, time::Duration};

use flashsale_e2e::{stack, wait::poll_until};
use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ProduceError, SCHEMA_VERSION};
use order_writer::sink::Sink;
use rdkafka::{
    ClientConfig, Offset, TopicPartitionList,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{Consumer, StreamConsumer},
};

/// An order topic and its DLQ, deleted by [`Topics::delete`].
pub struct Topics {
    pub brokers: String,
    pub topic: String,
    pub dlq: String,
    pub partitions: i32,
    admin: AdminClient<DefaultClientContext>,
}

fn admin_options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

impl Topics {
    /// Creates a fresh order topic with `partitions` and a one-partition DLQ.
    pub async fn create(partitions: i32) -> anyhow::Result<Self> {
        let brokers = stack::kafka_brokers()?;
        let (topic, dlq) = (
            stack::unique_name("orders"),
            stack::unique_name("orders-dlq"),
        );
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()?;
        let topics = [
            NewTopic::new(&topic, partitions, TopicReplication::Fixed(1)),
            NewTopic::new(&dlq, 1, TopicReplication::Fixed(1)),
        ];
        for result in admin.create_topics(&topics, &admin_options()).await? {
            result.map_err(|(name, code)| anyhow::anyhow!("creating {name}: {code}"))?;
        }
        Ok(Self {
            brokers,
            topic,
            dlq,
            partitions,
            admin,
        })
    }

    /// Deletes both topics.
    pub async fn delete(self) -> anyhow::Result<()> {
        self.admin
            .delete_topics(&[&self.topic, &self.dlq], &admin_options())
            .await?;
        Ok(())
    }

    /// Polls until `group` has committed the end of every partition, and
    /// returns the total number of messages.
    pub async fn wait_committed_to_end(
        &self,
        group: &str,
        within: Duration,
    ) -> anyhow::Result<i64> {
        let probe: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .create()?;
        let probe = std::sync::Arc::new(probe);
        let (topic, partitions) = (self.topic.clone(), self.partitions);
        poll_until(
            "offsets committed to the end of every partition",
            within,
            Duration::from_millis(250),
            || {
                let (probe, topic) = (probe.clone(), topic.clone());
                async move {
                    tokio::task::spawn_blocking(move || {
                        let (mut committed, mut end) = (0, 0);
                        let mut list = TopicPartitionList::new();
                        for p in 0..partitions {
                            list.add_partition(&topic, p);
                            let (_, high) = probe
                                .fetch_watermarks(&topic, p, Duration::from_secs(5))
                                .map_err(|e| e.to_string())?;
                            end += high;
                        }
                        let offsets = probe
                            .committed_offsets(list, Duration::from_secs(5))
                            .map_err(|e| e.to_string())?;
                        for e in offsets.elements() {
                            if let Offset::Offset(n) = e.offset() {
                                committed += n;
                            }
                        }
                        if committed == end {
                            Ok(end)
                        } else {
                            Err(format!("{committed} of {end} committed"))
                        }
                    })
                    .await
                    .map_err(|e| e.to_string())?
                }
            },
        )
        .await
        .map_err(Into::into)
    }
}

impl Topics {
    /// Messages in `topic` (high minus low watermark over its partitions).
    pub async fn message_count(&self, topic: &str, partitions: i32) -> anyhow::Result<i64> {
        let probe: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", stack::unique_name("count"))
            .create()?;
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut total = 0;
            for p in 0..partitions {
                let (low, high) = probe.fetch_watermarks(&topic, p, Duration::from_secs(5))?;
                total += high - low;
            }
            Ok(total)
        })
        .await?
    }
}

/// The `n`th created event of `sale`; 97 users so every partition gets some.
pub fn event(sale: &str, n: usize) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        kind: EventKind::Created,
        order_id: format!("{sale}-o{n}"),
        sale: sale.to_owned(),
        user_id: format!("u{}", n % 97),
        sku: "PHONE".into(),
        quantity: 1,
        amount_minor: 100,
        idempotency_key: format!("{sale}-k{n}"),
        reservation_id: format!("r{n}"),
        created_at: jiff::Timestamp::now(),
    }
}

/// Sends events `range` of `sale`, `window` at a time, and returns the
/// numbers whose send returned `Ok` (acknowledged by the broker).
pub async fn produce(
    producer: &OrderProducer,
    sale: &str,
    range: std::ops::Range<usize>,
    window: usize,
) -> (Vec<usize>, Vec<ProduceError>) {
    let (mut acked, mut failed) = (Vec::new(), Vec::new());
    let numbers: Vec<usize> = range.collect();
    for chunk in numbers.chunks(window.max(1)) {
        let sends = chunk.iter().map(|&n| async move {
            let result = producer.send(&event(sale, n)).await;
            (n, result)
        });
        for (n, result) in futures::future::join_all(sends).await {
            match result {
                Ok(_) => acked.push(n),
                Err(err) => failed.push(err),
            }
        }
    }
    (acked, failed)
}

/// Rows stored for `sale`, and how many distinct idempotency keys they hold.
pub async fn count_orders(sink: &Sink, sale: &str) -> Result<(i64, i64), String> {
    let result = match sink {
        Sink::Postgres(pool) => {
            sqlx::query_as(
                "SELECT COUNT(*), COUNT(DISTINCT idempotency_key) FROM orders WHERE sale = $1",
            )
            .bind(sale)
            .fetch_one(pool)
            .await
        }
        Sink::Mysql(pool) => {
            sqlx::query_as(
                "SELECT COUNT(*), COUNT(DISTINCT idempotency_key) FROM orders WHERE sale = ?",
            )
            .bind(sale)
            .fetch_one(pool)
            .await
        }
    };
    result.map_err(|e| e.to_string())
}

/// The order numbers stored for `sale`.
pub async fn stored_numbers(sink: &Sink, sale: &str) -> anyhow::Result<HashSet<usize>> {
    let ids: Vec<String> = match sink {
        Sink::Postgres(pool) => {
            sqlx::query_scalar("SELECT order_id FROM orders WHERE sale = $1")
                .bind(sale)
                .fetch_all(pool)
                .await?
        }
        Sink::Mysql(pool) => {
            sqlx::query_scalar("SELECT order_id FROM orders WHERE sale = ?")
                .bind(sale)
                .fetch_all(pool)
                .await?
        }
    };
    let prefix = format!("{sale}-o");
    Ok(ids
        .iter()
        .filter_map(|id| id.strip_prefix(&prefix)?.parse().ok())
        .collect())
}

/// Polls until `sale` has exactly `expected` rows, all distinct.
pub async fn wait_rows(
    sink: &Sink,
    sale: &str,
    expected: i64,
    within: Duration,
) -> anyhow::Result<()> {
    poll_until(
        "every event stored once",
        within,
        Duration::from_millis(200),
        || async {
            let (rows, distinct) = count_orders(sink, sale).await?;
            if rows != distinct {
                return Err(format!("{rows} rows but {distinct} distinct keys"));
            }
            if rows == expected {
                Ok(())
            } else {
                Err(format!("{rows} of {expected} rows"))
            }
        },
    )
    .await
    .map_err(Into::into)
}
