//! A metrics exporter the test owns: one gauge whose value (and sample
//! timestamp) the test sets, scraped by the stack's real Prometheus through
//! a file_sd target file, removed when dropped.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
};

use crate::stack;
use jiff::Timestamp;

/// Removes the target file when dropped, passed or not.
struct TargetFile(PathBuf);

impl Drop for TargetFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// No explicit timestamp: Prometheus stamps each sample with the scrape's
/// time, and writes a staleness marker once the series is gone.
pub const SCRAPE_TIME: i64 = 0;
/// An explicit timestamp, the serving instant: Prometheus tracks no
/// staleness of such a series, only the lookback bounds it.
pub const NOW: i64 = -1;

/// The test's exporter: one gauge whose value (and sample timestamp) the
/// test sets, scraped by Prometheus while registered.
pub struct Exporter {
    /// The gauge's name, unique to the test.
    pub metric: String,
    /// Its `exporter` label, unique to the test.
    pub label: String,
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
    pub async fn start(value: f64, stamp: i64) -> anyhow::Result<Self> {
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

    /// Serves `value` from now on.
    pub fn set(&self, value: f64) {
        self.value.store(value.to_bits(), Ordering::SeqCst);
    }

    /// From now on every scrape carries the same sample, stamped now, as an
    /// exporter whose source stopped updating would. Only for an exporter
    /// started with [`NOW`]: a series that gains a timestamp is one Prometheus
    /// stops tracking, and it writes a staleness marker at once.
    pub fn freeze(&self) {
        self.stamp
            .store(Timestamp::now().as_millisecond(), Ordering::SeqCst);
    }

    /// Takes the target out of Prometheus's file_sd.
    pub fn unregister(&mut self) {
        self.target = None;
    }

    /// PromQL selecting the gauge.
    pub fn query(&self) -> String {
        format!(r#"{}{{exporter="{}"}}"#, self.metric, self.label)
    }
}
