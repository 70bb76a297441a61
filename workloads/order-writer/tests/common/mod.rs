//! What the order-writer tests share: a database of their own, topics,
//! events, and the two checks every run ends with (exactly the orders the
//! test produced are stored, offsets committed to the end).

#![allow(dead_code)] // each test binary uses its own subset

use std::{collections::BTreeSet, time::Duration};

use flashsale_e2e::{stack, wait::poll_until};
use flashsale_orders::{EventKind, OrderEvent, OrderProducer, ProduceError, SCHEMA_VERSION};
use order_writer::{sink::Sink, writer::WriterSettings};
use rdkafka::{
    ClientConfig, Offset, TopicPartitionList,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    consumer::{Consumer, StreamConsumer},
};
use sqlx::Connection;

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
    /// Creates a fresh order topic with `partitions` and a one-partition DLQ
    /// on the stack's single broker.
    pub async fn create(partitions: i32) -> anyhow::Result<Self> {
        Self::create_on(&stack::kafka_brokers()?, partitions, 1, 1).await
    }

    /// Creates them on the cluster of `brokers`, every partition on
    /// `replicas` brokers, and a write (acks=all) acknowledged only once
    /// `min_insync` of them hold it.
    pub async fn create_on(
        brokers: &str,
        partitions: i32,
        replicas: i32,
        min_insync: i32,
    ) -> anyhow::Result<Self> {
        let (topic, dlq) = (
            stack::unique_name("orders"),
            stack::unique_name("orders-dlq"),
        );
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()?;
        let min_insync = min_insync.to_string();
        let topics = [
            NewTopic::new(&topic, partitions, TopicReplication::Fixed(replicas))
                .set("min.insync.replicas", &min_insync),
            NewTopic::new(&dlq, 1, TopicReplication::Fixed(replicas))
                .set("min.insync.replicas", &min_insync),
        ];
        for result in admin.create_topics(&topics, &admin_options()).await? {
            result.map_err(|(name, code)| anyhow::anyhow!("creating {name}: {code}"))?;
        }
        Ok(Self {
            brokers: brokers.to_owned(),
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
    /// Deletes the order topic's messages of `partition` before `offset`,
    /// which moves its low watermark there (retention, by hand).
    pub async fn delete_records_before(&self, partition: i32, offset: i64) -> anyhow::Result<()> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&self.topic, partition, Offset::Offset(offset))?;
        let done = self.admin.delete_records(&list, &admin_options()).await?;
        for element in done.elements() {
            element.error()?;
        }
        Ok(())
    }

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

/// A database of one test's own on the stack's PostgreSQL or MariaDB server:
/// the writer migrates it from scratch, and no other test, branch or
/// workload sees its schema or its rows. [`PrivateDatabase::remove`] drops
/// it once the test passed; a failed test leaves it to be looked at.
pub struct PrivateDatabase {
    /// Its URL.
    pub url: String,
    server_url: String,
    name: String,
}

impl PrivateDatabase {
    /// Creates a fresh database on the server of `server_url`.
    pub async fn create(server_url: &str) -> anyhow::Result<Self> {
        // Lowercase letters, digits and underscores only: safe as an identifier.
        let name = stack::unique_name("orders").replace('-', "_");
        run(server_url, format!("CREATE DATABASE {name}")).await?;
        let (server, _) = server_url
            .rsplit_once('/')
            .ok_or_else(|| anyhow::anyhow!("no database in {server_url}"))?;
        Ok(Self {
            url: format!("{server}/{name}"),
            server_url: server_url.to_owned(),
            name,
        })
    }

    /// Drops the database, ending the connections still open to it.
    pub async fn remove(self) -> anyhow::Result<()> {
        let drop = if self.server_url.starts_with("mysql://") {
            format!("DROP DATABASE {}", self.name)
        } else {
            format!("DROP DATABASE {} WITH (FORCE)", self.name)
        };
        run(&self.server_url, drop).await
    }
}

/// Runs one statement built from trusted parts on the server of `url`.
async fn run(url: &str, statement: String) -> anyhow::Result<()> {
    let statement = sqlx::AssertSqlSafe(statement);
    if url.starts_with("mysql://") {
        let mut conn = sqlx::MySqlConnection::connect(url).await?;
        sqlx::query(statement).execute(&mut conn).await?;
        conn.close().await?;
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        sqlx::query(statement).execute(&mut conn).await?;
        conn.close().await?;
    }
    Ok(())
}

/// The order id of the `n`th order of `sale`.
pub fn order_id(sale: &str, n: usize) -> String {
    format!("{sale}-o{n}")
}

/// The order ids of orders `numbers` of `sale`.
pub fn order_ids(sale: &str, numbers: impl IntoIterator<Item = usize>) -> BTreeSet<String> {
    numbers.into_iter().map(|n| order_id(sale, n)).collect()
}

/// The `n`th created event of `sale`; 97 users so every partition gets some.
pub fn event(sale: &str, n: usize) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        kind: EventKind::Created,
        order_id: order_id(sale, n),
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

/// Rows stored for `sale`: a progress measure only. Whether the right
/// orders are stored, each once, is [`stored_ids`] against what was produced.
pub async fn count_rows(sink: &Sink, sale: &str) -> Result<i64, String> {
    let result = match sink {
        Sink::Postgres(pool) => {
            sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE sale = $1")
                .bind(sale)
                .fetch_one(pool)
                .await
        }
        Sink::Mysql(pool) => {
            sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE sale = ?")
                .bind(sale)
                .fetch_one(pool)
                .await
        }
    };
    result.map_err(|e| e.to_string())
}

/// The order ids stored for `sale`.
pub async fn stored_ids(sink: &Sink, sale: &str) -> Result<BTreeSet<String>, String> {
    let ids: Result<Vec<String>, _> = match sink {
        Sink::Postgres(pool) => {
            sqlx::query_scalar("SELECT order_id FROM orders WHERE sale = $1")
                .bind(sale)
                .fetch_all(pool)
                .await
        }
        Sink::Mysql(pool) => {
            sqlx::query_scalar("SELECT order_id FROM orders WHERE sale = ?")
                .bind(sale)
                .fetch_all(pool)
                .await
        }
    };
    let ids = ids.map_err(|e| e.to_string())?;
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    if unique.len() == ids.len() {
        Ok(unique)
    } else {
        Err(format!(
            "{} rows hold {} order ids",
            ids.len(),
            unique.len()
        ))
    }
}

/// How `stored` differs from `expected`, or `None` when it is the same set.
pub fn difference(stored: &BTreeSet<String>, expected: &BTreeSet<String>) -> Option<String> {
    let missing: Vec<&String> = expected.difference(stored).collect();
    let extra: Vec<&String> = stored.difference(expected).collect();
    if missing.is_empty() && extra.is_empty() {
        return None;
    }
    Some(format!(
        "{} of {} orders stored; {} missing (first {:?}), {} not produced by this test (first {:?})",
        stored.len(),
        expected.len(),
        missing.len(),
        missing.first(),
        extra.len(),
        extra.first()
    ))
}

/// Polls until `sale` holds exactly the orders `expected`: none missing,
/// none the test did not produce.
pub async fn wait_stored_exactly(
    sink: &Sink,
    sale: &str,
    expected: &BTreeSet<String>,
    within: Duration,
) -> anyhow::Result<()> {
    poll_until(
        "exactly the produced orders stored",
        within,
        Duration::from_millis(200),
        || async {
            // Counting is cheap; the ids are read once there are enough rows.
            let rows = count_rows(sink, sale).await?;
            if rows < expected.len() as i64 {
                return Err(format!("{rows} of {} rows", expected.len()));
            }
            let stored = stored_ids(sink, sale).await?;
            match difference(&stored, expected) {
                None => Ok(()),
                Some(diff) => Err(diff),
            }
        },
    )
    .await
    .map_err(Into::into)
}

/// The value of the unlabelled sample `name` in the registry's exposition,
/// `None` when the registry has no such sample.
pub fn sample(
    registry: &prometheus_client::registry::Registry,
    name: &str,
) -> anyhow::Result<Option<i64>> {
    let text = flashsale_runtime::metrics::render(registry)?;
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().map_err(Into::into))
        .transpose()
}

/// The writer settings the tests run with, for `group` on these topics.
pub fn writer_settings(brokers: &str, topic: &str, dlq: &str, group: &str) -> WriterSettings {
    WriterSettings {
        brokers: brokers.to_owned(),
        group_id: group.to_owned(),
        topic: topic.to_owned(),
        dlq_topic: dlq.to_owned(),
        batch_size: 200,
        flush_interval: Duration::from_millis(100),
        write_concurrency: 2,
        // Short, so tests that stop a writer see its partitions move soon;
        // the broker failover test uses the production default.
        session_timeout: Duration::from_secs(10),
    }
}
