//! Buyers ordering at a steady rate through a sale's gateways while a drill
//! runs, keeping every order the gateways acknowledged, so a test can find
//! each one in the database afterwards (by order id).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tokio::{sync::watch, task::JoinSet};

use crate::real_node::{HS256_SECRET, token_signed};

/// The longest a flow runs, whoever forgets to stop it.
const LONGEST: Duration = Duration::from_secs(300);

/// What the buyers saw.
#[derive(Debug, Clone, Default)]
pub struct OrderTally {
    /// The order ids the gateways acknowledged (201).
    pub acknowledged: BTreeSet<String>,
    /// Answers by HTTP status.
    pub answers: BTreeMap<u16, u64>,
    /// Orders that got no whole answer (a reset, a timeout).
    pub unanswered: u64,
}

impl OrderTally {
    /// Answers with a 5xx status.
    pub fn server_errors(&self) -> u64 {
        self.answers
            .iter()
            .filter(|(status, _)| **status >= 500)
            .map(|(_, n)| n)
            .sum()
    }
}

/// Buyers ordering one unit of a SKU each, each buyer a new user with its
/// own idempotency key, at a fixed rate until stopped.
pub struct OrderFlow {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    tally: Arc<Mutex<OrderTally>>,
}

impl OrderFlow {
    /// Starts `per_second` orders a second of `sku` at `gateway`
    /// (`http://host[:port]`) by buyers `<buyers>-1`, `<buyers>-2`, …; an
    /// order is not waited for before the next.
    pub fn start(gateway: &str, buyers: &str, sku: &str, per_second: u32) -> anyhow::Result<Self> {
        Self::signed(gateway, buyers, sku, per_second, HS256_SECRET.to_vec())
    }

    /// [`OrderFlow::start`] on a sale whose buyers' tokens are signed with
    /// the HS256 key `secret`.
    pub fn signed(
        gateway: &str,
        buyers: &str,
        sku: &str,
        per_second: u32,
        secret: Vec<u8>,
    ) -> anyhow::Result<Self> {
        let secret: Arc<[u8]> = secret.into();
        let client = crate::real_node::http_per_request()?;
        let url = format!("{gateway}/api/v1/orders");
        let (sku, buyers) = (sku.to_owned(), buyers.to_owned());
        let tally = Arc::new(Mutex::new(OrderTally::default()));
        let (stop, mut stopped) = watch::channel(false);
        let every = Duration::from_secs(1) / per_second.max(1);
        let kept = tally.clone();
        let task = tokio::spawn(async move {
            let until = Instant::now() + LONGEST;
            let mut tick = tokio::time::interval(every);
            let mut orders = JoinSet::new();
            let mut n = 0u64;
            while Instant::now() < until {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                n += 1;
                let request = order(&client, &url, &sku, &format!("{buyers}-{n}"), &secret);
                let kept = kept.clone();
                orders.spawn(async move {
                    let answer = request.await;
                    if let Ok(mut tally) = kept.lock() {
                        tally.count(answer);
                    }
                });
            }
            // Every order sent gets its answer counted: one acknowledged
            // after the stop is still an order the database must hold.
            while orders.join_next().await.is_some() {}
        });
        Ok(Self { stop, task, tally })
    }

    /// What the buyers saw so far.
    pub fn tally(&self) -> OrderTally {
        self.tally.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Stops sending, waits for every order's answer and returns the tally.
    pub async fn stop(mut self) -> OrderTally {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
        self.tally.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

impl Drop for OrderFlow {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The gateway's answer to an order: (status, body), or `None` without
/// a whole answer.
type Answer = Option<(u16, Value)>;

impl OrderTally {
    fn count(&mut self, answer: Answer) {
        match answer {
            Some((status, body)) => {
                *self.answers.entry(status).or_default() += 1;
                if status == 201
                    && let Some(id) = body["orderId"].as_str()
                {
                    self.acknowledged.insert(id.to_owned());
                }
            }
            None => self.unanswered += 1,
        }
    }
}

/// One unit of `sku` for `buyer`, under the buyer's name as its key.
fn order(
    client: &reqwest::Client,
    url: &str,
    sku: &str,
    buyer: &str,
    secret: &[u8],
) -> impl Future<Output = Answer> + use<> {
    let request = client
        .post(url)
        .json(&json!({"sku": sku, "quantity": 1, "idempotencyKey": buyer}));
    let exp = jiff::Timestamp::now().as_second() + 3600;
    let buyer = token_signed(buyer, exp, secret).ok();
    async move {
        let response = request.bearer_auth(buyer?).send().await.ok()?;
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        Some((status, body))
    }
}
