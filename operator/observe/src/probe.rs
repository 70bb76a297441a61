//! Reads what only the workloads know: stock per SKU from the inventory's API,
//! and the order-writer's consumer lag from its replicas' metrics. Every call
//! is bounded, and a failure is a status condition, never a reconcile error:
//! an unreachable inventory must not put the controller in a retry loop.

use std::{net::SocketAddr, time::Duration};

use futures::{StreamExt, TryStreamExt, stream};
use serde::Deserialize;

use crate::replicas::{LagReading, ReplicaLag};
use flashsale_api::flashsale::ItemStatus;
use flashsale_inventory_api::{StockLevel, paths};

/// Why a workload could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The request failed or timed out.
    #[error("{url}: {}", causes(source))]
    Http {
        /// What was asked.
        url: String,
        /// Why it failed.
        source: reqwest::Error,
    },
    /// The answer was not what the workload sends.
    #[error("{url}: {message}")]
    Answer {
        /// What was asked.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// The probe could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Reads the workloads over HTTP.
#[derive(Debug, Clone)]
pub struct Probe {
    http: reqwest::Client,
    inventory_url: String,
}

/// One sale, as the probe addresses its inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleAddress {
    /// metadata.namespace: fills `{namespace}` of the URL template.
    pub namespace: String,
    /// metadata.name: fills `{sale}` of the URL template, since the
    /// inventory's Service is named after it.
    pub name: String,
    /// The sale id the inventory knows the sale by, in the URL path.
    pub id: String,
}

/// SKUs asked at once; a sale has at most 200.
const CONCURRENCY: usize = 16;

impl Probe {
    /// A probe whose inventory base URL is `inventory_url` with `{sale}` and
    /// `{namespace}` replaced, e.g. `http://{sale}-inventory.{namespace}.svc:8080`.
    /// Each request gives up after `timeout`.
    pub fn new(inventory_url: impl Into<String>, timeout: Duration) -> Result<Self, ProbeError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(ProbeError::Client)?;
        Ok(Self {
            http,
            inventory_url: inventory_url.into(),
        })
    }

    /// The inventory's base URL for one sale.
    pub fn inventory_base(&self, namespace: &str, sale: &str) -> String {
        self.inventory_url
            .replace("{sale}", sale)
            .replace("{namespace}", namespace)
    }

    /// Stock of every SKU, in the order given, asked with the inventory API
    /// `token` (the inventory refuses stock reads without it).
    pub async fn stock(
        &self,
        sale: &SaleAddress,
        token: &str,
        skus: &[String],
    ) -> Result<Vec<ItemStatus>, ProbeError> {
        let base = self.inventory_base(&sale.namespace, &sale.name);
        let id = &sale.id;
        // Owned items: a stream over borrowed ones trips the higher-ranked
        // lifetime check of the controller's Send bound.
        let asks: Vec<(String, String)> = skus
            .iter()
            .map(|sku| {
                let url = format!("{base}{}", paths::stock(id, sku));
                (sku.clone(), url)
            })
            .collect();
        stream::iter(asks)
            .map(|(sku, url)| async move {
                let level: StockLevel = self.get_json(&url, token).await?;
                // Counts are bounded far below i64::MAX by the spec's checks.
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                Ok(ItemStatus {
                    sku,
                    available: count(level.available),
                    reserved: count(level.reserved),
                    sold: count(level.sold),
                })
            })
            .buffered(CONCURRENCY)
            .try_collect()
            .await
    }

    /// What each order-writer replica reports as the group's consumer lag
    /// (`order_writer_consumer_lag` on its ops endpoint `addr`), in the order
    /// given. Never fails as a whole: each replica's failure is its reading.
    pub async fn writer_lags(&self, replicas: &[(String, SocketAddr)]) -> Vec<ReplicaLag> {
        self.replica_gauges(replicas, LAG_GAUGE)
            .await
            .into_iter()
            .map(|(pod, reading)| ReplicaLag {
                pod,
                reading: lag_reading(reading),
            })
            .collect()
    }

    /// The unlabelled `gauge` in each replica's metrics (`/metrics` on its
    /// ops endpoint `addr`), in the order given: `Ok(None)` when the replica
    /// does not export it (yet), `Err` when it could not be asked or the
    /// value is not a number. Never fails as a whole.
    pub async fn replica_gauges(
        &self,
        replicas: &[(String, SocketAddr)],
        gauge: &str,
    ) -> Vec<(String, Result<Option<f64>, String>)> {
        let asks: Vec<(String, String)> = replicas
            .iter()
            .map(|(pod, addr)| (pod.clone(), format!("http://{addr}/metrics")))
            .collect();
        stream::iter(asks)
            .map(|(pod, url)| async move {
                let reading = match self.get_text(&url, None).await {
                    Ok(text) => gauge_reading(&text, gauge),
                    Err(err) => Err(err.to_string()),
                };
                (pod, reading)
            })
            .buffered(CONCURRENCY)
            .collect()
            .await
    }

    async fn get_text(&self, url: &str, token: Option<&str>) -> Result<String, ProbeError> {
        let http = |source| ProbeError::Http {
            url: url.to_owned(),
            source,
        };
        let request = self.http.get(url);
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        request
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(http)?
            .text()
            .await
            .map_err(http)
    }

    async fn get_json<T: for<'de> Deserialize<'de>>(
        &self,
        url: &str,
        token: &str,
    ) -> Result<T, ProbeError> {
        let text = self.get_text(url, Some(token)).await?;
        serde_json::from_str(&text).map_err(|err| ProbeError::Answer {
            url: url.to_owned(),
            message: format!("unexpected answer: {err}"),
        })
    }
}

/// An error and its causes on one line: reqwest's own message ("error
/// sending request") hides the reason (DNS, refused, timeout) in its sources.
pub(crate) fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The order-writer's lag gauge.
const LAG_GAUGE: &str = "order_writer_consumer_lag";

/// The order-writer's lag gauge as read: absent means not measured yet; a
/// value that is not a count (negative, NaN) is an error, never a 0.
fn lag_reading(reading: Result<Option<f64>, String>) -> LagReading {
    match reading {
        Err(err) => LagReading::Failed(err),
        Ok(None) => LagReading::NotMeasured,
        Ok(Some(value)) if value.is_finite() && value >= 0.0 => {
            // `as` saturates, and no backlog comes near i64::MAX.
            LagReading::Measured(value as i64)
        }
        Ok(Some(value)) => LagReading::Failed(format!("{LAG_GAUGE} is {value}, not a count")),
    }
}

/// The value of an unlabelled gauge in Prometheus/OpenMetrics text: absent
/// is `None`, a value that is not a number is an error naming it.
fn gauge_reading(text: &str, gauge: &str) -> Result<Option<f64>, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(gauge)?;
            rest.strip_prefix(' ')?.split_whitespace().next()
        })
        .map(|value| {
            value
                .parse::<f64>()
                .map_err(|_| format!("{gauge} is {value:?}, not a number"))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag_of(text: &str) -> LagReading {
        lag_reading(gauge_reading(text, LAG_GAUGE))
    }

    #[test]
    fn reads_the_gauge_and_not_its_lookalikes() {
        let text = "# HELP order_writer_consumer_lag Events\n\
                    # TYPE order_writer_consumer_lag gauge\n\
                    order_writer_consumer_lag_total 99\n\
                    order_writer_consumer_lag 42\n";
        assert_eq!(lag_of(text), LagReading::Measured(42));
        assert_eq!(lag_of("x 1\n"), LagReading::NotMeasured);
        // Not a count is never read as zero.
        for bad in ["NaN", "-1", "NaNx", "+Inf"] {
            let text = format!("order_writer_consumer_lag {bad}\n");
            assert!(matches!(lag_of(&text), LagReading::Failed(_)), "{bad}");
        }
    }

    #[test]
    fn the_inventory_url_names_the_sale_and_namespace() -> Result<(), ProbeError> {
        let probe = Probe::new(
            "http://{sale}-inventory.{namespace}.svc:8080",
            Duration::from_secs(1),
        )?;
        assert_eq!(
            probe.inventory_base("shop", "d11"),
            "http://d11-inventory.shop.svc:8080"
        );
        Ok(())
    }

    /// Serves `app` on a free local port; returns its address.
    async fn serve(app: axum::Router) -> anyhow::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(addr)
    }

    fn metrics(text: &'static str) -> axum::Router {
        axum::Router::new().route("/metrics", axum::routing::get(move || async move { text }))
    }

    #[tokio::test]
    async fn each_replica_is_read_on_its_own() -> anyhow::Result<()> {
        let measured = serve(metrics("order_writer_consumer_lag 0\n")).await?;
        let starting = serve(metrics("order_writer_events_total 3\n")).await?;
        let broken = serve(axum::Router::new()).await?;
        // A port nobody listens on any more.
        let gone = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            listener.local_addr()?
        };
        let probe = Probe::new("http://unused", Duration::from_secs(1))?;
        let replicas = [
            ("a".to_owned(), measured),
            ("b".to_owned(), starting),
            ("c".to_owned(), broken),
            ("d".to_owned(), gone),
        ];
        let readings: Vec<(String, LagReading)> = probe
            .writer_lags(&replicas)
            .await
            .into_iter()
            .map(|r| (r.pod, r.reading))
            .collect();
        assert_eq!(readings[0], ("a".to_owned(), LagReading::Measured(0)));
        assert_eq!(readings[1], ("b".to_owned(), LagReading::NotMeasured));
        for (pod, reading) in &readings[2..] {
            assert!(
                matches!(reading, LagReading::Failed(err) if err.contains("/metrics")),
                "{pod}: {reading:?}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn the_stock_reading_sends_the_api_token_and_the_sale_id() -> anyhow::Result<()> {
        use axum::{
            extract::Path,
            http::{HeaderMap, StatusCode, header::AUTHORIZATION},
            routing::get,
        };
        let stock = get(
            |Path((sale, sku)): Path<(String, String)>, headers: HeaderMap| async move {
                let bearer = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
                if bearer != Some("Bearer s3cret") {
                    return Err(StatusCode::UNAUTHORIZED);
                }
                if sale != "shop.d11.6f1c5b8e" {
                    return Err(StatusCode::NOT_FOUND);
                }
                let available = if sku == "A" { 7 } else { 0 };
                Ok(axum::Json(serde_json::json!({
                    "stock": 10, "available": available, "reserved": 1, "sold": 2
                })))
            },
        );
        let app = axum::Router::new().route(paths::STOCK, stock);
        let addr = serve(app).await?;
        let probe = Probe::new(format!("http://{addr}"), Duration::from_secs(1))?;
        let sale = SaleAddress {
            namespace: "shop".into(),
            name: "d11".into(),
            id: "shop.d11.6f1c5b8e".into(),
        };
        let skus = ["A".to_owned(), "B".to_owned()];
        let items = probe.stock(&sale, "s3cret", &skus).await?;
        let seen: Vec<(&str, i64)> = items
            .iter()
            .map(|i| (i.sku.as_str(), i.available))
            .collect();
        assert_eq!(seen, [("A", 7), ("B", 0)]);
        let refused = probe.stock(&sale, "wrong", &skus).await;
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.to_string().contains("401")),
            "{refused:?}"
        );
        Ok(())
    }
}
