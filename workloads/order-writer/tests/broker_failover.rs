//! A broker of the stack's three-node Kafka cluster SIGKILLed mid-stream.
//! Several producers send orders through the gateway's own producer
//! (idempotent, acks=all) at a steady rate, retrying a failed send under the
//! same order id as the gateway's clients do; the order-writer consumes into
//! a database of its own. The broker leading the most partitions is killed,
//! the stream goes on through the election, the broker comes back and the
//! cluster is whole again before producing stops. Then every acknowledged
//! order is stored exactly once (counted per order id), nothing is stored
//! that was never sent, the writer's group has committed the end of every
//! partition, and the writer stored again within 5 s of the producers being
//! acknowledged again (it kept its partitions while the group's coordinator
//! moved). The cluster is optional in the stack but `e2e/local/stack test`
//! starts it; without it (`e2e/local/stack up kafka-cluster`) the test fails
//! and says how to start it.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::Topics;
use flashsale_e2e::{
    clusters::{KafkaCluster, PartitionState},
    faults, stack,
    wait::poll_until,
};
use flashsale_orders::{OrderEvent, OrderProducer, ProduceError, ProducerSettings};
use flashsale_runtime::{LogArgs, LogFormat, Shutdown};
use futures::{StreamExt, stream::FuturesUnordered};
use order_writer::{
    metrics::WriterMetrics,
    sink::Sink,
    writer::{Writer, WriterSettings, WriterStats},
};
use rdkafka::{
    ClientConfig,
    consumer::{BaseConsumer, Consumer},
};
use tokio::{task::JoinHandle, time::MissedTickBehavior};

const PARTITIONS: i32 = 6;
const REPLICAS: i32 = 3;
const MIN_INSYNC: i32 = 2;
/// Producing tasks, each a share of the gateway's concurrent requests.
const PRODUCERS: usize = 6;
/// Orders per second over all producers.
const RATE: f64 = 2_000.0;
/// Orders at most; the stream normally stops well before, once the
/// cluster is whole again.
const MAX_ORDERS: usize = 400_000;
/// Orders one producer has unanswered at most (the gateway's in-flight
/// requests): beyond, it waits, as a gateway at its concurrency limit sheds.
const MAX_IN_FLIGHT: usize = 5_000;
/// The gateway's publish bound: its default request timeout.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// A client's pause before it sends a failed order again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long a client keeps retrying one order before it gives up.
const RETRY_FOR: Duration = Duration::from_secs(40);
/// No new order is issued after this, whatever happens.
const PRODUCE_AT_MOST: Duration = Duration::from_secs(120);
/// From SIGKILL to new leaders: the brokers' session timeout (9 s) and slack.
const ELECTION: Duration = Duration::from_secs(45);
const HEALTHY: Duration = Duration::from_secs(90);
/// Riding through: the writer stores again at most this long after the
/// producers are acknowledged again (a fetch, a batch, a transaction, and
/// the consumer finding the partitions' new leaders).
const WRITER_CATCH_UP: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_mid_stream_loses_and_duplicates_no_acknowledged_order()
-> anyhow::Result<()> {
    let cluster = KafkaCluster::from_env()?;
    // RUST_LOG=order_writer=debug shows the writer's own account.
    if let Ok(filter) = std::env::var("RUST_LOG") {
        let args = LogArgs {
            log_format: LogFormat::Text,
            log_filter: filter,
        };
        flashsale_runtime::telemetry::init(&args)?;
    }
    let _exclusive = faults::exclusive().await;
    let stage = Stage::prepare(&cluster).await?;
    let start = Instant::now();
    println!(
        "topic {} ({PARTITIONS} partitions, {REPLICAS} replicas, min in sync {MIN_INSYNC}) ready",
        stage.topics.topic
    );
    let writing = Writing::start(&stage)?;
    let stream = Arc::new(Stream::default());
    let producing = start_producers(&stage, &stream, start)?;
    wait_steady(&stage, &stream).await?;
    println!("{:6.2} s: steady", start.elapsed().as_secs_f64());

    let (kill, killed) = kill_the_busiest_leader(&cluster, &stage, &stream, start).await?;
    let (riding, restored, healthy_at) =
        ride_through_and_restore(&cluster, &stage, &kill, killed, &stream, start).await;
    if riding.is_err() || restored.is_err() {
        for task in &producing {
            task.abort();
        }
        writing.shutdown.trigger();
    }
    riding?;
    restored?;
    println!(
        "{:6.2} s: cluster whole again, every partition of the topic with {REPLICAS} replicas \
         in sync; producing stops",
        healthy_at.as_secs_f64()
    );

    let mut tally = Tally::default();
    for task in producing {
        tally.merge(task.await?);
    }
    let produced_at = start.elapsed();
    let acked: BTreeSet<usize> = tally.acked.iter().map(|a| a.n).collect();
    let acked_ids = common::order_ids(&stage.sale, acked.iter().copied());
    let issued_ids = common::order_ids(&stage.sale, tally.issued.iter().copied());

    // Every acknowledged order stored; the group at the end of every partition.
    let counts = wait_all_stored(&stage, &acked_ids).await?;
    let log_end = stage
        .topics
        .wait_committed_to_end(&stage.group, Duration::from_secs(60))
        .await?;
    let drained_at = start.elapsed();
    let stats = writing.stop().await?;
    let counts = check_exactly_once(&stage, counts, &acked_ids, &issued_ids, &stats).await?;

    let gaps = print_gaps(&stage, &kill, &tally, &stream).await?;
    Totals {
        sent: tally.issued.len(),
        healthy_at,
        acked: acked.len(),
        stored: counts.len(),
        stored_unacked: counts.len().saturating_sub(acked_ids.len()),
        log_end,
        batches: stats.batches,
        drained_after: drained_at - produced_at,
    }
    .print();
    assert!(
        tally.abandoned.is_empty(),
        "orders abandoned: the stream did not ride through"
    );
    let (acked_again, stored_again) = (gaps.ack.1 - gaps.kill_s, gaps.store.1 - kill.wall);
    assert!(
        stored_again <= acked_again + WRITER_CATCH_UP.as_secs_f64(),
        "the writer did not ride through: it stored again {stored_again:.2} s after the kill, \
         {:.2} s after the producers were acknowledged again",
        stored_again - acked_again
    );

    stage.topics.delete().await?;
    stage.database.remove().await
}

/// What the test runs on: the topic, the writer's database of its own, the
/// sale and the writer's group.
struct Stage {
    topics: Topics,
    database: common::PrivateDatabase,
    sink: Sink,
    sale: String,
    group: String,
}

impl Stage {
    /// Waits for a whole cluster, creates the topic with every replica in
    /// sync, and a database of the test's own.
    async fn prepare(cluster: &KafkaCluster) -> anyhow::Result<Self> {
        cluster.until_healthy(HEALTHY).await?;
        let topics = Topics::create_on(cluster.brokers(), PARTITIONS, REPLICAS, MIN_INSYNC).await?;
        wait_in_sync(cluster, &topics.topic, HEALTHY).await?;
        let database = common::PrivateDatabase::create(&stack::postgres_url()?).await?;
        let sink = Sink::connect(&database.url, 2).await?;
        Ok(Self {
            topics,
            database,
            sink,
            sale: stack::unique_name("failover"),
            group: stack::unique_name("failover-group"),
        })
    }
}

/// The writer on a task of its own: its stats and whether it left its
/// group in time, once shut down.
struct Writing {
    shutdown: Shutdown,
    task: JoinHandle<common::WriterEnd>,
    /// Where the writer's metrics are registered, kept for its lifetime.
    _registry: prometheus_client::registry::Registry,
}

impl Writing {
    /// Starts the writer on the stage's topic, with the production session
    /// timeout: a shorter one lapses while the dead coordinator is fenced.
    fn start(stage: &Stage) -> anyhow::Result<Self> {
        let mut registry = prometheus_client::registry::Registry::default();
        let topics = &stage.topics;
        let settings = WriterSettings {
            session_timeout: order_writer::writer::DEFAULT_SESSION_TIMEOUT,
            ..common::writer_settings(&topics.brokers, &topics.topic, &topics.dlq, &stage.group)
        };
        let writer = Writer::new(
            settings,
            stage.sink.clone(),
            WriterMetrics::register(&mut registry),
        )?;
        let shutdown = Shutdown::new();
        let task = common::spawn_writer(writer, &shutdown);
        Ok(Self {
            shutdown,
            task,
            _registry: registry,
        })
    }

    /// Shuts the writer down; its stats, once it left its group.
    async fn stop(self) -> anyhow::Result<WriterStats> {
        self.shutdown.trigger();
        let (stats, closed) = self.task.await?;
        let stats = stats?;
        assert!(closed, "the writer did not leave its group within 10 s");
        Ok(stats)
    }
}

/// Starts the [`PRODUCERS`] producers of the stage's sale, through one
/// producer with the gateway's settings.
fn start_producers(
    stage: &Stage,
    stream: &Arc<Stream>,
    start: Instant,
) -> anyhow::Result<Vec<JoinHandle<Tally>>> {
    let mut settings = ProducerSettings::new(&stage.topics.brokers);
    settings.topic = stage.topics.topic.clone();
    settings.send_timeout = SEND_TIMEOUT;
    let producer = OrderProducer::new(&settings)?;
    Ok((0..PRODUCERS)
        .map(|first| {
            tokio::spawn(produce(
                producer.clone(),
                stage.sale.clone(),
                first,
                Arc::clone(stream),
                start,
            ))
        })
        .collect())
}

/// Steady state first: orders acknowledged and stored.
async fn wait_steady(stage: &Stage, stream: &Stream) -> anyhow::Result<()> {
    poll_until(
        "a steady stream, acknowledged and stored",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let acked = stream.acked.load(Ordering::Relaxed);
            let stored = common::count_rows(&stage.sink, &stage.sale).await?;
            if acked as f64 >= RATE * 3.0 && stored > 0 {
                Ok(())
            } else {
                Err(format!("{acked} acknowledged, {stored} stored"))
            }
        },
    )
    .await?;
    Ok(())
}

/// The kill: which broker, each partition's leader before it, and when it
/// came (since the start, and as Unix seconds).
struct Kill {
    victim: i32,
    leaders_before: BTreeMap<i32, i32>,
    at: Duration,
    wall: f64,
}

/// SIGKILLs the broker leading the most partitions (the group's
/// coordinator of a tie); the guard that starts it again.
async fn kill_the_busiest_leader(
    cluster: &KafkaCluster,
    stage: &Stage,
    stream: &Stream,
    start: Instant,
) -> anyhow::Result<(Kill, KilledBroker)> {
    let coordinator = group_coordinator(cluster, &stage.group).await?;
    let (victim, leaders_before) =
        busiest_leader(cluster, &stage.topics.topic, coordinator).await?;
    let killed = KilledBroker {
        cluster: cluster.clone(),
        id: victim,
        restored: false,
    };
    cluster.kill(victim).await?;
    let kill = Kill {
        victim,
        leaders_before,
        at: start.elapsed(),
        wall: unix_seconds(SystemTime::now()),
    };
    let acked_at_kill = stream.acked.load(Ordering::Relaxed);
    println!(
        "{:6.2} s: SIGKILLed broker {victim} (leading the most partitions; the writer's group \
         coordinator is {coordinator:?}), {acked_at_kill} orders acknowledged",
        kill.at.as_secs_f64()
    );
    Ok((kill, killed))
}

/// After the kill: rides through the election, then brings the broker back
/// while the stream goes on, and only then stops the stream. Whether each
/// went through, and when the cluster was whole (since the start).
async fn ride_through_and_restore(
    cluster: &KafkaCluster,
    stage: &Stage,
    kill: &Kill,
    killed: KilledBroker,
    stream: &Stream,
    start: Instant,
) -> (anyhow::Result<Duration>, anyhow::Result<()>, Duration) {
    let riding = ride_through(cluster, &stage.topics.topic, kill.victim, stream, start).await;
    if let Ok(elected_at) = &riding {
        println!(
            "{:6.2} s: every partition led by a live broker",
            elected_at.as_secs_f64()
        );
    }
    println!(
        "{:6.2} s: restarting broker {}",
        start.elapsed().as_secs_f64(),
        kill.victim
    );
    let restored = killed.restore(&stage.topics.topic).await;
    let healthy_at = start.elapsed();
    stream.stop.store(true, Ordering::Relaxed);
    (riding, restored, healthy_at)
}

/// Waits until every acknowledged order is stored; how many rows each
/// stored order id has.
async fn wait_all_stored(
    stage: &Stage,
    acked_ids: &BTreeSet<String>,
) -> anyhow::Result<BTreeMap<String, i64>> {
    Ok(poll_until(
        "every acknowledged order stored",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let counts = stored_counts(&stage.sink, &stage.sale).await?;
            let missing = acked_ids.iter().filter(|id| !counts.contains_key(*id));
            match missing.count() {
                0 => Ok(counts),
                n => Err(format!(
                    "{n} of {} acknowledged orders not stored",
                    acked_ids.len()
                )),
            }
        },
    )
    .await?)
}

/// Exactly once, counted per order id, and nothing that was never sent;
/// nothing dead-lettered. Returns the counts read again after the writer
/// stopped.
async fn check_exactly_once(
    stage: &Stage,
    counts: BTreeMap<String, i64>,
    acked_ids: &BTreeSet<String>,
    issued_ids: &BTreeSet<String>,
    stats: &WriterStats,
) -> anyhow::Result<BTreeMap<String, i64>> {
    let counts = {
        // Read again after the writer stopped: nothing may have come since.
        let again = stored_counts(&stage.sink, &stage.sale)
            .await
            .map_err(anyhow::Error::msg)?;
        assert_eq!(
            again, counts,
            "rows changed after the group reached the end"
        );
        again
    };
    let duplicated: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        duplicated.is_empty(),
        "{} orders stored more than once, first {:?}",
        duplicated.len(),
        duplicated.first()
    );
    let lost: Vec<_> = acked_ids
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .collect();
    assert!(lost.is_empty(), "{} acknowledged orders lost", lost.len());
    let unsent: Vec<_> = counts
        .keys()
        .filter(|id| !issued_ids.contains(*id))
        .collect();
    assert!(
        unsent.is_empty(),
        "{} stored orders were never sent, first {:?}",
        unsent.len(),
        unsent.first()
    );
    assert_eq!(stats.dead_lettered, 0, "nothing was poison");
    assert_eq!(stats.inserted as usize, counts.len());
    assert_eq!(stage.topics.message_count(&stage.topics.dlq, 1).await?, 0);
    Ok(counts)
}

/// The longest stretches without an acknowledgement and without a stored
/// order that ended after the kill, `(from, to)`: acknowledgements in
/// seconds since the start (the kill at `kill_s`), stores in Unix seconds.
struct Gaps {
    kill_s: f64,
    ack: (f64, f64),
    store: (f64, f64),
}

/// The acknowledgement times (seconds since the start, ascending) of
/// `partition`, or of every partition.
fn ack_times(tally: &Tally, partition: Option<i32>) -> Vec<f64> {
    let mut times: Vec<f64> = tally
        .acked
        .iter()
        .filter(|a| partition.is_none_or(|p| p == a.partition))
        .map(|a| a.at.as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

/// Prints how long the producers went unacknowledged and the writer
/// stored nothing around the kill, per partition and overall.
async fn print_gaps(
    stage: &Stage,
    kill: &Kill,
    tally: &Tally,
    stream: &Stream,
) -> anyhow::Result<Gaps> {
    let kill_s = kill.at.as_secs_f64();
    let (ack_gap_from, ack_gap_to) = longest_gap_ending_after(&ack_times(tally, None), kill_s)
        .ok_or_else(|| anyhow::anyhow!("no acknowledgement after the kill"))?;
    let stored_times = transaction_times(&stage.sink, &stage.sale).await?;
    let all_stored: Vec<f64> = {
        let mut all: Vec<f64> = stored_times.values().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        all.dedup();
        all
    };
    let (store_gap_from, store_gap_to) = longest_gap_ending_after(&all_stored, kill.wall)
        .ok_or_else(|| anyhow::anyhow!("nothing stored after the kill"))?;
    for p in 0..PARTITIONS {
        let acks = longest_gap_ending_after(&ack_times(tally, Some(p)), kill_s);
        let stores = stored_times
            .get(&p)
            .and_then(|times| longest_gap_ending_after(times, kill.wall));
        println!(
            "partition {p} (led by {:?} before the kill): acknowledged again {}, stored again {}",
            kill.leaders_before.get(&p),
            after_kill(acks, kill_s),
            after_kill(stores, kill.wall)
        );
    }
    let errors = stream.errors();
    println!(
        "producers: no acknowledgement for {:.2} s (from {:+.2} s to {:+.2} s of the kill); \
         {} failed sends retried ({errors:?}); {} orders abandoned after {} s of retries",
        ack_gap_to - ack_gap_from,
        ack_gap_from - kill_s,
        ack_gap_to - kill_s,
        stream.retried.load(Ordering::Relaxed),
        tally.abandoned.len(),
        RETRY_FOR.as_secs()
    );
    println!(
        "writer: stored nothing for {:.2} s (from {:+.2} s to {:+.2} s of the kill); stored again {:.2} s after the kill",
        store_gap_to - store_gap_from,
        store_gap_from - kill.wall,
        store_gap_to - kill.wall,
        store_gap_to - kill.wall
    );
    Ok(Gaps {
        kill_s,
        ack: (ack_gap_from, ack_gap_to),
        store: (store_gap_from, store_gap_to),
    })
}

/// The run's totals, for its last line.
struct Totals {
    /// Orders sent.
    sent: usize,
    /// When the cluster was whole again and producing stopped (since the start).
    healthy_at: Duration,
    /// Orders acknowledged.
    acked: usize,
    /// Orders stored.
    stored: usize,
    /// Orders stored but never acknowledged.
    stored_unacked: usize,
    /// Messages in the log.
    log_end: i64,
    /// The writer's batches.
    batches: u64,
    /// From producing stopped to all stored and committed.
    drained_after: Duration,
}

impl Totals {
    /// Prints the run's last line.
    fn print(&self) {
        println!(
            "totals: {} orders sent over {:.1} s{}, {} acknowledged, {} stored (each once; {} stored \
             but never acknowledged), {} messages in the log ({} more than orders stored: \
             retries of sends that had landed), {} batches; all stored and committed {:.1} s after \
             producing stopped",
            self.sent,
            self.healthy_at.min(PRODUCE_AT_MOST).as_secs_f64(),
            if self.healthy_at > PRODUCE_AT_MOST {
                " (the time bound ended it before the cluster was whole)"
            } else {
                ""
            },
            self.acked,
            self.stored,
            self.stored_unacked,
            self.log_end,
            self.log_end - self.stored as i64,
            self.batches,
            self.drained_after.as_secs_f64()
        );
    }
}

/// What the producers share: the stop signal and live counters.
#[derive(Default)]
struct Stream {
    stop: AtomicBool,
    acked: AtomicU64,
    retried: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Stream {
    fn failed(&self, error: &ProduceError) {
        if let Ok(mut errors) = self.errors.lock() {
            *errors.entry(error.to_string()).or_default() += 1;
        }
    }

    fn errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

/// One acknowledged order: its number, when (since the start), and the
/// partition it landed in.
#[derive(Debug, Clone, Copy)]
struct Acked {
    n: usize,
    at: Duration,
    partition: i32,
}

/// What producers sent: order numbers issued, acknowledged and abandoned.
#[derive(Default)]
struct Tally {
    issued: Vec<usize>,
    acked: Vec<Acked>,
    abandoned: Vec<usize>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.issued.extend(other.issued);
        self.acked.extend(other.acked);
        self.abandoned.extend(other.abandoned);
    }
}

/// One producer: issues orders `first`, `first + PRODUCERS`, … at its share
/// of [`RATE`], each sent until acknowledged, until the stream stops.
async fn produce(
    producer: OrderProducer,
    sale: String,
    first: usize,
    stream: Arc<Stream>,
    start: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(PRODUCERS as f64 / RATE));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut in_flight = FuturesUnordered::new();
    let mut next = first;
    loop {
        let open = !stream.stop.load(Ordering::Relaxed)
            && next < MAX_ORDERS
            && in_flight.len() < MAX_IN_FLIGHT
            && start.elapsed() < PRODUCE_AT_MOST;
        tokio::select! {
            _ = ticks.tick(), if open => {
                tally.issued.push(next);
                in_flight.push(send_until_acked(&producer, common::event(&sale, next), next, &stream, start));
                next += PRODUCERS;
            }
            Some((n, acked)) = in_flight.next() => match acked {
                Some(acked) => tally.acked.push(acked),
                None => tally.abandoned.push(n),
            },
            else => break,
        }
    }
    tally
}

/// Sends one order until its send returns `Ok` (the moment the gateway
/// would acknowledge it), the same event each time; `None` when the client
/// gave up.
async fn send_until_acked(
    producer: &OrderProducer,
    event: OrderEvent,
    n: usize,
    stream: &Stream,
    start: Instant,
) -> (usize, Option<Acked>) {
    let first = Instant::now();
    loop {
        match producer.send(&event).await {
            Ok(delivered) => {
                stream.acked.fetch_add(1, Ordering::Relaxed);
                let at = start.elapsed();
                let partition = delivered.partition;
                return (n, Some(Acked { n, at, partition }));
            }
            Err(error) => {
                stream.failed(&error);
                if first.elapsed() >= RETRY_FOR {
                    return (n, None);
                }
                stream.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// The broker that leads the most partitions of `topic`, and each
/// partition's leader. Of a tie (the brokers share the leaders evenly) the
/// group's coordinator, the harder case: the writer's heartbeats and commits
/// lose their broker too; then the lowest id.
async fn busiest_leader(
    cluster: &KafkaCluster,
    topic: &str,
    coordinator: Option<i32>,
) -> anyhow::Result<(i32, BTreeMap<i32, i32>)> {
    let (mut leaders, mut led) = (BTreeMap::new(), BTreeMap::<i32, usize>::new());
    for p in 0..PARTITIONS {
        let leader = cluster
            .leader_of(topic, p)
            .await?
            .ok_or_else(|| anyhow::anyhow!("partition {p} has no leader"))?;
        leaders.insert(p, leader);
        *led.entry(leader).or_default() += 1;
    }
    let busiest = led
        .iter()
        .max_by_key(|(id, count)| (**count, Some(**id) == coordinator, std::cmp::Reverse(**id)))
        .map(|(id, _)| *id)
        .ok_or_else(|| anyhow::anyhow!("no partition has a leader"))?;
    Ok((busiest, leaders))
}

/// The broker coordinating `group`: the leader of the partition of
/// `__consumer_offsets` that holds it, `abs(hashCode(group)) % partitions`
/// as the broker computes it (Java's string hash).
async fn group_coordinator(cluster: &KafkaCluster, group: &str) -> anyhow::Result<Option<i32>> {
    const OFFSETS: &str = "__consumer_offsets";
    let brokers = cluster.brokers().to_owned();
    let partitions = tokio::task::spawn_blocking(move || -> anyhow::Result<i32> {
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()?;
        let metadata = client.fetch_metadata(Some(OFFSETS), Duration::from_secs(5))?;
        let count = metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len());
        Ok(i32::try_from(count)?)
    })
    .await??;
    anyhow::ensure!(partitions > 0, "{OFFSETS} has no partitions");
    let hash = group
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    // Kafka's Utils.abs: 0 for i32::MIN.
    let partition = hash.checked_abs().unwrap_or(0) % partitions;
    Ok(cluster.leader_of(OFFSETS, partition).await?)
}

/// After the kill: waits until every partition has a live leader and the
/// producers are acknowledged again; returns when the partitions had
/// leaders (since the start).
async fn ride_through(
    cluster: &KafkaCluster,
    topic: &str,
    victim: i32,
    stream: &Stream,
    start: Instant,
) -> anyhow::Result<Duration> {
    until_partitions(
        cluster,
        topic,
        "every partition led by a live broker",
        ELECTION,
        |state| matches!(state.leader, Some(leader) if leader != victim),
    )
    .await?;
    let elected = start.elapsed();
    let acked = stream.acked.load(Ordering::Relaxed);
    poll_until(
        "the producers acknowledged again",
        ELECTION,
        Duration::from_millis(50),
        || async {
            let now = stream.acked.load(Ordering::Relaxed);
            if now as f64 >= acked as f64 + RATE {
                Ok(())
            } else {
                Err(format!(
                    "{} acknowledged since the election; failures: {:?}",
                    now - acked,
                    stream.errors()
                ))
            }
        },
    )
    .await?;
    Ok(elected)
}

/// Waits until every partition of `topic` has a leader and all replicas in
/// sync.
async fn wait_in_sync(cluster: &KafkaCluster, topic: &str, within: Duration) -> anyhow::Result<()> {
    until_partitions(
        cluster,
        topic,
        "every partition of the test's topic fully in sync",
        within,
        |state| state.leader.is_some() && state.isr.len() >= REPLICAS as usize,
    )
    .await
}

/// Polls every partition of `topic` until `ok` holds for each of them.
async fn until_partitions(
    cluster: &KafkaCluster,
    topic: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&PartitionState) -> bool,
) -> anyhow::Result<()> {
    poll_until(what, within, Duration::from_millis(250), || async {
        for p in 0..PARTITIONS {
            let state = cluster
                .partition(topic, p)
                .await
                .map_err(|e| e.to_string())?;
            if !ok(&state) {
                return Err(format!("partition {p}: {state:?}"));
            }
        }
        Ok(())
    })
    .await?;
    Ok(())
}

/// The killed broker. [`KilledBroker::restore`] brings it back and waits
/// until the cluster is whole; a test that ends before (an error, a panic)
/// still starts it again on drop, so later tests find the cluster whole.
struct KilledBroker {
    cluster: KafkaCluster,
    id: i32,
    restored: bool,
}

impl KilledBroker {
    async fn restore(mut self, topic: &str) -> anyhow::Result<()> {
        let began = Instant::now();
        self.cluster.restart(self.id).await?;
        self.restored = true;
        let up = began.elapsed();
        self.cluster.until_healthy(HEALTHY).await?;
        wait_in_sync(&self.cluster, topic, HEALTHY).await?;
        println!(
            "broker {} restarted by the stack in {:.1} s, in sync {:.1} s later",
            self.id,
            up.as_secs_f64(),
            (began.elapsed() - up).as_secs_f64()
        );
        Ok(())
    }
}

impl Drop for KilledBroker {
    fn drop(&mut self) {
        if !self.restored
            && let Ok(script) = stack::script()
        {
            let _ = std::process::Command::new(script)
                .args(["up", "kafka-cluster"])
                .status();
        }
    }
}

/// How many rows each stored order id of `sale` has.
async fn stored_counts(sink: &Sink, sale: &str) -> Result<BTreeMap<String, i64>, String> {
    let Sink::Postgres(pool) = sink else {
        return Err("the test reads PostgreSQL only".into());
    };
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT order_id, COUNT(*) FROM orders WHERE sale = $1 GROUP BY order_id")
            .bind(sale)
            .fetch_all(pool)
            .await
            .map_err(|e| e.to_string())?;
    Ok(rows.into_iter().collect())
}

/// When the writer's transactions that stored orders of `sale` ran, per
/// partition (Unix seconds, ascending): `updated_at` is the inserting
/// transaction's start.
async fn transaction_times(sink: &Sink, sale: &str) -> anyhow::Result<BTreeMap<i32, Vec<f64>>> {
    let Sink::Postgres(pool) = sink else {
        anyhow::bail!("the test reads PostgreSQL only");
    };
    let rows: Vec<(i32, f64)> = sqlx::query_as(
        "SELECT DISTINCT kafka_partition, EXTRACT(EPOCH FROM updated_at)::float8 AS t \
         FROM orders WHERE sale = $1 ORDER BY t",
    )
    .bind(sale)
    .fetch_all(pool)
    .await?;
    let mut times: BTreeMap<i32, Vec<f64>> = BTreeMap::new();
    for (partition, t) in rows {
        times.entry(partition).or_default().push(t);
    }
    Ok(times)
}

/// "+x s after the kill (after a y s gap)" for a gap's `(from, to)`.
fn after_kill(gap: Option<(f64, f64)>, kill: f64) -> String {
    match gap {
        Some((from, to)) => format!(
            "{:+.2} s after the kill (after a {:.2} s gap)",
            to - kill,
            to - from
        ),
        None => "never".to_owned(),
    }
}

/// The longest gap between consecutive `times` (ascending) among those that
/// end after `after`: `(from, to)`.
fn longest_gap_ending_after(times: &[f64], after: f64) -> Option<(f64, f64)> {
    times
        .windows(2)
        .filter(|w| w[1] > after)
        .map(|w| (w[0], w[1]))
        .max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)))
}

fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}
