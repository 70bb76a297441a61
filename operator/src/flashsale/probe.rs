//! Reads what only the workloads know: stock per SKU from the inventory's API,
//! and the order-writer's consumer lag from its replicas' metrics. Every call
//! is bounded, and a failure is a status condition, never a reconcile error:
//! an unreachable inventory must not put the controller in a retry loop.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use serde::Deserialize;

use crate::api::flashsale::ItemStatus;

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

#[derive(Deserialize)]
struct Stock {
    available: i64,
    reserved: i64,
    sold: i64,
}

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
                let url = format!("{base}/v1/sales/{id}/items/{sku}/stock");
                (sku.clone(), url)
            })
            .collect();
        stream::iter(asks)
            .map(|(sku, url)| async move {
                let stock: Stock = self.get_json(&url, token).await?;
                Ok(ItemStatus {
                    sku,
                    available: stock.available,
                    reserved: stock.reserved,
                    sold: stock.sold,
                })
            })
            .buffered(CONCURRENCY)
            .try_collect()
            .await
    }

    /// The order-writer's total consumer lag: the sum of
    /// `order_writer_consumer_lag` over its replicas' ops endpoints.
    pub async fn writer_lag(&self, pod_ips: &[String]) -> Result<i64, ProbeError> {
        let urls: Vec<String> = pod_ips
            .iter()
            .map(|ip| format!("http://{ip}:9090/metrics"))
            .collect();
        let lags: Vec<i64> = stream::iter(urls)
            .map(|url| async move {
                let text = self.get_text(&url, None).await?;
                parse_gauge(&text, "order_writer_consumer_lag").ok_or_else(|| ProbeError::Answer {
                    url,
                    message: "no order_writer_consumer_lag in the metrics".into(),
                })
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect()
            .await?;
        Ok(lags.iter().sum())
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
fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The value of an unlabelled gauge in Prometheus/OpenMetrics text.
fn parse_gauge(text: &str, name: &str) -> Option<i64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = rest.strip_prefix(' ')?.split_whitespace().next()?;
            value.parse::<f64>().ok().map(|v| v as i64)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_gauge_and_not_its_lookalikes() {
        let text = "# HELP order_writer_consumer_lag Events\n\
                    # TYPE order_writer_consumer_lag gauge\n\
                    order_writer_consumer_lag_total 99\n\
                    order_writer_consumer_lag 42\n";
        assert_eq!(parse_gauge(text, "order_writer_consumer_lag"), Some(42));
        assert_eq!(parse_gauge("x 1\n", "order_writer_consumer_lag"), None);
        assert_eq!(
            parse_gauge(
                "order_writer_consumer_lag NaNx\n",
                "order_writer_consumer_lag"
            ),
            None
        );
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
}
