//! A degradation policy's signal, read from the local stack's real
//! Prometheus: each test runs a tiny exporter of its own, registered as a
//! file_sd target, and sees the reader classify every kind of answer. Names
//! are unique per test, so the tests run in parallel.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use flashsale_e2e::{stack, wait::poll_until};
use flashsale_operator::degradation::signal::{LossCause, Reading, SignalReader};
use jiff::Timestamp;

/// Bound of every query.
const TIMEOUT: Duration = Duration::from_secs(2);
/// A staleness bound no scrape of a live target misses.
const FRESH: Duration = Duration::from_secs(30);
/// Time for Prometheus to discover a target and scrape it (every second).
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);

/// Removes the target file when dropped, passed or not.
struct TargetFile(PathBuf);

impl Drop for TargetFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// No explicit timestamp: Prometheus stamps each sample with the scrape's
/// time, and writes a staleness marker once the series is gone.
const SCRAPE_TIME: i64 = 0;
/// An explicit timestamp, the serving instant: Prometheus tracks no
/// staleness of such a series, only the lookback bounds it.
const NOW: i64 = -1;

/// The test's exporter: one gauge whose value (and sample timestamp) the
/// test sets, scraped by Prometheus while registered.
struct Exporter {
    /// The gauge's name, unique to the test.
    metric: String,
    /// Its `exporter` label, unique to the test.
    label: String,
    value: Arc<AtomicU64>,
    /// The sample's explicit timestamp in ms: [`SCRAPE_TIME`], [`NOW`], or
    /// a fixed instant.
    stamp: Arc<AtomicI64>,
    target: Option<TargetFile>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Exporter {
    /// Serves `value` on a free local port, stamped as `stamp` says, and
    /// registers it with Prometheus.
    async fn start(value: f64, stamp: i64) -> anyhow::Result<Self> {
        let targets = PathBuf::from(stack::prometheus_targets_dir()?);
        let label = stack::unique_name("signal");
        let metric = format!("degradation_test_{}", label.replace('-', "_"));
        let value = Arc::new(AtomicU64::new(value.to_bits()));
        let stamp = Arc::new(AtomicI64::new(stamp));
        let text = {
            let (metric, value, stamp) = (metric.clone(), value.clone(), stamp.clone());
            move || {
                let value = f64::from_bits(value.load(Ordering::SeqCst));
                let stamp = match stamp.load(Ordering::SeqCst) {
                    SCRAPE_TIME => String::new(),
                    NOW => format!(" {}", Timestamp::now().as_millisecond()),
                    ms => format!(" {ms}"),
                };
                async move { format!("# TYPE {metric} gauge\n{metric} {value}{stamp}\n") }
            }
        };
        let app = axum::Router::new().route("/metrics", axum::routing::get(text));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let path = targets.join(format!("{label}.json"));
        let target = TargetFile(path.clone());
        // Written aside and renamed, so Prometheus never reads half a file.
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            format!(r#"[{{"targets":["{addr}"],"labels":{{"exporter":"{label}"}}}}]"#),
        )?;
        std::fs::rename(&tmp, &path)?;
        Ok(Self {
            metric,
            label,
            value,
            stamp,
            target: Some(target),
            server,
        })
    }

    fn set(&self, value: f64) {
        self.value.store(value.to_bits(), Ordering::SeqCst);
    }

    /// From now on every scrape carries the same sample, stamped now, as an
    /// exporter whose source stopped updating would. Only for an exporter
    /// started with [`NOW`]: a series that gains a timestamp is one Prometheus
    /// stops tracking, and it writes a staleness marker at once.
    fn freeze(&self) {
        self.stamp
            .store(Timestamp::now().as_millisecond(), Ordering::SeqCst);
    }

    /// Takes the target out of Prometheus's file_sd.
    fn unregister(&mut self) {
        self.target = None;
    }

    /// PromQL selecting the gauge.
    fn query(&self) -> String {
        format!(r#"{}{{exporter="{}"}}"#, self.metric, self.label)
    }
}

/// Reads `query` until `wanted` holds of the reading; returns that reading.
async fn read_until(
    reader: &SignalReader,
    url: &str,
    query: &str,
    stale_after: Duration,
    what: &str,
    wanted: impl Fn(&Reading) -> bool,
) -> anyhow::Result<Reading> {
    let wanted = &wanted;
    let reading = poll_until(what, DEADLINE, POLL, move || async move {
        let reading = reader
            .read(url, query, TIMEOUT, stale_after, Timestamp::now())
            .await;
        if wanted(&reading) {
            Ok(reading)
        } else {
            Err(format!("{reading:?}"))
        }
    })
    .await?;
    Ok(reading)
}

fn value_is(expected: f64) -> impl Fn(&Reading) -> bool {
    move |reading| matches!(reading, Reading::Value(sample) if sample.value == expected)
}

fn lost_as(causes: &'static [LossCause]) -> impl Fn(&Reading) -> bool {
    move |reading| matches!(reading, Reading::Lost(loss) if causes.contains(&loss.cause))
}

#[tokio::test]
async fn the_value_the_exporter_serves_is_read_back_and_follows_it() -> anyhow::Result<()> {
    let url = stack::prometheus_url()?;
    let reader = SignalReader::new()?;
    let exporter = Exporter::start(0.42, SCRAPE_TIME).await?;
    let query = exporter.query();
    let first = read_until(&reader, &url, &query, FRESH, "0.42", value_is(0.42)).await?;
    let Reading::Value(sample) = first else {
        anyhow::bail!("not a value: {first:?}");
    };
    // Prometheus stamps the answer with its evaluation time.
    let age = Timestamp::now().duration_since(sample.at);
    assert!(age.as_secs() < 5, "sample at {}", sample.at);
    exporter.set(0.97);
    read_until(&reader, &url, &query, FRESH, "0.97", value_is(0.97)).await?;
    Ok(())
}

#[tokio::test]
async fn a_nan_value_is_not_a_number() -> anyhow::Result<()> {
    let url = stack::prometheus_url()?;
    let reader = SignalReader::new()?;
    let exporter = Exporter::start(f64::NAN, SCRAPE_TIME).await?;
    let wanted = lost_as(&[LossCause::NotANumber]);
    read_until(&reader, &url, &exporter.query(), FRESH, "NaN", wanted).await?;
    Ok(())
}

#[tokio::test]
async fn two_series_are_ambiguous() -> anyhow::Result<()> {
    let url = stack::prometheus_url()?;
    let reader = SignalReader::new()?;
    let exporter = Exporter::start(0.5, SCRAPE_TIME).await?;
    // The gauge and the target's `up`: two series.
    let query = format!(
        r#"{{__name__=~"up|{}",exporter="{}"}}"#,
        exporter.metric, exporter.label
    );
    let wanted = lost_as(&[LossCause::Ambiguous]);
    let reading = read_until(&reader, &url, &query, FRESH, "two series", wanted).await?;
    let Reading::Lost(loss) = reading else {
        anyhow::bail!("not lost: {reading:?}");
    };
    assert!(loss.detail.contains("2 series"), "{}", loss.detail);
    assert!(loss.detail.contains("sum()"), "{}", loss.detail);
    Ok(())
}

#[tokio::test]
async fn nothing_selected_is_empty_and_bad_promql_is_invalid() -> anyhow::Result<()> {
    let url = stack::prometheus_url()?;
    let reader = SignalReader::new()?;
    let nothing = stack::unique_name("nothing").replace('-', "_");
    let empty = reader
        .read(&url, &nothing, TIMEOUT, FRESH, Timestamp::now())
        .await;
    assert!(lost_as(&[LossCause::Empty])(&empty), "{empty:?}");

    let malformed = reader
        .read(&url, "sum(rate(x[5m]", TIMEOUT, FRESH, Timestamp::now())
        .await;
    let Reading::Lost(loss) = malformed else {
        anyhow::bail!("malformed PromQL read as {malformed:?}");
    };
    assert_eq!(loss.cause, LossCause::InvalidQuery);
    assert_eq!(loss.cause.reason(), "InvalidQuery");
    // Prometheus's own words, so the author can fix the query.
    assert!(loss.detail.contains("parse error"), "{}", loss.detail);
    Ok(())
}

#[tokio::test]
async fn a_closed_port_is_unreachable_at_once() -> anyhow::Result<()> {
    let reader = SignalReader::new()?;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let started = Instant::now();
    let reading = reader
        .read(
            &format!("http://{closed}"),
            "up",
            TIMEOUT,
            FRESH,
            Timestamp::now(),
        )
        .await;
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    let Reading::Lost(loss) = reading else {
        anyhow::bail!("a closed port answered: {reading:?}");
    };
    assert_eq!(loss.cause.reason(), "PrometheusUnreachable");
    assert!(loss.detail.contains(&closed.to_string()), "{}", loss.detail);
    Ok(())
}

#[tokio::test]
async fn a_silent_server_is_unreachable_within_the_timeout() -> anyhow::Result<()> {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let reader = SignalReader::new()?;
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let reading = reader
        .read(
            &format!("http://{addr}"),
            "up",
            timeout,
            FRESH,
            Timestamp::now(),
        )
        .await;
    let waited = started.elapsed();
    silent.abort();
    assert!(
        waited >= timeout && waited < timeout * 3,
        "answered after {waited:?}"
    );
    let Reading::Lost(loss) = reading else {
        anyhow::bail!("a silent server answered: {reading:?}");
    };
    assert_eq!(loss.cause, LossCause::Unreachable);
    assert!(loss.detail.contains("within 500ms"), "{}", loss.detail);
    Ok(())
}

#[tokio::test]
async fn a_removed_target_loses_the_signal() -> anyhow::Result<()> {
    let url = stack::prometheus_url()?;
    let reader = SignalReader::new()?;
    let stale_after = Duration::from_secs(3);
    let mut exporter = Exporter::start(0.6, SCRAPE_TIME).await?;
    let query = exporter.query();
    read_until(&reader, &url, &query, stale_after, "0.6", value_is(0.6)).await?;
    exporter.unregister();
    let gone = Instant::now();
    let wanted = lost_as(&[LossCause::Empty, LossCause::Stale]);
    read_until(&reader, &url, &query, stale_after, "the loss", wanted).await?;
    // File_sd's refresh, one scrape, and the bound itself.
    let bound = stale_after + Duration::from_secs(5);
    assert!(gone.elapsed() < bound, "lost after {:?}", gone.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_sample_older_than_stale_after_drops_out() -> anyhow::Result<()> {
    let url = stack::prometheus_url()?;
    let reader = SignalReader::new()?;
    let stale_after = Duration::from_secs(3);
    let exporter = Exporter::start(0.7, NOW).await?;
    let query = exporter.query();
    read_until(&reader, &url, &query, stale_after, "0.7", value_is(0.7)).await?;
    // Still scraped, but the sample no longer moves, and Prometheus writes no
    // staleness marker for it: only the bound makes it drop out.
    exporter.freeze();
    let frozen = Instant::now();
    let wanted = lost_as(&[LossCause::Empty, LossCause::Stale]);
    read_until(&reader, &url, &query, stale_after, "the loss", wanted).await?;
    let waited = frozen.elapsed();
    assert!(
        waited >= stale_after - Duration::from_millis(500),
        "lost after {waited:?}, before staleAfter"
    );
    assert!(
        waited < stale_after + Duration::from_secs(3),
        "lost after {waited:?}"
    );
    // With a longer bound the same sample is still there: the loss was the
    // bound's, not the exporter's.
    let longer = reader
        .read(&url, &query, TIMEOUT, FRESH, Timestamp::now())
        .await;
    assert!(value_is(0.7)(&longer), "{longer:?}");
    Ok(())
}
