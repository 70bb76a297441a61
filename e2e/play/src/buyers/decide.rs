//! What a buyer does next, given an answer: pure functions of the answer
//! (`None` when there was none: a connection error or a timeout), where
//! the purchase stands and the retry policy. The HTTP side only carries
//! them out.

use std::time::Duration;

use super::{answer::Answer, config::RetryPolicy};

/// Wait before polling the queue when the gateway gave no hint.
const DEFAULT_POLL: Duration = Duration::from_secs(2);
/// Wait before asking again when the sale is not open and no `Retry-After` came.
const NOT_OPEN_WAIT: Duration = Duration::from_secs(1);
/// Shortest wait before presenting a pass again after `replayed`: the
/// earlier redemption's lease must lapse or be settled first. The retry
/// budget at this pace outlasts a lease (twice the gateway's request
/// timeout plus 3 s, 7 s by default), so a purchase whose first request is
/// still running learns its outcome: the order (the gateway answers a
/// retry of an acknowledged order with its used pass) or the pass back.
const REPLAYED_WAIT: Duration = Duration::from_secs(2);

/// Where a purchase stands when an answer to its order request comes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// An earlier request with this key may have gone through.
    pub(crate) uncertain: bool,
    /// Retries spent of the budget.
    pub(crate) retries: u32,
    /// The request carried a waiting-room pass.
    pub(crate) with_pass: bool,
    /// The request carried a solved bot-shield challenge.
    pub(crate) with_proof: bool,
    /// The buyer is winding down (stopped or no longer active).
    pub(crate) winding_down: bool,
}

/// An order the gateway acknowledged, as it named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ack {
    pub(crate) order_id: String,
    pub(crate) sku: String,
    pub(crate) quantity: u64,
    pub(crate) amount_minor: u64,
    /// A retry of an order already paid (answered 200 `paid`).
    pub(crate) paid: bool,
}

/// Why a purchase ended without an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The SKU is sold out: stop buying it.
    SoldOut,
    /// The buyer's limit of the SKU is reached: stop buying it.
    LimitReached,
    /// The sale is over: stop buying altogether.
    SaleEnded,
    /// Nothing more to do for this key: winding down, retries spent, or
    /// the key's earlier attempt failed (`order_abandoned`).
    GivenUp,
    /// An answer the flow does not expect.
    Unexpected,
}

/// The next step of a purchase after an order answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OrderNext {
    /// Record the order.
    Acknowledged(Ack),
    /// Queued by the waiting room: poll for a pass, then order again.
    Queue { ticket: String, poll_in: Duration },
    /// Send the same request again after `wait`; `budgeted` ones count
    /// against the retry budget.
    Again {
        wait: Duration,
        uncertain: bool,
        budgeted: bool,
    },
    /// The pass was refused: order again without it (joining the queue).
    Rejoin,
    /// The sale's bot shield asks a proof of work to join: solve a
    /// challenge and order again with it; `budgeted` when the last proof
    /// was refused, which counts against the retry budget.
    Solve { budgeted: bool },
    /// The purchase is over; `unresolved` when a request with its key may
    /// still have gone through.
    End { why: Ending, unresolved: bool },
}

/// The next step after an answer to `POST /api/v1/orders`.
pub(crate) fn order(reply: Option<&Answer>, at: Attempt, policy: &RetryPolicy) -> OrderNext {
    let end = |why, unresolved| OrderNext::End { why, unresolved };
    // A budgeted retry, or the end when the budget is spent.
    let again = |wait: Duration, uncertain: bool| {
        if at.retries >= policy.max_retries {
            end(Ending::GivenUp, uncertain)
        } else {
            OrderNext::Again {
                wait,
                uncertain,
                budgeted: true,
            }
        }
    };
    // Waits that change nothing about the key: free while the buyer is
    // active, budgeted once it winds down (when an uncertain key still
    // needs an answer) or the end.
    let wait_for = |wait: Duration| {
        if !at.winding_down {
            OrderNext::Again {
                wait,
                uncertain: at.uncertain,
                budgeted: false,
            }
        } else if at.uncertain {
            again(wait, true)
        } else {
            end(Ending::GivenUp, false)
        }
    };
    let backoff = policy.backoff(at.retries);
    let Some(answer) = reply else {
        return again(backoff, true);
    };
    match (answer.status, answer.error.as_deref()) {
        (200 | 201, _) => match ack(answer) {
            Some(ack) => OrderNext::Acknowledged(ack),
            // Something was acknowledged, but not named.
            None => end(Ending::Unexpected, true),
        },
        (202, _) => match answer.text("ticket") {
            Some(ticket) if !at.winding_down => OrderNext::Queue {
                ticket: ticket.to_owned(),
                poll_in: poll_hint(answer),
            },
            // Queueing says nothing of an earlier attempt with a pass.
            Some(_) => end(Ending::GivenUp, at.uncertain),
            None => end(Ending::Unexpected, at.uncertain),
        },
        (429, _) => wait_for(answer.retry_after.unwrap_or(policy.rate_limited_wait)),
        // Shed before anything was done: it leaves the key as it was.
        (503, Some("overloaded")) => again(
            answer.retry_after.unwrap_or_default().max(backoff),
            at.uncertain,
        ),
        (503, _) => again(answer.retry_after.unwrap_or_default().max(backoff), true),
        (409, Some("sold_out")) => end(Ending::SoldOut, false),
        (409, Some("user_limit")) => end(Ending::LimitReached, false),
        (409, Some("order_abandoned")) => end(Ending::GivenUp, false),
        (409, Some("sale_not_open")) => wait_for(answer.retry_after.unwrap_or(NOT_OPEN_WAIT)),
        // A retry after the closing is refused without looking the key up.
        (410, _) => end(Ending::SaleEnded, at.uncertain),
        // The pass may be held by this key's own earlier request: its lease
        // lapses or settles within seconds, and then the retry resolves.
        (403, Some("replayed")) if at.with_pass && at.uncertain => {
            again(backoff.max(REPLAYED_WAIT), true)
        }
        // This user's place in the queue was used up by an earlier order:
        // rejoining returns the same place until its ticket expires.
        (403, Some("replayed")) if at.with_pass => end(Ending::GivenUp, false),
        (403, _) if at.with_pass => OrderNext::Rejoin,
        // A join without a proof, with the shield on: solve one, as a
        // browser does.
        (428, Some("challenge_required")) if at.winding_down => end(Ending::GivenUp, at.uncertain),
        (428, Some("challenge_required")) => OrderNext::Solve { budgeted: false },
        // A proof refused (expired while queued for a slot, say): a new one.
        (403, _) if at.with_proof => {
            if at.retries >= policy.max_retries || at.winding_down {
                end(Ending::GivenUp, at.uncertain)
            } else {
                OrderNext::Solve { budgeted: true }
            }
        }
        _ => end(Ending::Unexpected, at.uncertain),
    }
}

fn ack(answer: &Answer) -> Option<Ack> {
    Some(Ack {
        order_id: answer.text("orderId")?.to_owned(),
        sku: answer.text("sku")?.to_owned(),
        quantity: answer.number("quantity")?,
        amount_minor: answer.number("amountMinor")?,
        paid: answer.text("status") == Some("paid"),
    })
}

fn poll_hint(answer: &Answer) -> Duration {
    answer
        .number("nextPollMs")
        .map_or(DEFAULT_POLL, Duration::from_millis)
}

/// The next step after an answer to `GET /api/v1/queue/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PollNext {
    /// Admitted: order with this pass.
    Admitted(String),
    /// Poll again after this long; `budgeted` when the poll failed.
    Again { wait: Duration, budgeted: bool },
    /// The ticket was refused (e.g. expired): order again to get a new one.
    Rejoin,
    /// Give up waiting.
    Fail,
}

/// The next step after a queue-status answer.
pub(crate) fn poll(reply: Option<&Answer>, retries: u32, policy: &RetryPolicy) -> PollNext {
    let again = |wait| {
        if retries >= policy.max_retries {
            PollNext::Fail
        } else {
            PollNext::Again {
                wait,
                budgeted: true,
            }
        }
    };
    let backoff = policy.backoff(retries);
    let Some(answer) = reply else {
        return again(backoff);
    };
    match answer.status {
        200 => match answer.text("pass") {
            Some(pass) => PollNext::Admitted(pass.to_owned()),
            None => PollNext::Again {
                wait: poll_hint(answer),
                budgeted: false,
            },
        },
        403 => PollNext::Rejoin,
        429 | 503 => again(answer.retry_after.unwrap_or_default().max(backoff)),
        _ => PollNext::Fail,
    }
}

/// The next step of a request that either succeeds or is retried: paying
/// and the payment callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Answered 2xx.
    Done,
    /// Send again after this long.
    Again(Duration),
    /// Refused, or the retries are spent.
    Fail,
}

/// The verdict on an answer to a request retried on 429, 503 and
/// transport errors (both idempotent: paying only names the amount, and a
/// callback confirms once).
pub(crate) fn verdict(reply: Option<&Answer>, retries: u32, policy: &RetryPolicy) -> Verdict {
    let again = |wait| {
        if retries >= policy.max_retries {
            Verdict::Fail
        } else {
            Verdict::Again(wait)
        }
    };
    let backoff = policy.backoff(retries);
    match reply {
        None => again(backoff),
        Some(answer) if (200..300).contains(&answer.status) => Verdict::Done,
        Some(answer) if matches!(answer.status, 429 | 503) => {
            again(answer.retry_after.unwrap_or_default().max(backoff))
        }
        Some(_) => Verdict::Fail,
    }
}

/// What the gateway asks to be paid for an order: `(amountMinor, currency)`.
pub(crate) fn bill(answer: &Answer) -> Option<(u64, String)> {
    Some((
        answer.number("amountMinor")?,
        answer.text("currency")?.to_owned(),
    ))
}

#[cfg(test)]
mod tests;
