//! Payments come from the payment provider's signed callback, never from
//! the buyer: against a real inventory, Redis and Kafka.

mod common;

use std::time::Duration;

use common::{Funnel, Options, http, now_s, order, provider_pays, token, wait_past};
use flashsale_orders::EventKind;
use serde_json::{Value, json};

/// The reservation's state straight from the inventory.
async fn state_of(funnel: &Funnel, order_id: &str) -> anyhow::Result<String> {
    let id = flashsale_orders::reservation_id(order_id).unwrap_or_default();
    let record: Value = http()
        .get(format!(
            "{}/v1/sales/{}/reservations/{id}",
            funnel.inventory.url, funnel.sale
        ))
        .bearer_auth(common::INVENTORY_TOKEN)
        .send()
        .await?
        .json()
        .await?;
    Ok(record["state"].as_str().unwrap_or_default().to_owned())
}

fn paid_events(events: &[flashsale_orders::OrderEvent]) -> usize {
    events.iter().filter(|e| e.kind == EventKind::Paid).count()
}

#[tokio::test]
async fn the_buyer_cannot_mark_an_order_paid() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = &funnel.gateway.url;
    let (status, body, _) = order(gw, "gus", "A", "k1", None).await?;
    assert_eq!(status, 201, "{body}");
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    for _ in 0..3 {
        let answer = http()
            .post(format!("{gw}/api/v1/orders/{order_id}/pay"))
            .bearer_auth(token("gus"))
            .send()
            .await?;
        assert_eq!(answer.status().as_u16(), 202);
    }
    assert_eq!(state_of(&funnel, &order_id).await?, "reserved");
    assert_eq!(paid_events(&funnel.events().await?), 0);
    funnel.cleanup().await
}

#[tokio::test]
async fn a_callback_must_be_signed_fresh_and_for_the_right_amount() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options::default()).await?;
    let gw = &funnel.gateway.url;
    let (_, body, _) = order(gw, "hal", "A", "k1", None).await?;
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();

    // Unsigned, or signed with the wrong secret: 401.
    let unsigned = http()
        .post(format!("{gw}/api/v1/payments/callback"))
        .json(
            &json!({"paymentId": "p", "orderId": order_id, "amountMinor": 1999,
                      "currency": "CNY", "status": "succeeded"}),
        )
        .send()
        .await?;
    assert_eq!(unsigned.status().as_u16(), 401);
    // Signed too long ago (a replay): 401.
    let (status, stale) = provider_pays(gw, &order_id, 1999, "CNY", now_s() - 3600).await?;
    assert_eq!(
        (status, stale["error"].as_str()),
        (401, Some("bad_signature")),
        "{stale}"
    );
    // The wrong amount or currency: 409, and nothing confirmed.
    let (status, short) = provider_pays(gw, &order_id, 1, "CNY", now_s()).await?;
    assert_eq!(
        (status, short["error"].as_str()),
        (409, Some("amount_mismatch")),
        "{short}"
    );
    let (status, dollars) = provider_pays(gw, &order_id, 1999, "USD", now_s()).await?;
    assert_eq!(
        (status, dollars["error"].as_str()),
        (409, Some("amount_mismatch")),
        "{dollars}"
    );
    assert_eq!(state_of(&funnel, &order_id).await?, "reserved");
    assert_eq!(paid_events(&funnel.events().await?), 0);
    // Money moved that the order cannot take: both flagged for a refund.
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_refunds_needed_total{reason="amount_mismatch"}"#),
        Some(2.0)
    );

    // The right one pays it, and the paid event carries the order's amount.
    let (status, paid) = provider_pays(gw, &order_id, 1999, "CNY", now_s()).await?;
    assert_eq!((status, &paid["status"]), (200, &json!("paid")), "{paid}");
    assert_eq!(state_of(&funnel, &order_id).await?, "confirmed");
    let stored = funnel.events().await?;
    let paid: Vec<_> = stored
        .iter()
        .filter(|e| e.kind == EventKind::Paid)
        .collect();
    assert_eq!(paid.len(), 1, "{stored:?}");
    assert_eq!(
        (paid[0].order_id.as_str(), paid[0].amount_minor),
        (order_id.as_str(), 1999)
    );
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_payment_callbacks_total{outcome="unauthenticated"}"#),
        Some(2.0)
    );

    // An unknown order is a 404 to the provider.
    let (status, _) = provider_pays(gw, "ord-nosuchreservation", 1999, "CNY", now_s()).await?;
    assert_eq!(status, 404);
    funnel.cleanup().await
}

/// The moment between a reservation's deadline and the sweeper: the record
/// still says `reserved`, but the order has lapsed.
#[tokio::test]
async fn a_lapsed_reservation_is_no_order_before_it_is_swept() -> anyhow::Result<()> {
    let funnel = Funnel::start(Options {
        reservation_ttl: Duration::from_secs(2),
        ..Options::default()
    })
    .await?;
    let gw = &funnel.gateway.url;
    let pay = |order_id: &str| {
        http()
            .post(format!("{gw}/api/v1/orders/{order_id}/pay"))
            .bearer_auth(token("ida"))
            .send()
    };
    let (status, body, _) = order(gw, "ida", "A", "k1", None).await?;
    assert_eq!(status, 201, "{body}");
    let order_id = body["orderId"].as_str().unwrap_or_default().to_owned();
    let pay_before = body["payBeforeMs"].as_i64().unwrap_or_default();
    let started = pay(&order_id).await?;
    assert_eq!(
        started.status().as_u16(),
        202,
        "payable before its deadline"
    );

    wait_past(pay_before, Duration::from_secs(10)).await?;
    assert_eq!(state_of(&funnel, &order_id).await?, "reserved", "not swept");

    // A retry with the same key, and another: lapsed, and no second order.
    let lapsed = |(status, body): (u16, Value)| {
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("order_lapsed")),
            "{body}"
        );
    };
    for _ in 0..2 {
        let (status, body, _) = order(gw, "ida", "A", "k1", None).await?;
        lapsed((status, body));
    }
    let stored = funnel.events().await?;
    assert_eq!(
        stored
            .iter()
            .filter(|e| e.kind == EventKind::Created)
            .count(),
        1,
        "{stored:?}"
    );

    // The buyer is not sent to pay it.
    let refused = pay(&order_id).await?;
    let status = refused.status().as_u16();
    lapsed((status, refused.json().await?));

    // A payment that arrives all the same is refused and flagged for a refund.
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_refunds_needed_total{reason="lapsed"}"#),
        Some(0.0)
    );
    let (status, body) = provider_pays(gw, &order_id, 1999, "CNY", now_s()).await?;
    lapsed((status, body));
    assert_eq!(
        funnel
            .gateway
            .metric(r#"gateway_refunds_needed_total{reason="lapsed"}"#),
        Some(1.0)
    );
    assert_eq!(state_of(&funnel, &order_id).await?, "reserved");
    assert_eq!(paid_events(&funnel.events().await?), 0);
    funnel.cleanup().await
}
