//! One purchase: order one unit (through the waiting room when there is
//! one), retrying with the same idempotency key until the outcome is known,
//! then pay it or abandon it. Paying plays both sides: the buyer starts the
//! payment, and the payment provider confirms it with a signed callback.

use gateway::{
    bot_shield::{PROOF_HEADER, work},
    payments::{SIGNATURE_HEADER, sign},
    queue::{PASS_HEADER, TICKET_HEADER},
};
use rand::Rng;
use serde_json::json;

use super::{
    Error,
    answer::Answer,
    buyer::{Buyer, unexpected},
    decide::{self, Ack, Attempt, Ending, OrderNext, PollNext, Verdict},
    ledger::{OrderRecord, Unresolved},
    tally::{Count, Counters},
};

/// Units per purchase.
const QUANTITY: u64 = 1;

/// How a wait in the queue ended.
enum Queue {
    Pass(String),
    Rejoin,
    Left,
}

impl Buyer {
    /// Tries to buy one unit of `sku` under a fresh idempotency key.
    pub(super) async fn purchase(&mut self, sku: &str) -> Result<(), Error> {
        let counters = self.shared.gateway.counters().clone();
        counters.add(Count::Purchase);
        let key = uuid::Uuid::new_v4().simple().to_string();
        let mut at = Attempt::default();
        let mut pass: Option<String> = None;
        // A solved challenge of the sale's bot shield, until a join spends it.
        let mut proof: Option<String> = None;
        loop {
            at.with_pass = pass.is_some();
            at.with_proof = pass.is_none() && proof.is_some();
            at.winding_down = self.winding_down();
            let reply = self
                .order(sku, &key, pass.as_deref(), proof.as_deref())
                .await?;
            let last = reply
                .as_ref()
                .map_or("no answer".to_owned(), Answer::describe);
            let next = decide::order(reply.as_ref(), at, &self.shared.config.retry);
            match next {
                OrderNext::Acknowledged(ack) => return self.acknowledged(key, ack).await,
                OrderNext::Queue { ticket, poll_in } => {
                    proof = None;
                    if !self.was_queued {
                        self.was_queued = true;
                        counters.add(Count::Queued);
                    }
                    match self.queue(&ticket, poll_in).await? {
                        Queue::Pass(admitted) => {
                            if !self.was_admitted {
                                self.was_admitted = true;
                                counters.add(Count::Admitted);
                            }
                            pass = Some(admitted);
                        }
                        Queue::Rejoin => at = self.rejoin(at, &mut pass),
                        Queue::Left => {
                            self.ended(Ending::GivenUp, at.uncertain, key, sku, last);
                            return Ok(());
                        }
                    }
                }
                OrderNext::Again {
                    wait,
                    uncertain,
                    budgeted,
                } => {
                    at.uncertain = uncertain;
                    at.retries += u32::from(budgeted);
                    let wait = self.jitter(wait);
                    // A key that may have gone through is seen to the end:
                    // its retries are bounded, and its outcome must be known.
                    if uncertain {
                        tokio::time::sleep(wait).await;
                    } else if self.pause(wait).await {
                        self.ended(Ending::GivenUp, false, key, sku, last);
                        return Ok(());
                    }
                }
                OrderNext::Rejoin => at = self.rejoin(at, &mut pass),
                OrderNext::Solve { budgeted } => {
                    at.retries += u32::from(budgeted);
                    proof = self.solve().await?;
                    if proof.is_none() {
                        // No challenge to be had: as any unanswered request.
                        at.retries += 1;
                        let policy = &self.shared.config.retry;
                        let (spent, wait) =
                            (at.retries > policy.max_retries, policy.backoff(at.retries));
                        let wait = self.jitter(wait);
                        if spent || self.pause(wait).await {
                            self.ended(Ending::GivenUp, at.uncertain, key, sku, last);
                            return Ok(());
                        }
                    }
                }
                OrderNext::End { why, unresolved } => {
                    self.ended(why, unresolved, key, sku, last);
                    return Ok(());
                }
            }
        }
    }

    /// Drops a refused pass (the next order request joins the queue again);
    /// each rejoin spends a retry, so a pass refused for good ends the purchase.
    fn rejoin(&self, at: Attempt, pass: &mut Option<String>) -> Attempt {
        *pass = None;
        Attempt {
            retries: at.retries + 1,
            ..at
        }
    }

    async fn order(
        &mut self,
        sku: &str,
        key: &str,
        pass: Option<&str>,
        proof: Option<&str>,
    ) -> Result<Option<Answer>, Error> {
        let token = self.token()?;
        let mut request = self
            .shared
            .gateway
            .post("/api/v1/orders")
            .bearer_auth(token)
            .json(&json!({"sku": sku, "quantity": QUANTITY, "idempotencyKey": key}));
        if let Some(pass) = pass {
            request = request.header(PASS_HEADER, pass);
        } else if let Some(proof) = proof {
            request = request.header(PROOF_HEADER, proof);
        }
        Ok(self.shared.gateway.send(request).await)
    }

    /// A challenge of the sale's bot shield, solved as a browser solves it
    /// (on the blocking pool: it is CPU work): the `X-Queue-Proof` value, or
    /// `None` when no challenge was answered.
    async fn solve(&mut self) -> Result<Option<String>, Error> {
        let token = self.token()?;
        let request = self
            .shared
            .gateway
            .post("/api/v1/queue/challenge")
            .bearer_auth(token);
        let Some(answer) = self.shared.gateway.send(request).await else {
            return Ok(None);
        };
        let (Some(challenge), Some(difficulty)) =
            (answer.text("challenge"), answer.number("difficulty"))
        else {
            return Ok(None);
        };
        let (Some(mac), Ok(difficulty)) = (work::mac_of(challenge), u8::try_from(difficulty))
        else {
            return Ok(None);
        };
        let challenge = challenge.to_owned();
        let solved = tokio::task::spawn_blocking(move || work::solve(&mac, difficulty)).await;
        Ok(solved
            .ok()
            .map(|(solution, _)| format!("{challenge}:{solution}")))
    }

    /// Polls the queue status with the server's hinted waits until a pass
    /// comes; leaves when the buyer winds down.
    async fn queue(
        &mut self,
        ticket: &str,
        first_poll: std::time::Duration,
    ) -> Result<Queue, Error> {
        let policy = self.shared.config.retry.clone();
        let mut wait = first_poll;
        let mut retries = 0;
        loop {
            if self.pause(wait).await {
                return Ok(Queue::Left);
            }
            let token = self.token()?;
            let request = self
                .shared
                .gateway
                .get("/api/v1/queue/status")
                .bearer_auth(token)
                .header(TICKET_HEADER, ticket);
            let reply = self.shared.gateway.send(request).await;
            match decide::poll(reply.as_ref(), retries, &policy) {
                PollNext::Admitted(pass) => return Ok(Queue::Pass(pass)),
                PollNext::Again {
                    wait: next,
                    budgeted,
                } => {
                    // The budget is for failures in a row.
                    retries = if budgeted { retries + 1 } else { 0 };
                    wait = if budgeted { self.jitter(next) } else { next };
                }
                PollNext::Rejoin => return Ok(Queue::Rejoin),
                PollNext::Fail => {
                    if reply.as_ref().is_some_and(unexpected) {
                        self.shared.gateway.counters().add(Count::Unexpected);
                    }
                    return Ok(Queue::Left);
                }
            }
        }
    }

    /// Records an acknowledged order, then pays it or abandons it.
    async fn acknowledged(&mut self, key: String, ack: Ack) -> Result<(), Error> {
        let counters = self.shared.gateway.counters().clone();
        counters.add(Count::Acknowledged);
        if self.ledger.orders.is_empty() {
            counters.add(Count::OrderingBuyer);
        }
        // Counted once per buyer, at its first paid order.
        let paid = |counters: &Counters, paid_before: bool| {
            counters.add(Count::Paid);
            if !paid_before {
                counters.add(Count::PayingBuyer);
            }
        };
        let paid_before = self.ledger.orders.iter().any(|o| o.paid);
        *self.bought.entry(ack.sku.clone()).or_default() += ack.quantity;
        self.ledger.orders.push(OrderRecord {
            order_id: ack.order_id.clone(),
            idempotency_key: key,
            sku: ack.sku,
            quantity: ack.quantity,
            amount_minor: ack.amount_minor,
            acknowledged_at_ms: jiff::Timestamp::now().as_millisecond(),
            paid: ack.paid,
        });
        if ack.paid {
            paid(&counters, paid_before);
            return Ok(());
        }
        if self.rng.random::<f64>() < self.shared.config.abandon {
            counters.add(Count::Abandoned);
            return Ok(());
        }
        // The shopper takes a moment at the checkout; a buyer winding down
        // pays at once.
        let think = self.shared.config.think;
        self.pause(think).await;
        if self.pay(&ack.order_id).await? {
            paid(&counters, paid_before);
            if let Some(order) = self.ledger.orders.last_mut() {
                order.paid = true;
            }
        } else {
            counters.add(Count::PaymentFailed);
        }
        Ok(())
    }

    /// Starts the payment as the buyer, then confirms it as the payment
    /// provider; true when the callback was answered 2xx.
    async fn pay(&mut self, order_id: &str) -> Result<bool, Error> {
        let path = format!("/api/v1/orders/{order_id}/pay");
        let Some((amount_minor, currency)) = self
            .retried(|buyer| {
                let request = buyer.shared.gateway.post(&path).bearer_auth(buyer.token()?);
                Ok(request)
            })
            .await?
            .as_ref()
            .and_then(decide::bill)
        else {
            return Ok(false);
        };
        let body = gateway::payments::succeeded(order_id, amount_minor, &currency);
        let callback = self
            .retried(|buyer| {
                let now = jiff::Timestamp::now().as_second();
                let signature = sign(&buyer.shared.config.payment_secret, now, &body)?;
                Ok(buyer
                    .shared
                    .gateway
                    .post("/api/v1/payments/callback")
                    .header(SIGNATURE_HEADER, signature)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone()))
            })
            .await?;
        Ok(callback.is_some())
    }

    /// Sends the request `build` makes until it is answered 2xx (that
    /// answer) or refused, or the retries are spent (`None`).
    async fn retried(
        &mut self,
        mut build: impl FnMut(&mut Self) -> Result<reqwest::RequestBuilder, Error>,
    ) -> Result<Option<Answer>, Error> {
        let policy = self.shared.config.retry.clone();
        let mut retries = 0;
        loop {
            let request = build(self)?;
            let reply = self.shared.gateway.send(request).await;
            match decide::verdict(reply.as_ref(), retries, &policy) {
                Verdict::Done => return Ok(reply),
                Verdict::Again(wait) => {
                    retries += 1;
                    let wait = self.jitter(wait);
                    tokio::time::sleep(wait).await;
                }
                Verdict::Fail => {
                    if reply.as_ref().is_some_and(unexpected) {
                        self.shared.gateway.counters().add(Count::Unexpected);
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// A purchase ended without an order: what the buyer learnt, and the
    /// key kept when its outcome is unknown.
    fn ended(&mut self, why: Ending, unresolved: bool, key: String, sku: &str, last: String) {
        let counters = self.shared.gateway.counters().clone();
        match why {
            Ending::SoldOut => {
                self.sold_out.insert(sku.to_owned());
            }
            Ending::LimitReached => {
                self.limit_reached.insert(sku.to_owned());
            }
            Ending::SaleEnded => self.sale_over = true,
            Ending::GivenUp => {}
            Ending::Unexpected => counters.add(Count::Unexpected),
        }
        if unresolved {
            counters.add(Count::Unresolved);
            self.ledger.unresolved.push(Unresolved {
                idempotency_key: key,
                sku: sku.to_owned(),
                quantity: QUANTITY,
                given_up_at_ms: jiff::Timestamp::now().as_millisecond(),
                last,
            });
        } else if why == Ending::GivenUp {
            counters.add(Count::GivenUp);
        }
    }
}
