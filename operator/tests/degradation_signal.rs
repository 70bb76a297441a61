//! A degradation policy's signal, read from the local stack's real
//! Prometheus: each test runs a tiny exporter of its own, registered as a
//! file_sd target, and sees the reader classify every kind of answer. Names
//! are unique per test, so the tests run in parallel.

mod common;

use std::time::{Duration, Instant};

use common::exporter::{Exporter, NOW, SCRAPE_TIME};
use flashsale_e2e::{stack, wait::poll_until};
use flashsale_observe::{signal::Reading, signal::SignalLoss, signal::SignalReader};
use jiff::Timestamp;

/// Bound of every query.
const TIMEOUT: Duration = Duration::from_secs(2);
/// A staleness bound no scrape of a live target misses.
const FRESH: Duration = Duration::from_secs(30);
/// Time for Prometheus to discover a target and scrape it (every second).
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);

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

fn lost_as(causes: &'static [SignalLoss]) -> impl Fn(&Reading) -> bool {
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
    let wanted = lost_as(&[SignalLoss::NotANumber]);
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
    let wanted = lost_as(&[SignalLoss::AmbiguousResult]);
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
    assert!(lost_as(&[SignalLoss::EmptyResult])(&empty), "{empty:?}");

    let malformed = reader
        .read(&url, "sum(rate(x[5m]", TIMEOUT, FRESH, Timestamp::now())
        .await;
    let Reading::Lost(loss) = malformed else {
        anyhow::bail!("malformed PromQL read as {malformed:?}");
    };
    assert_eq!(loss.cause, SignalLoss::InvalidQuery);
    assert_eq!(loss.cause.as_str(), "InvalidQuery");
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
    assert_eq!(loss.cause.as_str(), "PrometheusUnreachable");
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
    assert_eq!(loss.cause, SignalLoss::PrometheusUnreachable);
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
    let wanted = lost_as(&[SignalLoss::EmptyResult, SignalLoss::StaleSample]);
    read_until(&reader, &url, &query, stale_after, "the loss", wanted).await?;
    // File_sd's refresh, one scrape and the bound itself, with room for a
    // loaded machine: what it tells apart is a loss seen within seconds
    // from a series Prometheus keeps answering for its 5-minute lookback.
    let bound = stale_after + Duration::from_secs(15);
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
    let wanted = lost_as(&[SignalLoss::EmptyResult, SignalLoss::StaleSample]);
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
