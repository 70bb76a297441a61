//! A sale's buyer funnel from Prometheus: requests a second over the last
//! minute at each step, from the gateways' and the inventory's own series.

use std::time::Duration;

use futures::future::try_join_all;
use serde::Serialize;

/// Steps of the funnel, per second over the last minute.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Funnel {
    /// Orders that reached a gateway.
    pub arrived: f64,
    /// Orders sent to the waiting room (202).
    pub queued: f64,
    /// Waiting-room passes redeemed.
    pub admitted: f64,
    /// Refused by the per-user rate limit.
    pub rate_limited: f64,
    /// Units the inventory reserved.
    pub reserved: f64,
    /// Orders acknowledged (201).
    pub ordered: f64,
    /// Payments confirmed.
    pub paid: f64,
}

/// Each step's PromQL, for the sale `sale` in `namespace`, in the order of
/// [`Funnel`]'s fields.
pub fn queries(namespace: &str, sale: &str) -> [String; 7] {
    let gateways = format!(r#"namespace="{namespace}",pod=~"{sale}-gateway-.*""#);
    let inventory = format!(r#"namespace="{namespace}",pod=~"{sale}-inventory-.*""#);
    let orders = format!(r#"{gateways},route="/api/v1/orders""#);
    let rate = |series: &str, labels: &str| format!("sum(rate({series}{{{labels}}}[1m]))");
    [
        rate("gateway_requests_total", &orders),
        rate("gateway_requests_total", &format!(r#"{orders},code="202""#)),
        rate("gateway_admitted_total", &gateways),
        rate("gateway_rate_limited_total", &gateways),
        rate(
            "inventory_reservations_total",
            &format!(r#"{inventory},result="ok""#),
        ),
        rate("gateway_requests_total", &format!(r#"{orders},code="201""#)),
        rate(
            "gateway_payment_callbacks_total",
            &format!(r#"{gateways},outcome="paid""#),
        ),
    ]
}

/// Reads the funnel of `sale` from the Prometheus at `url`, each query
/// bounded by two seconds; why not, in a sentence, when it cannot.
pub async fn read(
    http: &reqwest::Client,
    url: Option<&str>,
    namespace: &str,
    sale: &str,
) -> Result<Funnel, String> {
    let Some(url) = url else {
        return Err("no Prometheus: set --prometheus-url or PROMETHEUS_URL".to_owned());
    };
    let base = url.trim_end_matches('/');
    let asks = queries(namespace, sale).map(|query| instant(http, base, query));
    let values = try_join_all(asks)
        .await
        .map_err(|err| format!("Prometheus at {base} did not answer: {err}"))?;
    let [
        arrived,
        queued,
        admitted,
        rate_limited,
        reserved,
        ordered,
        paid,
    ] = <[f64; 7]>::try_from(values)
        .map_err(|_| "Prometheus answered too few queries".to_owned())?;
    Ok(Funnel {
        arrived,
        queued,
        admitted,
        rate_limited,
        reserved,
        ordered,
        paid,
    })
}

/// One instant query's single value; 0 when no series matched (nothing
/// happened at that step).
async fn instant(http: &reqwest::Client, base: &str, query: String) -> Result<f64, String> {
    let url = reqwest::Url::parse_with_params(&format!("{base}/api/v1/query"), [("query", query)])
        .map_err(|err| format!("the Prometheus URL: {err}"))?;
    let answer: serde_json::Value = http
        .get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|err| err.to_string())?
        .json()
        .await
        .map_err(|err| err.to_string())?;
    if answer["status"] != "success" {
        return Err(answer["error"].as_str().unwrap_or("an error").to_owned());
    }
    let Some(first) = answer["data"]["result"].as_array().and_then(|r| r.first()) else {
        return Ok(0.0);
    };
    first["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("an unreadable sample: {first}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queries_name_the_sales_own_pods() {
        let [arrived, queued, .., reserved, ordered, paid] = queries("shop", "d11");
        assert_eq!(
            arrived,
            r#"sum(rate(gateway_requests_total{namespace="shop",pod=~"d11-gateway-.*",route="/api/v1/orders"}[1m]))"#
        );
        assert!(queued.ends_with(r#"route="/api/v1/orders",code="202"}[1m]))"#));
        assert!(reserved.contains(r#"pod=~"d11-inventory-.*",result="ok""#));
        assert!(ordered.contains(r#"code="201""#));
        assert!(paid.contains(r#"outcome="paid""#));
    }
}
