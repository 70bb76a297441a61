use serde_json::json;

use super::*;

fn answer(status: u16, retry_after: Option<&str>, body: serde_json::Value) -> Answer {
    Answer::new(status, retry_after, false, body.to_string().as_bytes())
}

fn refusal(status: u16, code: &str, retry_after: Option<&str>) -> Answer {
    answer(status, retry_after, json!({"error": code, "message": "m"}))
}

const FRESH: Attempt = Attempt {
    uncertain: false,
    retries: 0,
    with_pass: false,
    with_proof: false,
    winding_down: false,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn again(wait: Duration, uncertain: bool, budgeted: bool) -> OrderNext {
    OrderNext::Again {
        wait,
        uncertain,
        budgeted,
    }
}

fn end(why: Ending, unresolved: bool) -> OrderNext {
    OrderNext::End { why, unresolved }
}

/// A case of `order`: its name, the answer (`None`: no answer), where the
/// purchase stood, and the next step it must lead to.
type OrderCase = (&'static str, Option<Answer>, Attempt, OrderNext);

const UNCERTAIN: Attempt = Attempt {
    uncertain: true,
    ..FRESH
};
const WINDING: Attempt = Attempt {
    winding_down: true,
    ..FRESH
};
const WINDING_UNCERTAIN: Attempt = Attempt {
    uncertain: true,
    winding_down: true,
    ..FRESH
};
const WITH_PASS: Attempt = Attempt {
    with_pass: true,
    ..FRESH
};
const PASS_UNCERTAIN: Attempt = Attempt {
    with_pass: true,
    uncertain: true,
    retries: 2,
    ..FRESH
};

/// An uncertain attempt with the whole retry budget spent.
fn spent(policy: &RetryPolicy) -> Attempt {
    Attempt {
        uncertain: true,
        retries: policy.max_retries,
        ..FRESH
    }
}

#[test]
fn order_answers_lead_to_their_next_step() {
    let policy = RetryPolicy::default();
    let table = [
        acknowledged_or_queued(),
        waits_and_retries(&policy),
        refusals_that_end_or_wait(),
        pass_and_token_refusals(),
        bot_shield_answers(&policy),
    ]
    .concat();
    for (name, reply, at, want) in table {
        assert_eq!(order(reply.as_ref(), at, &policy), want, "{name}");
    }
}

/// Answers that acknowledge an order or queue the buyer.
fn acknowledged_or_queued() -> Vec<OrderCase> {
    let created = answer(
        201,
        None,
        json!({"orderId": "ord-1", "reservationId": "1", "sku": "A", "quantity": 1,
               "amountMinor": 1999, "status": "reserved", "payBeforeMs": 5}),
    );
    let already_paid = answer(
        200,
        None,
        json!({"orderId": "ord-1", "sku": "A", "quantity": 1, "amountMinor": 1999, "status": "paid"}),
    );
    let queued = answer(
        202,
        None,
        json!({"status": "queued", "ticket": "T", "position": 3, "nextPollMs": 2300}),
    );
    let ack = |paid| {
        OrderNext::Acknowledged(Ack {
            order_id: "ord-1".into(),
            sku: "A".into(),
            quantity: 1,
            amount_minor: 1999,
            paid,
        })
    };
    vec![
        ("201 is an order", Some(created.clone()), FRESH, ack(false)),
        (
            "201 resolves an uncertain key",
            Some(created.clone()),
            UNCERTAIN,
            ack(false),
        ),
        (
            "200 paid is an order already paid",
            Some(already_paid),
            FRESH,
            ack(true),
        ),
        (
            "201 without an order id stays unresolved",
            Some(answer(201, None, json!({}))),
            FRESH,
            end(Ending::Unexpected, true),
        ),
        (
            "202 queues with the server's hint",
            Some(queued.clone()),
            FRESH,
            OrderNext::Queue {
                ticket: "T".into(),
                poll_in: ms(2300),
            },
        ),
        (
            "202 while winding down gives up",
            Some(queued.clone()),
            WINDING,
            end(Ending::GivenUp, false),
        ),
        (
            "202 while winding down with an uncertain key is unresolved",
            Some(queued),
            WINDING_UNCERTAIN,
            end(Ending::GivenUp, true),
        ),
    ]
}

/// Rate limits, overload and no answer: waits, on the budget or not, until
/// the budget is spent.
fn waits_and_retries(policy: &RetryPolicy) -> Vec<OrderCase> {
    vec![
        (
            "429 waits Retry-After, free of the budget",
            Some(refusal(429, "rate_limited", Some("2"))),
            FRESH,
            again(ms(2000), false, false),
        ),
        (
            "429 without Retry-After waits the default",
            Some(refusal(429, "rate_limited", None)),
            FRESH,
            again(policy.rate_limited_wait, false, false),
        ),
        (
            "429 while winding down gives up",
            Some(refusal(429, "rate_limited", Some("1"))),
            WINDING,
            end(Ending::GivenUp, false),
        ),
        (
            "429 while winding down with an uncertain key retries on the budget",
            Some(refusal(429, "rate_limited", Some("1"))),
            WINDING_UNCERTAIN,
            again(ms(1000), true, true),
        ),
        (
            "503 makes the key uncertain and retries after Retry-After",
            Some(refusal(503, "unavailable", Some("1"))),
            FRESH,
            again(ms(1000), true, true),
        ),
        (
            "503 overloaded changed nothing",
            Some(refusal(503, "overloaded", None)),
            FRESH,
            again(policy.backoff(0), false, true),
        ),
        (
            "503 overloaded keeps an uncertain key uncertain",
            Some(refusal(503, "overloaded", None)),
            UNCERTAIN,
            again(policy.backoff(0), true, true),
        ),
        (
            "no answer makes the key uncertain",
            None,
            FRESH,
            again(policy.backoff(0), true, true),
        ),
        (
            "no answer with the budget spent is unresolved",
            None,
            spent(policy),
            end(Ending::GivenUp, true),
        ),
        (
            "503 overloaded with the budget spent gives up, resolved",
            Some(refusal(503, "overloaded", None)),
            Attempt {
                uncertain: false,
                ..spent(policy)
            },
            end(Ending::GivenUp, false),
        ),
    ]
}

/// Refusals of the sale itself: sold out, limits, not open yet, ended.
fn refusals_that_end_or_wait() -> Vec<OrderCase> {
    vec![
        (
            "sold out",
            Some(refusal(409, "sold_out", None)),
            UNCERTAIN,
            end(Ending::SoldOut, false),
        ),
        (
            "user limit",
            Some(refusal(409, "user_limit", None)),
            FRESH,
            end(Ending::LimitReached, false),
        ),
        (
            "order_abandoned resolves the key: nothing was ordered",
            Some(refusal(409, "order_abandoned", None)),
            UNCERTAIN,
            end(Ending::GivenUp, false),
        ),
        (
            "not open waits Retry-After",
            Some(refusal(409, "sale_not_open", Some("30"))),
            FRESH,
            again(ms(30_000), false, false),
        ),
        (
            "not open while winding down gives up",
            Some(refusal(409, "sale_not_open", Some("30"))),
            WINDING,
            end(Ending::GivenUp, false),
        ),
        (
            "410 ends the sale",
            Some(refusal(410, "sale_ended", None)),
            FRESH,
            end(Ending::SaleEnded, false),
        ),
        (
            "410 after an uncertain attempt leaves it unresolved",
            Some(refusal(410, "sale_ended", None)),
            UNCERTAIN,
            end(Ending::SaleEnded, true),
        ),
    ]
}

/// Refused passes and tokens, and answers the flow does not expect.
/// Answers of a sale whose bot shield asks a proof of work to join.
fn bot_shield_answers(policy: &RetryPolicy) -> Vec<OrderCase> {
    let with_proof = Attempt {
        with_proof: true,
        ..FRESH
    };
    vec![
        (
            "a join without a proof solves a challenge",
            Some(refusal(428, "challenge_required", None)),
            FRESH,
            OrderNext::Solve { budgeted: false },
        ),
        (
            "no challenge is solved while winding down",
            Some(refusal(428, "challenge_required", None)),
            WINDING,
            end(Ending::GivenUp, false),
        ),
        (
            "a refused proof solves a new one, budgeted",
            Some(refusal(403, "expired", None)),
            with_proof,
            OrderNext::Solve { budgeted: true },
        ),
        (
            "a refused proof with the budget spent ends the purchase",
            Some(refusal(403, "unsolved", None)),
            Attempt {
                retries: policy.max_retries,
                ..with_proof
            },
            end(Ending::GivenUp, false),
        ),
        (
            "the source's budget is waited out",
            Some(refusal(429, "source_budget", Some("2"))),
            with_proof,
            again(Duration::from_secs(2), false, false),
        ),
    ]
}

fn pass_and_token_refusals() -> Vec<OrderCase> {
    vec![
        (
            "a refused pass rejoins",
            Some(refusal(403, "expired", None)),
            WITH_PASS,
            OrderNext::Rejoin,
        ),
        (
            "a replayed pass after an uncertain attempt waits for its lease",
            Some(refusal(403, "replayed", None)),
            PASS_UNCERTAIN,
            again(Duration::from_secs(2), true, true),
        ),
        (
            "a replayed pass of a used place ends the purchase",
            Some(refusal(403, "replayed", None)),
            WITH_PASS,
            end(Ending::GivenUp, false),
        ),
        (
            "403 without a pass is unexpected",
            Some(refusal(403, "forbidden", None)),
            FRESH,
            end(Ending::Unexpected, false),
        ),
        (
            "401 is unexpected",
            Some(refusal(401, "invalid_token", None)),
            FRESH,
            end(Ending::Unexpected, false),
        ),
        (
            "idempotency_key_reused is unexpected",
            Some(refusal(409, "idempotency_key_reused", None)),
            FRESH,
            end(Ending::Unexpected, false),
        ),
    ]
}

#[test]
fn queue_polls_follow_the_hint_until_a_pass() {
    let policy = RetryPolicy::default();
    let waiting = answer(
        200,
        None,
        json!({"position": 9, "nextPollMs": 2700, "admitted": false, "pass": null}),
    );
    let admitted = answer(
        200,
        None,
        json!({"position": 9, "nextPollMs": 2100, "admitted": true, "pass": "P"}),
    );
    let table: Vec<(&str, Option<Answer>, u32, PollNext)> = vec![
        (
            "waiting: the hint",
            Some(waiting),
            0,
            PollNext::Again {
                wait: ms(2700),
                budgeted: false,
            },
        ),
        (
            "admitted: the pass",
            Some(admitted),
            0,
            PollNext::Admitted("P".into()),
        ),
        (
            "a refused ticket rejoins",
            Some(refusal(403, "expired", None)),
            0,
            PollNext::Rejoin,
        ),
        (
            "503 retries after Retry-After",
            Some(refusal(503, "unavailable", Some("1"))),
            0,
            PollNext::Again {
                wait: ms(1000),
                budgeted: true,
            },
        ),
        (
            "no answer backs off",
            None,
            3,
            PollNext::Again {
                wait: policy.backoff(3),
                budgeted: true,
            },
        ),
        (
            "spent budget fails",
            None,
            policy.max_retries,
            PollNext::Fail,
        ),
        (
            "401 fails",
            Some(refusal(401, "invalid_token", None)),
            0,
            PollNext::Fail,
        ),
    ];
    for (name, reply, retries, want) in table {
        assert_eq!(poll(reply.as_ref(), retries, &policy), want, "{name}");
    }
}

#[test]
fn payments_retry_what_can_be_retried() {
    let policy = RetryPolicy::default();
    let table: Vec<(&str, Option<Answer>, u32, Verdict)> = vec![
        ("202", Some(answer(202, None, json!({}))), 0, Verdict::Done),
        (
            "200",
            Some(answer(200, None, json!({"status": "paid"}))),
            0,
            Verdict::Done,
        ),
        (
            "503",
            Some(refusal(503, "unavailable", Some("1"))),
            0,
            Verdict::Again(ms(1000)),
        ),
        (
            "429",
            Some(refusal(429, "rate_limited", None)),
            1,
            Verdict::Again(policy.backoff(1)),
        ),
        ("no answer", None, 2, Verdict::Again(policy.backoff(2))),
        ("spent", None, policy.max_retries, Verdict::Fail),
        (
            "409 lapsed",
            Some(refusal(409, "order_lapsed", None)),
            0,
            Verdict::Fail,
        ),
        (
            "401 bad signature",
            Some(refusal(401, "bad_signature", None)),
            0,
            Verdict::Fail,
        ),
    ];
    for (name, reply, retries, want) in table {
        assert_eq!(verdict(reply.as_ref(), retries, &policy), want, "{name}");
    }
}

#[test]
fn the_bill_is_the_pay_answer_amount_and_currency() {
    let pay = answer(
        202,
        None,
        json!({"orderId": "ord-1", "amountMinor": 500, "currency": "CNY", "status": "awaiting_payment"}),
    );
    assert_eq!(bill(&pay), Some((500, "CNY".to_owned())));
    assert_eq!(bill(&answer(202, None, json!({"amountMinor": 500}))), None);
}
