//! Load generator: persisted orders per second from Kafka to the database,
//! measured in the same run against the database's own ceiling:
//!
//! - `raw`: the same rows written straight into a table shaped like `orders`
//!   (PostgreSQL: one `COPY`; MariaDB: 1,000-row multi-row inserts);
//! - `writer`: the order-writer loop at its default batch of 200, from a
//!   topic of 6 partitions filled beforehand (steady rate, after the group join);
//! - `writer-b1`: the same with a batch of 1 (one transaction per event);
//! - then, in every run, the created → committed p99 with events produced at
//!   half of that run's writer rate (from `order_writer_commit_latency_seconds`).
//!
//! Needs the local stack (`eval "$(e2e/local/stack env)"`). Run:
//! `cargo run --release -p order-writer --example bench_writer -- --events 100000 --runs 3`

use std::time::{Duration, Instant};

use clap::Parser;
use flashsale_bench::{Recorder, median, ms};
use flashsale_e2e::{
    orders::{Topics, event, produce},
    stack,
};
use flashsale_orders::{OrderProducer, ProducerSettings};
use flashsale_runtime::{Shutdown, metrics::render};
use order_writer::{
    metrics::WriterMetrics,
    sink::Sink,
    writer::{Writer, WriterSettings},
};
use prometheus_client::registry::Registry;

/// Persisted orders per second, Kafka → database, against the raw ceiling.
#[derive(Debug, Parser)]
struct Options {
    /// Events per throughput run.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Events for the batch-of-1 run (it is slow).
    #[arg(long, default_value_t = 3_000)]
    batch_one_events: usize,
    /// Runs per database; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds of paced traffic for the latency measurement.
    #[arg(long, default_value_t = 10)]
    latency_seconds: u64,
    /// Concurrent transactions of the writer.
    #[arg(long, default_value_t = 2)]
    write_concurrency: usize,
    /// Database families to measure.
    #[arg(long, value_delimiter = ',', default_value = "postgres,mariadb")]
    databases: Vec<String>,
}

/// The value of an unlabelled sample line `name value` in the registry's text.
fn sample(registry: &Registry, name: &str) -> anyhow::Result<f64> {
    Ok(flashsale_e2e::metrics::sample(&render(registry)?, name).unwrap_or(0.0))
}

/// The `q` quantile of created → committed, from the writer's
/// `order_writer_commit_latency_seconds` histogram: each commit is known
/// only to its bucket, so it is recorded at the bucket's upper bound (the
/// last finite bound for the overflow bucket), and the quantile is the
/// recorder's. An upper bound of the quantile, at the buckets' resolution.
fn commit_latency_quantile(registry: &Registry, q: f64) -> anyhow::Result<Option<Duration>> {
    let text = render(registry)?;
    let mut recorder = Recorder::new();
    let (mut bound, mut below) = (Duration::ZERO, 0_u64);
    for line in text.lines() {
        let Some((le, count)) = line
            .strip_prefix("order_writer_commit_latency_seconds_bucket{le=\"")
            .and_then(|rest| rest.split_once("\"} "))
        else {
            continue;
        };
        let count: u64 = count.parse()?;
        if let Ok(le) = le.parse::<f64>()
            && le.is_finite()
        {
            bound = Duration::from_secs_f64(le);
        }
        recorder.record_n(bound, count.saturating_sub(below));
        below = count;
    }
    Ok(recorder.quantile(q))
}

/// The ceiling: the same rows straight into a table shaped like `orders`.
async fn raw_rows_per_second(sink: &Sink, sale: &str, events: usize) -> anyhow::Result<f64> {
    let rows: Vec<_> = (0..events).map(|n| event(sale, n)).collect();
    let started;
    match sink {
        Sink::Postgres(pool) => {
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_orders_raw (LIKE orders INCLUDING ALL)")
                .execute(pool)
                .await?;
            sqlx::query("TRUNCATE bench_orders_raw")
                .execute(pool)
                .await?;
            let mut csv = String::with_capacity(events * 160);
            for (n, e) in rows.iter().enumerate() {
                csv.push_str(&format!(
                    "{},{},{},{},{},{},{},{},pending_payment,{},{},{}\n",
                    e.order_id,
                    e.idempotency_key,
                    e.sale,
                    e.user_id,
                    e.sku,
                    e.quantity,
                    e.amount_minor,
                    e.reservation_id,
                    e.created_at,
                    n % 6,
                    n
                ));
            }
            started = Instant::now();
            let mut conn = pool.acquire().await?;
            let mut copy = conn
                .copy_in_raw(
                    "COPY bench_orders_raw (order_id, idempotency_key, sale, user_id, sku, \
                     quantity, amount_minor, reservation_id, status, created_at, \
                     kafka_partition, kafka_offset) FROM STDIN (FORMAT csv)",
                )
                .await?;
            copy.send(csv.as_bytes()).await?;
            copy.finish().await?;
        }
        Sink::Mysql(pool) => {
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_orders_raw LIKE orders")
                .execute(pool)
                .await?;
            sqlx::query("TRUNCATE bench_orders_raw")
                .execute(pool)
                .await?;
            started = Instant::now();
            for (chunk_no, chunk) in rows.chunks(1_000).enumerate() {
                let mut insert = sqlx::QueryBuilder::<sqlx::MySql>::new(
                    "INSERT INTO bench_orders_raw (order_id, idempotency_key, sale, user_id, sku, \
                     quantity, amount_minor, reservation_id, status, created_at, \
                     kafka_partition, kafka_offset) ",
                );
                insert.push_values(chunk.iter().enumerate(), |mut row, (i, e)| {
                    let n = chunk_no * 1_000 + i;
                    row.push_bind(e.order_id.clone())
                        .push_bind(e.idempotency_key.clone())
                        .push_bind(e.sale.clone())
                        .push_bind(e.user_id.clone())
                        .push_bind(e.sku.clone())
                        .push_bind(e.quantity)
                        .push_bind(e.amount_minor)
                        .push_bind(e.reservation_id.clone())
                        .push_bind("pending_payment")
                        .push_bind(e.created_at.to_string().trim_end_matches('Z').to_owned())
                        .push_bind((n % 6) as i32)
                        .push_bind(n as i64);
                });
                insert.build().execute(pool).await?;
            }
        }
    }
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

async fn delete_sale(sink: &Sink, sale: &str) -> anyhow::Result<()> {
    match sink {
        Sink::Postgres(pool) => {
            sqlx::query("DELETE FROM orders WHERE sale = $1")
                .bind(sale)
                .execute(pool)
                .await?;
        }
        Sink::Mysql(pool) => {
            sqlx::query("DELETE FROM orders WHERE sale = ?")
                .bind(sale)
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}

/// A writer on a fresh group, running until the returned shutdown fires.
struct Bench {
    registry: Registry,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<()>,
}

fn start_writer(
    topics: &Topics,
    sink: &Sink,
    batch_size: usize,
    write_concurrency: usize,
) -> anyhow::Result<Bench> {
    let mut registry = Registry::default();
    let metrics = WriterMetrics::register(&mut registry);
    let writer = Writer::new(
        WriterSettings {
            brokers: topics.brokers.clone(),
            group_id: stack::unique_name("bench-writer"),
            topic: topics.topic.clone(),
            dlq_topic: topics.dlq.clone(),
            batch_size,
            flush_interval: Duration::from_millis(100),
            write_concurrency,
            session_timeout: Duration::from_secs(10),
        },
        sink.clone(),
        metrics,
    )?;
    let shutdown = Shutdown::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            if let Err(err) = writer.run(shutdown).await {
                eprintln!("writer stopped: {err}");
            }
            writer.close(Duration::from_secs(10)).await;
        }
    });
    Ok(Bench {
        registry,
        shutdown,
        task,
    })
}

impl Bench {
    /// Waits until `events` are persisted; the rate counts from the first
    /// persisted batch, so the group join is not measured.
    async fn steady_rate(&self, events: usize) -> anyhow::Result<f64> {
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut first: Option<(Instant, f64)> = None;
        loop {
            anyhow::ensure!(Instant::now() < deadline, "writer did not finish");
            let persisted = sample(&self.registry, "order_writer_persisted_total")?;
            if persisted > 0.0 && first.is_none() {
                first = Some((Instant::now(), persisted));
            }
            if persisted as usize >= events
                && let Some((at, count)) = first
            {
                return Ok((events as f64 - count) / at.elapsed().as_secs_f64());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.trigger();
        self.task.await?;
        Ok(())
    }
}

async fn writer_rows_per_second(
    sink: &Sink,
    producer_for: impl Fn(&Topics) -> anyhow::Result<OrderProducer>,
    sale: &str,
    events: usize,
    batch_size: usize,
    write_concurrency: usize,
) -> anyhow::Result<f64> {
    let topics = Topics::create(6).await?;
    let producer = producer_for(&topics)?;
    let (acked, failed) = produce(&producer, sale, 0..events, 10_000).await;
    anyhow::ensure!(failed.is_empty() && acked.len() == events, "produce failed");
    let bench = start_writer(&topics, sink, batch_size, write_concurrency)?;
    let rate = bench.steady_rate(events).await?;
    bench.stop().await?;
    delete_sale(sink, sale).await?;
    topics.delete().await?;
    Ok(rate)
}

/// Produces at `rate` events/s for `seconds` with a running writer, then
/// reads the p99 of created → committed (`None` when nothing committed).
async fn commit_p99_at(
    sink: &Sink,
    producer_for: impl Fn(&Topics) -> anyhow::Result<OrderProducer>,
    sale: &str,
    rate: f64,
    seconds: u64,
    write_concurrency: usize,
) -> anyhow::Result<Option<Duration>> {
    let topics = Topics::create(6).await?;
    let producer = producer_for(&topics)?;
    let bench = start_writer(&topics, sink, 200, write_concurrency)?;
    // Warm up: the group has joined once the first event is stored.
    let (acked, _) = produce(&producer, sale, 0..1, 1).await;
    anyhow::ensure!(acked.len() == 1, "warm-up event not acknowledged");
    bench.steady_rate(1).await?;

    let tick = Duration::from_millis(10);
    let per_tick = (rate * tick.as_secs_f64()).max(1.0) as usize;
    let total = (rate * seconds as f64) as usize;
    let mut interval = tokio::time::interval(tick);
    let mut sends = Vec::new();
    let mut next = 1;
    while next < total + 1 {
        interval.tick().await;
        let (producer, sale, range) = (producer.clone(), sale.to_owned(), next..next + per_tick);
        next += per_tick;
        sends.push(tokio::spawn(async move {
            produce(&producer, &sale, range, usize::MAX).await
        }));
    }
    for send in sends {
        let (_, failed) = send.await?;
        anyhow::ensure!(failed.is_empty(), "paced send failed");
    }
    bench.steady_rate(next).await?;
    let p99 = commit_latency_quantile(&bench.registry, 0.99)?;
    bench.stop().await?;
    delete_sale(sink, sale).await?;
    topics.delete().await?;
    Ok(p99)
}

/// A producer to `topics`' order topic.
fn producer_for(topics: &Topics) -> anyhow::Result<OrderProducer> {
    let mut settings = ProducerSettings::new(&topics.brokers);
    settings.topic = topics.topic.clone();
    Ok(OrderProducer::new(&settings)?)
}

/// One run's figures on one database.
struct RunFigures {
    /// The raw ceiling, rows/s.
    raw: f64,
    /// The writer at a batch of 200, rows/s.
    writer: f64,
    /// The writer at a batch of 1, rows/s.
    batch_one: f64,
    /// The created → committed p99 at half the writer's rate, ms.
    p99_ms: f64,
}

/// One run on `sink`: the raw ceiling, the writer at both batch sizes, and
/// the commit p99 at half the writer's rate.
async fn one_run(
    opts: &Options,
    sink: &Sink,
    database: &str,
    run: usize,
) -> anyhow::Result<RunFigures> {
    let sale = stack::unique_name("bench");
    let r = raw_rows_per_second(sink, &sale, opts.events).await?;
    let w = writer_rows_per_second(
        sink,
        producer_for,
        &sale,
        opts.events,
        200,
        opts.write_concurrency,
    )
    .await?;
    let b = writer_rows_per_second(
        sink,
        producer_for,
        &sale,
        opts.batch_one_events,
        1,
        opts.write_concurrency,
    )
    .await?;
    let p99 = commit_p99_at(
        sink,
        producer_for,
        &sale,
        w / 2.0,
        opts.latency_seconds,
        opts.write_concurrency,
    )
    .await?;
    let p99 = p99.map_or(f64::NAN, ms);
    eprintln!(
        "{database} run {run}: raw {r:.0}/s, writer {w:.0}/s, batch-1 {b:.0}/s, \
         p99 {p99:.1} ms at {:.0}/s",
        w / 2.0
    );
    Ok(RunFigures {
        raw: r,
        writer: w,
        batch_one: b,
        p99_ms: p99,
    })
}

/// Removes the raw ceiling's table.
async fn drop_raw_table(sink: &Sink) -> anyhow::Result<()> {
    match sink {
        Sink::Postgres(pool) => {
            sqlx::query("DROP TABLE bench_orders_raw")
                .execute(pool)
                .await?;
        }
        Sink::Mysql(pool) => {
            sqlx::query("DROP TABLE bench_orders_raw")
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    println!(
        "| database | raw ceiling rows/s | writer (batch 200) rows/s | writer / raw | writer (batch 1) rows/s | batch 1 / raw | p99 created→committed at half rate |"
    );
    println!("|---|---|---|---|---|---|---|");
    for database in &opts.databases {
        let url = match database.as_str() {
            "postgres" => stack::postgres_url()?,
            "mariadb" => stack::mysql_url()?,
            other => anyhow::bail!("unknown database {other}: postgres or mariadb"),
        };
        let sink = Sink::connect(&url, 4).await?;
        let (mut raw, mut writer, mut one, mut ratio, mut ratio_one, mut latency) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for run in 0..opts.runs {
            let figures = one_run(&opts, &sink, database, run).await?;
            latency.push(figures.p99_ms);
            raw.push(figures.raw);
            writer.push(figures.writer);
            one.push(figures.batch_one);
            ratio.push(figures.writer / figures.raw);
            ratio_one.push(figures.batch_one / figures.raw);
        }
        let of = |values: Vec<f64>| median(values).unwrap_or(f64::NAN);
        let writer_rate = of(writer);
        println!(
            "| {database} | {:.0} | {:.0} | {:.2} | {:.0} | {:.3} | {:.1} ms at about {:.0}/s |",
            of(raw),
            writer_rate,
            of(ratio),
            of(one),
            of(ratio_one),
            of(latency),
            writer_rate / 2.0
        );
        drop_raw_table(&sink).await?;
    }
    Ok(())
}
