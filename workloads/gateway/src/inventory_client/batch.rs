//! Reservations that travel together: a gateway's concurrent reservations
//! go to the inventory many in one request (the inventory API's
//! reservation batches), so the HTTP exchange (parsing, routing,
//! authentication, a task on both sides) is paid once per batch, not once
//! per buyer. The inventory then decides a batch's reservations of
//! one SKU in one script call.
//!
//! Shape, as the inventory's own coalescing: at most [`IN_FLIGHT`] batches
//! are out at a time; while they are, later reservations queue, and a
//! freed slot takes everything queued (up to [`MAX_MEMBERS`]) as the next
//! batch. A lone reservation goes at once: there is no timer and no
//! waiting for company. Each member waits for its own answer within its own
//! deadline; a batch that fails as a whole fails each member with the same
//! reason, and each retries under its request id (the inventory answers a
//! repeat with the reservation if the failed batch did make it).

use std::sync::{
    Arc, OnceLock,
    atomic::{AtomicBool, Ordering},
};

use flashsale_inventory_api::{
    ErrorBody, MemberAnswer, Reservation, ReserveBatchAnswer, ReserveBatchBody, ReserveBody,
};
use reqwest::{Method, StatusCode};
use tokio::{
    sync::{Semaphore, mpsc, oneshot},
    time::Instant,
};

use super::{Attempt, DEADLINE_REACHED, Http, InventoryError};

/// Batches out at a time: enough to keep the inventory busy while one is
/// on the wire, few enough that a burst forms large batches.
const IN_FLIGHT: usize = 4;

/// Most reservations in one batch: the inventory's own coalescing decides
/// up to this many in one script call.
const MAX_MEMBERS: usize = 128;

/// What a member is answered.
type Outcome = Result<(StatusCode, Reservation), Attempt>;

/// One reservation waiting to be sent.
struct Member {
    body: ReserveBody<u64>,
    deadline: Instant,
    answer: oneshot::Sender<Outcome>,
}

/// The queue of a client's reservations and the task that sends them.
#[derive(Debug)]
pub(super) struct Batcher {
    http: Http,
    url: String,
    /// Started on the first reservation, inside the runtime.
    queue: OnceLock<mpsc::UnboundedSender<Member>>,
    /// False once the inventory said it has no batch route (an older
    /// release during a rolling upgrade): reservations then go alone.
    supported: Arc<AtomicBool>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("request_id", &self.body.request_id)
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// A batcher posting to `path` of the inventory `http` calls.
    pub(super) fn new(http: Http, path: String) -> Self {
        let url = format!("{}{path}", http.base);
        Self {
            http,
            url,
            queue: OnceLock::new(),
            supported: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Whether the inventory takes batches (as far as is known).
    pub(super) fn supported(&self) -> bool {
        self.supported.load(Ordering::Relaxed)
    }

    /// One attempt at `body` in the next batch, answered by `deadline`.
    pub(super) async fn reserve(&self, body: ReserveBody<u64>, deadline: Instant) -> Outcome {
        let queue = self.queue.get_or_init(|| {
            let (queue, members) = mpsc::unbounded_channel();
            let sender = Sender {
                http: self.http.clone(),
                url: self.url.clone(),
                supported: self.supported.clone(),
            };
            tokio::spawn(sender.drain(members));
            queue
        });
        let (answer, answered) = oneshot::channel();
        let member = Member {
            body,
            deadline,
            answer,
        };
        if queue.send(member).is_err() {
            return Err(Attempt::Retry("the batch sender stopped".to_owned()));
        }
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(Attempt::Retry("the batch was dropped".to_owned())),
            Err(_) => Err(Attempt::Retry(DEADLINE_REACHED.to_owned())),
        }
    }
}

/// The task's side: where batches go.
struct Sender {
    http: Http,
    url: String,
    supported: Arc<AtomicBool>,
}

impl Sender {
    /// Forms batches from `members` as slots free up, until every client
    /// is gone.
    async fn drain(self, mut members: mpsc::UnboundedReceiver<Member>) {
        let this = Arc::new(self);
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        while let Some(first) = members.recv().await {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < MAX_MEMBERS {
                match members.try_recv() {
                    Ok(member) => batch.push(member),
                    Err(_) => break,
                }
            }
            // A member whose caller gave up is not sent.
            batch.retain(|m| !m.answer.is_closed());
            if batch.is_empty() {
                continue;
            }
            let this = this.clone();
            tokio::spawn(async move {
                this.send(batch).await;
                drop(slot);
            });
        }
    }

    /// Sends one batch and answers each member.
    async fn send(&self, batch: Vec<Member>) {
        let deadline = batch.iter().map(|m| m.deadline).max();
        let (bodies, waiting): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|m| (m.body, m.answer)).unzip();
        let count = bodies.len();
        let body = ReserveBatchBody {
            reservations: bodies,
        };
        let answer = match deadline {
            Some(deadline) => {
                self.http
                    .attempt::<ReserveBatchAnswer, _>(
                        &Method::POST,
                        &self.url,
                        Some(&body),
                        deadline,
                    )
                    .await
            }
            None => return,
        };
        let outcomes: Vec<Outcome> = match answer {
            Ok((_, answer)) if answer.results.len() == count => {
                answer.results.into_iter().map(member_outcome).collect()
            }
            Ok((_, answer)) => {
                let reason = format!(
                    "a batch of {count} was answered {} times",
                    answer.results.len()
                );
                vec![Err(Attempt::Retry(reason)); count]
            }
            // Members are refused one by one; only the route is missing
            // as a whole.
            Err(Attempt::Final(InventoryError::Refused { status, .. }))
                if status == StatusCode::NOT_FOUND =>
            {
                tracing::warn!(url = %self.url, "the inventory takes no batches; reserving one at a time");
                self.supported.store(false, Ordering::Relaxed);
                vec![Err(Attempt::Retry("no batch route".to_owned())); count]
            }
            Err(failure) => vec![Err(failure); count],
        };
        for (answer, outcome) in waiting.into_iter().zip(outcomes) {
            // A member whose caller is gone has nobody to tell.
            let _ = answer.send(outcome);
        }
    }
}

/// What a member's own answer means for it, as [`Http::attempt`] reads a
/// whole answer.
fn member_outcome(answer: MemberAnswer) -> Outcome {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    match (answer.reservation, answer.error) {
        (Some(record), _) if status.is_success() => Ok((status, record)),
        (_, Some(ErrorBody { error, message })) if status.is_client_error() => {
            Err(Attempt::Final(InventoryError::Refused {
                status,
                code: error,
                message,
            }))
        }
        _ => Err(Attempt::Retry(format!("HTTP {status}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::atomic::AtomicU32, time::Duration};

    use axum::{Json, Router, extract::State, routing::post};
    use flashsale_inventory_api::{ReservationState, paths};

    use super::*;
    use crate::inventory_client::{InventoryClient, client_of};

    /// The record a stub inventory makes of `body`.
    fn record(body: &ReserveBody) -> Reservation {
        Reservation {
            id: format!("res-{}", body.request_id),
            sku: body.sku.clone(),
            user: body.user.clone(),
            quantity: u64::try_from(body.quantity).unwrap_or_default(),
            amount_minor: 0,
            request_id: body.request_id.clone(),
            state: ReservationState::Reserved,
            reason: None,
            expires_at_ms: 0,
        }
    }

    /// A client of a stub inventory that answers each request after 20 ms,
    /// with batches or (`batches` false) only one reservation at a time,
    /// and the count of requests it took.
    async fn stub(batches: bool) -> anyhow::Result<(InventoryClient, Arc<AtomicU32>)> {
        let requests = Arc::new(AtomicU32::new(0));
        let mut router = Router::new().route(
            paths::RESERVATIONS,
            post(
                |State(n): State<Arc<AtomicU32>>, Json(body): Json<ReserveBody>| async move {
                    n.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    (axum::http::StatusCode::CREATED, Json(record(&body)))
                },
            ),
        );
        if batches {
            router = router.route(
                paths::RESERVATION_BATCHES,
                post(
                    |State(n): State<Arc<AtomicU32>>, Json(batch): Json<ReserveBatchBody>| async move {
                        n.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let results = batch
                            .reservations
                            .iter()
                            .map(|body| MemberAnswer {
                                status: 201,
                                reservation: Some(record(body)),
                                error: None,
                            })
                            .collect();
                        Json(ReserveBatchAnswer { results })
                    },
                ),
            );
        }
        let router = router
            .fallback(|| async {
                let body = serde_json::json!({"error": "not_found", "message": "no such route"});
                (axum::http::StatusCode::NOT_FOUND, Json(body))
            })
            .with_state(requests.clone());
        Ok((client_of(router).await?, requests))
    }

    /// Reserves `n` at once; each answer must be its own request's.
    async fn reserve_all(client: &InventoryClient, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let calls = (0..n).map(|i| {
            let id = format!("r{i}");
            async move {
                let record = client.reserve("A", "u", 1, 0, &id, deadline).await?;
                anyhow::ensure!(record.request_id == id, "{id} got {record:?}");
                Ok(())
            }
        });
        futures::future::try_join_all(calls).await.map(drop)
    }

    #[tokio::test]
    async fn concurrent_reservations_travel_in_few_requests_each_answered_its_own()
    -> anyhow::Result<()> {
        let (client, requests) = stub(true).await?;
        reserve_all(&client, 64).await?;
        let sent = requests.load(Ordering::SeqCst);
        // The first few go alone while slots are free; the rest wait for
        // one and go together.
        assert!(
            sent <= 2 * IN_FLIGHT as u32,
            "64 reservations took {sent} requests"
        );
        Ok(())
    }

    #[tokio::test]
    async fn an_inventory_without_batches_is_sent_one_reservation_at_a_time() -> anyhow::Result<()>
    {
        let (client, requests) = stub(false).await?;
        reserve_all(&client, 8).await?;
        assert!(!client.batcher.supported());
        // The refused batches, then one request per reservation.
        assert!(requests.load(Ordering::SeqCst) >= 8);
        Ok(())
    }

    #[test]
    fn a_members_answer_is_read_as_its_own_request_would_be() {
        let refused = member_outcome(MemberAnswer {
            status: 409,
            reservation: None,
            error: Some(ErrorBody {
                error: "sold_out".into(),
                message: "A is sold out".into(),
            }),
        });
        assert!(
            matches!(&refused, Err(Attempt::Final(InventoryError::Refused { status, code, .. }))
                if *status == StatusCode::CONFLICT && code == "sold_out"),
            "{refused:?}"
        );
        let failed = member_outcome(MemberAnswer {
            status: 503,
            reservation: None,
            error: Some(ErrorBody {
                error: "retry".into(),
                message: "not durable".into(),
            }),
        });
        assert!(matches!(failed, Err(Attempt::Retry(_))), "{failed:?}");
        // A success without its record is not trusted.
        let empty = member_outcome(MemberAnswer {
            status: 201,
            reservation: None,
            error: None,
        });
        assert!(matches!(empty, Err(Attempt::Retry(_))), "{empty:?}");
    }
}
