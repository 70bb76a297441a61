//! 100,000 events, the writer binary killed with SIGKILL twice mid-stream and
//! restarted: exactly the orders produced are stored (none missing, none
//! extra, each once) and the group's offsets end at the end of every
//! partition. On PostgreSQL and on MariaDB, each in a database of its own.

mod common;

use std::{process::Stdio, time::Duration};

use common::Topics;
use flashsale_e2e::{stack, wait::poll_until};
use flashsale_orders::{OrderProducer, ProducerSettings};
use order_writer::sink::Sink;

const EVENTS: usize = 100_000;
const PARTITIONS: i32 = 6;

async fn two_sigkills_lose_and_duplicate_nothing(server_url: String) -> anyhow::Result<()> {
    let database = common::PrivateDatabase::create(&server_url).await?;
    let topics = Topics::create(PARTITIONS).await?;
    let sale = stack::unique_name("crash");
    let sink = Sink::connect(&database.url, 2).await?;
    let group = stack::unique_name("crash-group");

    // Events keep arriving while the writer is killed and restarted.
    let mut settings = ProducerSettings::new(&topics.brokers);
    settings.topic = topics.topic.clone();
    let producer = OrderProducer::new(&settings)?;
    let producing = tokio::spawn({
        let sale = sale.clone();
        async move { common::produce(&producer, &sale, 0..EVENTS, 5_000).await }
    });

    let mut writer = WriterProcess::start(&topics, &group, &database.url)?;
    for kill_at in [EVENTS as i64 / 5, EVENTS as i64 / 2] {
        let stored = poll_until(
            "the writer to get mid-stream",
            Duration::from_secs(120),
            Duration::from_millis(20),
            || async {
                let rows = common::count_rows(&sink, &sale).await?;
                if rows >= kill_at {
                    Ok(rows)
                } else {
                    Err(format!("{rows} rows stored; log: {}", writer.log.display()))
                }
            },
        )
        .await?;
        writer.kill().await?;
        let after_kill = common::count_rows(&sink, &sale)
            .await
            .map_err(anyhow::Error::msg)?;
        assert!(
            after_kill < EVENTS as i64,
            "the kill came after the end ({after_kill} rows)"
        );
        eprintln!(
            "{}: killed the writer with {stored}..{after_kill} of {EVENTS} rows stored",
            server_url.split(':').next().unwrap_or_default()
        );
        writer = WriterProcess::start(&topics, &group, &database.url)?;
    }

    let (acked, failed) = producing.await?;
    assert!(failed.is_empty(), "sends failed: {:?}", failed.first());
    assert_eq!(acked.len(), EVENTS);
    common::wait_stored_exactly(
        &sink,
        &sale,
        &common::order_ids(&sale, 0..EVENTS),
        Duration::from_secs(180),
    )
    .await?;
    let end = topics
        .wait_committed_to_end(&group, Duration::from_secs(60))
        .await?;
    assert_eq!(end, EVENTS as i64);
    writer.stop().await?;
    // Nothing was poison, so nothing went to the DLQ.
    let dlq_messages = topics.message_count(&topics.dlq, 1).await?;
    assert_eq!(dlq_messages, 0);
    topics.delete().await?;
    database.remove().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_sigkills_lose_and_duplicate_nothing() -> anyhow::Result<()> {
    two_sigkills_lose_and_duplicate_nothing(stack::postgres_url()?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_two_sigkills_lose_and_duplicate_nothing() -> anyhow::Result<()> {
    two_sigkills_lose_and_duplicate_nothing(stack::mysql_url()?).await
}

/// The order-writer binary as a child process of the test.
struct WriterProcess {
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl WriterProcess {
    /// Starts the binary on `topics` with `group` and `database_url`; its
    /// log goes to a file named in failures.
    fn start(topics: &Topics, group: &str, database_url: &str) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!("{}.log", stack::unique_name("order-writer")));
        let file = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-writer"))
            .args(["--brokers", &topics.brokers])
            .args(["--group", group])
            .args(["--topic", &topics.topic])
            .args(["--dlq-topic", &topics.dlq])
            .args(["--database-url", database_url])
            .args(["--ops-addr", "127.0.0.1:0"])
            .args(["--session-timeout-ms", "6000"])
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { child, log })
    }

    /// SIGKILL: no shutdown path runs, nothing is flushed or committed.
    async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// SIGTERM, then waits for a clean exit.
    async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| anyhow::anyhow!("writer already exited"))?;
        let status = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await?;
        anyhow::ensure!(status.success(), "kill -TERM {pid} failed");
        let exit = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        anyhow::ensure!(
            exit.success(),
            "writer exited with {exit}; log: {}",
            self.log.display()
        );
        Ok(())
    }
}
