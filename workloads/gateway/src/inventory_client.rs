//! The inventory's reservation API as the gateway calls it (the contract is
//! `flashsale-inventory-api`): every call runs within the caller's deadline,
//! and only failures that cannot have changed anything twice (the
//! inventory's calls are idempotent by request id or reservation id) or that
//! were never answered are retried, with jittered exponential backoff, until
//! the deadline. Concurrent reservations travel together, many in one
//! request ([`batch`]).

mod batch;

use std::{future::Future, time::Duration};

use backon::{ExponentialBuilder, Retryable};
use flashsale_inventory_api::{ErrorBody, Reservation, ReserveBody, StockLevel, paths};
use rand::Rng;
use reqwest::{Method, StatusCode};
use serde::{
    Serialize,
    de::{DeserializeOwned, IgnoredAny},
};
use tokio::time::Instant;

use self::batch::Batcher;

/// Caps of the pauses between attempts: 10 ms, doubling up to 200 ms, for
/// as long as the deadline allows. Each pause is drawn below its cap (full
/// jitter, in [`InventoryClient::call`]).
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(10))
    .with_factor(2.0)
    .with_max_delay(Duration::from_millis(200))
    .without_max_times();

/// Why an attempt failed when the deadline left no time for it, or ran out
/// before its answer.
const DEADLINE_REACHED: &str = "deadline reached";

/// What went wrong calling the inventory.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InventoryError {
    /// The inventory answered with a refusal (4xx): final, not retried.
    #[error("inventory refused: {status} {code}: {message}")]
    Refused {
        /// HTTP status.
        status: StatusCode,
        /// The inventory's error code (`sold_out`, `user_limit`, ...).
        code: String,
        /// Its message.
        message: String,
    },
    /// No usable answer before the deadline (down, overloaded, too slow).
    #[error("inventory unavailable after {attempts} attempt(s): {last}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// The token cannot be sent in a header.
    #[error("the inventory token contains characters not allowed in a header")]
    Token,
}

/// A client of one sale's reservation API.
#[derive(Debug, Clone)]
pub struct InventoryClient {
    http: Http,
    sale: String,
    /// Gathers concurrent reservations into batches; shared by clones.
    batcher: std::sync::Arc<Batcher>,
}

/// Requests to the inventory, one at a time.
#[derive(Debug, Clone)]
struct Http {
    client: reqwest::Client,
    base: String,
    /// `Bearer <token>` when the inventory requires one.
    authorization: Option<reqwest::header::HeaderValue>,
}

impl InventoryClient {
    /// A client for `sale` at `base_url` (e.g. `http://inventory:8080`),
    /// sending `token` as a bearer token when given.
    pub fn new(base_url: &str, sale: &str, token: Option<&str>) -> Result<Self, ClientError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()?;
        let authorization = token
            .map(|t| {
                let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| ClientError::Token)?;
                value.set_sensitive(true);
                Ok::<_, ClientError>(value)
            })
            .transpose()?;
        let http = Http {
            client,
            base: base_url.trim_end_matches('/').to_owned(),
            authorization,
        };
        Ok(Self {
            batcher: std::sync::Arc::new(Batcher::new(
                http.clone(),
                paths::reservation_batches(sale),
            )),
            http,
            sale: sale.to_owned(),
        })
    }

    /// Reserves `quantity` of `sku` for `user` at `amount_minor`; a repeat
    /// of `request_id` returns the same reservation as it is now, and one
    /// for another SKU or quantity is refused (`idempotency_mismatch`).
    /// It travels with the other reservations made meanwhile, in one
    /// request; an inventory that does not take batches gets it alone.
    pub async fn reserve(
        &self,
        sku: &str,
        user: &str,
        quantity: u64,
        amount_minor: u64,
        request_id: &str,
        deadline: Instant,
    ) -> Result<Reservation, InventoryError> {
        let body = ReserveBody {
            amount_minor,
            quantity,
            request_id: request_id.to_owned(),
            sku: sku.to_owned(),
            user: user.to_owned(),
        };
        let alone = format!("{}{}", self.http.base, paths::reservations(&self.sale));
        let (_, record) = self
            .http
            .retrying(&alone, deadline, || {
                let (body, alone) = (body.clone(), &alone);
                async move {
                    if self.batcher.supported() {
                        self.batcher.reserve(body, deadline).await
                    } else {
                        let post = &Method::POST;
                        self.http.attempt(post, alone, Some(&body), deadline).await
                    }
                }
            })
            .await?;
        Ok(record)
    }

    /// One reservation.
    pub async fn reservation(
        &self,
        id: &str,
        deadline: Instant,
    ) -> Result<Reservation, InventoryError> {
        let path = paths::reservation(&self.sale, id);
        self.http
            .call(Method::GET, &path, None::<&()>, deadline)
            .await
            .map(|(_, record)| record)
    }

    /// Marks a reservation paid (idempotent).
    pub async fn confirm(&self, id: &str, deadline: Instant) -> Result<(), InventoryError> {
        let path = paths::confirm(&self.sale, id);
        // Any JSON answer will do: success is the news.
        self.http
            .call::<IgnoredAny, ()>(Method::POST, &path, None, deadline)
            .await
            .map(drop)
    }

    /// Stock of `sku`.
    pub async fn stock(&self, sku: &str, deadline: Instant) -> Result<StockLevel, InventoryError> {
        let path = paths::stock(&self.sale, sku);
        self.http
            .call(Method::GET, &path, None::<&()>, deadline)
            .await
            .map(|(_, level)| level)
    }

    /// Stock of `sku`, read hedged: when the first request has not
    /// answered within `hedge_after`, a second one is sent on another
    /// connection and the first answer of either wins, so one slow
    /// connection or replica does not hold the reading up. Says whether
    /// the hedge was sent.
    pub async fn stock_hedged(
        &self,
        sku: &str,
        hedge_after: Duration,
        deadline: Instant,
    ) -> (Result<StockLevel, InventoryError>, bool) {
        let first = self.stock(sku, deadline);
        tokio::pin!(first);
        tokio::select! {
            answer = &mut first => return (answer, false),
            () = tokio::time::sleep(hedge_after) => {}
        }
        let second = self.stock(sku, deadline);
        tokio::pin!(second);
        // A refusal or a give-up from one does not end the other's chance.
        let answer = tokio::select! {
            answer = &mut first => match answer {
                Ok(level) => Ok(level),
                Err(_) => second.await,
            },
            answer = &mut second => match answer {
                Ok(level) => Ok(level),
                Err(_) => first.await,
            },
        };
        (answer, true)
    }
}

impl Http {
    /// Calls `path` until an answer, a refusal, or the deadline.
    async fn call<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        deadline: Instant,
    ) -> Result<(StatusCode, T), InventoryError> {
        let (method, url) = (&method, &format!("{}{path}", self.base));
        self.retrying(url, deadline, || self.attempt(method, url, body, deadline))
            .await
    }

    /// Runs `attempt` until an answer, a refusal, or the deadline; `url`
    /// names what is called in the logs.
    async fn retrying<T, F, Fut>(
        &self,
        url: &str,
        deadline: Instant,
        mut attempt: F,
    ) -> Result<T, InventoryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let mut attempts = 0;
        (|| {
            attempts += 1;
            let number = attempts;
            let once = attempt();
            async move { once.await.map_err(|failure| (number, failure)) }
        })
        .retry(BACKOFF)
        .when(|(_, failure)| matches!(failure, Attempt::Retry(_)))
        // Full jitter: retries of many requests spread out instead of
        // hitting a recovering inventory together. No pause that would end
        // past the deadline: the caller has better use for the time.
        .adjust(|_, cap| {
            // backon doubles the cap in f32, which leaves it nanoseconds off
            // the millisecond; to the nearest microsecond it is exact.
            let cap = (cap? + Duration::from_nanos(500)).as_micros() as u64;
            let pause = Duration::from_micros(rand::rng().random_range(0..=cap));
            (Instant::now() + pause < deadline).then_some(pause)
        })
        .notify(|(attempts, failure), _| {
            if let Attempt::Retry(reason) = failure {
                tracing::debug!(%url, attempts, %reason, "retrying inventory call");
            }
        })
        .await
        .map_err(|(attempts, failure)| match failure {
            Attempt::Final(err) => err,
            Attempt::Retry(last) => InventoryError::Unavailable { attempts, last },
        })
    }

    /// One request, given what is left of the deadline.
    async fn attempt<T: DeserializeOwned, B: Serialize>(
        &self,
        method: &Method,
        url: &str,
        body: Option<&B>,
        deadline: Instant,
    ) -> Result<(StatusCode, T), Attempt> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Attempt::Retry(DEADLINE_REACHED.to_owned()));
        }
        let mut request = self.client.request(method.clone(), url).timeout(left);
        if let Some(authorization) = &self.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization.clone());
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| {
            Attempt::Retry(if e.is_timeout() {
                DEADLINE_REACHED.to_owned()
            } else {
                e.to_string()
            })
        })?;
        let status = response.status();
        if status.is_success() {
            return response
                .json::<T>()
                .await
                .map(|value| (status, value))
                .map_err(|e| Attempt::Retry(format!("unreadable answer: {e}")));
        }
        if status.is_server_error() {
            return Err(Attempt::Retry(format!("HTTP {status}")));
        }
        let (code, message) = match response.json::<ErrorBody>().await {
            Ok(ErrorBody { error, message }) => (error, message),
            Err(_) => ("unexpected".to_owned(), format!("HTTP {status}")),
        };
        Err(Attempt::Final(InventoryError::Refused {
            status,
            code,
            message,
        }))
    }
}

/// A client of sale `s1` of a stand-in inventory serving `router` on
/// loopback.
#[cfg(test)]
async fn client_of(router: axum::Router) -> anyhow::Result<InventoryClient> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(InventoryClient::new(&url, "s1", None)?)
}

/// How one attempt failed.
#[derive(Debug, Clone)]
enum Attempt {
    /// Unanswered, a 5xx or an unreadable answer: worth another try.
    Retry(String),
    /// A refusal: the same request gets the same answer.
    Final(InventoryError),
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use axum::{Json, Router, extract::State, http::StatusCode as Status, routing::get};
    use backon::BackoffBuilder;

    use super::*;

    #[test]
    fn the_pause_caps_double_from_10_ms_to_200_ms_without_end() {
        let caps: Vec<Duration> = BACKOFF.build().take(8).collect();
        let wanted = [10, 20, 40, 80, 160, 200, 200, 200].map(Duration::from_millis);
        for (cap, wanted) in caps.iter().zip(wanted) {
            assert!(cap.abs_diff(wanted) < Duration::from_nanos(500), "{caps:?}");
        }
    }

    /// A client of an inventory that answers the `n`th stock read (from 1)
    /// with `answer(n)`, and the count of reads.
    async fn inventory(
        answer: fn(u32) -> (Status, serde_json::Value),
    ) -> anyhow::Result<(InventoryClient, Arc<AtomicU32>)> {
        let reads = Arc::new(AtomicU32::new(0));
        let router = Router::new()
            .route(
                paths::STOCK,
                get(move |State(reads): State<Arc<AtomicU32>>| async move {
                    let (status, body) = answer(reads.fetch_add(1, Ordering::SeqCst) + 1);
                    (status, Json(body))
                }),
            )
            .with_state(reads.clone());
        Ok((client_of(router).await?, reads))
    }

    #[tokio::test]
    async fn failures_are_retried_until_an_answer() -> anyhow::Result<()> {
        let (client, reads) = inventory(|n| match n {
            1..=3 => (Status::BAD_GATEWAY, serde_json::json!({})),
            _ => (
                Status::OK,
                serde_json::json!({"stock": 10, "available": 7, "reserved": 2, "sold": 1}),
            ),
        })
        .await?;
        let level = client
            .stock("A", Instant::now() + Duration::from_secs(5))
            .await?;
        assert_eq!((level.stock, level.available), (10, 7));
        assert_eq!(reads.load(Ordering::SeqCst), 4);
        Ok(())
    }

    #[tokio::test]
    async fn a_refusal_is_final() -> anyhow::Result<()> {
        let (client, reads) = inventory(|_| {
            let body = serde_json::json!({"error": "unknown_sku", "message": "no SKU A"});
            (Status::NOT_FOUND, body)
        })
        .await?;
        let refused = client
            .stock("A", Instant::now() + Duration::from_secs(5))
            .await;
        let Err(InventoryError::Refused { status, code, .. }) = refused else {
            anyhow::bail!("not refused: {refused:?}");
        };
        assert_eq!((status, code.as_str()), (Status::NOT_FOUND, "unknown_sku"));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        Ok(())
    }

    /// A client of an inventory whose `n`th stock read (from 1) answers
    /// after `delay(n)`, and the count of reads.
    async fn slow_inventory(
        delay: fn(u32) -> Duration,
    ) -> anyhow::Result<(InventoryClient, Arc<AtomicU32>)> {
        let reads = Arc::new(AtomicU32::new(0));
        let router = Router::new()
            .route(
                paths::STOCK,
                get(move |State(reads): State<Arc<AtomicU32>>| async move {
                    let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(delay(n)).await;
                    Json(serde_json::json!({"stock": 10, "available": n, "reserved": 0, "sold": 0}))
                }),
            )
            .with_state(reads.clone());
        Ok((client_of(router).await?, reads))
    }

    #[tokio::test]
    async fn a_slow_read_is_hedged_and_the_first_answer_wins() -> anyhow::Result<()> {
        // The first read hangs past the deadline; the hedge answers at once.
        let (client, reads) = slow_inventory(|n| match n {
            1 => Duration::from_secs(5),
            _ => Duration::ZERO,
        })
        .await?;
        let deadline = Instant::now() + Duration::from_secs(2);
        let (level, hedged) = client
            .stock_hedged("A", Duration::from_millis(10), deadline)
            .await;
        assert!(hedged);
        assert_eq!(level?.available, 2, "the hedge's answer");
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        // A prompt inventory is read once.
        let (level, hedged) = client
            .stock_hedged("A", Duration::from_secs(1), deadline)
            .await;
        assert!(!hedged);
        assert_eq!(level?.available, 3);
        assert_eq!(reads.load(Ordering::SeqCst), 3);
        Ok(())
    }

    #[tokio::test]
    async fn a_hedged_read_gives_up_at_its_deadline() -> anyhow::Result<()> {
        let (client, reads) = slow_inventory(|_| Duration::from_secs(5)).await?;
        let started = Instant::now();
        let (level, hedged) = client
            .stock_hedged(
                "A",
                Duration::from_millis(10),
                started + Duration::from_millis(110),
            )
            .await;
        assert!(hedged);
        assert!(
            matches!(level, Err(InventoryError::Unavailable { .. })),
            "{level:?}"
        );
        // Both requests were sent and both were given up.
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        assert!(started.elapsed() < Duration::from_secs(5));
        Ok(())
    }

    #[tokio::test]
    async fn a_failing_inventory_is_given_up_at_the_deadline() -> anyhow::Result<()> {
        let (client, reads) =
            inventory(|_| (Status::SERVICE_UNAVAILABLE, serde_json::json!({}))).await?;
        let failed = client
            .stock("A", Instant::now() + Duration::from_secs(1))
            .await;
        let Err(InventoryError::Unavailable { attempts, last }) = failed else {
            anyhow::bail!("not unavailable: {failed:?}");
        };
        // Every attempt was a request. The last one answered 503, or, on a
        // busy machine, was cut off by the deadline before its answer.
        assert_eq!(attempts, reads.load(Ordering::SeqCst));
        assert!(attempts >= 2, "{attempts}");
        assert!(
            last == "HTTP 503 Service Unavailable" || last == DEADLINE_REACHED,
            "{last}"
        );
        Ok(())
    }
}
