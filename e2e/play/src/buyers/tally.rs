//! What the buyers did, counted: live [`Counters`] shared by every buyer,
//! and the [`Tally`], a snapshot of them.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::{Deserialize, Serialize};

/// A snapshot of the counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tally {
    /// Buyers active at the snapshot.
    pub active: u64,
    /// Buyers that became active at least once.
    pub arrived: u64,
    /// Requests sent.
    pub requests: u64,
    /// Requests without an answer: connection errors and timeouts.
    pub transport_errors: u64,
    /// Answers by HTTP status code.
    pub by_code: BTreeMap<u16, u64>,
    /// Answers carrying `X-Flashsale-Degraded`.
    pub degraded: u64,
    /// Browsing actions (page views).
    pub browses: u64,
    /// Purchase intents (each with a fresh idempotency key).
    pub purchases: u64,
    /// Buyers queued by the waiting room at least once.
    pub queued: u64,
    /// Buyers the waiting room let through at least once.
    pub admitted: u64,
    /// 429 answers, on any route.
    pub rate_limited: u64,
    /// Orders the gateway acknowledged.
    pub acknowledged: u64,
    /// Buyers with at least one acknowledged order.
    pub ordering_buyers: u64,
    /// Buyers with at least one paid order.
    pub paying_buyers: u64,
    /// Acknowledged orders whose payment callback was answered 2xx.
    pub paid: u64,
    /// Acknowledged orders the buyer chose never to pay.
    pub abandoned: u64,
    /// Orders meant to be paid whose payment did not go through.
    pub payment_failed: u64,
    /// `409 sold_out` answers.
    pub sold_out: u64,
    /// `409 user_limit` answers.
    pub user_limit: u64,
    /// `409 sale_not_open` answers.
    pub sale_not_open: u64,
    /// `410 sale_ended` answers.
    pub sale_ended: u64,
    /// `409 order_abandoned` answers (an earlier attempt failed; the key is spent).
    pub order_abandoned: u64,
    /// Purchase intents given up with nothing acknowledged: the buyer wound
    /// down while queued or rate-limited, or the retries ran out on answers
    /// that changed nothing.
    pub given_up: u64,
    /// Purchase intents whose outcome stayed unknown (kept in the ledger).
    pub unresolved: u64,
    /// Answers no step of the flow expects (e.g. 400, 401, 404), also in
    /// [`Tally::by_code`].
    pub unexpected: u64,
}

impl Tally {
    /// Transport errors, 5xx answers and unexpected answers.
    pub fn errors(&self) -> u64 {
        let server: u64 = self.by_code.range(500..600).map(|(_, n)| n).sum();
        self.transport_errors + server + self.unexpected
    }

    /// Answers received, whatever their code.
    pub fn answers(&self) -> u64 {
        self.by_code.values().sum()
    }
}

/// Live counters, shared by every buyer and readable while they run; cheap
/// to clone.
#[derive(Debug, Clone, Default)]
pub struct Counters(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    active: AtomicU64,
    arrived: AtomicU64,
    requests: AtomicU64,
    transport_errors: AtomicU64,
    by_code: Mutex<BTreeMap<u16, u64>>,
    degraded: AtomicU64,
    browses: AtomicU64,
    purchases: AtomicU64,
    queued: AtomicU64,
    admitted: AtomicU64,
    rate_limited: AtomicU64,
    acknowledged: AtomicU64,
    ordering_buyers: AtomicU64,
    paying_buyers: AtomicU64,
    paid: AtomicU64,
    abandoned: AtomicU64,
    payment_failed: AtomicU64,
    sold_out: AtomicU64,
    user_limit: AtomicU64,
    sale_not_open: AtomicU64,
    sale_ended: AtomicU64,
    order_abandoned: AtomicU64,
    given_up: AtomicU64,
    unresolved: AtomicU64,
    unexpected: AtomicU64,
}

/// One count the buyers add to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    Arrived,
    Request,
    TransportError,
    Degraded,
    Browse,
    Purchase,
    Queued,
    Admitted,
    RateLimited,
    Acknowledged,
    OrderingBuyer,
    PayingBuyer,
    Paid,
    Abandoned,
    PaymentFailed,
    SoldOut,
    UserLimit,
    SaleNotOpen,
    SaleEnded,
    OrderAbandoned,
    GivenUp,
    Unresolved,
    Unexpected,
}

impl Counters {
    /// Buyers active now.
    pub fn active(&self) -> u64 {
        self.0.active.load(Ordering::Relaxed)
    }

    /// A snapshot of every count.
    pub fn tally(&self) -> Tally {
        let inner = &self.0;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let by_code = inner
            .by_code
            .lock()
            .map(|codes| codes.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone());
        Tally {
            active: get(&inner.active),
            arrived: get(&inner.arrived),
            requests: get(&inner.requests),
            transport_errors: get(&inner.transport_errors),
            by_code,
            degraded: get(&inner.degraded),
            browses: get(&inner.browses),
            purchases: get(&inner.purchases),
            queued: get(&inner.queued),
            admitted: get(&inner.admitted),
            rate_limited: get(&inner.rate_limited),
            acknowledged: get(&inner.acknowledged),
            ordering_buyers: get(&inner.ordering_buyers),
            paying_buyers: get(&inner.paying_buyers),
            paid: get(&inner.paid),
            abandoned: get(&inner.abandoned),
            payment_failed: get(&inner.payment_failed),
            sold_out: get(&inner.sold_out),
            user_limit: get(&inner.user_limit),
            sale_not_open: get(&inner.sale_not_open),
            sale_ended: get(&inner.sale_ended),
            order_abandoned: get(&inner.order_abandoned),
            given_up: get(&inner.given_up),
            unresolved: get(&inner.unresolved),
            unexpected: get(&inner.unexpected),
        }
    }

    pub(crate) fn add(&self, count: Count) {
        let inner = &self.0;
        let counter = match count {
            Count::Arrived => &inner.arrived,
            Count::Request => &inner.requests,
            Count::TransportError => &inner.transport_errors,
            Count::Degraded => &inner.degraded,
            Count::Browse => &inner.browses,
            Count::Purchase => &inner.purchases,
            Count::Queued => &inner.queued,
            Count::Admitted => &inner.admitted,
            Count::RateLimited => &inner.rate_limited,
            Count::Acknowledged => &inner.acknowledged,
            Count::OrderingBuyer => &inner.ordering_buyers,
            Count::PayingBuyer => &inner.paying_buyers,
            Count::Paid => &inner.paid,
            Count::Abandoned => &inner.abandoned,
            Count::PaymentFailed => &inner.payment_failed,
            Count::SoldOut => &inner.sold_out,
            Count::UserLimit => &inner.user_limit,
            Count::SaleNotOpen => &inner.sale_not_open,
            Count::SaleEnded => &inner.sale_ended,
            Count::OrderAbandoned => &inner.order_abandoned,
            Count::GivenUp => &inner.given_up,
            Count::Unresolved => &inner.unresolved,
            Count::Unexpected => &inner.unexpected,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn answered(&self, code: u16) {
        let mut codes = self
            .0
            .by_code
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *codes.entry(code).or_default() += 1;
    }

    pub(crate) fn activated(&self) {
        self.0.active.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn deactivated(&self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_in_the_snapshot_and_errors_add_up() {
        let counters = Counters::default();
        counters.add(Count::Request);
        counters.add(Count::Request);
        counters.add(Count::TransportError);
        counters.add(Count::Unexpected);
        counters.answered(201);
        counters.answered(503);
        counters.answered(503);
        counters.activated();
        counters.activated();
        counters.deactivated();
        let tally = counters.tally();
        assert_eq!(tally.requests, 2);
        assert_eq!(tally.by_code, BTreeMap::from([(201, 1), (503, 2)]));
        assert_eq!(tally.active, 1);
        assert_eq!(counters.active(), 1);
        // 1 transport error + 2 × 503 + 1 unexpected.
        assert_eq!(tally.errors(), 4);
        assert_eq!(tally.answers(), 3);
    }
}
