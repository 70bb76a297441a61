//! The gateway over HTTP: sends a request, counts it and its answer, and
//! reduces the answer to an [`Answer`].

use std::time::Duration;

use reqwest::{RequestBuilder, header::RETRY_AFTER};

use super::{
    answer::{Answer, DEGRADED_HEADER},
    tally::{Count, Counters},
};

/// One HTTP client for every buyer; cheap to clone.
#[derive(Clone)]
pub(crate) struct Gateway {
    http: reqwest::Client,
    base: String,
    counters: Counters,
}

impl Gateway {
    pub(crate) fn new(
        base: &str,
        timeout: Duration,
        counters: Counters,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self {
            http,
            base: base.to_owned(),
            counters,
        })
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    pub(crate) fn get(&self, path: &str) -> RequestBuilder {
        self.http.get(format!("{}{path}", self.base))
    }

    pub(crate) fn post(&self, path: &str) -> RequestBuilder {
        self.http.post(format!("{}{path}", self.base))
    }

    /// Sends `request`; `None` when no whole answer came (a connection
    /// error, a timeout, a body cut short).
    pub(crate) async fn send(&self, request: RequestBuilder) -> Option<Answer> {
        self.counters.add(Count::Request);
        let answer = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let headers = response.headers();
                let retry_after = headers
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let degraded = headers.contains_key(DEGRADED_HEADER);
                response
                    .bytes()
                    .await
                    .ok()
                    .map(|body| Answer::new(status, retry_after.as_deref(), degraded, &body))
            }
            Err(_) => None,
        };
        match &answer {
            Some(answer) => self.count(answer),
            None => self.counters.add(Count::TransportError),
        }
        answer
    }

    fn count(&self, answer: &Answer) {
        self.counters.answered(answer.status);
        if answer.degraded {
            self.counters.add(Count::Degraded);
        }
        let named = match (answer.status, answer.error.as_deref()) {
            (429, _) => Some(Count::RateLimited),
            (409, Some("sold_out")) => Some(Count::SoldOut),
            (409, Some("user_limit")) => Some(Count::UserLimit),
            (409, Some("sale_not_open")) => Some(Count::SaleNotOpen),
            (409, Some("order_abandoned")) => Some(Count::OrderAbandoned),
            (410, _) => Some(Count::SaleEnded),
            _ => None,
        };
        if let Some(count) = named {
            self.counters.add(count);
        }
    }
}
